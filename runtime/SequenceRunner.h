// Runs a cell over a whole sequence from user-facing tensors: checks every shape the user gave
// (naming the tensor, its expected and actual shape), infers the sizes, binds the weights and
// runs it on the JIT or the reference interpreter. The JIT runs inference; dropout in training
// mode runs on the interpreter. One layer, one direction.
#pragma once

#include "ir/Cell.h"
#include "runtime/CompiledCell.h"
#include "runtime/Interpreter.h"
#include "runtime/SafeTensors.h"

#include <map>
#include <memory>
#include <string>

namespace rnnc {

// Which executor runs the cell: native code from the JIT, the reference interpreter, or the
// GPU's kernels (runtime/GpuCell.h) on an NVIDIA GPU or emulated on this CPU (the kernels' own
// code, GPU thread after GPU thread: for testing them where there is no GPU).
enum class Engine { Jit, Interpreter, Cuda, CudaEmulated };

const char* engineName(Engine engine); // "jit", "interpreter", "cuda", "cuda-emulated"

// The engine for a device ("cpu", "cuda", "cuda-emulated") and whether the JIT or the
// interpreter is asked for; UserError for an unknown device, or the interpreter with a GPU.
// `deviceOption` and `interpreterOption` are how the caller spells them, for the messages
// ("--device", "--interpret"; "device", "jit=False").
Engine engineFor(const std::string& device, bool interpret, const std::string& deviceOption,
                 const std::string& interpreterOption);
inline bool isGpuEngine(Engine engine) {
  return engine == Engine::Cuda || engine == Engine::CudaEmulated;
}

struct SequenceRequest {
  std::map<std::string, Tensor> inputs;        // cell input name -> [T, B, F]
  std::map<std::string, Tensor> initialStates; // cell state name -> [1, B, F]; absent = zeros
  const TensorMap* weights = nullptr;
  std::string weightsSource = "weights"; // file name for error messages
  ir::SizeMap sizes;                     // sizes given explicitly (--size)
  ExecutionOptions options;
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

SequenceResult runSequence(const ir::Cell& cell, const SequenceRequest& request);

} // namespace rnnc
