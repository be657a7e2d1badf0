#include "sluice/core/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

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

void RemoveStaleTemporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string prefix = p.filename().string() + ".tmp-";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    if (digits.size() > 9) continue;  // not a pid sluice wrote
    const long pid = std::stol(digits);
    // A live process may be writing it: only a pid that is gone (ESRCH) leaves a stale file. Our
    // own pid's file is stale too: it is ours only between open and rename.
    if (pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)) continue;
    std::error_code ignored;
    fs::remove(it->path(), ignored);
  }
}

namespace {

[[noreturn]] void FailSave(std::string_view what, const std::string& path, const std::string& how) {
  throw IoError(fmt::format("cannot save {} '{}': {} ({})", what, path, how, std::strerror(errno)));
}

void WriteAll(int fd, std::string_view bytes, std::string_view what, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      FailSave(what, path, "write failed");
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void WriteFileAtomic(std::string_view what, const std::string& path, std::string_view bytes) {
  WriteFileAtomic(what, path, [&](const ByteSink& sink) { sink(bytes); });
}

void WriteFileAtomic(std::string_view what, const std::string& path,
                     const std::function<void(const ByteSink& sink)>& write) {
  // lstat: a symbolic link is replaced itself, like a regular file (as for checkpoints), so that
  // a link to a pipe without a reader does not block the write.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode) &&
      !S_ISLNK(st.st_mode)) {
    // A device or pipe: written in place (there is no file to keep).
    Fd f{::open(path.c_str(), O_WRONLY | O_CLOEXEC)};
    if (f.fd < 0) FailSave(what, path, "cannot open");
    write([&](std::string_view bytes) { WriteAll(f.fd, bytes, what, path); });
    const int closed = ::close(f.fd);
    f.fd = -1;
    if (closed != 0) FailSave(what, path, "close failed");
    return;
  }
  RemoveStaleTemporaries(path);
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) FailSave(what, path, fmt::format("cannot create '{}'", tmp));
  auto give_up = [&](const char* how) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    FailSave(what, path, how);
  };
  try {
    write([&](std::string_view bytes) { WriteAll(fd, bytes, what, path); });
  } catch (...) {
    const int saved = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = saved;
    throw;
  }
  if (::fsync(fd) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    give_up("fsync failed");
  }
  if (::close(fd) != 0) give_up("close failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0) give_up("rename failed");
  // Make the rename itself durable.
  const std::string dir = fs::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void CheckReplaceable(std::string_view what, const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;  // nothing there to replace
  if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)) return;
  throw IoError(fmt::format(
      "{} '{}' is {}: this output is written to a new file renamed over its path, which would "
      "replace it; name a regular file",
      what, path, KindOf(st.st_mode)));
}

// The bytes of every pipe or device read so far, by (device, inode): a pipe yields its bytes
// once, and a run builds its dataset (or parses its program) more than once.
struct SpecialFileCache {
  std::mutex mutex;
  std::map<std::pair<dev_t, ino_t>, std::string> bytes;
};

SpecialFileCache& SpecialFiles() {
  static SpecialFileCache cache;
  return cache;
}

std::string ReadWholeFile(std::string_view what, const std::string& path, int64_t special_limit) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    throw IoError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    throw IoError(fmt::format("cannot read {} '{}': it is a directory, not a file", what, path));
  }
  const bool regular = S_ISREG(st.st_mode);
  auto too_long = [&] {
    return IoError(fmt::format(
        "{} '{}' is {} and yields more than {} MiB, the most read from anything but a regular "
        "file; copy what it should hold into a file",
        what, path, KindOf(st.st_mode), special_limit >> 20));
  };
  const std::pair<dev_t, ino_t> key{st.st_dev, st.st_ino};
  SpecialFileCache& cache = SpecialFiles();
  // Held while a pipe is read, so that two threads reading one pipe share what it yields.
  std::unique_lock<std::mutex> lock(cache.mutex, std::defer_lock);
  if (!regular) {
    lock.lock();
    if (auto it = cache.bytes.find(key); it != cache.bytes.end()) {
      if (static_cast<int64_t>(it->second.size()) > special_limit) throw too_long();
      return it->second;
    }
  }
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    throw IoError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
  }
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
    if (!regular && static_cast<int64_t>(bytes.size()) > special_limit) throw too_long();
  }
  if (!regular) cache.bytes.emplace(key, bytes);
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
