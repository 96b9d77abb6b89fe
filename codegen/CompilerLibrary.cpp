#include "codegen/CompilerLibrary.h"

#include "codegen/SourceDigest.h"
#include "ir/Error.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <dlfcn.h>

namespace rnnc::codegen {
namespace {

std::atomic<const CompilerApi*> loadedApi{nullptr};

#ifdef RNNC_COMPILER_LINKED

const CompilerApi& load() {
  return *rnnc_compiler_api();
}

#else

// The directory of the module (executable or shared object) this code was linked into.
std::string ownDirectory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&ownDirectory), &info) || !info.dli_fname)
    return {};
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::vector<std::string> candidates() {
  std::vector<std::string> paths;
  if (const char* given = std::getenv("RNNC_COMPILER_LIBRARY"); given && *given) {
    paths.push_back(given); // explicit: nothing else is tried
    return paths;
  }
  if (std::string own = ownDirectory(); !own.empty())
    paths.push_back(own + "/" RNNC_COMPILER_FILE_NAME);
  paths.push_back(RNNC_COMPILER_BUILD_PATH);
  paths.push_back(RNNC_COMPILER_INSTALL_PATH);
  return paths;
}

const CompilerApi& load() {
  std::string tried;
  for (const std::string& path : candidates()) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      tried += "\n  " + path + ": " + (why ? why : "not loadable");
      continue;
    }
    auto entry = reinterpret_cast<const CompilerApi* (*)()>(dlsym(handle, kCompilerApiSymbol));
    const CompilerApi* api = entry ? entry() : nullptr;
    if (!api || api->abi != kCompilerAbi || std::strcmp(api->sourceDigest, sourceDigest()) != 0) {
      tried += "\n  " + path + ": from another build of rnnc";
      dlclose(handle);
      continue;
    }
    return *api; // stays loaded for the process's lifetime
  }
  throw UserError("cannot load rnnc's compiler library (" RNNC_COMPILER_FILE_NAME
                  "), needed to generate code; tried:" +
                  tried + "\nset RNNC_COMPILER_LIBRARY to its path");
}

#endif

} // namespace

const CompilerApi& compilerLibrary() {
  if (const CompilerApi* api = loadedApi.load(std::memory_order_acquire))
    return *api;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (const CompilerApi* api = loadedApi.load(std::memory_order_acquire))
    return *api;
  const CompilerApi& api = load();
  loadedApi.store(&api, std::memory_order_release);
  return api;
}

namespace {

// Throws again what a call into the library threw (CompilerLibrary.h).
void throwAgain(const CompilerFailure& failure) {
  using Kind = CompilerFailure::Kind;
  switch (failure.kind) {
  case Kind::None:
    return;
  case Kind::User:
    throw UserError(failure.message);
  case Kind::Internal: {
    const std::string prefix = "internal error: "; // InternalError adds it again
    throw InternalError(failure.message.rfind(prefix, 0) == 0
                            ? failure.message.substr(prefix.size())
                            : failure.message);
  }
  case Kind::OutOfMemory:
    throw std::bad_alloc();
  case Kind::Other:
    break;
  }
  throw std::runtime_error(failure.message);
}

// Calls the library's `function` with `args` and its failure, and throws what it threw.
template <typename Function, typename... Args> auto call(Function function, Args&&... args) {
  CompilerFailure failure;
  auto result = function(std::forward<Args>(args)..., &failure);
  throwAgain(failure);
  return result;
}

} // namespace

// codegen/Compiler.h and HostTarget.h, through the library.

std::string generate(const ir::Cell& cell, const StoragePlan& plan, const Target& target,
                     Stage stage) {
  return call(compilerLibrary().generate, cell, plan, target, stage, nullptr);
}

std::string generate(const ir::Cell& cell, const StoragePlan& plan, const Target& target,
                     Stage stage, CodegenTimes* times) {
  return call(compilerLibrary().generate, cell, plan, target, stage, times);
}

std::string generateGpu(const ir::Cell& cell, const StoragePlan& plan, const Target& gpu,
                        Stage stage) {
  return call(compilerLibrary().generateGpu, cell, plan, gpu, stage);
}

std::string generateGpuEmulation(const ir::Cell& cell, const StoragePlan& plan, Stage stage) {
  return call(compilerLibrary().generateGpuEmulation, cell, plan, stage);
}

std::string generateGemmTile(const Target& target, Stage stage, GemmOperands operands) {
  return call(compilerLibrary().generateGemmTile, target, stage, operands);
}

// Once per process: the CPU does not change under it, and each CPUID instruction LLVM's
// detection runs traps to the hypervisor in a virtual machine (0.12-0.15 ms a compile, a quarter
// of a cache hit's time there).
HostTarget detectHostTarget() {
  static const HostTarget host = call(compilerLibrary().detectHostTarget);
  return host;
}

HostTarget namedX86Target(const std::string& cpu) {
  return call(compilerLibrary().namedX86Target, cpu);
}

std::string llvmVersion() {
  return RNNC_LLVM_VERSION;
}

std::string codeGeneratorVersion() {
  return "rnnc " RNNC_VERSION " codegen " + std::string(sourceDigest()) + "\nLLVM " + llvmVersion();
}

} // namespace rnnc::codegen
