#include "runtime/exec/Gemm.h"
#include "runtime/exec/TargetMemo.h"

#include "codegen/CacheLines.h"
#include "codegen/Compiler.h"
#include "codegen/GemmTile.h"
#include "ir/Error.h"
#include "runtime/data/AlignedBuffer.h"
#include "runtime/exec/CellBuild.h"
#include "runtime/exec/CompileCache.h"

#include <Eigen/Core>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace rnnc {
namespace {

struct Tile {
  // With bf16 pairs (codegen::GemmOperands::Bf16Pairs), the function takes the depth in pairs
  // and A and B as 32-bit words of two bf16 values.
  bool pairs = false;
  RnncGemmTileFunction function = nullptr;
  std::shared_ptr<void> lifetime;
  codegen::GemmTileShape shape;
  int64_t depthBlock = 0;  // kc: a column strip of B (kc x columns), 32 KB
  int64_t rowBlock = 0;    // mc: a block of A (mc x kc) stays in L2
  int64_t columnBlock = 0; // nc: a panel of B (kc x nc)
};

// `bf16`: the tile of bf16 products, in pairs where the target pairs them (vdpbf16ps), else the
// fp32 tile (its operands rounded when packed).
Tile compileTile(const std::string& targetCpu, bool bf16) {
  const codegen::Target target = runnableTarget(targetCpu, CacheOptions::fromEnvironment());
  const bool pairs = bf16 && target.pairsBf16Products();
  Tile tile;
  tile.pairs = pairs;
  tile.shape = codegen::gemmTileShape(target);
  // 512 depths per block, at any vector width: a strip of B of 32 KB at AVX2's 16 columns, 64 KB
  // at AVX-512's 32, which streams from L2 fine. C's tiles are read and written once per depth
  // block, and C (dX = G W: 6400 x 512) is larger than the caches: with 128 depths dX = G W
  // took 98.5 ms, with 384 84.5, with 512 80.0 (Zen 5, 1 thread, medians of 5 alternating
  // runs). AVX-512 had 256 (a 32 KB strip) until four alternating runs of 512 against 256 on
  // Zen 5 gave dX 312 against 324 ms, dW_ih + dW_hh 616 against 632 (1 thread) and 328 against
  // 334 (2 threads). Half of the L2 for the block of A. bf16 pairs take half the bytes per
  // depth: 1024 depths make the same strips and blocks, and C's tiles are read half as often
  // (dW = G^T X 48.2 -> 46.3 ms, dX = G W 45.3 -> 43.2, 1 thread, Zen 5, medians of five
  // alternating runs).
  tile.depthBlock = pairs ? 1024 : 512; // (an even count: whole pairs)
  const int64_t bytesPerDepth = pairs ? 2 : 4;
  tile.rowBlock = std::clamp<int64_t>(target.l2Bytes / 2 / (tile.depthBlock * bytesPerDepth),
                                      tile.shape.rows, 512) /
                  tile.shape.rows * tile.shape.rows;
  tile.columnBlock = 4096 / tile.shape.columns * tile.shape.columns;

  const auto operands = pairs ? codegen::GemmOperands::Bf16Pairs : codegen::GemmOperands::F32;
  LoadedCode code = loadOrGenerate(
      CacheOptions::fromEnvironment(),
      codeCacheKey(target, pairs ? "gemm pair tile\n" : "gemm tile\n"),
      pairs ? codegen::kGemmPairTileFunctionName : codegen::kGemmTileFunctionName,
      [&] { return codegen::generateGemmTile(target, codegen::Stage::Object, operands); });
  tile.function = reinterpret_cast<RnncGemmTileFunction>(code.loaded.address);
  tile.lifetime = std::move(code.loaded.lifetime);
  return tile;
}

// The tile for `targetCpu` ("": this machine), compiled once per process and target: a layer
// built for another CPU (`--target-cpu haswell` on an AVX-512 host) takes its weight gradients
// in that CPU's code too, as its kernels are.
// `bf16`: the tile for bf16 products (compileTile).
const Tile& processTile(const std::string& targetCpu, bool bf16 = false) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, bool>, std::unique_ptr<Tile>> tiles;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Tile>& tile = tiles[{targetCpu, bf16}];
  if (!tile)
    tile = std::make_unique<Tile>(compileTile(targetCpu, bf16));
  return *tile;
}

