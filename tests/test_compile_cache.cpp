// The compile cache: hits from memory and disk, and corrupt, truncated, stale or concurrently
// written entries detected and recompiled, never trusted.
#include "frontend/BuiltinCells.h"
#include "ir/FileIO.h"
#include "runtime/exec/CompileCache.h"
#include "runtime/exec/CompiledCell.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace rnnc;

namespace {

class CompileCacheTest : public test::ScratchDirTest {
protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    directory_ = dir_ / "cache";
    cell_ = frontend::loadCell("gru");
    cell_->bindSizes({{"input_size", 3}, {"hidden_size", 5}});
  }

  CompileOptions options(bool memory = false) const {
    CompileOptions o;
    o.cache.disk = true;
    o.cache.directory = directory_.string();
    o.memoryCache = memory;
    return o;
  }

  std::vector<std::filesystem::path> entries() const {
    std::vector<std::filesystem::path> found;
    if (std::filesystem::exists(directory_))
      for (const auto& e : std::filesystem::directory_iterator(directory_))
        // Not the hit counts (rnnc cache stats) nor the host's target (TargetMemo.h).
        if (e.path().filename() != "stats" && e.path().extension() != ".target")
          found.push_back(e.path());
    return found;
  }

  // Runs a compiled GRU on fixed data, so results of differently obtained code can be compared.
  static TensorData runIt(const CompiledCell& compiled) {
    std::vector<Tensor> params = {Tensor({15, 3}, 0.1f), Tensor({15, 5}, -0.2f), Tensor({15}, 0.3f),
                                  Tensor({15}, 0.05f)};
    std::vector<Tensor> inputs = {Tensor({4, 2, 3}, 0.7f)};
    std::vector<Tensor> states = {Tensor({2, 5}, 0.25f)};
    return compiled.run(params, inputs, states).values();
  }

  std::filesystem::path directory_;
  std::unique_ptr<ir::Cell> cell_;
};

TEST_F(CompileCacheTest, SecondCompileComesFromDiskThenFromMemory) {
  auto first = CompiledCell::compile(*cell_, options());
  EXPECT_EQ(first->source(), CodeSource::Compiled);
  ASSERT_EQ(entries().size(), 1u);
  auto second = CompiledCell::compile(*cell_, options());
  EXPECT_EQ(second->source(), CodeSource::DiskCache);
  EXPECT_EQ(runIt(*second), runIt(*first));
  auto third = CompiledCell::compile(*cell_, options(/*memory=*/true));
  auto fourth = CompiledCell::compile(*cell_, options(/*memory=*/true));
  EXPECT_EQ(fourth->source(), CodeSource::MemoryCache);
  EXPECT_EQ(runIt(*fourth), runIt(*first));
}

// Code no cell holds any more stays in memory for a while: a program rebuilt for new weights
// (rnnc.nn after an optimiser step), whose predecessor went first so that its buffers serve it,
// finds its code there rather than loading it from the disk cache again; compileAll then starts
// no thread.
TEST_F(CompileCacheTest, CodeDroppedByEveryCellStaysInMemoryForTheNextBuild) {
  auto other = frontend::loadCell("gru");
  other->bindSizes({{"input_size", 3}, {"hidden_size", 11}});
  const TensorData expected = [&] {
    auto first = CompiledCell::compile(*cell_, options(/*memory=*/true));
    CompiledCell::compileAll({other.get()}, options(/*memory=*/true));
    return runIt(*first);
  }(); // every cell dropped
  auto again = CompiledCell::compile(*cell_, options(/*memory=*/true));
  EXPECT_EQ(again->source(), CodeSource::MemoryCache);
  EXPECT_EQ(runIt(*again), expected);
  auto both = CompiledCell::compileAll({cell_.get(), other.get()}, options(/*memory=*/true));
  EXPECT_EQ(both[0]->source(), CodeSource::MemoryCache);
  EXPECT_EQ(both[1]->source(), CodeSource::MemoryCache);
}

