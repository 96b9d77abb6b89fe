#include "codegen/GemmTile.h"

namespace rnnc::codegen {

GemmTileShape gemmTileShape(const Target& target) {
  // Two vectors of B per depth; as many rows as the registers hold beside them and the
  // broadcast: every register but four for the accumulators (AVX2 12 of 16, AVX-512 28 of 32).
  const int64_t vectors = 2;
  const int64_t accumulators = target.vectorRegisters - 4;
  return {accumulators / vectors, vectors * target.vectorWidth};
}

} // namespace rnnc::codegen