// Two values as bf16 (rounded to nearest even by Eigen, as the weights' packing and the
// interpreter round them) in one word, the first in the lower half.
inline uint32_t pairOf(float low, float high) {
  return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(low)) |
         static_cast<uint32_t>(Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(high))) << 16;
}

void roundToBf16(float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    values[i] = static_cast<float>(Eigen::bfloat16(values[i]));
}

// Calls `body` with the tile's row count as a compile-time constant (a std::integral_constant)
// where it is one of the tiles' (AVX2 6, AVX-512 14); false for any other count.
template <class Body> bool withTileRows(int64_t rows, Body&& body) {
  switch (rows) {
  case 6:
    body(std::integral_constant<int64_t, 6>{});
    return true;
  case 14:
    body(std::integral_constant<int64_t, 14>{});
    return true;
  }
  return false;
}

// The first `fullPairs / 16 * 16` pairs of depths of `Rows` rows of a row-major A (`rowStride`
// apart) as bf16 pairs in a strip, `Rows` words per pair, in blocks of 16 pairs: each row's 32
// values rounded in one contiguous run, which the compiler vectorises, then the block's words
// written out pair by pair. Element by element straight into the strip's scattered words it
// rounded one value at a time: dX = G W in bf16 ran at 1.14x fp32, against dW's 1.6x. total[i]
// += row i's values, in the order the element-wise loop adds them. Returns the pairs done.
template <int64_t Rows>
int64_t pairBlocksIntoStrip(const float* first, int64_t rowStride, int64_t fullPairs, uint32_t* out,
                            float* total) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "a pair's first value in its low half");
  constexpr int64_t kPairs = 16;
  int64_t p0 = 0;
  for (; p0 + kPairs <= fullPairs; p0 += kPairs) {
    uint32_t words[Rows][kPairs];
    for (int64_t i = 0; i < Rows; ++i) {
      const float* from = first + i * rowStride + 2 * p0;
      uint16_t halves[2 * kPairs];
      for (int64_t k = 0; k < 2 * kPairs; ++k)
        halves[k] = Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(from[k]));
      std::memcpy(words[i], halves, sizeof(halves));
      for (int64_t p = 0; p < kPairs; ++p)
        total[i] += from[2 * p] + from[2 * p + 1];
    }
    uint32_t* to = out + p0 * Rows;
    for (int64_t p = 0; p < kPairs; ++p)
      for (int64_t i = 0; i < Rows; ++i)
        to[p * Rows + i] = words[i][p];
  }
  return p0;
}

// The first `fullPairs` pairs of depths of `Rows` rows of a transposed row-major A, each depth a
// run of the rows (`depthStride` apart), as bf16 pairs in a strip, `Rows` words per pair: with
// the row count a constant, each pair's words are made a vector at a time (dW = G^T X in bf16,
// 1 thread, Zen 5: 42.5-43.2 -> 39.6-40.3 ms, alternating runs, medians of 5). total[i] += row
// i's values, as the element-wise loop adds them. Returns the pairs done.
template <int64_t Rows>
int64_t pairsOfRunsIntoStrip(const float* first, int64_t depthStride, int64_t fullPairs,
                             uint32_t* out, float* total) {
  for (int64_t p = 0; p < fullPairs; ++p) {
    const float* low = first + 2 * p * depthStride;
    const float* high = low + depthStride;
    uint32_t* to = out + p * Rows;
    for (int64_t i = 0; i < Rows; ++i) {
      to[i] = pairOf(low[i], high[i]);
      total[i] += low[i] + high[i];
    }
  }
  return fullPairs;
}

