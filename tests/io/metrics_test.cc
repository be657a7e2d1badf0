// MetricsWriter keeps whole lines only and never destroys an earlier run's metrics before it has
// a line of its own (io/metrics.h says what "atomic" means for a file that grows a line at a time).
#include "sluice/io/metrics.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "sluice/core/error.h"

namespace sluice {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

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
