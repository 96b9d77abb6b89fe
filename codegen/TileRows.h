// How a product's rows are cut into register tiles: the policy, written once. The generated code
// applies it to a row count known only at run time (the batch, a chunk) by calling the runtime
// (codegen/RunArgs.h, rnnc_tile_split), which costs LLVM less than the same arithmetic emitted
// as IR; tests and planning call it directly (tileHeights). No LLVM here.
//
// Rows come in tiles of `tileRows`, `tileRows - 1` and `tileRows - 2` rows, balanced so that no
// short tail is left: 64 rows of an AVX2 LSTM are 9 tiles of 6 and 2 of 5, where 10 tiles of 6
// left 4 rows for tiles of 3 and 1, with too few accumulator chains to cover the FMA latency
// (those 4 rows took 10% of the product's time); 64 rows of an AVX-512 LSTM are 4 tiles of 13
// and one of 12, not 4 of 14, 7 and 1. Counts too small to balance (fewer tiles than half the
// rows short) take full tiles and leave the rest to tiles of half height, then single rows: five
// variants of the tile, however many rows, to bound what LLVM compiles.
//
// Where the tile's FMAs can take a height known only at run time (`anyHeight`: the full tile's
// rows past half its height each skipped above the height, ProductKernelEmitter::emitTile), the
// same split is computed in two variants: every tile of at least half height at its own height
// (so the rest of a count too small to balance is one tile, not half tiles and single rows),
// single rows below.
//
// A row-split product (the input projection over T*B rows) is `padded`: it reads copies of its
// rows with room for whole tiles, so every tile of at least half height is computed at full
// height (the rows past its own are computed and dropped), and only a rest under half a tile
// takes single rows. Two variants instead of four, for a product whose short tiles come once
// per sequence: its full tiles are most of LLVM's work on the kernel and its time.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace rnnc::codegen {

// The heights a tile may have, for tiles of at most `tileRows` rows; without `shorter` tiles
// (a product that cuts rows short rarely: the last chunk of a row-split one) only counts one row
// short per tile are balanced.
struct TileShapes {
  int64_t full, shortened, shorter, half;
  bool padded;    // every tile of at least half height computed at full height
  bool anyHeight; // every tile of at least half height computed at its own, in one variant
  explicit TileShapes(int64_t tileRows, bool withShorter = true, bool padded = false,
                      bool anyHeight = false)
      : full(tileRows), shortened(tileRows - 1), shorter(withShorter ? tileRows - 2 : 0),
        half(std::max<int64_t>(1, tileRows / 2)), padded(padded), anyHeight(anyHeight) {}
  // Whether the shortened (shorter) tile is a variant of its own, not covered by half tiles.
  bool hasShortened() const { return shortened > half; }
  bool hasShorter() const { return shorter > half; }
  // Whether tiles two rows short are used at all: as a variant, or as one half tile.
  bool balancesTwoShort() const { return shorter >= 1 && shorter >= half; }
  // The shapes as one number and back: what generated code passes to the runtime's
  // rnnc_tile_split and rnnc_tile_unit_start (codegen/RunArgs.h).
  int64_t code() const {
    return full | int64_t{shorter != 0} << 32 | int64_t{padded} << 33 | int64_t{anyHeight} << 34;
  }
  static TileShapes fromCode(int64_t code) {
    return TileShapes(code & 0xffffffff, (code >> 32) & 1, (code >> 33) & 1, (code >> 34) & 1);
  }
};

// Where the full tiles of rows [0, rows) end, where the shortened ones do and where the
// shorter ones do; the rows from `shorterEnd` on are left to half tiles and single rows.
struct TileSplit {
  int64_t fullEnd, shortenedEnd, shorterEnd;
};