// Rows [row, row + rows) and depths [depth, depth + depths) of A as bf16 pairs in strips of the
// tile's rows: strip s (`stride` words from the last) holds, per pair of depths, its `tileRows`
// words (zero past A's rows, and in the upper half past an odd last depth). With `sums`,
// sums[i] += the fp32 values of A's row i at these depths.
void packAPairs(const MatrixView& a, int64_t row, int64_t rows, int64_t depth, int64_t depths,
                int64_t tileRows, int64_t stride, uint32_t* out, float* sums) {
  const int64_t pairs = (depths + 1) / 2;
  for (int64_t strip = 0; strip < rows; strip += tileRows) {
    const int64_t count = std::min(tileRows, rows - strip);
    uint32_t* stripOut = out + strip / tileRows * stride;
    float total[32] = {};
    if (a.rowStride == 1) {
      // A transposed row-major matrix (dW = G^T X): each depth a contiguous run of A's rows;
      // a whole strip's full pairs with its row count a constant first.
      int64_t done = 0;
      if (count == tileRows)
        withTileRows(tileRows, [&](auto constant) {
          done = pairsOfRunsIntoStrip<decltype(constant)::value>(
              a.data + row + strip + depth * a.columnStride, a.columnStride, depths / 2, stripOut,
              total);
        });
      for (int64_t p = done; p < pairs; ++p) {
        const float* low = a.data + row + strip + (depth + 2 * p) * a.columnStride;
        const float* high = 2 * p + 1 < depths ? low + a.columnStride : nullptr;
        uint32_t* to = stripOut + p * tileRows;
        for (int64_t i = 0; i < count; ++i) {
          const float h = high ? high[i] : 0.0f;
          to[i] = pairOf(low[i], h);
          total[i] += low[i] + h;
        }
      }
    } else {
      // Any other A (row-major: dX = G W): row by row, each pair two neighbours of a row; a
      // whole strip of a row-major A in blocks first.
      int64_t done = 0;
      if (a.columnStride == 1 && count == tileRows)
        withTileRows(tileRows, [&](auto constant) {
          done = pairBlocksIntoStrip<decltype(constant)::value>(
              a.data + (row + strip) * a.rowStride + depth, a.rowStride, depths / 2, stripOut,
              total);
        });
      for (int64_t i = 0; i < count; ++i) {
        const float* first = a.data + (row + strip + i) * a.rowStride + depth * a.columnStride;
        for (int64_t p = done; p < pairs; ++p) {
          const float low = first[2 * p * a.columnStride];
          const float h = 2 * p + 1 < depths ? first[(2 * p + 1) * a.columnStride] : 0.0f;
          stripOut[p * tileRows + i] = pairOf(low, h);
          total[i] += low + h;
        }
      }
    }
    for (int64_t p = 0; p < pairs; ++p)
      std::fill(stripOut + p * tileRows + count, stripOut + (p + 1) * tileRows, 0u);
    if (sums)
      for (int64_t i = 0; i < count; ++i)
        sums[row + strip + i] += total[i];
  }
}

// Depths [depth, depth + depths) and columns [column, column + columns) of B as bf16 pairs in
// strips of the tile's columns, per pair of depths `tileColumns` words (zero past B's columns
// and in the upper half past an odd last depth), strips `stride` words apart.
void packBPairs(const MatrixView& b, int64_t depth, int64_t depths, int64_t column, int64_t columns,
                int64_t tileColumns, int64_t stride, uint32_t* out) {
  const int64_t pairs = (depths + 1) / 2;
  for (int64_t strip = 0; strip < columns; strip += tileColumns) {
    const int64_t count = std::min(tileColumns, columns - strip);
    for (int64_t p = 0; p < pairs; ++p) {
      uint32_t* to = out + strip / tileColumns * stride + p * tileColumns;
      const float* low = b.data + (depth + 2 * p) * b.rowStride + (column + strip) * b.columnStride;
      const bool high = 2 * p + 1 < depths;
      if (b.columnStride == 1) // row-major B: each depth a contiguous run of B's columns
        for (int64_t j = 0; j < count; ++j)
          to[j] = pairOf(low[j], high ? low[j + b.rowStride] : 0.0f);
      else
        for (int64_t j = 0; j < count; ++j)
          to[j] =
              pairOf(low[j * b.columnStride], high ? low[j * b.columnStride + b.rowStride] : 0.0f);
      std::fill(to + count, to + tileColumns, 0u);
    }
  }
}

