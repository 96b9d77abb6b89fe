// One layer in one direction from a map of the cell's inputs: the tests' shorthand for the one
// driver (runtime/layers/LayerRunner.h), a layer stack of one layer. Inputs [T, B, F] by name (the
// first the layer's input, the others its side inputs), initial states [1, B, F] by name.
#pragma once

#include "ir/Error.h"
#include "runtime/layers/LayerRunner.h"

#include <map>
#include <memory>
#include <string>

namespace rnnc {

struct SequenceRequest {
  std::map<std::string, Tensor> inputs;        // cell input name -> [T, B, F]
  std::map<std::string, Tensor> initialStates; // cell state name -> [1, B, F]; absent = zeros
  const TensorMap* weights = nullptr;
  std::string weightsSource = "weights"; // file name for error messages
  ir::SizeMap sizes;                     // sizes given explicitly (--size)
  ExecutionOptions options;              // training and the dropout seed
  Engine engine = Engine::Jit;
  CompileOptions compile; // for the JIT
  int threads = 1;        // for the JIT: each step split between them
};

struct SequenceResult {
  Tensor output;                             // [T, B, H]
  std::map<std::string, Tensor> finalStates; // state name -> [1, B, F]
  std::shared_ptr<ir::Cell> boundCell;       // the cell with its sizes bound
  Engine engine = Engine::Jit;               // what actually ran it
};

inline SequenceResult runSequence(const ir::Cell& cell, const SequenceRequest& request) {
  if (cell.inputs.empty())
    throw UserError("cell '" + cell.name + "' has no input, so it has no sequence to run over");
  for (const auto& [name, tensor] : request.inputs)
    if (!cell.findArgument(name) || cell.findArgument(name)->argKind != ir::ArgKind::Input)
      throw UserError("cell '" + cell.name + "' has no input named '" + name + "'");
  LayerOptions options;
  options.numLayers = 1;
  options.bidirectional = false;
  options.training = request.options.training;
  options.seed = request.options.seed;
  options.engine = request.engine;
  options.threads = request.threads;
  options.compile = request.compile;
  options.sizes = request.sizes;
  const std::string& first = cell.inputs[0]->name;
  auto input = request.inputs.find(first);
  if (input == request.inputs.end())
    throw UserError("cell '" + cell.name + "' needs input '" + first + "' of shape [T, B, " +
                    cell.inputs[0]->shape[1].str() + "]");
  LayerRequest layerRequest;
  layerRequest.input = input->second;
  layerRequest.sideInputs = request.inputs;
  layerRequest.sideInputs.erase(first);
  layerRequest.initialStates = request.initialStates;
  auto program =
      LayerProgram::build(cell, *request.weights, request.weightsSource, options, &layerRequest);
  LayerResult layer = program->run(layerRequest.input, layerRequest.initialStates, std::nullopt,
                                   layerRequest.sideInputs);
  const LayerProgram::Slot& slot = program->slots().at(0);
  SequenceResult result;
  result.output = std::move(layer.output);
  result.finalStates = std::move(layer.finalStates);
  result.boundCell = slot.bound;
  result.engine = slot.compiled ? Engine::Jit : slot.gpu ? request.engine : Engine::Interpreter;
  return result;
}

} // namespace rnnc
