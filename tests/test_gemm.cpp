// runtime/exec/Gemm.h: C += A B on the generated tile, against a double-precision loop, at sizes
// that are not multiples of the tile or of the depth, row and column blocks, with transposed and
// strided operands, on 1-3 threads; and the tile itself, generated for AVX2 and (where the host
// has it) AVX-512, run directly.
#include "runtime/exec/Gemm.h"

#include "codegen/Compiler.h"
#include "codegen/GemmTile.h"
#include "ir/Error.h"
#include "runtime/exec/CompiledCell.h"

#include <Eigen/Core>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace rnnc {
namespace {

std::vector<float> randomValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v)
    x = uniform(rng);
  return v;
}

// C[M, N] (given) + A B in double precision.
std::vector<double> reference(const MatrixView& a, const MatrixView& b, const std::vector<float>& c,
                              int64_t ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.columns; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < a.columns; ++k)
        sum += static_cast<double>(a.at(i, k)) * b.at(k, j);
      out[static_cast<size_t>(i * ldc + j)] += sum;
    }
  return out;
}

void expectNear(const std::vector<float>& got, const std::vector<double>& want, int64_t depth,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  const double tolerance = 1e-6 * (depth + 10);
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - want[i]) > tolerance && reported++ < 5)
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
}

struct Shape {
  int64_t m, n, k;
};

// Past every edge: one element, a partial tile each way, a depth past the depth block (512),
// rows past the row block, columns past the 4096-column panel; and the last two with rows
// enough for several threads over several panels and several depth blocks.
const Shape kShapes[] = {{1, 1, 1},      {7, 17, 3},      {13, 33, 300},
                         {100, 70, 600}, {600, 50, 40},   {5, 4200, 9},
                         {64, 512, 257}, {120, 4130, 20}, {130, 70, 1100}};

TEST(Gemm, RowMajorOperandsMatchTheReference) {
  for (const Shape& s : kShapes)
    for (int threads : {1, 2, 3}) {
      std::vector<float> a = randomValues(s.m * s.k, 1), b = randomValues(s.k * s.n, 2);
      std::vector<float> c = randomValues(s.m * s.n, 3); // accumulated into
      MatrixView va = MatrixView::rowMajor(a.data(), s.m, s.k, s.k);
      MatrixView vb = MatrixView::rowMajor(b.data(), s.k, s.n, s.n);
      std::vector<double> want = reference(va, vb, c, s.n);
      gemmAccumulate(va, vb, c.data(), s.n, threads);
      expectNear(c, want, s.k,
                 "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) +
                     " K=" + std::to_string(s.k) + " threads=" + std::to_string(threads));
    }
}

// The CPUs whose tiles the products can run here: this machine's, and AVX2's (6 x 16) where it
// runs.
std::vector<std::string> tileTargets() {
  std::vector<std::string> targets{""};
  try {
    codegen::runnableTarget("haswell");
    targets.push_back("haswell");
  } catch (const UserError&) {
  }
  return targets;
}

