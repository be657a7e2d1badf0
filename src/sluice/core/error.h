// Error conventions for all of sluice.
//
// Two kinds of failure, kept apart on purpose:
//   * User-facing failures (bad program text, bad shapes, bad CLI arguments, unreadable files,
//     exhausted memory) throw a subclass of `sluice::Error`. The message names the thing and the
//     place ("matmul %h: inner dimensions differ: [8, 16] x [32, 4]"), and where possible the fix.
//     Callers at the boundary (the CLI) print `what()` and exit non-zero.
//   * Broken internal invariants use SLUICE_CHECK, which is always on (also in release builds) and
//     throws `InternalError` carrying file and line. Seeing one is a bug in sluice.
//
// Thread-safety: the types are plain values; throwing is safe from any thread. Errors raised on a
// worker thread are captured (std::exception_ptr) and rethrown on the caller's thread, never
// allowed to unwind across threads.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace sluice {

// Base of every user-facing failure.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An argument, option or configuration value is not acceptable.
class InvalidArgument : public Error {
  using Error::Error;
};

// Shapes or dtypes do not fit an operation (shape inference, broadcasting, views).
class ShapeError : public Error {
  using Error::Error;
};

// Text could not be parsed. The message starts with "file:line:col: ".
class ParseError : public Error {
 public:
  ParseError(std::string file, int line, int col, const std::string& message)
      : Error(fmt::format("{}:{}:{}: {}", file, line, col, message)),
        file_(std::move(file)),
        line_(line),
        col_(col) {}
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int col() const { return col_; }

 private:
  std::string file_;
  int line_;
  int col_;
};

// A program is malformed (verifier) or cannot be executed as asked.
class ProgramError : public Error {
  using Error::Error;
};

// A file could not be read or written, or its contents are not what they claim.
class IoError : public Error {
  using Error::Error;
};

// An allocator could not satisfy a request.
class OutOfMemory : public Error {
  using Error::Error;
};

// The system refused a resource other than memory: a thread could not be started (a pid or
// thread limit, too many threads asked for).
class ResourceError : public Error {
  using Error::Error;
};

// A value that must be finite is not: a training step's loss or gradient norm, a tensor about to
// be saved. The message names the step or the tensor.
class NonFiniteError : public Error {
  using Error::Error;
};

// A broken internal invariant (a bug in sluice). Thrown by SLUICE_CHECK.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

namespace internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message = {});
}  // namespace internal

}  // namespace sluice

// SLUICE_CHECK(cond) or SLUICE_CHECK(cond, "fmt {}", args...): always-on invariant check.
// Throws sluice::InternalError("file.cc:42: check failed: cond: message").
#define SLUICE_CHECK(cond, ...)                                                             \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      ::sluice::internal::CheckFailed(                                                      \
          __FILE__, __LINE__, #cond __VA_OPT__(, ) __VA_OPT__(::fmt::format(__VA_ARGS__))); \
    }                                                                                       \
  } while (0)
