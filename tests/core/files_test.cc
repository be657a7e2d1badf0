// Files at the boundary: whole-file reads refuse directories and endless devices with a message
// naming the file, and output paths that clash with an input or with each other, or cannot be
// written, are refused before any work.
#include "sluice/core/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) /
        ("files_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
         "_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // The message of the IoError or InvalidArgument `f` throws; fails the test if it throws none.
  template <typename E, typename F>
  std::string ErrorOf(F&& f) {
    try {
      f();
    } catch (const E& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }
  fs::path dir_;
};

TEST_F(Files, ReadsARegularFileWhole) {
  EXPECT_EQ(ReadWholeFile("program file", Write("a.txt", "hello\n")), "hello\n");
  EXPECT_EQ(ReadWholeFile("program file", Write("empty.txt", "")), "");
}

TEST_F(Files, AMissingFileOrADirectoryIsAnIoErrorNamingIt) {
  EXPECT_THAT(ErrorOf<IoError>([&] { ReadWholeFile("data file", (dir_ / "none").string()); }),
              HasSubstr("cannot read data file '" + (dir_ / "none").string() +
                        "': No such file or directory"));
  EXPECT_THAT(ErrorOf<IoError>([&] { ReadWholeFile("data file", dir_.string()); }),
              HasSubstr("it is a directory, not a file"));
}

// Regression: /dev/zero given as a program, data or checkpoint was read until memory ran out.
TEST_F(Files, ADeviceIsReadOnlyUpToTheLimit) {
  const std::string what =
      ErrorOf<IoError>([] { ReadWholeFile("program file", "/dev/zero", int64_t{1} << 20); });
  EXPECT_THAT(what, HasSubstr("program file '/dev/zero' is a character device and yields more "
                              "than 1 MiB"));
  EXPECT_EQ(ReadWholeFile("program file", "/dev/null"), "");  // a device that ends is fine
}

// A pipe yields its bytes once; every reader of it in the process gets them all, also two threads
// reading it at once (the second waits for the first and takes its bytes from the cache; under
// ThreadSanitizer this is the cache's locking). More than the read buffer and the pipe's
// capacity, so the writer blocks while the first reader reads.
TEST_F(Files, APipeReadByTwoThreadsAtOnceYieldsItsBytesToBoth) {
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string sent(300 << 10, '\0');
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>('a' + i % 26);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << sent; });
  std::string first, second;
  std::thread reader([&] { first = ReadWholeFile("data file", fifo); });
  second = ReadWholeFile("data file", fifo);
  reader.join();
  writer.join();
  EXPECT_EQ(first, sent);
  EXPECT_EQ(second, sent);
  EXPECT_EQ(ReadWholeFile("data file", fifo), sent);  // and any later read
}

TEST_F(Files, AnOutputNamingAnInputIsRefused) {
  const std::string data = Write("corpus.txt", "text");
  fs::create_symlink(data, dir_ / "link.txt");
  fs::create_hard_link(data, dir_ / "hard.txt");
  for (const std::string& out : {data, (dir_ / "link.txt").string(), (dir_ / "hard.txt").string(),
                                 (dir_ / "." / "corpus.txt").string()}) {
    EXPECT_THAT(ErrorOf<InvalidArgument>([&] {
                  CheckOutputPaths({{"--data", data}}, {{"--metrics", out}});
                }),
                HasSubstr("--metrics '" + out + "' is the --data file '" + data + "'"));
  }
  // An input that does not exist yet (a checkpoint to come) still clashes by name.
  const std::string ck = (dir_ / "ck.safetensors").string();
  EXPECT_THROW(CheckOutputPaths({{"--resume", ck}}, {{"--save", ck}}), InvalidArgument);
}

TEST_F(Files, TwoOutputsOfOneFileAreRefused) {
  const std::string p = (dir_ / "out.json").string();
  EXPECT_THAT(ErrorOf<InvalidArgument>([&] {
                CheckOutputPaths({}, {{"--save", p}, {"--metrics", ""}, {"--trace", p}});
              }),
              HasSubstr("--save '" + p + "' and --trace '" + p + "' are the same file"));
}