// Per depth k, the contiguous run of `strips * Width` values at first + k * depthStride dealt to
// `strips` strips of `Width` values per depth (strip s at out + s * stride): each run read
// whole, one stream of lines that the prefetcher follows. The width is a constant, so that each
// piece is a vector or two moved inline (with a copy function called per piece, packing took
// 11% of dW = G^T X; a memcpy of a size known only at run time, 7%).
template <int64_t Width>
void dealToStripsOf(const float* first, int64_t depthStride, int64_t depths, int64_t strips,
                    int64_t stride, float* out) {
  for (int64_t k = 0; k < depths; ++k) {
    const float* from = first + k * depthStride;
    float* to = out + k * Width;
    for (int64_t strip = 0; strip < strips; ++strip)
      std::memcpy(to + strip * stride, from + strip * Width, Width * sizeof(float));
  }
}

void dealToStrips(const float* first, int64_t depthStride, int64_t depths, int64_t strips,
                  int64_t width, int64_t stride, float* out) {
  switch (width) { // the tiles' sizes: AVX2 6 x 16, AVX-512 14 x 32
  case 6:
    return dealToStripsOf<6>(first, depthStride, depths, strips, stride, out);
  case 14:
    return dealToStripsOf<14>(first, depthStride, depths, strips, stride, out);
  case 16:
    return dealToStripsOf<16>(first, depthStride, depths, strips, stride, out);
  case 32:
    return dealToStripsOf<32>(first, depthStride, depths, strips, stride, out);
  }
  for (int64_t k = 0; k < depths; ++k)
    for (int64_t strip = 0; strip < strips; ++strip)
      std::memcpy(out + strip * stride + k * width, first + k * depthStride + strip * width,
                  static_cast<size_t>(width) * sizeof(float));
}

// Rows of a row-major A transposed into a strip, k-major: `Rows` rows (`rowStride` apart) of
// `depths` values each. In blocks of 16 depths (a cache line of each row), each block read into
// registers whole and written out as one contiguous run, with sizes the compiler knows (one
// float per loop trip with run-time bounds took 9% of dX = G W).
template <int64_t Rows>
void transposeIntoStrip(const float* first, int64_t rowStride, int64_t depths, float* out) {
  constexpr int64_t kBlock = 16;
  int64_t k0 = 0;
  for (; k0 + kBlock <= depths; k0 += kBlock) {
    float block[Rows][kBlock];
    for (int64_t i = 0; i < Rows; ++i)
      std::memcpy(block[i], first + i * rowStride + k0, sizeof(block[i]));
    float* to = out + k0 * Rows;
    for (int64_t k = 0; k < kBlock; ++k)
      for (int64_t i = 0; i < Rows; ++i)
        to[k * Rows + i] = block[i][k];
  }
  for (; k0 < depths; ++k0)
    for (int64_t i = 0; i < Rows; ++i)
      out[k0 * Rows + i] = first[i * rowStride + k0];
}

void transposeIntoStrip(const float* first, int64_t rowStride, int64_t depths, int64_t rows,
                        float* out) {
  if (withTileRows(rows, [&](auto constant) {
        transposeIntoStrip<decltype(constant)::value>(first, rowStride, depths, out);
      }))
    return;
  for (int64_t k = 0; k < depths; ++k)
    for (int64_t i = 0; i < rows; ++i)
      out[k * rows + i] = first[i * rowStride + k];
}

