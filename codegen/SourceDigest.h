// A digest of the code generator's own sources, computed by the build: part of the compile
// cache's key, so that code cached by an older rnnc is never taken for current.
#pragma once

namespace rnnc::codegen {

const char* sourceDigest();

} // namespace rnnc::codegen
