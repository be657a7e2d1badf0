// Files at the boundary: every file sluice reads whole (a program, a data file, a checkpoint) goes
// through ReadWholeFile, and every command checks its output paths with CheckOutputPaths before it
// does any work — so that a directory, a device or an unwritable folder is a clear error at once,
// never an exception from the standard library, an endless read or a failure after hours of
// training.
//
// Errors: IoError for what the file system refuses (missing, a directory, unreadable, unwritable,
// a device that yields more than the limit); InvalidArgument for paths that clash (an output that
// is an input, or two outputs that are one file). Every message names the option or the kind of
// file, the path, and what is allowed.
//
// Thread-safety: plain functions over the file system; safe from any thread.
//
// Example:
//   const std::string text = ReadWholeFile("program", path);            // IoError if unreadable
//   CheckOutputPaths({{"--resume", resume}, {"--data", data}},          // inputs
//                    {{"--save", save}, {"--metrics", metrics}});       // outputs
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

// The most bytes read from a file that is not a regular file (a pipe, /dev/stdin, a device such as
// /dev/zero, which never ends). A regular file is read at its size.
inline constexpr int64_t kSpecialFileLimit = int64_t{64} << 20;

// The whole content of `path`. `what` names the file in messages ("program", "--data file").
// Throws IoError when it does not exist, is a directory, cannot be read, or is not a regular file
// and yields more than `special_limit` bytes. A file that is not regular (a pipe, /dev/stdin) is
// read once per process: a later call for it (by device and inode) returns the bytes of the first,
// since a pipe yields them only once and a run may read its data or program twice.
std::string ReadWholeFile(std::string_view what, const std::string& path,
                          int64_t special_limit = kSpecialFileLimit);

// A path given on the command line, with the option that named it ("--save").
struct NamedPath {
  std::string option;
  std::string path;  // empty: not given (skipped)
  // Outputs: written to a new file renamed over `path` (checkpoints), which replaces whatever is
  // there; CheckOutputPaths then also refuses a device, pipe or socket (CheckReplaceable).
  bool replaced = false;
};

// Refuses (IoError naming `what`, the path and its kind) a path that holds a device, a pipe or a
// socket, for an output written by renaming a new file over it: as root, `--save /dev/null` would
// otherwise replace /dev/null itself. A regular file, a symbolic link (the link is replaced, not
// its target), a path that does not exist and a directory (for the caller's own message) pass.
void CheckReplaceable(std::string_view what, const std::string& path);

// Writes `bytes` to `path` so that `path` holds what it held before or all of `bytes`, never a
// part (a full disk, a folder removed meanwhile, a process killed mid-write): the bytes go to
// "<path>.tmp-<pid>" beside it, are fsync'ed and renamed over `path`, and the folder is fsync'ed.
// A device or pipe at `path` (an output written in place: /dev/null, a FIFO) is written directly
// instead — there is no file to keep, and renaming over it would replace the device (a symbolic
// link is not followed: the link itself is replaced, whatever it points to); a caller
// that must never write in place refuses such a path first (CheckReplaceable). Removes stale
// temporaries of `path` first (RemoveStaleTemporaries). `what` names the file in messages: IoError
// "cannot save WHAT 'PATH': cannot create 'PATH.tmp-42' (No such file or directory)".
void WriteFileAtomic(std::string_view what, const std::string& path, std::string_view bytes);

// The bytes of a file given piece by piece: WriteFileAtomic calls `write` once, and `write` hands
// each piece to `sink` in order (the sink writes it out before returning, so the caller may drop
// the piece). An exception thrown by `write` (or by `sink`) removes the temporary and propagates:
// `path` keeps what it held.
using ByteSink = std::function<void(std::string_view)>;

// WriteFileAtomic of the bytes `write` hands to its sink: the same file, written as it is made, so
// that no more than a piece is held at once.
void WriteFileAtomic(std::string_view what, const std::string& path,
                     const std::function<void(const ByteSink& sink)>& write);

// Removes "<path>.tmp-<pid>" files left by a process killed while writing `path` atomically: those
// of a pid that no longer runs (and of this process). A live process's temporary is left alone.
void RemoveStaleTemporaries(const std::string& path);

// Before any work: refuses an output that resolves to the same file as an input or as another
// output (symbolic and hard links and "./a" vs "a" included) — InvalidArgument naming both options
// and the path; then checks that each output can be written: its folder exists and is writable,
// and the path is not a directory, nor, for a `replaced` output, a device, pipe or socket (IoError
// naming the option, the path and the reason).
void CheckOutputPaths(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs);

}  // namespace sluice