// sums[i] += the sum over the depths of row i of a packed strip of A (`Rows` values per depth,
// zero past its `count` rows): the bias gradients' column sums of G. The strip's rows are summed
// in registers, a depth's `Rows` values a vector or two; with a run-time row count the compiler
// left it a float at a time through memory (1.6% of a training step on one thread, 0.8% after).
template <int64_t Rows>
void addStripSumsOf(const float* strip, int64_t depths, int64_t count, float* sums) {
  float total[Rows] = {};
  for (int64_t k = 0; k < depths; ++k)
    for (int64_t i = 0; i < Rows; ++i)
      total[i] += strip[k * Rows + i];
  for (int64_t i = 0; i < count; ++i)
    sums[i] += total[i];
}

void addStripSums(const float* strip, int64_t depths, int64_t rows, int64_t count, float* sums) {
  if (withTileRows(rows, [&](auto constant) {
        addStripSumsOf<decltype(constant)::value>(strip, depths, count, sums);
      }))
    return;
  for (int64_t k = 0; k < depths; ++k)
    for (int64_t i = 0; i < count; ++i)
      sums[i] += strip[k * rows + i];
}

// Rows [row, row + rows) and depths [depth, depth + depths) of A into strips of the tile's
// rows, k-major, `stride` floats apart: strip s holds, per depth, its `tileRows` values (zero
// past A's rows).
void packA(const MatrixView& a, int64_t row, int64_t rows, int64_t depth, int64_t depths,
           int64_t tileRows, int64_t stride, float* out) {
  const int64_t fullStrips = rows / tileRows;
  if (a.rowStride == 1) {
    // A transposed row-major matrix (dW = G^T X): each depth is a contiguous run of A's rows.
    dealToStrips(a.data + row + depth * a.columnStride, a.columnStride, depths, fullStrips,
                 tileRows, stride, out);
  } else if (a.columnStride == 1) {
    // Row-major A (dX = G W): each strip's rows transposed.
    for (int64_t strip = 0; strip < fullStrips; ++strip)
      transposeIntoStrip(a.data + (row + strip * tileRows) * a.rowStride + depth, a.rowStride,
                         depths, tileRows, out + strip * stride);
  }
  // Any other strides, and the last strip when it is short (zero past A's rows).
  const int64_t firstStrip = (a.rowStride == 1 || a.columnStride == 1) ? fullStrips : 0;
  for (int64_t strip = firstStrip * tileRows; strip < rows; strip += tileRows) {
    const int64_t count = std::min(tileRows, rows - strip);
    float* stripOut = out + strip / tileRows * stride;
    for (int64_t k = 0; k < depths; ++k) {
      float* to = stripOut + k * tileRows;
      const float* from = a.data + (row + strip) * a.rowStride + (depth + k) * a.columnStride;
      int64_t i = 0;
      for (; i < count; ++i)
        to[i] = from[i * a.rowStride];
      for (; i < tileRows; ++i)
        to[i] = 0.0f;
    }
  }
}

// Depths [depth, depth + depths) and columns [column, column + columns) of B into strips of
// the tile's columns, k-major, `stride` floats apart (zero past B's columns).
void packB(const MatrixView& b, int64_t depth, int64_t depths, int64_t column, int64_t columns,
           int64_t tileColumns, int64_t stride, float* out) {
  const int64_t fullStrips = b.columnStride == 1 ? columns / tileColumns : 0;
  if (fullStrips > 0) // row-major B: each depth is a contiguous run of B's columns
    dealToStrips(b.data + depth * b.rowStride + column, b.rowStride, depths, fullStrips,
                 tileColumns, stride, out);
  for (int64_t strip = fullStrips * tileColumns; strip < columns; strip += tileColumns) {
    const int64_t count = std::min(tileColumns, columns - strip);
    for (int64_t k = 0; k < depths; ++k) {
      float* to = out + strip / tileColumns * stride + k * tileColumns;
      const float* from = b.data + (depth + k) * b.rowStride + (column + strip) * b.columnStride;
      int64_t j = 0;
      for (; j < count; ++j)
        to[j] = from[j * b.columnStride];
      for (; j < tileColumns; ++j)
        to[j] = 0.0f;
    }
  }
}

