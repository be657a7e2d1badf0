// Where tests write their files.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace sluice::testing_support {

// The path of `name` in a folder of this test process's own under ::testing::TempDir() (created
// here, removed with what it holds when the process exits): two checkouts, or two ctest runs,
// running the suite at once each write their own files, and a name keeps its stem and extension.
inline std::string ScratchPath(const std::string& name) {
  struct Folder {
    std::filesystem::path path =
        std::filesystem::path(::testing::TempDir()) / ("sluice_test_" + std::to_string(::getpid()));
    Folder() { std::filesystem::create_directories(path); }
    ~Folder() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Folder folder;
  return (folder.path / name).string();
}

}  // namespace sluice::testing_support