TEST_F(CompileCacheTest, DifferentSizesAreDifferentEntries) {
  CompiledCell::compile(*cell_, options());
  auto other = frontend::loadCell("gru");
  other->bindSizes({{"input_size", 3}, {"hidden_size", 6}});
  EXPECT_EQ(CompiledCell::compile(*other, options())->source(), CodeSource::Compiled);
  EXPECT_EQ(entries().size(), 2u);
}

// compileAll compiles the distinct cells side by side (one cache entry each, identical cells
// sharing one result) and gives each the code compile() would; a failure is rethrown.
TEST_F(CompileCacheTest, CompileAllCompilesEachDistinctCellOnce) {
  auto wider = frontend::loadCell("gru");
  wider->bindSizes({{"input_size", 3}, {"hidden_size", 6}});
  auto same = cell_->clone();
  auto all = CompiledCell::compileAll({cell_.get(), wider.get(), same.get()}, options());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(entries().size(), 2u);
  EXPECT_EQ(all[0], all[2]);
  EXPECT_NE(all[0], all[1]);
  EXPECT_EQ(ir::columnsOf(all[1]->optimisedCell().output), 6);
  EXPECT_EQ(runIt(*all[0]), runIt(*CompiledCell::compile(*cell_, options())));

  auto unbound = frontend::loadCell("gru"); // sizes not bound: compile() refuses it
  EXPECT_ANY_THROW(CompiledCell::compileAll({cell_.get(), unbound.get()}, options()));
}

TEST_F(CompileCacheTest, CorruptTruncatedAndStaleEntriesAreRecompiled) {
  auto reference = runIt(*CompiledCell::compile(*cell_, options()));
  ASSERT_EQ(entries().size(), 1u);
  std::filesystem::path entry = entries()[0];
  std::string good = readFileBytes(entry.string());

  std::string corrupt = good;
  corrupt[corrupt.size() / 2] ^= 0x5a;
  std::string truncated = good.substr(0, good.size() / 3);
  std::string empty;
  // A well-formed entry for another key at this path (a digest collision, or an old format).
  std::string stale = good;
  stale.replace(stale.find("codegen"), 7, "CODEGEN");
  for (const std::string* bad : {&corrupt, &truncated, &empty, &stale}) {
    writeFileBytes(entry.string(), {*bad});
    auto recompiled = CompiledCell::compile(*cell_, options());
    EXPECT_EQ(recompiled->source(), CodeSource::Compiled);
    EXPECT_EQ(runIt(*recompiled), reference);
    EXPECT_EQ(readFileBytes(entry.string()), good) << "the bad entry was not replaced";
  }
}

TEST_F(CompileCacheTest, DisabledCacheWritesNothing) {
  CompileOptions o = options();
  o.cache.disk = false;
  EXPECT_EQ(CompiledCell::compile(*cell_, o)->source(), CodeSource::Compiled);
  EXPECT_EQ(CompiledCell::compile(*cell_, o)->source(), CodeSource::Compiled);
  EXPECT_TRUE(entries().empty());
}

TEST_F(CompileCacheTest, ConcurrentWritersLeaveOneValidEntry) {
  auto reference = runIt(*CompiledCell::compile(*cell_, [&] {
    CompileOptions o = options();
    o.cache.disk = false;
    return o;
  }()));
  std::vector<std::thread> threads;
  std::vector<TensorData> results(4);
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] { results[i] = runIt(*CompiledCell::compile(*cell_, options())); });
  for (auto& t : threads)
    t.join();
  for (const auto& r : results)
    EXPECT_EQ(r, reference);
  ASSERT_EQ(entries().size(), 1u) << "temporary files were left behind";
  EXPECT_EQ(CompiledCell::compile(*cell_, options())->source(), CodeSource::DiskCache);
}

// ---- A cache that trusts nothing (issue 18) ---------------------------------------------------

// The key text stored in an entry (after the magic and the key's length).
std::string keyOf(const std::string& entry) {
  const size_t magic = std::string("RNNC-CACHE-2\n").size();
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(entry[magic + i])) << (8 * i);
  return entry.substr(magic + 8, length);
}