// One A against several B (a layer's dW_ih and dW_hh from the same G^T), one of them wider than
// the 4096-column panel, with A's row sums (its bias gradient): each C and the sums as the
// reference gives them, at depths past the depth block, on 1-3 threads, with this machine's
// tile and AVX2's (whose strips of A, 6 rows, are dealt from G's rows at another width).
TEST(Gemm, SharedOperandProductsAndRowSumsMatchTheReference) {
  const int64_t wide = 41, gWidth = 29;
  for (const std::string& target : tileTargets())
    for (int64_t depth : {1, 37, 700}) {
      std::vector<float> o = randomValues(depth * wide, 21);
      MatrixView g{o.data() + 3, depth, gWidth, wide, 1}; // G: [depth, gWidth], a column slice
      const MatrixView a = g.transposed();                // A = G^T: [gWidth, depth]
      const int64_t columns[] = {19, 4100, 1};
      for (int threads : {1, 2, 3}) {
        std::vector<std::vector<float>> bs, cs;
        std::vector<GemmProduct> products;
        std::vector<std::vector<double>> want;
        for (size_t p = 0; p < 3; ++p) {
          bs.push_back(randomValues(depth * columns[p], 22 + p));
          cs.push_back(randomValues(gWidth * (columns[p] + 2), 25 + p));
          const MatrixView b = MatrixView::rowMajor(bs[p].data(), depth, columns[p], columns[p]);
          want.push_back(reference(a, b, cs[p], columns[p] + 2));
          products.push_back({b, nullptr, columns[p] + 2});
        }
        for (size_t p = 0; p < 3; ++p)
          products[p].c = cs[p].data();
        std::vector<float> sums = randomValues(gWidth, 28);
        std::vector<double> wantSums(sums.begin(), sums.end());
        for (int64_t i = 0; i < gWidth; ++i)
          for (int64_t k = 0; k < depth; ++k)
            wantSums[i] += a.at(i, k);
        gemmAccumulate(a, products, threads, sums.data(), target);
        const std::string what = "target '" + target + "', depth " + std::to_string(depth) +
                                 ", threads " + std::to_string(threads);
        for (size_t p = 0; p < 3; ++p)
          expectNear(cs[p], want[p], depth, what + ", product " + std::to_string(p));
        expectNear(sums, wantSums, depth, what + ", row sums");
      }
    }
}

TEST(Gemm, TransposedAndStridedOperandsAndPaddedOutput) {
  // The training's shapes in small: dW += G^T X with G a column slice of wider rows, and
  // dX += G W; C with more floats per row than it has columns (the rest untouched).
  const int64_t rows = 301, wide = 50, gOffset = 7, gWidth = 37, features = 19, ldc = 23;
  std::vector<float> o = randomValues(rows * wide, 4), x = randomValues(rows * features, 5);
  MatrixView g{o.data() + gOffset, rows, gWidth, wide, 1};
  MatrixView vx = MatrixView::rowMajor(x.data(), rows, features, features);
  for (int threads : {1, 2}) {
    std::vector<float> dW = randomValues(gWidth * ldc, 6);
    std::vector<double> want = reference(g.transposed(), vx, dW, ldc);
    gemmAccumulate(g.transposed(), vx, dW.data(), ldc, threads);
    expectNear(dW, want, rows, "G^T X");

    std::vector<float> w = randomValues(features * gWidth, 7); // W [features, gWidth]: dX += G W^T
    MatrixView wt = MatrixView::rowMajor(w.data(), features, gWidth, gWidth).transposed();
    std::vector<float> dX = randomValues(rows * ldc, 8);
    std::vector<double> wantX = reference(g, wt, dX, ldc);
    gemmAccumulate(g, wt, dX.data(), ldc, threads);
    expectNear(dX, wantX, gWidth, "G W^T");
  }
}

// bf16 products (GemmPrecision::Bf16, mixed-precision training's dW and dX): the reference on
// operands rounded by Eigen's bfloat16, on the host's code (vdpbf16ps pairs where it has
// AVX512_BF16), Zen 4's (pairs) where the host can run it, Skylake's and AVX2's (the fp32 tile on
// rounded values): every edge of kShapes, the shared-operand products with row sums (of A as
// given) over several row blocks and an odd depth past the depth block, on 1 and 2 threads.
std::vector<float> bf16Rounded(std::vector<float> values) {
  for (float& v : values)
    v = static_cast<float>(Eigen::bfloat16(v));
  return values;
}

std::vector<std::string> bf16Targets() {
  std::vector<std::string> targets = tileTargets();
  for (const std::string cpu : {"skylake-avx512", "znver4"}) {
    try {
      const codegen::Target target = codegen::runnableTarget(cpu);
      if (cpu == "skylake-avx512" || target.has("avx512bf16")) // (znver4's code pairs)
        targets.push_back(cpu);
    } catch (const UserError&) { // not runnable here
    }
  }
  return targets;
}

