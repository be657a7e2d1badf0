// MetricsWriter: JSON lines, one object per line, flushed after every line so that a crashed run
// keeps what it measured and `tail -f` works.
//
// Thread-safety: none; one writer per file.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace sluice {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens (truncates, or appends when `append`) `path`. Throws IoError naming the path.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& other) noexcept { *this = std::move(other); }
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;

  bool is_open() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  // Writes one line; a no-op when not open. Throws IoError when the write fails.
  void Write(const nlohmann::json& object);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace sluice
