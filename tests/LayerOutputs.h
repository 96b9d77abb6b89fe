// A PyTorch layer fixture (tests/fixtures/layers/NAME: its weights and input) run through the JIT
// (or the interpreter, which rounds as the JIT does) with its weights stored as `type`, from zero
// initial states: what the reduced-precision tests
// compare against the same layer in fp32.
#pragma once

#include "codegen/WeightType.h"
#include "frontend/BuiltinCells.h"
#include "runtime/data/Npy.h"
#include "runtime/data/SafeTensors.h"
#include "runtime/layers/LayerRunner.h"
#include "tests/TestSupport.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace rnnc::test {

inline Tensor fixtureLayerOutput(const std::string& cell, const std::string& fixture,
                                 codegen::WeightType type, Engine engine = Engine::Jit) {
  const std::string path = kLayerFixtures + fixture + "/";
  LayerOptions options;
  options.engine = engine;
  options.compile.cache.disk = false;
  options.compile.weights = type;
  return LayerProgram::build(*frontend::loadCell(cell),
                             readSafeTensors(path + "weights.safetensors"), "weights", options)
      ->run(readNpyFloat32(path + "input.npy"), {}, std::nullopt, {})
      .output;
}

// max |a - b| over the largest |b|: an error relative to the reference's range.
inline float relativeError(const Tensor& a, const Tensor& b) {
  float largest = 0;
  for (float v : b.values())
    largest = std::max(largest, std::fabs(v));
  return maxAbsDiff(a, b) / largest;
}

} // namespace rnnc::test
