// Whole-file reads (ir/FileIO.h) refuse what never ends or cannot fit, naming the file: issue 18
// found `--input /dev/zero` ending in an unnamed std::bad_alloc.
#include "ir/Error.h"
#include "ir/FileIO.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rnnc {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string errorOf(const std::string& path) {
  try {
    readFileBytes(path);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

class FileIOTest : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("rnnc_file_io_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    unsetenv("RNNC_MAX_FILE_BYTES");
    fs::remove_all(dir_);
  }
  // `bytes` bytes, byte i being i * step + first, written to `name` in the scratch directory.
  std::string writePatterned(const std::string& name, size_t bytes, int step, int first) const {
    std::string contents(bytes, '\0');
    for (size_t i = 0; i < contents.size(); ++i)
      contents[i] = static_cast<char>(static_cast<int>(i) * step + first);
    std::ofstream(dir_ / name, std::ios::binary) << contents;
    return contents;
  }
  fs::path dir_;
};

TEST_F(FileIOTest, ReadsARegularFileWhole) {
  std::ofstream(dir_ / "a.txt") << "hello";
  EXPECT_EQ(readFileBytes((dir_ / "a.txt").string()), "hello");
}

// mapFileBytes views a regular file's pages and reads a pipe whole: the same bytes either way,
// and the same errors as readFileBytes.
TEST_F(FileIOTest, MappedBytesAreTheFilesForFilesAndPipes) {
  const std::string contents = writePatterned("a.bin", 3 * 4096 + 17, 7, 3);
  std::ofstream(dir_ / "empty.bin", std::ios::binary);
  FileBytes mapped = mapFileBytes((dir_ / "a.bin").string());
  FileBytes moved = std::move(mapped); // the view survives a move
  EXPECT_EQ(moved.view(), contents);
  EXPECT_EQ(mapFileBytes((dir_ / "empty.bin").string()).view(), "");
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << contents; });
  FileBytes piped = mapFileBytes(fifo.string());
  writer.join();
  FileBytes pipedMoved = std::move(piped);
  EXPECT_EQ(pipedMoved.view(), contents);
  EXPECT_THROW(mapFileBytes("/dev/zero"), UserError);
  EXPECT_THROW(mapFileBytes(dir_.string()), UserError);
  EXPECT_THROW(mapFileBytes((dir_ / "absent").string()), UserError);
}

// A file of 256 KB or more is read into huge pages rather than mapped: the same bytes, at every
// offset (a size that is not a whole number of pages, nor of 2 MB pages), after a move, and it
// stays readable after the file is gone (the copy is private).
TEST_F(FileIOTest, LargeFilesAreReadWholeIntoMemoryOfTheirOwn) {
  for (size_t size : {size_t{256} << 10, (size_t{2} << 20) + 4096 * 3 + 5}) {
    std::string contents(size, '\0');
    for (size_t i = 0; i < contents.size(); ++i)
      contents[i] = static_cast<char>(i * 131 + i / 4096);
    std::ofstream(dir_ / "large.bin", std::ios::binary) << contents;
    FileBytes read = mapFileBytes((dir_ / "large.bin").string());
    fs::remove(dir_ / "large.bin");
    FileBytes moved = std::move(read);
    ASSERT_EQ(moved.view().size(), size);
    EXPECT_TRUE(moved.view() == contents) << size << " bytes";
  }
}

// A file mapped privately holds the file's bytes, and what is written to it stays in this
// process; a file cut short since it was opened, and an empty one, are not mapped (their pages
// would fault). A host whose mapped pages are slow to touch maps nothing either.
TEST_F(FileIOTest, APrivateMappingHoldsTheFileAndKeepsItsWritesAndACutFileIsNotMapped) {
  const std::string contents = writePatterned("mapped.bin", 3 * 4096 + 100, 7, 3);
  const fs::path file = dir_ / "mapped.bin";
  {
    std::unique_ptr<PositionalFile> opened = PositionalFile::open(file.string());
    ASSERT_TRUE(opened);
    std::shared_ptr<const FileMapping> mapping = opened->mapPrivately();
    if (mapping) {
      ASSERT_EQ(mapping->size(), contents.size());
      EXPECT_EQ(std::string(mapping->data(), mapping->size()), contents);
      std::fill(mapping->data(), mapping->data() + mapping->size(), 'x');
      EXPECT_EQ(readFileBytes(file.string()), contents) << "a private mapping's writes";
    } else {
      std::cout << "note: mapped pages are slow to touch on this host: nothing mapped\n";
    }
  }
  std::unique_ptr<PositionalFile> opened = PositionalFile::open(file.string());
  ASSERT_TRUE(opened);
  fs::resize_file(file, 100); // cut past its first page since opened
  EXPECT_FALSE(opened->mapPrivately());
  std::ofstream(dir_ / "empty.bin", std::ios::binary);
  EXPECT_FALSE(PositionalFile::open((dir_ / "empty.bin").string())->mapPrivately());
}