inline TileSplit splitIntoTiles(int64_t rows, const TileShapes& shapes) {
  const int64_t tileRows = shapes.full;
  const int64_t tiles = (rows + tileRows - 1) / tileRows;
  const int64_t missing = tiles * tileRows - rows;
  // Each tile one row short (tiles - missing full ones), else each one or two rows short (none
  // full, a + b = tiles and a + 2b = missing), else as many full tiles as fit.
  int64_t fullTiles = rows / tileRows, shortenedTiles = 0, shorterTiles = 0;
  if (missing <= tiles) {
    fullTiles = tiles - missing;
    shortenedTiles = missing;
  } else if (shapes.balancesTwoShort() && missing <= 2 * tiles) {
    fullTiles = 0;
    shortenedTiles = 2 * tiles - missing;
    shorterTiles = missing - tiles;
  }
  const int64_t fullEnd = fullTiles * shapes.full;
  const int64_t shortenedEnd = fullEnd + shortenedTiles * shapes.shortened;
  return {fullEnd, shortenedEnd, shortenedEnd + shorterTiles * shapes.shorter};
}

// The split's tiles of full, shortened and shorter height, in that order.
inline std::array<int64_t, 3> tileCounts(const TileSplit& split, const TileShapes& shapes) {
  auto tiles = [](int64_t from, int64_t to, int64_t height) {
    return height > 0 ? (to - from) / height : 0;
  };
  return {tiles(0, split.fullEnd, shapes.full),
          tiles(split.fullEnd, split.shortenedEnd, shapes.shortened),
          tiles(split.shortenedEnd, split.shorterEnd, shapes.shorter)};
}

// Threads (and chunks) take whole tiles of one split of all the rows, so that every row is
// computed in the same tile, at the same height, however many threads run: a tile's height
// decides how its depth is summed (ProductKernelEmitter::accumulatorSets), and a row's result
// must not change with the thread count (which an automatic run picks from the machine's load).
// Units are the split's tiles of full, shortened and shorter height, then the rest (half tiles
// and single rows, fewer than a full tile's rows) as one last unit.
inline int64_t tileUnits(int64_t rows, const TileSplit& split, const TileShapes& shapes) {
  const std::array<int64_t, 3> counts = tileCounts(split, shapes);
  return counts[0] + counts[1] + counts[2] + (rows > split.shorterEnd ? 1 : 0);
}

// The first row of unit `unit` (in [0, tileUnits]; tileUnits gives `rows`).
inline int64_t tileUnitStart(int64_t rows, const TileSplit& split, const TileShapes& shapes,
                             int64_t unit) {
  const std::array<int64_t, 3> counts = tileCounts(split, shapes);
  const int64_t heights[3] = {shapes.full, shapes.shortened, shapes.shorter};
  int64_t row = 0;
  int64_t remaining = unit; // units not yet passed
  for (int h = 0; h < 3; ++h) {
    // This height's tiles before the unit: `remaining` clamped to [0, count].
    row += std::clamp<int64_t>(remaining, 0, counts[h]) * heights[h];
    remaining -= counts[h];
  }
  // Past the tiles: the rest, whole.
  return remaining <= 0 ? row : rows;
}

// The heights of the tiles rows [0, rows) are computed in, in order (a padded tile's full
// height, though fewer of its rows are kept): what the generated code does, as plain numbers.
inline std::vector<int64_t> tileHeights(int64_t rows, const TileShapes& shapes) {
  const TileSplit split = splitIntoTiles(rows, shapes);
  std::vector<int64_t> heights;
  for (int64_t r = 0; r < rows;) {
    int64_t height = r < split.fullEnd        ? shapes.full
                     : r < split.shortenedEnd ? shapes.shortened
                     : r < split.shorterEnd   ? shapes.shorter
                                              : rows - r;
    // What the generated code's switch does with a height: a full, shortened or shorter tile,
    // else half tiles, then single rows; padded, a full tile from half height on.
    if (shapes.padded || shapes.anyHeight) {
      if (height >= shapes.half)
        heights.push_back(shapes.padded ? shapes.full : height);
      else
        heights.insert(heights.end(), static_cast<size_t>(height), 1);
    } else if (height == shapes.full || (height == shapes.shortened && shapes.hasShortened()) ||
               (height == shapes.shorter && shapes.hasShorter())) {
      heights.push_back(height);
    } else {
      int64_t halves = height / shapes.half * shapes.half;
      for (int64_t m = 0; m < halves; m += shapes.half)
        heights.push_back(shapes.half);
      for (int64_t m = halves; m < height; ++m)
        heights.push_back(1);
    }
    r += height;
  }
  return heights;
}

} // namespace rnnc::codegen