TEST(Gemm, Bf16ProductsAreTheReferenceOnRoundedOperands) {
  for (const std::string& target : bf16Targets())
    for (const Shape& s : kShapes)
      for (int threads : {1, 2}) {
        const std::vector<float> a = randomValues(s.m * s.k, 31), b = randomValues(s.k * s.n, 32);
        std::vector<float> c = randomValues(s.m * s.n, 33);
        const std::vector<float> roundedA = bf16Rounded(a), roundedB = bf16Rounded(b);
        std::vector<double> want =
            reference(MatrixView::rowMajor(roundedA.data(), s.m, s.k, s.k),
                      MatrixView::rowMajor(roundedB.data(), s.k, s.n, s.n), c, s.n);
        std::vector<double> unrounded =
            reference(MatrixView::rowMajor(a.data(), s.m, s.k, s.k),
                      MatrixView::rowMajor(b.data(), s.k, s.n, s.n), c, s.n);
        gemmAccumulate(MatrixView::rowMajor(a.data(), s.m, s.k, s.k),
                       MatrixView::rowMajor(b.data(), s.k, s.n, s.n), c.data(), s.n, threads,
                       target, GemmPrecision::Bf16);
        const std::string what = "target '" + target + "' M=" + std::to_string(s.m) +
                                 " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                                 " threads=" + std::to_string(threads);
        expectNear(c, want, s.k, what);
        double apart = 0; // from the products of the operands as given: the rounding's
        for (size_t i = 0; i < c.size(); ++i)
          apart = std::max(apart, std::abs(c[i] - unrounded[i]));
        EXPECT_GT(apart, 1e-4) << what << ": the operands were not rounded";
      }
}

TEST(Gemm, Bf16SharedOperandProductsAndRowSumsOfAAsGiven) {
  const int64_t wide = 310, gWidth = 300; // A's rows: more than a row block (252 at AVX-512)
  for (const std::string& target : bf16Targets())
    for (int64_t depth : {37, 701})
      for (int threads : {1, 2}) {
        std::vector<float> o = randomValues(depth * wide, 41);
        const std::vector<float> roundedO = bf16Rounded(o);
        const MatrixView a = MatrixView{o.data() + 3, depth, gWidth, wide, 1}.transposed();
        const MatrixView roundedA =
            MatrixView{roundedO.data() + 3, depth, gWidth, wide, 1}.transposed();
        const int64_t columns[] = {19, 70};
        std::vector<std::vector<float>> bs, roundedBs, cs;
        std::vector<GemmProduct> products;
        std::vector<std::vector<double>> want;
        for (size_t p = 0; p < 2; ++p) {
          bs.push_back(randomValues(depth * columns[p], 42 + p));
          roundedBs.push_back(bf16Rounded(bs[p]));
          cs.push_back(randomValues(gWidth * columns[p], 44 + p));
          want.push_back(reference(
              roundedA, MatrixView::rowMajor(roundedBs[p].data(), depth, columns[p], columns[p]),
              cs[p], columns[p]));
        }
        for (size_t p = 0; p < 2; ++p)
          products.push_back({MatrixView::rowMajor(bs[p].data(), depth, columns[p], columns[p]),
                              cs[p].data(), columns[p]});
        std::vector<float> sums = randomValues(gWidth, 46);
        std::vector<double> wantSums(sums.begin(), sums.end());
        for (int64_t i = 0; i < gWidth; ++i)
          for (int64_t k = 0; k < depth; ++k)
            wantSums[static_cast<size_t>(i)] += a.at(i, k);
        gemmAccumulate(a, products, threads, sums.data(), target, GemmPrecision::Bf16);
        const std::string what = "target '" + target + "', depth " + std::to_string(depth) +
                                 ", threads " + std::to_string(threads);
        for (size_t p = 0; p < 2; ++p)
          expectNear(cs[p], want[p], depth, what + ", product " + std::to_string(p));
        expectNear(sums, wantSums, depth, what + ", row sums");
      }
}