// Regression: an unwritable --save or --trace failed only after all the training.
TEST_F(Files, AnOutputThatCannotBeWrittenIsRefusedFirst) {
  const std::string missing = (dir_ / "no" / "ck.safetensors").string();
  EXPECT_THAT(ErrorOf<IoError>([&] {
                CheckOutputPaths({}, {{"--save", missing}});
              }),
              HasSubstr("--save '" + missing + "': its folder '" + (dir_ / "no").string() +
                        "' does not exist"));
  const std::string file = Write("plain.txt", "x");
  EXPECT_THAT(ErrorOf<IoError>([&] {
                CheckOutputPaths({}, {{"--trace", file + "/t.json"}});
              }),
              HasSubstr("is not a directory"));
  EXPECT_THAT(ErrorOf<IoError>([&] {
                CheckOutputPaths({}, {{"--save", dir_.string()}});
              }),
              HasSubstr("is a directory; name a file in it"));
  EXPECT_NO_THROW(CheckOutputPaths(
      {{"--data", file}}, {{"--save", (dir_ / "ck").string()}, {"--metrics", "relative.jsonl"}}));
}

// An output written by renaming a new file over its path (a checkpoint) would replace a device or
// a pipe there; a symbolic link is replaced itself, not what it points to.
TEST_F(Files, AReplacedOutputMayNotBeADeviceOrAPipe) {
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(ErrorOf<IoError>([&] {
                CheckOutputPaths({}, {{"--save", fifo, /*replaced=*/true}});
              }),
              HasSubstr("--save '" + fifo +
                        "' is a pipe: this output is written to a new file "
                        "renamed over its path, which would replace it; name a regular file"));
  EXPECT_THAT(ErrorOf<IoError>([&] { CheckReplaceable("checkpoint", "/dev/null"); }),
              HasSubstr("checkpoint '/dev/null' is a character device"));
  // Written in place, a pipe or a device is fine (--metrics >(jq), --trace /dev/null).
  EXPECT_NO_THROW(CheckOutputPaths({}, {{"--metrics", fifo}}));
  const std::string link = (dir_ / "link").string();
  fs::create_symlink(fifo, link);
  EXPECT_NO_THROW(CheckReplaceable("--save", link));
  EXPECT_NO_THROW(CheckReplaceable("--save", Write("plain.txt", "x")));
  EXPECT_NO_THROW(CheckReplaceable("--save", (dir_ / "missing").string()));
}

TEST_F(Files, WriteFileAtomicReplacesWholeAndLeavesNoTemporary) {
  const std::string path = Write("out.json", "old");
  WriteFileAtomic("trace", path, "new content\n");
  EXPECT_EQ(ReadWholeFile("trace", path), "new content\n");
  // Only the file itself is left: the temporary was renamed over it.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  // A temporary a killed writer left behind (no process has pid 999999999) is removed.
  Write("out.json.tmp-999999999", "torn");
  WriteFileAtomic("trace", path, "again");
  EXPECT_FALSE(fs::exists(dir_ / "out.json.tmp-999999999"));
}

TEST_F(Files, WriteFileAtomicFailsNamingThePathAndKeepsNothingTorn) {
  const std::string missing = (dir_ / "gone" / "r.html").string();
  EXPECT_THAT(
      ErrorOf<IoError>([&] { WriteFileAtomic("report", missing, "x"); }),
      HasSubstr("cannot save report '" + missing + "': cannot create '" + missing + ".tmp-"));
  // A device is written in place: /dev/full fails with its error, /dev/null takes the bytes.
  EXPECT_THAT(ErrorOf<IoError>([&] { WriteFileAtomic("trace", "/dev/full", "x"); }),
              HasSubstr("cannot save trace '/dev/full': write failed (No space left on device)"));
  EXPECT_NO_THROW(WriteFileAtomic("trace", "/dev/null", "x"));
}

// Regression: a link to a pipe with no reader was followed and written in place, which blocked
// for ever (BadInputCli.SaveNeverReplacesADeviceOrAPipe hung). The link itself is replaced.
TEST_F(Files, WriteFileAtomicReplacesALinkInsteadOfFollowingIt) {
  const std::string fifo = (dir_ / "fifo").string(), link = (dir_ / "link").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(fifo, link);
  WriteFileAtomic("trace", link, "x");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(link)));
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(ReadWholeFile("trace", link), "x");
}

}  // namespace
}  // namespace sluice
