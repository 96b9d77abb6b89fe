#include "runtime/exec/TargetMemo.h"

#include "codegen/HostTarget.h"
#include "runtime/threads/ForkSafety.h"

#include <fmt/format.h>

#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include <cpuid.h>

namespace rnnc {

std::string cpuSignature() {
  std::string text;
  // Every leaf asked once: __get_cpuid_count asks the highest leaf again for every leaf, and in
  // a VM each CPUID is an exit to the hypervisor (7 us on a Zen 5 VM, where the signature took
  // 28 of them, 0.2 ms of every rnnc process; now 12 to 15).
  std::array<unsigned, 4> highest{}, highestExtendedLeaf{};
  __cpuid(0, highest[0], highest[1], highest[2], highest[3]);
  __cpuid(0x80000000u, highestExtendedLeaf[0], highestExtendedLeaf[1], highestExtendedLeaf[2],
          highestExtendedLeaf[3]);
  const unsigned highestBasic = highest[0], highestExtended = highestExtendedLeaf[0];
  auto record = [&](unsigned number, unsigned sub, std::array<unsigned, 4> r, unsigned keepB) {
    text +=
        fmt::format("{:x}.{:x}:{:x},{:x},{:x},{:x};", number, sub, r[0], r[1] & keepB, r[2], r[3]);
    return r;
  };
  auto leaf = [&](unsigned number, unsigned sub, unsigned keepB = ~0u) {
    std::array<unsigned, 4> r{};
    if (number > (number & 0x80000000u ? highestExtended : highestBasic))
      return r;
    __cpuid_count(number, sub, r[0], r[1], r[2], r[3]);
    return record(number, sub, r, keepB);
  };
  record(0, 0, highest, ~0u);              // vendor, highest leaf
  const auto basic = leaf(1, 0, 0xffffff); // family, model, stepping, features; no APIC ID
  for (unsigned sub : {0u, 1u})
    leaf(7, sub); // AVX2, AVX-512, AMX, AVX-VNNI...
  leaf(0xd, 1);   // XSAVE features
  leaf(0x14, 0);
  leaf(0x19, 0);
  leaf(0x24, 0); // AVX10
  record(0x80000000u, 0, highestExtendedLeaf, ~0u);
  for (unsigned number : {0x80000001u, 0x80000002u, 0x80000003u, 0x80000004u, 0x80000008u})
    leaf(number, 0);
  if (basic[2] & (1u << 27)) { // OSXSAVE: which register states the OS saves (AVX, AVX-512)
    unsigned low = 0, high = 0;
    __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    text += fmt::format("xcr0:{:x},{:x}", low, high);
  }
  return text;
}

std::string targetText(const codegen::Target& target) {
  return fmt::format("triple {}\ncpu {}\nfeatures {}\nvectorWidth {}\nvectorRegisters {}\n"
                     "interleavedVectors {}\nl2Bytes {}\n",
                     target.triple, target.cpu, target.features, target.vectorWidth,
                     target.vectorRegisters, target.interleavedVectors, target.l2Bytes);
}

std::optional<codegen::Target> parseTargetText(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t space = line.find(' ');
    if (space == std::string::npos)
      return std::nullopt;
    fields[line.substr(0, space)] = line.substr(space + 1);
  }
  codegen::Target target;
  try {
    target.triple = fields.at("triple");
    target.cpu = fields.at("cpu");
    target.features = fields.at("features");
    target.vectorWidth = std::stoi(fields.at("vectorWidth"));
    target.vectorRegisters = std::stoi(fields.at("vectorRegisters"));
    target.interleavedVectors = std::stoi(fields.at("interleavedVectors"));
    target.l2Bytes = std::stoll(fields.at("l2Bytes"));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (fields.size() != 7 || target.triple.empty() || target.cpu.empty() || target.vectorWidth < 1 ||
      target.vectorRegisters < 1 || target.interleavedVectors < 1 || target.l2Bytes < 1)
    return std::nullopt;
  return target;
}

std::string targetMemoKey(const std::string& cpu) {
  static const std::string signature = cpuSignature();
  return codegen::codeGeneratorVersion() + "\nhost-target " +
         (cpu.empty() ? std::string("host") : cpu) + "\ncpuid " + signature + "\n";
}

codegen::Target rememberedTarget(const std::string& cpu, const CacheOptions& cache) {
  const std::string key = targetMemoKey(cpu);
  std::optional<DiskCache> disk;
  if (cache.disk)
    disk.emplace(cache.directory, DiskCache::Holds::Targets);
  if (disk)
    if (std::optional<std::string> text = disk->load(key))
      if (std::optional<codegen::Target> target = parseTargetText(*text))
        return *target;
  codegen::Target target = codegen::runnableTarget(cpu); // LLVM's answer
  if (disk)
    disk->store(key, targetText(target));
  return target;
}

codegen::Target runnableTarget(const std::string& cpu, const CacheOptions& cache) {
  static std::mutex mutex;
  static std::map<std::string, codegen::Target> known; // this process's, by CPU name
  static const HeldAcrossFork forkHold(mutex);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(cpu); it != known.end())
    return it->second;
  return known.emplace(cpu, rememberedTarget(cpu, cache)).first->second;
}

} // namespace rnnc