// PositionalFile reads any range of a regular file into the caller's memory; a range past the
// end (the file cut short since it was opened) is an error naming the file. Pipes are not
// positional: open() says so with nothing, for the caller to read them whole.
TEST_F(FileIOTest, APositionalFileReadsRangesAndNamesAFileCutShort) {
  const std::string contents = writePatterned("a.bin", 5000, 13, 1);
  const fs::path file = dir_ / "a.bin";
  std::unique_ptr<PositionalFile> opened = PositionalFile::open(file.string());
  ASSERT_TRUE(opened);
  EXPECT_EQ(opened->size(), contents.size());
  std::string range(4000, '\0');
  opened->read(999, range.data(), range.size());
  EXPECT_EQ(range, contents.substr(999, 4000));
  fs::resize_file(file, 100);
  try {
    opened->read(50, range.data(), 60);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("a.bin: the file ended at byte 100, before the 5000 bytes"));
  }
  // Anything but a regular file is left unopened, for the whole-file readers: a named pipe
  // opened and closed here would cut its writer off.
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_FALSE(PositionalFile::open(fifo.string())); // no writer: opening it would block
  EXPECT_FALSE(PositionalFile::open("/dev/zero"));
  EXPECT_FALSE(PositionalFile::open(dir_.string()));
  EXPECT_THROW(PositionalFile::open((dir_ / "absent").string()), UserError);
}

// writeFileBytes rewrites a file in place and cuts it to what it wrote: a longer file it replaces
// keeps none of its tail; a pipe gets the bytes too.
TEST_F(FileIOTest, AWriteReplacesALongerFileExactly) {
  const fs::path file = dir_ / "out.bin";
  std::ofstream(file, std::ios::binary) << std::string(10000, 'z');
  writeFileBytes(file.string(), {"head", "", "tail"});
  EXPECT_EQ(readFileBytes(file.string()), "headtail");
  writeFileBytes(file.string(), {std::string(6000, 'a')});
  EXPECT_EQ(readFileBytes(file.string()), std::string(6000, 'a'));
  writeFileBytes((dir_ / "new.bin").string(), {"fresh"});
  EXPECT_EQ(readFileBytes((dir_ / "new.bin").string()), "fresh");
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string piped;
  std::thread reader([&] { piped = readFileBytes(fifo.string()); });
  writeFileBytes(fifo.string(), {"through ", "a pipe"});
  reader.join();
  EXPECT_EQ(piped, "through a pipe");
  EXPECT_THAT(
      [&] {
        try {
          writeFileBytes((dir_ / "absent" / "x.bin").string(), {"x"});
        } catch (const UserError& e) {
          return std::string(e.what());
        }
        return std::string("no error");
      }(),
      HasSubstr("x.bin: cannot open file for writing: No such file or directory"));
}

// A write that fails part way (here past a file size limit: EFBIG) is an error naming the file,
// and the file is cut where the writing stopped: not the new bytes followed by the old file's
// tail, which would look complete.
TEST_F(FileIOTest, AFailedWriteLeavesNoTailOfTheOldFile) {
  const fs::path file = dir_ / "out.bin";
  std::ofstream(file, std::ios::binary) << std::string(300, 'o');
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &previous);
  struct rlimit limit {
  }, saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  limit = saved;
  limit.rlim_cur = 100;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string message = "no error";
  try {
    writeFileBytes(file.string(), {std::string(40, 'a'), std::string(200, 'b')});
  } catch (const UserError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  sigaction(SIGXFSZ, &previous, nullptr);
  EXPECT_THAT(message, HasSubstr("out.bin: cannot write file: File too large"));
  EXPECT_EQ(readFileBytes(file.string()), std::string(40, 'a') + std::string(60, 'b'));
}

TEST_F(FileIOTest, DevicesAndDirectoriesAreRefusedByName) {
  EXPECT_THAT(errorOf("/dev/zero"), HasSubstr("/dev/zero: cannot read file: not a regular file"));
  EXPECT_THAT(errorOf(dir_.string()), HasSubstr("cannot read file: Is a directory"));
  EXPECT_THAT(errorOf((dir_ / "absent").string()), HasSubstr("absent: cannot open file"));
}

TEST_F(FileIOTest, FilesAndPipesPastTheLimitAreRefused) {
  setenv("RNNC_MAX_FILE_BYTES", "10", 1);
  std::ofstream(dir_ / "big.txt") << "eleven char";
  EXPECT_THAT(errorOf((dir_ / "big.txt").string()),
              HasSubstr("big.txt: the file is larger than 10 bytes"));
  // A pipe whose writer never stops is read up to the limit, then refused (the writer then meets
  // a closed pipe: EPIPE, not the signal that would end the test binary).
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &previous);
  const fs::path fifo = dir_ / "endless";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    std::ofstream out(fifo);
    for (int i = 0; i < 100000 && out; ++i)
      out << "0123456789";
  });
  EXPECT_THAT(errorOf(fifo.string()), HasSubstr("larger than 10 bytes"));
  writer.join();
  sigaction(SIGPIPE, &previous, nullptr);
  setenv("RNNC_MAX_FILE_BYTES", "ten", 1);
  EXPECT_THROW(maxFileBytes(), UserError);
}

} // namespace
} // namespace rnnc
