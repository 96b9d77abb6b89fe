// LLVM's view of CPUs, inside the compiler library (codegen/CompilerLibrary.h): everything
// else asks for it through codegen/HostTarget.h.
#pragma once

#include "codegen/HostTarget.h"

#include <string>

namespace rnnc::codegen {

HostTarget llvmHostTarget();
HostTarget llvmNamedX86Target(const std::string& cpu);

} // namespace rnnc::codegen
