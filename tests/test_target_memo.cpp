// The JIT's target remembered in the disk cache (runtime/exec/TargetMemo.h), against LLVM's own
// answer (codegen::runnableTarget, through the compiler library): the same target from a fresh
// entry, from a stored one, and after an entry that is not a target; a CPU signature that does not
// depend on the core it is read on.
#include "codegen/HostTarget.h"
#include "runtime/exec/CompileCache.h"
#include "runtime/exec/TargetMemo.h"
#include "tests/TestSupport.h"

#include <gtest/gtest.h>

#include <sched.h>
#include <thread>

using namespace rnnc;

namespace {

class TargetMemoTest : public test::ScratchDirTest {
protected:
  CacheOptions cache() const {
    CacheOptions o;
    o.disk = true;
    o.directory = (dir_ / "cache").string();
    return o;
  }
};

void expectSameTarget(const codegen::Target& a, const codegen::Target& b) {
  EXPECT_EQ(a.describe(), b.describe());
  EXPECT_EQ(a.triple, b.triple);
  EXPECT_EQ(a.cpu, b.cpu);
  EXPECT_EQ(a.features, b.features);
}

TEST_F(TargetMemoTest, RemembersWhatLlvmSaysForTheHostAndANamedCpu) {
  for (const std::string cpu : {"", "x86-64"}) {
    SCOPED_TRACE("cpu '" + cpu + "'");
    const codegen::Target llvm = codegen::runnableTarget(cpu);
    DiskCache disk(cache().directory, DiskCache::Holds::Targets);
    EXPECT_FALSE(disk.load(targetMemoKey(cpu)));
    expectSameTarget(rememberedTarget(cpu, cache()), llvm); // asked LLVM, stored it
    ASSERT_TRUE(disk.load(targetMemoKey(cpu)));
    expectSameTarget(*parseTargetText(*disk.load(targetMemoKey(cpu))), llvm);
    expectSameTarget(rememberedTarget(cpu, cache()), llvm); // from the entry
  }
}

TEST_F(TargetMemoTest, AnEntryThatIsNotATargetIsReplaced) {
  DiskCache disk(cache().directory, DiskCache::Holds::Targets);
  disk.store(targetMemoKey(""), "triple x86_64\ncpu\n");
  const codegen::Target llvm = codegen::runnableTarget("");
  expectSameTarget(rememberedTarget("", cache()), llvm);
  expectSameTarget(*parseTargetText(*disk.load(targetMemoKey(""))), llvm);
}

TEST(TargetText, RoundTripsAndRejectsWhatIsNotATarget) {
  codegen::Target t;
  t.triple = "x86_64-pc-linux-gnu";
  t.cpu = "znver4";
  t.features = "+avx2,+avx512f,+fma";
  t.vectorWidth = 16;
  t.vectorRegisters = 32;
  t.interleavedVectors = 4;
  t.l2Bytes = 1 << 20;
  expectSameTarget(*parseTargetText(targetText(t)), t);
  EXPECT_EQ(parseTargetText(targetText(t))->l2Bytes, 1 << 20);
  EXPECT_FALSE(parseTargetText(""));
  EXPECT_FALSE(parseTargetText("garbage"));
  std::string noWidth = targetText(t);
  noWidth.replace(noWidth.find("vectorWidth 16"), 14, "vectorWidth x");
  EXPECT_FALSE(parseTargetText(noWidth));
  EXPECT_FALSE(parseTargetText(targetText(t) + "extra 1\n"));
}

// The key must not change with the core a process happens to run on (CPUID's leaf 1 carries the
// core's APIC ID): read on every core this process may use, one thread pinned to each.
TEST(CpuSignature, IsTheSameOnEveryCore) {
  const std::string here = cpuSignature();
  EXPECT_FALSE(here.empty());
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  for (int core = 0; core < CPU_SETSIZE; ++core) {
    if (!CPU_ISSET(core, &allowed))
      continue;
    std::string there;
    std::thread pinned([&] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(core, &one);
      if (sched_setaffinity(0, sizeof(one), &one) == 0)
        there = cpuSignature();
      else
        there = here; // not allowed after all: nothing to compare
    });
    pinned.join();
    EXPECT_EQ(there, here) << "core " << core;
  }
}

} // namespace
