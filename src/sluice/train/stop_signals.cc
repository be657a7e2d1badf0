#include "sluice/train/stop_signals.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

namespace {

// The first stop signal's number, 0 while none came. Written by the handler, read by the training
// loop on another thread: an atomic, lock-free so that the handler may store to it.
std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free);
// Whether a StopSignals is installed (only the constructing thread writes it).
std::atomic<bool> g_installed{false};

void WriteStderr(const char* text, size_t size) {
  // write(2) is async-signal-safe; a failed write of this note changes nothing.
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text, size);
}

template <size_t N>
void WriteStderr(const char (&text)[N]) {
  WriteStderr(text, N - 1);
}

void OnStopSignalKeepingErrno(int signal) {
  int none = 0;
  if (g_received.compare_exchange_strong(none, signal)) {
    if (signal == SIGINT) {
      WriteStderr(
          "\nsluice: SIGINT: finishing this step, then trying to save a checkpoint (send it again "
          "to stop at once, without one)\n");
    } else {
      WriteStderr(
          "\nsluice: SIGTERM: finishing this step, then trying to save a checkpoint (send it "
          "again to stop at once, without one)\n");
    }
    return;
  }
  // The second signal: the default action (termination by `signal`), at once. The signal is
  // blocked while its handler runs, so the raised one is delivered as the handler returns.
  WriteStderr("\nsluice: second signal: stopping at once, no checkpoint\n");
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  ::sigaction(signal, &default_action, nullptr);
  ::raise(signal);
}

extern "C" void OnStopSignal(int signal) {
  // write(2) may fail (stderr closed or full, a broken pipe) and set errno, which the interrupted
  // code may be about to read: the handler leaves it as it was.
  const int saved_errno = errno;
  OnStopSignalKeepingErrno(signal);
  errno = saved_errno;
}

}  // namespace

StopSignals::StopSignals() {
  SLUICE_CHECK(!g_installed.exchange(true));
  g_received.store(0);
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or a wait in progress goes on after the handler
  ::sigaction(SIGINT, &action, &previous_int_);
  ::sigaction(SIGTERM, &action, &previous_term_);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &previous_pipe_);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &previous_int_, nullptr);
  ::sigaction(SIGTERM, &previous_term_, nullptr);
  ::sigaction(SIGPIPE, &previous_pipe_, nullptr);
  g_installed.store(false);
}

int StopSignals::received() const { return g_received.load(); }

std::string SignalName(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return fmt::format("signal {}", signal);
  }
}

}  // namespace sluice
