// The x86-64 CPUs whose generated code the tests run on this host: AVX2 (haswell) everywhere,
// AVX-512 (skylake-avx512) where the host has it.
#pragma once

#include "codegen/HostTarget.h"

#include <string>
#include <vector>

namespace rnnc::test {

inline std::vector<std::string> runnableCpus() {
  std::vector<std::string> cpus = {"haswell"};
  if (codegen::detectHostTarget().has("avx512f"))
    cpus.push_back("skylake-avx512");
  return cpus;
}

} // namespace rnnc::test
