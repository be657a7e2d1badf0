#include "sluice/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

namespace {

namespace fs = std::filesystem;

std::string KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes a file descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Where `path` leads: the same string for two names of one file (symbolic links, "./", "..");
// for a path that does not exist yet, its existing folder resolved and the rest appended.
std::string Resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? path : p.string();
}

// Two names of one file: the same resolved path, or the same inode (hard links).
bool SameFile(const std::string& a, const std::string& b) {
  if (Resolved(a) == Resolved(b)) return true;
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

void CheckWritable(const NamedPath& out) {
  struct stat st;
  if (::stat(out.path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      throw IoError(fmt::format("{} '{}' is a directory; name a file in it", out.option, out.path));
    }
    if (out.replaced) CheckReplaceable(out.option, out.path);
    if (::access(out.path.c_str(), W_OK) != 0) {
      throw IoError(
          fmt::format("{} '{}' cannot be written: {}", out.option, out.path, std::strerror(errno)));
    }
  }
  const fs::path parent = fs::path(out.path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  if (::stat(dir.c_str(), &st) != 0) {
    throw IoError(fmt::format("{} '{}': its folder '{}' does not exist ({}); create it first",
                              out.option, out.path, dir, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    throw IoError(fmt::format("{} '{}': '{}' is not a directory", out.option, out.path, dir));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw IoError(fmt::format("{} '{}': cannot create files in '{}': {}", out.option, out.path, dir,
                              std::strerror(errno)));
  }
}

}  // namespace

void CheckReplaceable(std::string_view what, const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;  // nothing there to replace
  if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)) return;
  throw IoError(fmt::format(
      "{} '{}' is {}: this output is written to a new file renamed over its path, which would "
      "replace it; name a regular file",
      what, path, KindOf(st.st_mode)));
}

std::string ReadWholeFile(std::string_view what, const std::string& path, int64_t special_limit) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    throw IoError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    throw IoError(fmt::format("cannot read {} '{}': it is a directory, not a file", what, path));
  }
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    throw IoError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
  }
  const bool regular = S_ISREG(st.st_mode);
  std::string bytes;
  if (regular) bytes.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(
          fmt::format("error while reading {} '{}': {}", what, path, std::strerror(errno)));
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
    if (!regular && static_cast<int64_t>(bytes.size()) > special_limit) {
      throw IoError(fmt::format(
          "{} '{}' is {} and yields more than {} MiB, the most read from anything but a regular "
          "file; copy what it should hold into a file",
          what, path, KindOf(st.st_mode), special_limit >> 20));
    }
  }
  return bytes;
}

void CheckOutputPaths(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (out.path.empty()) continue;
    for (const NamedPath& in : inputs) {
      if (!in.path.empty() && SameFile(out.path, in.path)) {
        throw InvalidArgument(fmt::format(
            "{} '{}' is the {} file '{}': writing it would destroy an input of this run; choose "
            "another path",
            out.option, out.path, in.option, in.path));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (!outputs[j].path.empty() && SameFile(out.path, outputs[j].path)) {
        throw InvalidArgument(
            fmt::format("{} '{}' and {} '{}' are the same file: give each output its own path",
                        outputs[j].option, outputs[j].path, out.option, out.path));
      }
    }
  }
  for (const NamedPath& out : outputs) {
    if (!out.path.empty()) CheckWritable(out);
  }
}

}  // namespace sluice
