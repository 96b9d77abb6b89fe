#include "codegen/Target.h"

#include "codegen/HostTarget.h"
#include "ir/Error.h"

#include <algorithm>

#include <unistd.h>

namespace rnnc::codegen {

std::string Target::describe() const {
  return triple + " " + cpu + " w" + std::to_string(vectorWidth) + " r" +
         std::to_string(vectorRegisters) + " i" + std::to_string(interleavedVectors) +
         " l2=" + std::to_string(l2Bytes) + " " + features + (tensorCores ? " tensor-cores" : "");
}

bool Target::has(const std::string& feature) const {
  const std::string wanted = "+" + feature;
  for (size_t at = features.find(wanted); at != std::string::npos;
       at = features.find(wanted, at + 1)) {
    const size_t end = at + wanted.size();
    if (end == features.size() || features[end] == ',')
      return true;
  }
  return false;
}

bool Target::pairsBf16Products() const {
  return vectorWidth == 16 && has("avx512bf16") && cpu.rfind("znver", 0) == 0;
}

bool Target::widensFp16BesideFmas() const {
  return cpu.rfind("znver", 0) == 0;
}

bool HostTarget::has(const std::string& feature) const {
  return std::binary_search(features.begin(), features.end(), feature);
}

Target targetFor(const HostTarget& host) {
  Target target;
  target.triple = host.triple;
  target.cpu = host.cpu;
  for (const auto& feature : host.features)
    target.features += (target.features.empty() ? "+" : ",+") + feature;
  target.vectorWidth = host.has("avx512f") ? 16 : host.has("avx") ? 8 : 4;
  target.vectorRegisters = host.has("avx512f") ? 32 : 16;
  // 32 floats per iteration either way: four ymm or two zmm. Four zmm (64 floats) were twice
  // the code LLVM compiles for every elementwise kernel (a layer-norm LSTM's time loop: 25 ->
  // 17 ms of back end) for no speed: Zen 4, alternating runs, 1 thread, rnn_eltwise 48.5 ->
  // 45.0 us, LayerNorm-LSTM at B=64 262 -> 259 ms and at B=1 6.47 -> 6.44, LSTM and GRU
  // forward + backward 771 vs 775 and 588 vs 587 ms (minima).
  target.interleavedVectors = target.vectorWidth >= 16 ? 2 : 4;
  return target;
}

Target withHostCaches(Target target) {
  static const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE); // CPUID too, once
  if (l2 >= 128 * 1024) // 0 or -1 where the OS does not say; a smaller figure is not an L2
    target.l2Bytes = l2;
  return target;
}

Target gpuTarget(const std::string& sm, bool tensorCores) {
  // The PTX ISA each needs at least (PTX 7.0 introduced sm_80, 7.8 sm_90); 7.8 for both, which
  // every CUDA 12 and 13 driver loads.
  if (sm != "sm_80" && sm != "sm_90")
    throw UserError("unknown GPU '" + sm + "': rnnc generates PTX for sm_80 and sm_90");
  Target target;
  target.triple = "nvptx64-nvidia-cuda";
  target.cpu = sm;
  target.features = "+ptx78";
  target.vectorWidth = 1;
  target.vectorRegisters = 255; // per thread; not a tile budget on a GPU
  target.interleavedVectors = 1;
  target.tensorCores = tensorCores;
  return target;
}

} // namespace rnnc::codegen
