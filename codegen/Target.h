// What differs between targets, behind one small interface so that the emitter does not change
// when a target is added (Halide's CodeGen_PTX_Dev overrides only what differs): the triple, the
// CPU and its features, the float vector width the kernels use.
#pragma once

#include <string>

namespace rnnc::codegen {

struct Target {
  std::string triple;
  std::string cpu;
  std::string features;     // LLVM feature string: "+avx2,+fma,..."
  int vectorWidth = 4;      // floats per vector in generated kernels
  int vectorRegisters = 16; // architectural vector registers (32 with AVX-512)

  std::string describe() const; // for cache keys and `rnnc version`
};

// The machine we run on, as LLVM sees it: AVX-512 gives 16-float vectors, AVX 8, else 4.
Target hostTarget();

} // namespace rnnc::codegen
