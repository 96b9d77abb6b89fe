// Which executor runs a cell: native code from the JIT, the reference interpreter, or the GPU's
// kernels (runtime/gpu/GpuCell.h) on an NVIDIA GPU or emulated on this CPU (the kernels' own code,
// GPU thread after GPU thread: for testing them where there is no GPU).
#pragma once

#include <string>

namespace rnnc {

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

} // namespace rnnc
