// The code generator proper, everything that runs LLVM (the emitters, LLVM's optimiser and back
// end, LLVM's view of the CPU), is a library of its own, librnnc_compiler.so, which this loads
// with dlopen the first time something must be compiled or a CPU looked up by LLVM: a process
// that finds its kernels in the disk cache (a warm `rnnc run`, an application embedding rnnc,
// the Python module) never maps libLLVM, whose loading and relocation alone cost more than a
// cached run (issue 19). Under the sanitizers the library is linked in instead (a shared object
// would need their runtimes arranged for it), behind the same table.
//
// Where it is looked for, in order: $RNNC_COMPILER_LIBRARY; beside the module this code is in
// (the rnnc tool, librnnc.so, the Python module); the build tree; the install prefix's lib/.
// The library must come from the same sources as its caller (their digests are compared), so a
// stale one is refused rather than used.
#pragma once

#include "codegen/Compiler.h"
#include "codegen/HostTarget.h"

#include <cstdint>
#include <string>

namespace rnnc::codegen {

inline constexpr uint32_t kCompilerAbi = 3;
inline constexpr const char* kCompilerApiSymbol = "rnnc_compiler_api";

// What a call into the library threw. No exception crosses the library's boundary: the rnnc
// tool links its own C++ runtime and unwinder (a shared libgcc cost 0.3-0.4 ms of every start in
// a VM, issue 19), the library has its own too (with LLVM's static libraries; the shared ones
// where it links the shared libLLVM: codegen/CMakeLists.txt), and an exception thrown through
// one unwinder is not caught through the other (the process aborts). So the library catches
// each exception into this, and the caller throws its like again. What crosses is data alone
// (strings, vectors, shared pointers: one layout on both sides, freed through the same malloc).
struct CompilerFailure {
  enum class Kind : uint32_t { None, User, Internal, OutOfMemory, Other };
  Kind kind = Kind::None;
  std::string message; // the exception's what()
};

// What librnnc_compiler.so provides (codegen/Compiler.h and HostTarget.h, implemented there);
// each function's last argument receives what it threw.
struct CompilerApi {
  uint32_t abi;             // kCompilerAbi
  const char* sourceDigest; // codegen::sourceDigest() of the library's build
  std::string (*generate)(const ir::Cell&, const StoragePlan&, const Target&, Stage, CodegenTimes*,
                          CompilerFailure*);
  std::string (*generateGpu)(const ir::Cell&, const StoragePlan&, const Target&, Stage,
                             CompilerFailure*);
  std::string (*generateGpuEmulation)(const ir::Cell&, const StoragePlan&, Stage, CompilerFailure*);
  std::string (*generateGemmTile)(const Target&, Stage, GemmOperands, CompilerFailure*);
  HostTarget (*detectHostTarget)(CompilerFailure*);
  HostTarget (*namedX86Target)(const std::string&, CompilerFailure*);
};

// The library's table, loaded on first use (thread-safe); UserError naming every place
// tried, and why each failed, when none loads.
const CompilerApi& compilerLibrary();

} // namespace rnnc::codegen

// The library's one exported symbol.
extern "C" const rnnc::codegen::CompilerApi* rnnc_compiler_api();
