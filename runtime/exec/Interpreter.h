// The reference interpreter: executes a cell's IR op by op with Eigen, materialising every
// intermediate tensor. It is the unfused baseline that `rnnc bench` compares against and the
// oracle for every faster path, so it favours clarity over speed.
#pragma once

#include "codegen/WeightType.h"
#include "ir/Cell.h"
#include "runtime/data/Tensor.h"

#include <cstdint>
#include <vector>

namespace rnnc {

struct ExecutionOptions {
  bool training = false; // dropout is active only in training
  uint64_t seed = 0;     // dropout masks are a pure function of (seed, op, row, column)
  // Matrix products multiply their operands rounded to bf16 (to nearest even, by Eigen), and sum
  // in fp32: what the generated code computes with bf16 weights (codegen/Bf16Products.cpp).
  bool bf16Products = false;
  // Matrix products multiply by their weights rounded to fp16 (to nearest even, by Eigen): what
  // the generated code computes with fp16 weights. The weight a product reads, a parameter or
  // one made of parameters (which the JIT packs, and so rounds, as made).
  bool f16Weights = false;
  // Matrix products with their weights (parameters, or made of parameters) quantized as int8
  // weights are, their inputs per row, summed exactly: what the generated code computes with
  // int8 weights (runtime/exec/Int8Reference.h).
  bool int8Products = false;
};

// `options` with the products the generated code computes with its weights stored as `weights`
// (fp32: exact products): the interpreter as the reference of reduced-precision weights.
ExecutionOptions withProductsAs(codegen::WeightType weights, ExecutionOptions options = {});
// UserError where reduced weights would change nothing in `cell`: no linear or matmul has
// weights known before the loop (a parameter, or made of parameters), as the JIT refuses.
void checkReducedWeightsChangeSomething(const ir::Cell& cell, codegen::WeightType weights);

// One instruction whose operands have no batch dimension (values made of a cell's parameters
// alone), evaluated as the interpreter evaluates it in inference; `sizes` binds the cell's.
Tensor evaluateUnbatched(const ir::Instr& instr, const std::vector<const Tensor*>& operands,
                         const ir::SizeMap& sizes);

class Interpreter {
public:
  // `cell` must have all its sizes bound and outlive the interpreter. `params` follow
  // cell.params' order and shapes.
  Interpreter(const ir::Cell& cell, std::vector<Tensor> params, ExecutionOptions options = {});

  // Runs the whole sequence: `inputs` holds one [T, B, F] tensor per cell input (cell order),
  // `states` one [B, F] tensor per state (cell order), overwritten with the final states.
  // Returns the per-step outputs, [T, B, H]. `firstRow`: the dropout masks' row index of the
  // first step's first row (a stretch of a packed batch starts past the rows before it).
  Tensor run(const std::vector<Tensor>& inputs, std::vector<Tensor>& states,
             int64_t firstRow = 0) const;

private:
  const ir::Cell& cell_;
  std::vector<Tensor> params_;
  ExecutionOptions options_;
};

} // namespace rnnc
