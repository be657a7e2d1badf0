// MetricsWriter: JSON lines, one object per line, each written with one write() as soon as it is
// made, so that a crashed run keeps what it measured and `tail -f` works.
//
// What "atomic" means for a file that grows a line at a time:
//   - whole lines only: a line whose write fails part-way (a full disk) is cut off again, so the
//     file ends with the last whole line; a resumed run (`append`) first drops a torn last line a
//     killed run may have left, so that its lines never glue onto a fragment;
//   - a path is written only when the run has its first whole line: a new file, or an earlier
//     run's regular file that is replaced, is written as "<path>.tmp-<pid>" beside it, renamed
//     over the path once its first line is whole (core/files.h's temporaries). A run that fails
//     before — no step, or a full disk at the first line — leaves the previous run's metrics
//     whole, or no file at all, never an empty one; its temporary is removed. Through a symbolic
//     link the file it points to is written in place (truncated at the first line), and a
//     resumed run (`append`) appends to its file in place;
//   - a failed write throws IoError, and the trainer abandons the metrics there while training
//     goes on (train/trainer.h, docs/errors.md "Nothing lost").
// A pipe or device (`--metrics /dev/stdout`) is written in place, without the truncations.
//
// Thread-safety: none; one writer per file.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace sluice {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens `path` for writing (creating it); with `append` its lines are kept and new ones follow,
  // otherwise they are dropped at the first Write. Throws IoError naming the path.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& other) noexcept { *this = std::move(other); }
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Writes one line; a no-op when not open. Throws IoError when the write fails, having cut the
  // file back to its last whole line.
  void Write(const nlohmann::json& object);

 private:
  void Close();

  std::string path_;
  int fd_ = -1;
  bool regular_ = false;   // a regular file: truncated and cut back; else written in place
  bool truncate_ = false;  // drop the previous run's lines at the first Write
  int64_t size_ = 0;       // bytes of whole lines in a regular file
  std::string temporary_;  // written until its first line is whole, then renamed to path_
};

}  // namespace sluice
