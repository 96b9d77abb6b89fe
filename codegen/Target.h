// What differs between targets, behind one small interface so that the emitter does not change
// when a target is added (Halide's CodeGen_PTX_Dev overrides only what differs): the triple, the
// CPU and its features, the float vector width the kernels use.
#pragma once

#include <cstdint>
#include <string>

namespace rnnc::codegen {

struct HostTarget;

struct Target {
  std::string triple;
  std::string cpu;
  std::string features;     // LLVM feature string: "+avx2,+fma,..."
  int vectorWidth = 4;      // floats per vector in generated kernels
  int vectorRegisters = 16; // architectural vector registers (32 with AVX-512)
  // Vectors an elementwise loop computes per iteration, as one wider LLVM vector that the
  // backend splits into interleaved native ones. A sigmoid is a chain of some 40 cycles of
  // latency; with one vector per iteration the reorder window cannot overlap enough
  // iterations to keep the FMA pipes busy (rnn_eltwise ran at 2x the time). targetFor: 32
  // floats, four ymm or two zmm.
  int interleavedVectors = 4;
  // The L2 cache of one core, in bytes: what a matrix product over many rows keeps its chunk of
  // input rows in while every block of the packed weights passes over them. The host's is read
  // from the OS; a CPU named for another machine gets the smallest of the x86-64 cores we run on
  // (Zen 3's 512 KB).
  int64_t l2Bytes = 512 * 1024;
  // A GPU: the block tiles' matrix products on the tensor cores (PackedProduct::tensorCores),
  // where their tiles allow; else in fp32 FMAs.
  bool tensorCores = false;

  std::string describe() const;               // for cache keys and `rnnc version`
  bool has(const std::string& feature) const; // "f16c": in `features` as "+f16c"
  // bf16 products by vdpbf16ps (two products per lane where an FMA does one) where it is the
  // faster: AVX512_BF16 on AMD's cores (LLVM's znver4, znver5, ...), where it issues as fast as
  // an FMA. Intel's (Cooper Lake to Granite Rapids) issues one vdpbf16ps per ~4 FMAs, half the
  // products of the FMAs: an Intel Xeon of family 6 model 207 (AVX512_BF16) ran 1.3 G vdpbf16ps
  // against 5.4 G FMAs a second, and an LSTM's bf16 weights ran at 0.54x the fp32 speed paired
  // against 0.86x widened to fp32 in registers. There bf16 weights are widened.
  bool pairsBf16Products() const;
  // fp16 weights widened by vcvtph2ps on pipes beside the FMAs': AMD's cores (LLVM's znver*),
  // where a step's fp16 tiles beat fp32 ones read from L2 even where those fit (Zen 5, batch 1,
  // fp32 W_hh in half of L2, 1 thread: tanh RNN I = H = 256 1.26x, GRU 192 1.10x, LSTM 160
  // 1.21x; Zen 4 widens 44.8 G weights/s in ymm against fp32's 23.8 from L2). Intel's cores
  // issue it on the FMA ports, where fp16 tiles ran 0.81-0.88x fp32 (a Xeon, family 6 model
  // 207): there such a step's weights are widened once, at packing (PackedProduct::widenedFrom).
  bool widensFp16BesideFmas() const;
  // An NVIDIA GPU (nvptx64-nvidia-cuda, `cpu` its compute capability: sm_80, sm_90): the cell
  // is lowered to grid kernels (codegen/GpuEmitter.h), not to one run function.
  bool isGpu() const { return triple.rfind("nvptx", 0) == 0; }
};

// An NVIDIA GPU by its compute capability as LLVM's NVPTX back end names it: sm_80 (Ampere) or
// sm_90 (Hopper); UserError for another. Each GPU thread computes scalars (one lane per thread
// where a CPU has a vector), so the vector width is 1.
Target gpuTarget(const std::string& sm, bool tensorCores = true);

// A target from LLVM's view of a CPU (HostTarget.h): AVX-512 gives 16-float vectors, AVX 8,
// else 4; and `target` with this machine's cache sizes, where the OS gives them.
Target targetFor(const HostTarget& cpu);
Target withHostCaches(Target target);

// The machine we run on, as LLVM sees it (targetFor its CPU, with its caches).
Target hostTarget();
// An x86-64 CPU by LLVM's name (`rnnc compile --target-cpu`); UserError for an unknown one.
Target namedCpuTarget(const std::string& cpu);
// Code for a named CPU that is to run on this machine (`rnnc bench --target-cpu haswell` times
// the AVX2 kernels on an AVX-512 host): the CPU's instruction set with the host's caches; an
// empty name is the host itself. UserError when the host lacks a vector extension of the CPU.
Target runnableTarget(const std::string& cpu);

} // namespace rnnc::codegen
