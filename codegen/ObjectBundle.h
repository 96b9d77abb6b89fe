// Several relocatable objects as one byte string: how a cell's code, compiled in parts side by
// side (the setup phases and the time loop, each its own LLVM module on its own thread), travels
// from the compiler through the disk cache to the loader. The loader loads the parts in order,
// each able to call the functions the earlier ones define (runtime/exec/ObjectLoader.h). No LLVM.
//
// Layout: the 8 bytes "RNNCOBJS", the part count (u64, little-endian), then per part its size
// (u64) and bytes. A single object (an ELF file) is not a bundle and loads as it is.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rnnc::codegen {

bool isObjectBundle(std::string_view bytes);
std::string bundleObjects(const std::vector<std::string>& objects);
// The parts of a bundle; InternalError for a damaged one (a count or size past its end).
std::vector<std::string_view> objectsOfBundle(std::string_view bundle);

} // namespace rnnc::codegen
