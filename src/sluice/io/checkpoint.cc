#include "sluice/io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/io/safetensors.h"

namespace sluice {

namespace {

[[noreturn]] void Fail(const std::string& what, const std::string& path) {
  throw IoError(fmt::format("cannot save checkpoint '{}': {} ({})", path, what, std::strerror(errno)));
}

void WriteAll(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Fail("write failed", path);
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void SaveCheckpointAtomic(const std::string& path, const std::map<std::string, Tensor>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  const std::string bytes = SerializeSafetensors(tensors, metadata);
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail(fmt::format("cannot create '{}'", tmp), path);
  try {
    WriteAll(fd, bytes, path);
    if (::fsync(fd) != 0) Fail("fsync failed", path);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    Fail("close failed", path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    Fail("rename failed", path);
  }
  // Make the rename itself durable.
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

Checkpoint LoadCheckpoint(const std::string& path, Allocator& allocator) {
  SafetensorsFile f = ReadSafetensors(path, allocator);
  return Checkpoint{path, std::move(f.tensors), std::move(f.metadata)};
}

}  // namespace sluice
