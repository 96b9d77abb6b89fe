// From an optimised cell to native code: emit LLVM IR (codegen/CellEmitter), verify it,
// optimise it with LLVM's O2 pipeline for the target, and produce an object file; or print any
// of those stages for `rnnc compile --emit=llvm|asm`.
#pragma once

#include "codegen/StoragePlan.h"
#include "codegen/Target.h"
#include "ir/Cell.h"

#include <string>

namespace rnnc::codegen {

enum class Stage { LLVM, OptimisedLLVM, Assembly, Object };

// `cell` must be verified and have all its sizes bound. `functionName` is what the run function
// is called in the result.
std::string generate(const ir::Cell& cell, const StoragePlan& plan, const Target& target,
                     Stage stage, const std::string& functionName);

} // namespace rnnc::codegen