// C's rows [rowBegin, rowEnd) of every product on this thread. Per block of the depth, every
// product's B packed (in panels of the tile's column block); per block of A's rows, A packed
// once and run against every panel.
// `bf16`: the operands rounded to bf16 (in pairs, where the tile takes pairs).
void multiplyRows(const Tile& tile, const MatrixView& a, const std::vector<GemmProduct>& products,
                  int64_t rowBegin, int64_t rowEnd, float* rowSums, bool bf16) {
  const int64_t mr = tile.shape.rows, nr = tile.shape.columns;
  const int64_t depth = a.columns;
  const int64_t kc = std::min(tile.depthBlock, depth);
  const int64_t mc = std::min(tile.rowBlock, (rowEnd - rowBegin + mr - 1) / mr * mr);
  // Every depth block's strips as far apart as the first's (the longest), an odd number of lines:
  // packing writes a piece of every strip at each depth, and strips a multiple of 4 KB apart
  // (AVX2's 6-row strips of A over 512 depths are 12 KB apart) took 8.6% of the tile's time in
  // packing, 3.7% after (AVX2 weight gradients, Zen 5).
  // (Pairs: words of two depths each, half as many.)
  const int64_t kcElements = tile.pairs ? (kc + 1) / 2 : kc;
  const int64_t aStride = codegen::oddLinesApart(mr * kcElements),
                bStride = codegen::oddLinesApart(nr * kcElements);
  struct Panel {
    const GemmProduct* product;
    int64_t column, columns; // of the product's B and C
    int64_t offset;          // in the packed panels, per depth block
  };
  std::vector<Panel> panels;
  int64_t packedStrips = 0;
  for (const GemmProduct& product : products)
    for (int64_t jc = 0; jc < product.b.columns; jc += tile.columnBlock) {
      const int64_t columns = std::min(tile.columnBlock, product.b.columns - jc);
      panels.push_back({&product, jc, columns, packedStrips * bStride});
      packedStrips += (columns + nr - 1) / nr;
    }
  // Packing writes every float a tile reads (zero past A's rows and B's columns), so the panels
  // need no clearing; B's are megabytes, reused from the last call's (AlignedBuffer.h).
  AlignedBuffer packedA = AlignedBuffer::uninitialized(mc / mr * aStride),
                packedB = AlignedBuffer::uninitialized(packedStrips * bStride),
                scratch = AlignedBuffer::uninitialized(mr * nr); // cleared before each use
  for (int64_t pc = 0; pc < depth; pc += kc) {
    const int64_t depths = std::min(kc, depth - pc);
    // The tile's depth argument: depths, or pairs of them.
    const int64_t tileDepth = tile.pairs ? (depths + 1) / 2 : depths;
    for (const Panel& panel : panels) {
      float* strips = packedB.data() + panel.offset;
      const int64_t stripCount = (panel.columns + nr - 1) / nr;
      if (tile.pairs) {
        packBPairs(panel.product->b, pc, depths, panel.column, panel.columns, nr, bStride,
                   reinterpret_cast<uint32_t*>(strips));
        continue;
      }
      packB(panel.product->b, pc, depths, panel.column, panel.columns, nr, bStride, strips);
      if (bf16)
        for (int64_t strip = 0; strip < stripCount; ++strip)
          roundToBf16(strips + strip * bStride, nr * depths);
    }
    for (int64_t ic = rowBegin; ic < rowEnd; ic += mc) {
      const int64_t blockRows = std::min(mc, rowEnd - ic);
      if (tile.pairs) {
        packAPairs(a, ic, blockRows, pc, depths, mr, aStride,
                   reinterpret_cast<uint32_t*>(packedA.data()), rowSums);
      } else {
        packA(a, ic, blockRows, pc, depths, mr, aStride, packedA.data());
        if (rowSums)
          for (int64_t ir = 0; ir < blockRows; ir += mr)
            addStripSums(packedA.data() + ir / mr * aStride, depths, mr,
                         std::min(mr, blockRows - ir), rowSums + ic + ir);
        if (bf16) // after the sums, which are of A as given
          for (int64_t ir = 0; ir < blockRows; ir += mr)
            roundToBf16(packedA.data() + ir / mr * aStride, mr * depths);
      }
      for (const Panel& panel : panels) {
        const GemmProduct& product = *panel.product;
        for (int64_t jr = 0; jr < panel.columns; jr += nr) {
          const float* bStrip = packedB.data() + panel.offset + jr / nr * bStride;
          const int64_t tileColumns = std::min(nr, panel.columns - jr);
          for (int64_t ir = 0; ir < blockRows; ir += mr) {
            const float* aStrip = packedA.data() + ir / mr * aStride;
            const int64_t tileRows = std::min(mr, blockRows - ir);
            float* cTile = product.c + (ic + ir) * product.ldc + panel.column + jr;
            if (tileRows == mr && tileColumns == nr) {
              tile.function(tileDepth, aStrip, bStrip, cTile, product.ldc);
              continue;
            }
            std::fill(scratch.data(), scratch.data() + mr * nr, 0.0f);
            tile.function(tileDepth, aStrip, bStrip, scratch.data(), nr);
            for (int64_t i = 0; i < tileRows; ++i)
              for (int64_t j = 0; j < tileColumns; ++j)
                cTile[i * product.ldc + j] += scratch.data()[i * nr + j];
          }
        }
      }
    }
  }
}

} // namespace

