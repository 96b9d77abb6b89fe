// The tile-height policy (codegen/TileRows.h), as plain numbers: the same template the code
// generator emits as IR. The JIT tests run it on real products (test_jit.cpp's
// EveryBatchFromOneToForty, test_jit_gemm.cpp).
#include "codegen/TileRows.h"

#include "codegen/RunArgs.h"
#include "runtime/exec/Kernels.h"

#include <gtest/gtest.h>

#include <numeric>
#include <tuple>

using namespace rnnc::codegen;

namespace {

TEST(TileRows, SixtyFourRowsAreBalancedWithoutAShortTail) {
  // AVX2 LSTM (6-row tiles): 9 x 6 + 2 x 5, not 10 x 6 + 3 + 1.
  std::vector<int64_t> avx2(9, 6);
  avx2.insert(avx2.end(), {5, 5});
  EXPECT_EQ(tileHeights(64, TileShapes(6)), avx2);
  // AVX-512 LSTM (14-row tiles): 4 x 13 + 12, not 4 x 14 + 7 + 1.
  EXPECT_EQ(tileHeights(64, TileShapes(14)), (std::vector<int64_t>{13, 13, 13, 13, 12}));
  // Without shorter tiles (unpadded): 4 x 14, then 7 + 1.
  EXPECT_EQ(tileHeights(64, TileShapes(14, /*withShorter=*/false)),
            (std::vector<int64_t>{14, 14, 14, 14, 7, 1}));
  // A multiple of the tile: full tiles only.
  EXPECT_EQ(tileHeights(42, TileShapes(14)), (std::vector<int64_t>{14, 14, 14}));
}

// The input projection's tiles (a row-split product, padded): full from half height on, the
// rows past a short tile's own computed and dropped; a rest under half a tile in single rows.
TEST(TileRows, PaddedTilesAreFullFromHalfHeightOn) {
  const TileShapes padded(14, /*withShorter=*/false, /*padded=*/true);
  // 64 rows: 4 x 14 and a rest of 8 in a fifth full tile, not 7 + 1.
  EXPECT_EQ(tileHeights(64, padded), (std::vector<int64_t>{14, 14, 14, 14, 14}));
  // 27 rows (a tile of 14 and one of 13): both full.
  EXPECT_EQ(tileHeights(27, padded), (std::vector<int64_t>{14, 14}));
  // 100 rows (T=100, B=1): 7 x 14, then the 2 rows left alone.
  std::vector<int64_t> hundred(7, 14);
  hundred.insert(hundred.end(), {1, 1});
  EXPECT_EQ(tileHeights(100, padded), hundred);
  for (int64_t tileRows = 1; tileRows <= 14; ++tileRows) {
    const TileShapes shapes(tileRows, false, true);
    for (int64_t rows = 0; rows <= 300; ++rows) {
      int64_t computed = 0, singles = 0;
      for (int64_t h : tileHeights(rows, shapes)) {
        EXPECT_TRUE(h == tileRows || h == 1) << h << " rows in tiles of " << tileRows;
        computed += h;
        singles += h == 1 && tileRows > 1;
      }
      // Every row computed, at most a tile's worth past them, fewer single rows than half a tile.
      EXPECT_GE(computed, rows);
      EXPECT_LT(computed, rows + std::max<int64_t>(tileRows, 1) * (rows / tileRows + 1));
      EXPECT_LT(singles, std::max<int64_t>(shapes.half, 1) + (tileRows == 1 ? rows : 0));
    }
  }
}

TEST(TileRows, SmallCountsFallBackToHalfTilesAndSingleRows) {
  // 9 rows of 14-row tiles: one tile, 5 rows short: half tiles of 7, then single rows.
  EXPECT_EQ(tileHeights(9, TileShapes(14)), (std::vector<int64_t>{7, 1, 1}));
  EXPECT_EQ(tileHeights(1, TileShapes(6)), (std::vector<int64_t>{1}));
  EXPECT_TRUE(tileHeights(0, TileShapes(6)).empty());
}

TEST(TileRows, EveryCountIsCoveredByTheFiveVariants) {
  for (int64_t tileRows = 1; tileRows <= 14; ++tileRows) {
    const TileShapes shapes(tileRows);
    for (int64_t rows = 0; rows <= 300; ++rows) {
      std::vector<int64_t> heights = tileHeights(rows, shapes);
      EXPECT_EQ(std::accumulate(heights.begin(), heights.end(), int64_t{0}), rows)
          << rows << " rows in tiles of " << tileRows;
      int64_t small = 0; // rows in half tiles and single rows
      for (int64_t h : heights) {
        EXPECT_TRUE(h == shapes.full || h == shapes.shortened || h == shapes.shorter ||
                    h == shapes.half || h == 1)
            << h << " rows in tiles of " << tileRows;
        small += h < shapes.shorter ? h : 0;
      }
      // Once there are as many tiles as rows short of whole ones (or half as many), no tile
      // smaller than tileRows - 2 rows is left.
      const int64_t tiles = (rows + tileRows - 1) / tileRows;
      const int64_t missing = tiles * tileRows - rows;
      if (tileRows > 2 &&
          (missing <= tiles || (shapes.balancesTwoShort() && missing <= 2 * tiles))) {
        EXPECT_EQ(small, 0) << rows << " rows in tiles of " << tileRows;
      }
    }
  }
}

// With tiles of run-time height, the balanced split is computed as before, and what is left of a
// count too small to balance is one tile from half a tile's rows on, single rows below it.
TEST(TileRows, TilesOfAnyHeightTakeTheSplitAndTheRestWhole) {
  const TileShapes any(14, /*withShorter=*/true, /*padded=*/false, /*anyHeight=*/true);
  EXPECT_EQ(tileHeights(64, any), (std::vector<int64_t>{13, 13, 13, 13, 12}));
  EXPECT_EQ(tileHeights(42, any), (std::vector<int64_t>{14, 14, 14}));
  EXPECT_EQ(tileHeights(9, any), (std::vector<int64_t>{9}));
  EXPECT_EQ(tileHeights(6, any), (std::vector<int64_t>{1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(tileHeights(7, any), (std::vector<int64_t>{7}));
  for (int64_t tileRows = 4; tileRows <= 14; ++tileRows) {
    const TileShapes shapes(tileRows, true, false, true);
    for (int64_t rows = 0; rows <= 300; ++rows) {
      const std::vector<int64_t> heights = tileHeights(rows, shapes);
      const std::vector<int64_t> variants = tileHeights(rows, TileShapes(tileRows));
      EXPECT_EQ(std::accumulate(heights.begin(), heights.end(), int64_t{0}), rows);
      for (int64_t h : heights)
        EXPECT_TRUE(h == 1 || (h >= shapes.half && h <= tileRows)) << h << " of " << tileRows;
      // Never more tiles than the five variants' cut of the same rows.
      EXPECT_LE(heights.size(), variants.size()) << rows << " rows in tiles of " << tileRows;
    }
  }
}

// The generated code's walk from row 0 over the split's tiles: each tile's height from where it
// starts (full up to fullEnd, shortened to shortenedEnd, shorter to shorterEnd; the rest, past
// the balanced tiles, is one step). The tiles' first rows, then `rows`.
std::vector<int64_t> walkedTileStarts(int64_t rows, const TileSplit& split,
                                      const TileShapes& shapes) {
  std::vector<int64_t> starts;
  for (int64_t r = 0; r < rows;) {
    starts.push_back(r);
    r += r < split.fullEnd        ? shapes.full
         : r < split.shortenedEnd ? shapes.shortened
         : r < split.shorterEnd   ? shapes.shorter
                                  : rows - r;
  }
  starts.push_back(rows);
  return starts;
}

// Units (what threads share) start where tiles start, in order, and cover every row once: a
// thread's rows are then whole tiles at the heights one thread would use for them.
TEST(TileRows, UnitsStartAtTheTilesOfTheWholeSplit) {
  for (bool withShorter : {true, false})
    for (int64_t tileRows = 1; tileRows <= 14; ++tileRows) {
      const TileShapes shapes(tileRows, withShorter);
      for (int64_t rows = 0; rows <= 200; ++rows) {
        const TileSplit split = splitIntoTiles(rows, shapes);
        const int64_t units = tileUnits(rows, split, shapes);
        const std::vector<int64_t> starts = walkedTileStarts(rows, split, shapes);
        ASSERT_EQ(units + 1, static_cast<int64_t>(starts.size()))
            << rows << " rows in tiles of " << tileRows;
        for (int64_t u = 0; u <= units; ++u)
          EXPECT_EQ(tileUnitStart(rows, split, shapes, u), starts[u])
              << "unit " << u << " of " << rows << " rows in tiles of " << tileRows;
      }
    }
}

// The generated code asks the runtime for the split (rnnc_tile_split, rnnc_tile_unit_start),
// passing the shapes as one number: every shape the emitter makes survives the round trip, and
// the runtime's answers are the tiles a walk from row 0 takes.
TEST(TileRows, TheRuntimeSplitsRowsAsTheTilesAreWalked) {
  for (int64_t tileRows = 1; tileRows <= 14; ++tileRows)
    for (bool withShorter : {true, false})
      for (bool padded : {false, true})
        for (bool anyHeight : {false, true}) {
          const TileShapes shapes(tileRows, withShorter, padded, anyHeight);
          const TileShapes back = TileShapes::fromCode(shapes.code());
          ASSERT_EQ(std::tie(back.full, back.shortened, back.shorter, back.half, back.padded,
                             back.anyHeight),
                    std::tie(shapes.full, shapes.shortened, shapes.shorter, shapes.half,
                             shapes.padded, shapes.anyHeight))
              << tileRows << " rows " << withShorter << padded << anyHeight;
          for (int64_t rows : {0, 1, 2, 7, 13, 14, 27, 64, 100, 641}) {
            const int64_t code = shapes.code();
            const TileSplit ends{rnnc_tile_split(rows, code, RNNC_TILES_FULL_END),
                                 rnnc_tile_split(rows, code, RNNC_TILES_SHORTENED_END),
                                 rnnc_tile_split(rows, code, RNNC_TILES_SHORTER_END)};
            EXPECT_TRUE(0 <= ends.fullEnd && ends.fullEnd <= ends.shortenedEnd &&
                        ends.shortenedEnd <= ends.shorterEnd && ends.shorterEnd <= rows)
                << rows << " rows in tiles of " << tileRows;
            const std::vector<int64_t> starts = walkedTileStarts(rows, ends, shapes);
            const int64_t units = rnnc_tile_split(rows, code, RNNC_TILES_UNITS);
            ASSERT_EQ(units + 1, static_cast<int64_t>(starts.size()))
                << rows << " rows in tiles of " << tileRows;
            for (int64_t u = 0; u <= units; ++u)
              EXPECT_EQ(rnnc_tile_unit_start(rows, code, u), starts[u])
                  << "unit " << u << " of " << rows << " rows in tiles of " << tileRows;
          }
        }
}

} // namespace
