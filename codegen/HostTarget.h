// What LLVM sees of the machine it generates code for: the target triple, the CPU name and its
// features. The JIT compiles for exactly this, and the compile cache keys on it.
#pragma once

#include <string>
#include <vector>

namespace rnnc::codegen {

struct HostTarget {
  std::string triple;                // x86_64-pc-linux-gnu
  std::string cpu;                   // rocketlake
  std::vector<std::string> features; // enabled features, sorted: avx2, avx512f, fma, ...
  bool has(const std::string& feature) const;
};

HostTarget detectHostTarget();
// An x86-64 CPU by LLVM's name for it (skylake-avx512, znver4, x86-64-v3...), with the features
// LLVM gives it: for reading the code generated for a machine other than this one. Throws
// UserError, listing the names LLVM knows, for any other name.
HostTarget namedX86Target(const std::string& cpu);
std::string llvmVersion();
// rnnc's version, the code generator's digest and LLVM's version: how every cache key begins.
std::string codeGeneratorVersion();

} // namespace rnnc::codegen