TEST_F(CompileCacheTest, ADirectoryOfAnotherUserIsNotUsed) {
  std::filesystem::create_directories(directory_);
  if (chown(directory_.c_str(), 65534, 65534) != 0)
    GTEST_SKIP() << "changing a directory's owner needs root";
  EXPECT_FALSE(DiskCache(directory_.string()).usable());
  EXPECT_NE(preparePrivateDirectory(directory_.string()).find("belongs to user id 65534"),
            std::string::npos);
  EXPECT_EQ(CompiledCell::compile(*cell_, options())->source(), CodeSource::Compiled);
  EXPECT_EQ(CompiledCell::compile(*cell_, options())->source(), CodeSource::Compiled);
  EXPECT_TRUE(entries().empty()) << "an entry was written into another user's directory";
}

TEST_F(CompileCacheTest, DirectoriesAreMadePrivateAndLinksRefused) {
  std::filesystem::create_directories(directory_);
  chmod(directory_.c_str(), 0777);
  CompiledCell::compile(*cell_, options());
  EXPECT_EQ(std::filesystem::status(directory_).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  std::filesystem::path link = dir_ / "link";
  std::filesystem::create_directory_symlink(directory_, link);
  EXPECT_NE(preparePrivateDirectory(link.string()).find("not a directory"), std::string::npos);
}

TEST_F(CompileCacheTest, NoDirectoryMeansNoDiskCacheNeverATemporaryOne) {
  const char* names[] = {"RNNC_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::optional<std::string>> saved;
  for (const char* name : names) {
    const char* value = std::getenv(name);
    saved.push_back(value ? std::optional<std::string>(value) : std::nullopt);
    unsetenv(name);
  }
  EXPECT_EQ(defaultCacheDirectory(), "");
  EXPECT_FALSE(DiskCache("").usable());
  for (size_t i = 0; i < saved.size(); ++i)
    if (saved[i])
      setenv(names[i], saved[i]->c_str(), 1);
}

// What sits at an entry's path and is no entry: a FIFO (once blocked forever), a link, a huge
// sparse file (once read whole), an entry of another key grafted under this one (once ran the
// other cell's code on this one's buffers), one whose digest does not match, one that is well
// formed but whose code does not load. Each is deleted and rebuilt, and never blocks.
TEST_F(CompileCacheTest, WhatIsNoEntryIsDeletedAndRebuilt) {
  auto reference = runIt(*CompiledCell::compile(*cell_, options()));
  ASSERT_EQ(entries().size(), 1u);
  const std::filesystem::path entry = entries()[0];
  const std::string good = readFileBytes(entry.string());
  const std::string key = keyOf(good);
  ASSERT_NE(key.find("LLVM"), std::string::npos);

  auto other = frontend::loadCell("gru");
  other->bindSizes({{"input_size", 3}, {"hidden_size", 7}});
  std::filesystem::path otherDir = dir_ / "other";
  CompileOptions o = options();
  o.cache.directory = otherDir.string();
  CompiledCell::compile(*other, o);
  std::string grafted;
  for (const auto& e : std::filesystem::directory_iterator(otherDir))
    if (e.path().extension() == ".o")
      grafted = readFileBytes(e.path().string());

  std::string forged = good;
  forged[forged.size() / 2] ^= 1;
  const std::string unloadable = encodeCacheEntry(key, "not an object file");
  std::vector<std::function<void()>> plant = {
      [&] { ASSERT_EQ(mkfifo(entry.c_str(), 0600), 0); },
      [&] { std::filesystem::create_symlink("/etc/passwd", entry); },
      [&] {
        writeFileBytes(entry.string(), {good});
        ASSERT_EQ(truncate(entry.c_str(), int64_t{6} << 30), 0); // 6 GB, sparse
      },
      [&] { writeFileBytes(entry.string(), {grafted}); },
      [&] { writeFileBytes(entry.string(), {forged}); },
      [&] { writeFileBytes(entry.string(), {unloadable}); },
  };
  for (size_t i = 0; i < plant.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    std::filesystem::remove(entry);
    plant[i]();
    auto recompiled = CompiledCell::compile(*cell_, options());
    EXPECT_EQ(recompiled->source(), CodeSource::Compiled);
    EXPECT_EQ(runIt(*recompiled), reference);
    EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(entry)));
    EXPECT_EQ(readFileBytes(entry.string()), good) << "the bad entry was not replaced";
  }
}

