// The only way codegen/ includes LLVM: one place to see what we depend on, and LLVM's headers
// stay out of every other stage.
#pragma once

#include <llvm/ADT/StringMap.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/Support/Error.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/Triple.h>
