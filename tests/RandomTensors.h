// Random tensors and weights for tests and the cell fuzzer (no test framework needed).
#pragma once

#include "ir/Cell.h"
#include "runtime/data/SafeTensors.h"

#include <cmath>
#include <random>

namespace rnnc::test {

// Uniform in [-bound, bound].
inline Tensor randomTensor(TensorShape shape, std::mt19937& rng, float bound = 0.4f) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  Tensor t(std::move(shape));
  for (float& v : t.values())
    v = dist(rng);
  return t;
}

// Random values for every parameter of `cell` at `sizes`. Matrices are scaled by
// 1/sqrt(fan-in), as PyTorch initialises them, so activations stay of order one at every size.
inline TensorMap randomWeights(const ir::Cell& cell, const ir::SizeMap& sizes, std::mt19937& rng) {
  TensorMap weights;
  for (const auto& p : cell.params) {
    TensorShape shape;
    for (const ir::Dim& d : p->shape)
      shape.push_back(*d.evaluate(sizes));
    float bound = shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(shape[1])) : 0.4f;
    weights[p->name] = randomTensor(shape, rng, bound);
  }
  return weights;
}

// The same in the cell's parameter order, as CompiledCell and the interpreter take them.
inline std::vector<Tensor> randomParams(const ir::Cell& cell, const ir::SizeMap& sizes,
                                        std::mt19937& rng) {
  TensorMap weights = randomWeights(cell, sizes, rng);
  std::vector<Tensor> params;
  for (const auto& p : cell.params)
    params.push_back(weights.at(p->name));
  return params;
}

} // namespace rnnc::test
