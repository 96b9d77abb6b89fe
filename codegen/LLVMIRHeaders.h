// The part of LLVM that building IR needs: what the emitters (EmitContext.h and its users,
// VectorMath, GemmTile) include. codegen/LLVMHeaders.h adds the rest (the optimiser, the
// targets, the JIT) for the files that compile; kept apart because those headers are most of a
// file's build: an empty file including them all took 9.2 s at -O3, with these alone 2.6 s.
#pragma once

#include <llvm/ADT/StringMap.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>
