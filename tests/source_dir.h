// The checkout the tests read their data from (fuzz corpora, golden files).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

namespace sluice::testing_support {

// SLUICE_SOURCE_DIR under CTest (tests/CMakeLists.txt sets it: __FILE__ may be relative to the
// build folder when ccache rewrites paths, and CTest runs a test from another folder). Run by hand,
// the nearest folder at or above the working directory that holds this header, else the one
// __FILE__ names.
inline std::filesystem::path SourceDir() {
  if (const char* root = std::getenv("SLUICE_SOURCE_DIR")) return root;
  std::error_code ec;
  for (std::filesystem::path dir = std::filesystem::current_path(ec); !ec && !dir.empty();
       dir = dir.parent_path()) {
    if (std::filesystem::exists(dir / "tests" / "source_dir.h", ec)) return dir;
    if (dir == dir.parent_path()) break;
  }
  return std::filesystem::path(__FILE__).parent_path().parent_path();
}

// The files of fuzz/corpus/<target> (seed inputs of fuzz/<target>_fuzz.cc), sorted by name.
inline std::vector<std::filesystem::path> FuzzCorpus(const char* target) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry :
       std::filesystem::directory_iterator(SourceDir() / "fuzz" / "corpus" / target)) {
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace sluice::testing_support
