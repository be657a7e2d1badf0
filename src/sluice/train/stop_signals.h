// StopSignals: SIGINT (Ctrl-C) and SIGTERM (what a batch scheduler sends before preempting) as a
// request to stop training gracefully. While a StopSignals lives, the first such signal only
// records its number (an atomic store: the handler is async-signal-safe) and prints one line on
// stderr; the training loop reads it between steps (Trainer::Run's `stop`), finishes the current
// step, saves a checkpoint and ends with exit status 128 + signal (docs/errors.md). A second
// signal ends the process at once, killed by that signal (the default action), as if sluice had
// not caught it: no checkpoint, shells report 128 + signal. SIGPIPE is ignored meanwhile: a
// reader of stderr or of a --metrics pipe that goes away (`sluice train 2>&1 | head -3`) costs
// the messages, which fail with EPIPE and are lost (a --metrics write is a side output's failure,
// docs/errors.md), not the run — SIGPIPE's default action ended it at once, its state unsaved.
//
// Thread-safety: received() may be called from any thread; the handler may run on any thread of
// the process (a stage's, a BLAS worker's). At most one StopSignals exists at a time (a second
// is an internal error); the destructor restores the dispositions it found.
//
// Example:
//   StopSignals signals;
//   trainer.Run(on_step, on_eval, [&] { return signals.received(); });
#pragma once

#include <csignal>
#include <string>

namespace sluice {

class StopSignals {
 public:
  StopSignals();  // installs the handler for SIGINT and SIGTERM (SA_RESTART), ignores SIGPIPE
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received (SIGINT or SIGTERM); 0 while none has come.
  int received() const;

 private:
  struct sigaction previous_int_ {
  }, previous_term_{}, previous_pipe_{};
};

// "SIGINT", "SIGTERM", or "signal N".
std::string SignalName(int signal);

}  // namespace sluice
