#include "sluice/io/metrics.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (file_ == nullptr) {
    throw IoError(fmt::format("cannot open metrics file '{}': {}", path, std::strerror(errno)));
  }
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (file_ != nullptr) std::fclose(file_);
    path_ = std::move(other.path_);
    file_ = other.file_;
    other.file_ = nullptr;
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::Write(const nlohmann::json& object) {
  if (file_ == nullptr) return;
  std::string line = object.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw IoError(fmt::format("cannot write metrics file '{}': {}", path_, std::strerror(errno)));
  }
}

}  // namespace sluice
