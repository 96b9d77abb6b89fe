// The one place where llvm::Error and llvm::Expected become rnnc exceptions. Code generation
// failing is a bug in rnnc (the IR was verified), so it surfaces as an InternalError.
#pragma once

#include "codegen/LLVMHeaders.h"
#include "ir/Error.h"

#include <type_traits>

namespace rnnc::codegen {

inline void check(llvm::Error error, const char* what) {
  if (error)
    throw InternalError(std::string(what) + ": " + llvm::toString(std::move(error)));
}

template <class T> T unwrap(llvm::Expected<T> value, const char* what) {
  if (!value)
    throw InternalError(std::string(what) + ": " + llvm::toString(value.takeError()));
  if constexpr (std::is_reference_v<T>)
    return *value;
  else
    return std::move(*value);
}

} // namespace rnnc::codegen