// A directory its owner made read-only (a shared image, a cache warmed once): its entries are
// used, nothing is written or deleted there, and compiling what is not there still works. Root
// writes anywhere, so as root the check runs in a child process as user nobody, which then owns
// the directory.
TEST_F(CompileCacheTest, AReadOnlyDirectoryIsUsedButNeverWritten) {
  auto reference = runIt(*CompiledCell::compile(*cell_, options()));
  ASSERT_EQ(entries().size(), 1u);
  const std::string entry = entries()[0].string();
  const std::string good = readFileBytes(entry);
  auto other = frontend::loadCell("gru");
  other->bindSizes({{"input_size", 3}, {"hidden_size", 7}});
  const bool root = geteuid() == 0;
  if (root &&
      (chown(directory_.c_str(), 65534, 65534) != 0 || chown(entry.c_str(), 65534, 65534) != 0))
    GTEST_SKIP() << "cannot hand the directory to user nobody";
  ASSERT_EQ(chmod(directory_.c_str(), 0500), 0);

  // Each failed check is one bit of the exit status: a child process cannot report through gtest.
  auto check = [&]() -> int {
    int failed = 0;
    auto cached = CompiledCell::compile(*cell_, options());
    if (cached->source() != CodeSource::DiskCache)
      failed |= 1;
    if (runIt(*cached) != reference)
      failed |= 2;
    if (CompiledCell::compile(*other, options())->source() != CodeSource::Compiled)
      failed |= 4;
    if (entries().size() != 1u || readFileBytes(entry) != good)
      failed |= 8;
    return failed;
  };
  int failed = 0;
  if (!root) {
    ASSERT_EQ(chmod(entry.c_str(), 0400), 0);
    try {
      failed = check();
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  } else {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0)
        _exit(64);
      try {
        _exit(check());
      } catch (...) {
        _exit(32);
      }
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "the child crashed";
    failed = WEXITSTATUS(status);
  }
  chmod(directory_.c_str(), 0700);
  EXPECT_FALSE(failed & 1) << "the entry was not loaded";
  EXPECT_FALSE(failed & 2) << "the loaded code gave other results";
  EXPECT_FALSE(failed & 4) << "a cell not in the cache did not compile";
  EXPECT_FALSE(failed & 8) << "the directory's contents changed";
  EXPECT_FALSE(failed & (16 | 32 | 64)) << "exit status " << failed;
}

TEST_F(CompileCacheTest, TheLeastRecentlyUsedEntriesGoPastTheSizeLimit) {
  CompiledCell::compile(*cell_, options());
  ASSERT_EQ(entries().size(), 1u);
  const auto oneEntry = static_cast<int64_t>(std::filesystem::file_size(entries()[0]));
  setenv("RNNC_CACHE_MAX_BYTES", std::to_string(oneEntry * 5 / 2).c_str(), 1);
  for (int hidden : {6, 7, 8, 9}) {
    auto other = frontend::loadCell("gru");
    other->bindSizes({{"input_size", 3}, {"hidden_size", hidden}});
    CompiledCell::compile(*other, options());
    CompiledCell::compile(*cell_, options()); // used again: kept
  }
  unsetenv("RNNC_CACHE_MAX_BYTES");
  EXPECT_LE(entries().size(), 2u);
  EXPECT_EQ(CompiledCell::compile(*cell_, options())->source(), CodeSource::DiskCache);
}

TEST(CompileCacheKey, DigestIsStableAndSpreads) {
  EXPECT_EQ(digest("abc"), digest("abc"));
  EXPECT_NE(digest("abc"), digest("abd"));
  EXPECT_EQ(digest("").size(), 64u); // SHA-256
  EXPECT_EQ(digest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

} // namespace
