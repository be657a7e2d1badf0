// MetricsWriter keeps whole lines only and never destroys an earlier run's metrics before it has
// a line of its own (io/metrics.h says what "atomic" means for a file that grows a line at a time).
#include "sluice/io/metrics.h"

#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "scratch_path.h"
#include "sluice/core/error.h"

namespace sluice {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempPath(const std::string& name) { return testing_support::ScratchPath(name); }

TEST(MetricsWriter, AnEarlierRunsFileIsReplacedOnlyAtTheFirstLine) {
  const std::string path = TempPath("metrics_replace.jsonl");
  std::ofstream(path) << "{\"step\":1}\n{\"step\":2}\n";
  { MetricsWriter w(path); }  // a run that failed before its first step
  EXPECT_EQ(Slurp(path), "{\"step\":1}\n{\"step\":2}\n");
  {
    MetricsWriter w(path);
    w.Write({{"step", 7}});
  }
  EXPECT_EQ(Slurp(path), "{\"step\":7}\n");
  std::filesystem::remove(path);
}

TEST(MetricsWriter, AResumedFileDropsATornLastLine) {
  const std::string path = TempPath("metrics_torn.jsonl");
  std::ofstream(path) << "{\"step\":1}\n{\"step\":2,\"lo";  // a run killed mid-line
  {
    MetricsWriter w(path, /*append=*/true);
    w.Write({{"step", 2}});
  }
  EXPECT_EQ(Slurp(path), "{\"step\":1}\n{\"step\":2}\n");
  std::ofstream(path) << "{\"step\":1,\"lo";  // no whole line at all
  {
    MetricsWriter w(path, /*append=*/true);
    w.Write({{"step", 1}});
  }
  EXPECT_EQ(Slurp(path), "{\"step\":1}\n");
  std::filesystem::remove(path);
}

// A full disk, as a regular file meets it: RLIMIT_FSIZE at `bytes` makes a write past that size
// fail (EFBIG, with SIGXFSZ ignored) while the object lives.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limited = saved_;
    limited.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  void (*old_handler_)(int) = nullptr;
};

// Regression: a --metrics file that did not exist was left empty (0 bytes) when the disk was full
// at the first line, and an earlier run's file was truncated to nothing. Now neither path changes
// before a whole line has landed, no temporary is left, and a later full disk cuts the file back
// to its whole lines.
TEST(MetricsWriter, AFullDiskAtTheFirstLineLeavesNoFileAndAnEarlierRunsWhole) {
  const std::string path = TempPath("metrics_full.jsonl");
  std::filesystem::remove(path);
  auto temporaries = [&] {
    int n = 0;
    for (const auto& e :
         std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
      n += e.path().filename().string().starts_with("metrics_full.jsonl.tmp-") ? 1 : 0;
    return n;
  };
  {
    MetricsWriter w(path);
    const FileSizeLimit full(0);
    EXPECT_THROW(w.Write({{"step", 1}}), IoError);
    EXPECT_FALSE(w.is_open());
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "a new file was left with no line";
  EXPECT_EQ(temporaries(), 0);

  std::ofstream(path) << "{\"step\":1}\n";
  {
    MetricsWriter w(path);
    const FileSizeLimit full(0);
    try {
      w.Write({{"step", 7}});
      FAIL() << "a write past RLIMIT_FSIZE succeeded";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot write metrics file '" + path + "'"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(Slurp(path), "{\"step\":1}\n") << "the earlier run's metrics were lost";
  EXPECT_EQ(temporaries(), 0);

  {
    MetricsWriter w(path);
    const FileSizeLimit full(20);  // the first line (11 bytes) fits, the second not whole
    w.Write({{"step", 7}});
    EXPECT_THROW(w.Write({{"step", 8}, {"loss", 1.5}}), IoError);
  }
  EXPECT_EQ(Slurp(path), "{\"step\":7}\n");
  EXPECT_EQ(temporaries(), 0);
  std::filesystem::remove(path);
}

TEST(MetricsWriter, AFullDeviceIsAnIoErrorNamingTheFile) {
  MetricsWriter w("/dev/full");
  try {
    w.Write({{"step", 1}});
    FAIL() << "a write to /dev/full succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write metrics file '/dev/full'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sluice
