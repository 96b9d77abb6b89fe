// The loop nests of a block: the runs of instructions that one kernel computes. A fused kernel
// (the instructions of one `fused { }`, ir/README.md) is one; an elementwise instruction outside
// any kernel (--no-fuse) is one of its own. The code generators emit one loop nest for each;
// everything else in a block (products, layer norms, concatenations, constants) is not in one.
#pragma once

#include "ir/Cell.h"

#include <cstddef>
#include <vector>

namespace rnnc::ir {

struct KernelGroup {
  size_t first, last; // [first, last) in the block
};

std::vector<KernelGroup> kernelGroups(const Block& block);

} // namespace rnnc::ir
