#include "runtime/exec/Engine.h"

#include "ir/Error.h"

#include <fmt/format.h>

namespace rnnc {

Engine engineFor(const std::string& device, bool interpret, const std::string& deviceOption,
                 const std::string& interpreterOption) {
  if (device == "cpu")
    return interpret ? Engine::Interpreter : Engine::Jit;
  if (device != "cuda" && device != "cuda-emulated")
    throw UserError(
        fmt::format("{} must be cpu, cuda or cuda-emulated, not '{}'", deviceOption, device));
  if (interpret)
    throw UserError(fmt::format("{} runs on the CPU's interpreter; it does not go with {} {}",
                                interpreterOption, deviceOption, device));
  return device == "cuda" ? Engine::Cuda : Engine::CudaEmulated;
}

const char* engineName(Engine engine) {
  switch (engine) {
  case Engine::Jit:
    return "jit";
  case Engine::Interpreter:
    return "interpreter";
  case Engine::Cuda:
    return "cuda";
  case Engine::CudaEmulated:
    return "cuda-emulated";
  }
  return "?";
}

} // namespace rnnc
