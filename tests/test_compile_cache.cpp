// The compile cache: hits from memory and disk, and corrupt, truncated, stale or concurrently
// written entries detected and recompiled, never trusted.
#include "frontend/BuiltinCells.h"
#include "runtime/CompileCache.h"
#include "runtime/CompiledCell.h"
#include "ir/FileIO.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

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
        found.push_back(e.path());
    return found;
  }

  // Runs a compiled GRU on fixed data, so results of differently obtained code can be compared.
  static std::vector<float> runIt(const CompiledCell& compiled) {
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

TEST_F(CompileCacheTest, DifferentSizesAreDifferentEntries) {
  CompiledCell::compile(*cell_, options());
  auto other = frontend::loadCell("gru");
  other->bindSizes({{"input_size", 3}, {"hidden_size", 6}});
  EXPECT_EQ(CompiledCell::compile(*other, options())->source(), CodeSource::Compiled);
  EXPECT_EQ(entries().size(), 2u);
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
  std::vector<std::vector<float>> results(4);
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] { results[i] = runIt(*CompiledCell::compile(*cell_, options())); });
  for (auto& t : threads)
    t.join();
  for (const auto& r : results)
    EXPECT_EQ(r, reference);
  ASSERT_EQ(entries().size(), 1u) << "temporary files were left behind";
  EXPECT_EQ(CompiledCell::compile(*cell_, options())->source(), CodeSource::DiskCache);
}

TEST(CompileCacheKey, DigestIsStableAndSpreads) {
  EXPECT_EQ(digest("abc"), digest("abc"));
  EXPECT_NE(digest("abc"), digest("abd"));
  EXPECT_EQ(digest("").size(), 32u);
}

} // namespace
