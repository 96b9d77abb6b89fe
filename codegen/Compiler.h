// From an optimised cell to native code: emit LLVM IR (codegen/CellEmitter), verify it,
// optimise it with LLVM's O2 pipeline for the target, and produce an object file; or print any
// of those stages for `rnnc compile --emit=llvm|asm`.
#pragma once

#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "ir/Cell.h"

#include <memory>
#include <string>

namespace rnnc::codegen {

enum class Stage { LLVM, OptimisedLLVM, Assembly, Object };

// One cell lowered to an LLVM module, kept so that its text can key a cache before the costly
// part (optimisation and machine code) runs. The run function is always `rnnc_run`: each loaded
// object lives in its own JIT dylib.
class GeneratedModule {
public:
  // `cell` must be verified and have all its sizes bound.
  GeneratedModule(const ir::Cell& cell, const StoragePlan& plan, const Target& target);
  ~GeneratedModule();
  GeneratedModule(const GeneratedModule&) = delete;
  GeneratedModule& operator=(const GeneratedModule&) = delete;

  // The module as emitted, before any LLVM optimisation.
  std::string text() const;
  // Optimises and produces a later stage (LLVM text after O2, assembly, or an object file).
  // Call once.
  std::string finish(Stage stage);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Shorthand: emit and finish in one go.
std::string generate(const ir::Cell& cell, const StoragePlan& plan, const Target& target,
                     Stage stage);

} // namespace rnnc::codegen