void gemmAccumulate(const MatrixView& a, const MatrixView& b, float* c, int64_t ldc, int threads,
                    const std::string& targetCpu, GemmPrecision precision) {
  gemmAccumulate(a, {GemmProduct{b, c, ldc}}, threads, nullptr, targetCpu, precision);
}

codegen::GemmTileShape gemmTileShapeFor(const std::string& targetCpu) {
  return processTile(targetCpu).shape;
}

void gemmAccumulate(const MatrixView& a, const std::vector<GemmProduct>& products, int threads,
                    float* rowSums, const std::string& targetCpu, GemmPrecision precision) {
  RNNC_INTERNAL_CHECK(threads >= 1, "a GEMM's thread count is resolved by its caller");
  std::vector<GemmProduct> work;
  for (const GemmProduct& product : products) {
    RNNC_INTERNAL_CHECK(a.columns == product.b.rows, "GEMM operands' inner sizes differ");
    if (product.b.columns > 0)
      work.push_back(product);
  }
  const int64_t rows = a.rows;
  if (rows <= 0 || a.columns <= 0 || (work.empty() && !rowSums))
    return;
  const bool bf16 = precision == GemmPrecision::Bf16;
  const Tile& tile = processTile(targetCpu, bf16);
  // C's rows split between the threads, each element summed over the whole depth as one thread
  // sums it, so that the result is the same bits on any thread count (an automatic count
  // follows the machine's load). Splitting the depth of the weight gradients instead (each
  // thread packing its part of B rather than all of it, partial sums added at the end) was 1-2%
  // faster at 2 threads (dW = G^T X, T*B = 6400, 4H = 2048, I = 512: 37.8-38.0 against
  // 38.2-39.4 ms, Zen 5) and changed the gradients' bits with the thread count: not done.
  // At least a few of the tile's rows per thread: fewer would pack B for little work.
  threads = static_cast<int>(std::clamp<int64_t>(rows / (4 * tile.shape.rows), 1, threads));
  auto part = [&](int index) {
    // Each thread's rows start on a multiple of the tile's rows.
    const int64_t strips = (rows + tile.shape.rows - 1) / tile.shape.rows;
    const int64_t begin = std::min(rows, strips * index / threads * tile.shape.rows);
    const int64_t end = std::min(rows, strips * (index + 1) / threads * tile.shape.rows);
    if (begin < end)
      multiplyRows(tile, a, work, begin, end, rowSums, bf16);
  };
  std::vector<std::thread> helpers;
  for (int i = 1; i < threads; ++i)
    helpers.emplace_back(part, i);
  part(0);
  for (std::thread& t : helpers)
    t.join();
}

} // namespace rnnc
