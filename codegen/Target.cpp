#include "codegen/Target.h"

#include "codegen/HostTarget.h"

namespace rnnc::codegen {

std::string Target::describe() const {
  return triple + " " + cpu + " w" + std::to_string(vectorWidth) + " r" +
         std::to_string(vectorRegisters) + " i" + std::to_string(interleavedVectors) + " " +
         features;
}

namespace {

Target targetFor(const HostTarget& host) {
  Target target;
  target.triple = host.triple;
  target.cpu = host.cpu;
  for (const auto& feature : host.features)
    target.features += (target.features.empty() ? "+" : ",+") + feature;
  target.vectorWidth = host.has("avx512f") ? 16 : host.has("avx") ? 8 : 4;
  target.vectorRegisters = host.has("avx512f") ? 32 : 16;
  return target;
}

} // namespace

Target hostTarget() {
  return targetFor(detectHostTarget());
}

Target namedCpuTarget(const std::string& cpu) {
  return targetFor(namedX86Target(cpu));
}

} // namespace rnnc::codegen
