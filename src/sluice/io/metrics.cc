#include "sluice/io/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/core/files.h"

namespace sluice {

namespace {

// The length of `fd`'s first `size` bytes up to and including their last newline (0: none).
int64_t WholeLinesLength(int fd, int64_t size) {
  char buffer[4096];
  for (int64_t end = size; end > 0;) {
    const int64_t start = std::max<int64_t>(0, end - static_cast<int64_t>(sizeof buffer));
    const ssize_t n = ::pread(fd, buffer, static_cast<size_t>(end - start), start);
    if (n <= 0) return size;  // unreadable: keep it as it is
    for (ssize_t i = n - 1; i >= 0; --i) {
      if (buffer[i] == '\n') return start + i + 1;
    }
    end = start;
  }
  return 0;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  // A new file, or an earlier run's regular file replaced: the lines go to a temporary beside it
  // that the first whole line renames over the path (lstat: a symbolic link is written through).
  struct stat link {};
  const bool exists = ::lstat(path.c_str(), &link) == 0;
  if (!exists || (S_ISREG(link.st_mode) && !append)) {
    RemoveStaleTemporaries(path);
    temporary_ = fmt::format("{}.tmp-{}", path, ::getpid());
    fd_ = ::open(temporary_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ >= 0) {
      regular_ = true;
      return;
    }
    temporary_.clear();  // a folder that takes no new file: the existing file, in place
  }
  // O_RDWR: a resumed file is read back to find its last whole line.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    throw IoError(fmt::format("cannot open metrics file '{}': {}", path, std::strerror(errno)));
  }
  struct stat st {};
  regular_ = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
  if (!regular_) return;
  truncate_ = !append;
  if (append) {
    // A killed run may have left half a line: drop it, so the next line starts a line of its own.
    size_ = WholeLinesLength(fd_, st.st_size);
    if (size_ != st.st_size && ::ftruncate(fd_, size_) != 0) size_ = st.st_size;
  }
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    Close();
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    regular_ = other.regular_;
    truncate_ = other.truncate_;
    size_ = other.size_;
    temporary_ = std::move(other.temporary_);
    other.fd_ = -1;
    other.temporary_.clear();
  }
  return *this;
}

MetricsWriter::~MetricsWriter() { Close(); }

void MetricsWriter::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  // No line ever landed: the path keeps what it held, or stays absent.
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
  temporary_.clear();
}

void MetricsWriter::Write(const nlohmann::json& object) {
  if (fd_ < 0) return;
  const std::string line = object.dump() + "\n";
  auto fail = [&](int error) {
    // Cut a part-written line off: the file keeps whole lines only. A temporary without a line
    // goes, and the writer with it: the path never sees an empty or torn file.
    if (!temporary_.empty()) {
      Close();
    } else if (regular_) {
      [[maybe_unused]] const int cut = ::ftruncate(fd_, size_);  // best effort; the error follows
    }
    return IoError(fmt::format("cannot write metrics file '{}': {}", path_, std::strerror(error)));
  };
  if (truncate_) {
    if (::ftruncate(fd_, 0) != 0) throw fail(errno);
    truncate_ = false;
    size_ = 0;
  }
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = regular_ ? ::pwrite(fd_, line.data() + done, line.size() - done,
                                          size_ + static_cast<int64_t>(done))
                               : ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw fail(n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  size_ += static_cast<int64_t>(line.size());
  if (!temporary_.empty()) {  // the first whole line: the file takes the path
    if (::rename(temporary_.c_str(), path_.c_str()) != 0) throw fail(errno);
    temporary_.clear();
  }
}

}  // namespace sluice