TEST(Gemm, EmptyProductsLeaveCAlone) {
  std::vector<float> c = {1, 2, 3, 4};
  std::vector<float> a(4), b(4);
  gemmAccumulate(MatrixView::rowMajor(a.data(), 2, 0, 0), MatrixView::rowMajor(b.data(), 0, 2, 2),
                 c.data(), 2, 1);
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 4}));
}

// The tile generated for a named CPU, run on one full tile at a depth of 37 (no depth is a
// multiple of anything), against the reference; skipped where the host lacks the CPU's vectors.
void checkTileFor(const std::string& cpu) {
  codegen::Target target;
  try {
    target = codegen::runnableTarget(cpu);
  } catch (const UserError& e) {
    GTEST_SKIP() << e.what();
  }
  const codegen::GemmTileShape shape = codegen::gemmTileShape(target);
  EXPECT_EQ(shape.columns, 2 * target.vectorWidth);
  EXPECT_EQ(shape.rows, (target.vectorRegisters - 4) / 2);
  LoadedFunction loaded = loadGeneratedCode(
      codegen::generateGemmTile(target, codegen::Stage::Object), codegen::kGemmTileFunctionName);
  auto tile = reinterpret_cast<RnncGemmTileFunction>(loaded.address);
  const int64_t depth = 37, ldc = shape.columns + 3;
  std::vector<float> a = randomValues(depth * shape.rows, 9);
  std::vector<float> b = randomValues(depth * shape.columns, 10);
  std::vector<float> c = randomValues(shape.rows * ldc, 11);
  // The packed operands as views: A's (i, k) at a[k * rows + i], B's (k, j) at b[k * columns + j].
  MatrixView va{a.data(), shape.rows, depth, 1, shape.rows};
  MatrixView vb = MatrixView::rowMajor(b.data(), depth, shape.columns, shape.columns);
  std::vector<double> want = reference(va, vb, c, ldc);
  tile(depth, a.data(), b.data(), c.data(), ldc);
  expectNear(c, want, depth, cpu + " tile");
  const std::string assembly = codegen::generateGemmTile(target, codegen::Stage::Assembly);
  EXPECT_NE(assembly.find(target.vectorWidth == 16 ? "zmm" : "ymm"), std::string::npos);
  EXPECT_NE(assembly.find("vfmadd"), std::string::npos);
}

TEST(GemmTile, Avx2TileMatchesTheReference) {
  checkTileFor("haswell");
}
TEST(GemmTile, Avx512TileMatchesTheReference) {
  checkTileFor("skylake-avx512");
}

// The products take the tile of the target they are asked for, as a layer built for another
// CPU does for its weight gradients: AVX2's (6 x 16) for haswell on any host that runs it, with
// the same sums as the reference past every edge.
TEST(Gemm, ProductsForANamedCpuUseItsTile) {
  try {
    codegen::runnableTarget("haswell");
  } catch (const UserError& e) {
    GTEST_SKIP() << e.what();
  }
  const codegen::GemmTileShape shape = gemmTileShapeFor("haswell");
  EXPECT_EQ(shape.rows, 6);
  EXPECT_EQ(shape.columns, 16);
  for (const Shape& s : kShapes) {
    std::vector<float> a = randomValues(s.m * s.k, 4), b = randomValues(s.k * s.n, 5);
    std::vector<float> c = randomValues(s.m * s.n, 6);
    MatrixView va = MatrixView::rowMajor(a.data(), s.m, s.k, s.k);
    MatrixView vb = MatrixView::rowMajor(b.data(), s.k, s.n, s.n);
    std::vector<double> want = reference(va, vb, c, s.n);
    gemmAccumulate(va, vb, c.data(), s.n, 2, "haswell");
    expectNear(c, want, s.k,
               "haswell M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) +
                   " K=" + std::to_string(s.k));
  }
}

} // namespace
} // namespace rnnc
