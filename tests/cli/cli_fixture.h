// CliTest: the fixture every CLI test uses to run the built `sluice` binary as a user would.
// SLUICE_BINARY (set by CTest for tests/cli/) names the binary; each test gets a scratch folder,
// removed afterwards.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace sluice {

struct CliResult {
  int status;  // exit status; -1 when the process did not exit normally
  std::string out, err;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* binary = std::getenv("SLUICE_BINARY");
    ASSERT_NE(binary, nullptr) << "SLUICE_BINARY must name the sluice binary (CTest sets it)";
    binary_ = binary;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("sluice_cli_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string ReadFile(const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  // Every line of a JSON-lines file (metrics), parsed.
  static std::vector<nlohmann::json> Lines(const std::filesystem::path& p) {
    std::vector<nlohmann::json> out;
    std::ifstream in(p);
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  std::filesystem::path Write(const std::string& name, const std::string& text) {
    std::filesystem::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  // Runs `env sluice args`, capturing stdout and stderr.
  CliResult Sluice(const std::string& args, const std::string& env = "") {
    const std::filesystem::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd =
        fmt::format("{} '{}' {} > '{}' 2> '{}'", env, binary_, args, out.string(), err.string());
    const int raw = std::system(cmd.c_str());
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, ReadFile(out), ReadFile(err)};
  }

  // Runs `sluice args`, which must fail cleanly: exit status 1 and "sluice: error: ", never
  // "internal error", a signal or a success. Returns stderr.
  std::string Refused(const std::string& args) {
    const CliResult r = Sluice(args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("sluice: error: "), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << args << "\n" << r.err;
    return r.err;
  }

  std::string binary_;
  std::filesystem::path dir_;
};

}  // namespace sluice
