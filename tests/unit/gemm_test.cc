// kiln's GEMM templates (runtime/cpu/gemm/) against a plain double-precision product, on every
// tile of every ISA build this machine runs, with odd and SIMD-multiple sizes, several K / M / N
// blocks, thread grids, transposed and packed operands and every part of the epilogue; and the
// kiln.gemm kernels against the reference kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "compile/pipeline.h"
#include "formats/infer.h"
#include "runtime/compare.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/gemm/prefetch.h"
#include "runtime/cpu/linear.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "runtime/threads.h"
#include "tests/unit/kernel_test_util.h"

namespace kiln {
namespace {

using cpu::Isa;
using testing::attr;
using testing::check;
using testing::isa_paths;
using testing::noise;
using testing::to_bf16;
using testing::to_f16;
namespace gemm = cpu::gemm;

std::vector<Isa> isas() {
  std::vector<Isa> out;
  if (cpu::best_isa(CpuFeatures::host()) == Isa::avx512) out.push_back(Isa::avx512);
  if (cpu::best_isa(CpuFeatures::host())) out.push_back(Isa::avx2);
  return out;
}

struct Operands {
  int64_t m, n, k;
  bool trans_a = false, trans_b = false;
  bool bias = false, residual = false;
  ActivationSpec act, post;
};

// C = post(act(A·B + bias) + Z) in double, A and B as stored (transposed when asked).
std::vector<float> expected(const Operands& o, const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& z) {
  std::vector<float> c(static_cast<size_t>(o.m * o.n));
  auto apply = [](const ActivationSpec& s, double v) {
    switch (s.kind) {
      case Activation::none: return v;
      case Activation::relu: return std::max(v, 0.0);
      case Activation::gelu: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      case Activation::clip: return std::min(std::max(v, double{s.a}), double{s.b});
      case Activation::silu: return v / (1 + std::exp(-v));
      case Activation::sigmoid: return 1 / (1 + std::exp(-v));
      default: return std::nan("");
    }
  };
  for (int64_t i = 0; i < o.m; ++i)
    for (int64_t j = 0; j < o.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < o.k; ++p) {
        const float av = o.trans_a ? a.data<float>()[p * o.m + i] : a.data<float>()[i * o.k + p];
        const float bv = o.trans_b ? b.data<float>()[j * o.k + p] : b.data<float>()[p * o.n + j];
        s += double{av} * bv;
      }
      if (o.bias) s += bias.data<float>()[j];
      s = apply(o.act, s);
      if (o.residual) s += z.data<float>()[i * o.n + j];
      c[static_cast<size_t>(i * o.n + j)] = static_cast<float>(apply(o.post, s));
    }
  return c;
}

// Runs the product with `p` (B packed ahead when `packed`) and compares it with expected().
void check_gemm(const gemm::GemmParams& p, const Operands& o, bool packed) {
  SCOPED_TRACE(p.name() + " m=" + std::to_string(o.m) + " n=" + std::to_string(o.n) + " k=" + std::to_string(o.k) +
               (o.trans_a ? " transA" : "") + (o.trans_b ? " transB" : "") + (packed ? " packedB" : ""));
  const Tensor a = noise(o.trans_a ? std::vector<int64_t>{o.k, o.m} : std::vector<int64_t>{o.m, o.k}, 1);
  const Tensor b = noise(o.trans_b ? std::vector<int64_t>{o.n, o.k} : std::vector<int64_t>{o.k, o.n}, 2);
  const Tensor bias = noise({o.n}, 3), z = noise({o.m, o.n}, 4);
  std::vector<float> bp;
  gemm::GemmProblem g{.m = o.m, .n = o.n, .k = o.k, .a = a.data<float>(), .lda = o.trans_a ? o.m : o.k, .trans_a = o.trans_a,
                      .b = b.data<float>(), .ldb = o.trans_b ? o.k : o.n, .trans_b = o.trans_b};
  if (packed) {
    bp.assign(static_cast<size_t>(gemm::packed_b_floats(o.k, o.n, p.tile.nr)), std::nanf(""));
    gemm::pack_b(b.data<float>(), g.ldb, o.trans_b, o.k, o.n, p.tile.nr, bp.data());
    g.b = bp.data();
    g.b_packed = true;
  }
  std::vector<float> c(static_cast<size_t>(o.m * o.n), std::nanf(""));
  g.c = c.data();
  g.ldc = o.n;
  g.epilogue = gemm::Epilogue{.bias = o.bias ? bias.data<float>() : nullptr, .z = o.residual ? z.data<float>() : nullptr,
                              .ldz = o.n, .act = o.act, .post = o.post};
  Tensor ws(DType::u8, {static_cast<int64_t>(gemm::workspace_bytes(p, g)) + 1});
  gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
  const std::vector<float> want = expected(o, a, b, bias, z);
  double err = 0, ref = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_FALSE(std::isnan(c[i])) << "element " << i << " not written";
    err += (double{c[i]} - want[i]) * (double{c[i]} - want[i]);
    ref += double{want[i]} * want[i];
  }
  EXPECT_LE(std::sqrt(err / std::max(ref, 1e-30)), 2e-6);
}

// `p` with blocks of one tile and 5 steps of K: several K slices, M and N blocks per product.
gemm::GemmParams small_blocks(gemm::GemmParams p) {
  p.kc = 5;
  p.mc = p.tile.mr;
  p.nc = p.tile.nr;
  return p;
}

// The thread grids (tm, tn) of two threads, and one. Two threads split one dimension, each
// share in chunks that either thread may take (run's queues).
constexpr std::pair<int, int> kGrids[] = {{1, 1}, {2, 1}, {1, 2}};

TEST(Gemm, EveryTileOddSizesBlocksAndGrids) {
  ASSERT_FALSE(isas().empty()) << "this machine has neither AVX2 nor AVX-512";
  use_threads(2);
  for (Isa isa : isas())
    for (const gemm::Tile& t : gemm::tiles(isa))
      for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {1, 1, 1}, {5, 17, 7}, {t.mr, t.nr, 16}, {2 * t.mr + 1, 3 * t.nr - 5, 37}, {37, 130, 301},
               // enough panels, or rows of tiles, for each thread's share to be cut into chunks of several
               {3, 70 * t.nr + 5, 9}, {70 * t.mr + 3, 5, 9}})
        for (bool pack_a : {false, true}) {
          gemm::GemmParams p = gemm::default_params(isa, t, gemm::CacheSizes::host(), m, n, k, 1);
          p.pack_a = pack_a;
          check_gemm(p, {m, n, k}, true);
          // Small blocks: several K slices, M and N blocks, and both thread grids.
          p = small_blocks(p);
          for (auto [tm, tn] : kGrids) {
            p.tm = tm;
            p.tn = tn;
            check_gemm(p, {m, n, k}, true);
            check_gemm(p, {m, n, k}, false);
          }
        }
}

// Runs `g` with C in parts of `widths` columns (3 floats past each part's rows, which stay
// untouched; the second part plain) and checks each part bit for bit against the whole C with
// the activation (`whole`) or, for the plain part, without it (`bare`).
void check_column_parts(const gemm::GemmParams& p, gemm::GemmProblem g, const std::vector<int64_t>& widths,
                        const std::vector<float>& whole, const std::vector<float>& bare, std::byte* ws) {
  std::vector<std::vector<float>> out;
  std::vector<gemm::ColumnPart> parts;
  int64_t begin = 0;
  for (int64_t w : widths) {
    out.emplace_back(static_cast<size_t>(g.m * (w + 3)), std::nanf(""));
    parts.push_back({.begin = begin, .c = out.back().data(), .ldc = w + 3, .plain = parts.size() == 1});
    begin += w;
  }
  g.c = nullptr;
  g.parts = parts;
  gemm::run(p, g, ws);
  for (size_t q = 0; q < parts.size(); ++q)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < widths[q] + 3; ++j) {
        const float got = out[q][static_cast<size_t>(i * (widths[q] + 3) + j)];
        if (j >= widths[q]) EXPECT_TRUE(std::isnan(got)) << "part " << q << " wrote past its row " << i;
        else ASSERT_EQ(got, (parts[q].plain ? bare : whole)[static_cast<size_t>(i * g.n + parts[q].begin + j)]) << "part " << q << " at " << i << ", " << j;
      }
}

// C in parts that lie apart (split outputs): every tile lands in its part, rows `ldc` apart,
// bit for bit what the whole C gets, the middle part without the activation (`plain`); with no
// K (the bias alone) too.
TEST(Gemm, ColumnPartsTakeTheirColumns) {
  use_threads(2);
  for (Isa isa : isas())
    for (const gemm::Tile& t : gemm::tiles(isa))
      for (int64_t k : {int64_t{37}, int64_t{0}}) {
        const int64_t m = 2 * t.mr + 1;
        const std::vector<int64_t> widths = {t.nr, 2 * t.nr, 5};
        const int64_t n = widths[0] + widths[1] + widths[2];
        const Tensor a = noise({m, std::max<int64_t>(k, 1)}, 1), b = noise({std::max<int64_t>(k, 1), n}, 2), bias = noise({n}, 3);
        gemm::GemmParams p = small_blocks(gemm::default_params(isa, t, gemm::CacheSizes::host(), m, n, k, 1));
        for (auto [tm, tn] : kGrids) {
          p.tm = tm;
          p.tn = tn;
          SCOPED_TRACE(p.name() + " k=" + std::to_string(k));
          gemm::GemmProblem g{.m = m, .n = n, .k = k, .a = a.data<float>(), .lda = std::max<int64_t>(k, 1), .b = b.data<float>(), .ldb = n};
          g.epilogue = gemm::Epilogue{.bias = bias.data<float>()};
          Tensor ws(DType::u8, {static_cast<int64_t>(gemm::workspace_bytes(p, g)) + 1});
          std::vector<float> whole(static_cast<size_t>(m * n), std::nanf("")), bare = whole;
          g.c = bare.data();
          g.ldc = n;
          gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
          g.epilogue.act = {Activation::gelu};
          g.c = whole.data();
          gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
          check_column_parts(p, g, widths, whole, bare, static_cast<std::byte*>(ws.raw()));
        }
      }
}

// A gated product (SwiGLU): B's columns alternate 64 values and their 64 gates; Y, half as
// wide, is value · SiLU(gate). Every tile whose width divides 64, K over several slices and
// none, one-tile blocks (the gates' tiles in other Nc blocks than their values'), all three
// thread grids (two threads split N in whole pairs of blocks); bit-equal to the whole product
// combined by the row kernels, and nothing written past Y's rows.
TEST(Gemm, GatedProductsMultiplyValuesByTheirGates) {
  use_threads(2);
  constexpr int64_t kBlock = 64, n = 3 * 2 * kBlock, half = n / 2, ldy = half + 3;
  for (Isa isa : isas())
    for (const gemm::Tile& t : gemm::tiles(isa)) {
      if (kBlock % t.nr != 0) continue;
      for (int64_t k : {int64_t{37}, int64_t{0}})
        for (bool small : {true, false}) {
          const int64_t m = 2 * t.mr + 1;
          const Tensor a = noise({m, std::max<int64_t>(k, 1)}, 1), b = noise({std::max<int64_t>(k, 1), n}, 2), bias = noise({n}, 3);
          gemm::GemmParams p = gemm::default_params(isa, t, gemm::CacheSizes::host(), m, n, k, 1);
          if (small) p = small_blocks(p);
          gemm::GemmProblem g{.m = m, .n = n, .k = k, .a = a.data<float>(), .lda = std::max<int64_t>(k, 1), .b = b.data<float>(), .ldb = n};
          g.epilogue = gemm::Epilogue{.bias = bias.data<float>()};
          std::vector<float> whole(static_cast<size_t>(m * n));
          g.c = whole.data();
          g.ldc = n;
          Tensor whole_ws(DType::u8, {static_cast<int64_t>(gemm::workspace_bytes(p, g)) + 1});
          gemm::run(p, g, static_cast<std::byte*>(whole_ws.raw()));
          // The expected Y: each value times its gate's SiLU, as the row kernels compute it.
          std::vector<float> want(static_cast<size_t>(m * half));
          for (int64_t i = 0; i < m; ++i) {
            std::vector<float> gate(static_cast<size_t>(half));
            for (int64_t j = 0; j < half; ++j) gate[static_cast<size_t>(j)] = whole[static_cast<size_t>(i * n + j / kBlock * 2 * kBlock + kBlock + j % kBlock)];
            cpu::row_kernels(isa).activation(gate.data(), gate.data(), half, {Activation::silu});
            for (int64_t j = 0; j < half; ++j)
              want[static_cast<size_t>(i * half + j)] = whole[static_cast<size_t>(i * n + j / kBlock * 2 * kBlock + j % kBlock)] * gate[static_cast<size_t>(j)];
          }
          g.epilogue.act = {Activation::silu};
          for (auto [tm, tn] : kGrids) {
            p.tm = tm;
            p.tn = tn;
            SCOPED_TRACE(p.name() + " k=" + std::to_string(k));
            std::vector<float> y(static_cast<size_t>(m * ldy), std::nanf("")), gates(static_cast<size_t>(m * half), std::nanf(""));
            g.c = y.data();
            g.ldc = ldy;
            g.gate_block = kBlock;
            g.gates = gates.data();
            g.ldgates = half;
            Tensor ws(DType::u8, {static_cast<int64_t>(gemm::workspace_bytes(p, g)) + 1});
            gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < ldy; ++j) {
                const float got = y[static_cast<size_t>(i * ldy + j)];
                if (j >= half) EXPECT_TRUE(std::isnan(got)) << "wrote past row " << i;
                else EXPECT_EQ(got, want[static_cast<size_t>(i * half + j)]) << "at " << i << ", " << j;
              }
          }
        }
    }
}

// A Sigmoid or SiLU alone after the bias: a panel's whole tiles apply it in their registers
// (panel()) as they store their last K slice, the panel's last rows and a few rows' streamed
// panels get it from the row kernels after the product. Every element has the bits the row
// kernels give the plain product's (one definition, logistic.inc), on every tile, A in place
// and packed, one K slice and several, one thread and two; and it is the activation
// (expected()).
TEST(Gemm, SigmoidAndSiluInTheRegistersAreTheRowKernels) {
  use_threads(2);
  for (Isa isa : isas())
    for (const gemm::Tile& t : gemm::tiles(isa))
      for (Activation kind : {Activation::silu, Activation::sigmoid})
        for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
                 {4 * t.mr + 3, 2 * t.nr + 5, 37}, {5 * t.mr, t.nr, 16}, {3, 4 * t.nr, 20}})
          for (bool pack_a : {false, true})
            for (bool small : {false, true}) {
              gemm::GemmParams p = gemm::default_params(isa, t, gemm::CacheSizes::host(), m, n, k, 1);
              p.pack_a = pack_a;
              if (small) p = small_blocks(p);
              const Operands o{m, n, k, false, false, true, false, {kind}, {}};
              check_gemm(p, o, true);
              const Tensor a = noise({m, k}, 5), b = noise({k, n}, 6), bias = noise({n}, 7);
              std::vector<float> bp(static_cast<size_t>(gemm::packed_b_floats(k, n, t.nr)));
              gemm::pack_b(b.data<float>(), n, false, k, n, t.nr, bp.data());
              for (auto [tm, tn] : kGrids) {
                p.tm = tm;
                p.tn = tn;
                SCOPED_TRACE(p.name() + (kind == Activation::silu ? " silu" : " sigmoid") + " m=" + std::to_string(m) +
                             " n=" + std::to_string(n) + " k=" + std::to_string(k));
                std::vector<float> plain(static_cast<size_t>(m * n)), activated(plain.size());
                gemm::GemmProblem g{.m = m, .n = n, .k = k, .a = a.data<float>(), .lda = k, .b = bp.data(), .b_packed = true,
                                    .c = plain.data(), .ldc = n, .epilogue = {.bias = bias.data<float>()}};
                Tensor ws(DType::u8, {static_cast<int64_t>(gemm::workspace_bytes(p, g)) + 1});
                gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
                cpu::row_kernels(isa).activation(plain.data(), plain.data(), m * n, {kind});
                g.c = activated.data();
                g.epilogue.act = {kind};
                gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
                for (size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(activated[i], plain[i]) << "element " << i;
              }
            }
}

// The default thread grid splits N first, then M, never into more M parts than M has rows of
// tiles: a single row's product runs on every thread that has a panel of N; M alone for a small
// B and rows enough.
TEST(Gemm, DefaultGridNeverLeavesThreadsWithoutRows) {
  const gemm::Tile t{8, 48};
  const gemm::CacheSizes& c = gemm::CacheSizes::host();
  // {tm, tn} of the default grid for M×N×K on `threads` with these caches.
  auto grid = [&](const gemm::CacheSizes& caches, int64_t m, int64_t n, int64_t k, int threads) {
    const gemm::GemmParams p = gemm::default_params(Isa::avx512, t, caches, m, n, k, threads);
    return std::pair{p.tm, p.tn};
  };
  EXPECT_EQ(grid(c, 1, 1000, 2048, 16), std::pair(1, 16));  // 21 panels
  EXPECT_EQ(grid(c, 1, 100, 64, 2), std::pair(1, 2));       // 3 panels
  EXPECT_EQ(grid(c, 1, 40, 64, 4), std::pair(1, 1));        // 1 panel: one thread
  EXPECT_EQ(grid(c, 10, 100, 64, 4), std::pair(2, 2));      // 2 row tiles, 3 panels
  EXPECT_EQ(grid(c, 128, 768, 768, 16), std::pair(2, 8));   // BERT's: N first, then M
  // M alone where B fits half of L2 and each thread has 192 rows or more: EfficientNet-B0's
  // 28x28 expansion (40 -> 240 channels), YOLO's 20x20 head layer; not EfficientNet-B0's 14x14
  // expansions (196 rows), nor over 7x7 pixels, nor by a B past half of L2.
  const gemm::CacheSizes two_mib{.l1d = 48 << 10, .l2 = 2 << 20, .l3 = 32 << 20};
  EXPECT_EQ(grid(two_mib, 784, 240, 40, 2), std::pair(2, 1));
  EXPECT_EQ(grid(two_mib, 400, 255, 128, 2), std::pair(2, 1));
  EXPECT_EQ(grid(two_mib, 196, 672, 112, 2), std::pair(1, 2));
  EXPECT_EQ(grid(two_mib, 49, 1152, 192, 2), std::pair(1, 2));
  EXPECT_EQ(grid(two_mib, 784, 768, 768, 2), std::pair(1, 2));
  use_threads(2);
  for (Isa isa : isas()) check_gemm(gemm::default_params(isa, gemm::tiles(isa)[0], c, 1, 300, 70, 2), {1, 300, 70, false, false, true}, true);
}

// The default Mc: half of L2 over Kc, but 128 rows (whole tiles) where K is 64 or less and B
// has more than one panel (that fits half of L2): the product then writes C in blocks of whole
// rows, not one panel's columns down all of M.
TEST(Gemm, DefaultMcWritesWholeRowsOfAShortProduct) {
  const gemm::CacheSizes c{.l1d = 48 << 10, .l2 = 1280 << 10, .l3 = 24 << 20};
  EXPECT_EQ(gemm::default_params(Isa::avx512, gemm::Tile{6, 64}, c, 3136, 256, 64, 1).mc, 132);
  EXPECT_EQ(gemm::default_params(Isa::avx512, gemm::Tile{8, 48}, c, 12544, 96, 16, 1).mc, 128);
  EXPECT_EQ(gemm::default_params(Isa::avx512, gemm::Tile{8, 48}, c, 12544, 96, 16, 2).mc, 128);
  EXPECT_EQ(gemm::default_params(Isa::avx512, gemm::Tile{6, 64}, c, 3136, 64, 64, 1).mc, 2556);  // one panel: L2's
  EXPECT_EQ(gemm::default_params(Isa::avx512, gemm::Tile{6, 64}, c, 784, 512, 128, 1).mc, 786);   // K past 64
}

// The default Kc: K whole up to the L1 bound (eight rows of A over Kc in two thirds of L1d),
// a longer K in equal chunks of whole 16s under it, never past the L2 bound.
TEST(Gemm, DefaultKcChunksLongK) {
  const gemm::Tile t{8, 48};
  gemm::CacheSizes c;
  c.l1d = 48 << 10, c.l2 = 2 << 20, c.l3 = 64 << 20;
  EXPECT_EQ(gemm::default_params(Isa::avx512, t, c, 128, 768, 1024, 1).kc, 1024);
  EXPECT_EQ(gemm::default_params(Isa::avx512, t, c, 128, 768, 1000, 1).kc, 1000);
  EXPECT_EQ(gemm::default_params(Isa::avx512, t, c, 128, 768, 3072, 1).kc, 1024);  // 3 chunks
  EXPECT_EQ(gemm::default_params(Isa::avx512, t, c, 96, 512, 4608, 1).kc, 928);    // 5 chunks, the last 896
  EXPECT_EQ(gemm::default_params(Isa::avx512, t, c, 128, 768, 1100, 1).kc, 560);   // 2 chunks
  c.l1d = 32 << 10;  // 672 at most
  EXPECT_EQ(gemm::default_params(Isa::avx512, t, c, 128, 768, 3072, 1).kc, 624);
  c.l2 = 128 << 10;  // the L2 bound below the L1 one: 128 KiB * 3/4 / (4 * 56) = 438
  EXPECT_EQ(gemm::default_params(Isa::avx512, t, c, 128, 768, 3072, 1).kc, 432);
}

// But with AVX-512's tiles of 48 columns or more, more than one tile of rows and 64 or fewer by
// a weight of a quarter of L2 or more into a C of a quarter of L2 or less: K in equal chunks
// whose Kc×NR slice of B fits two thirds of L1d (ResNet-50's 7x7 layers, a language model's
// 32-row products); not for one tile's rows, 96 rows, a K under two slices, a small weight, a
// wide C (a language model's head), nor the narrower tiles (14x32, AVX2's).
TEST(Gemm, DefaultKcShortForFewRowsByAStreamingWeight) {
  const gemm::CacheSizes c{.l1d = 48 << 10, .l2 = 2 << 20, .l3 = 64 << 20};
  auto kc = [&](Isa isa, gemm::Tile t, int64_t m, int64_t n, int64_t k) { return gemm::default_params(isa, t, c, m, n, k, 1).kc; };
  EXPECT_EQ(kc(Isa::avx512, {6, 64}, 49, 512, 2048), 128);   // 32 KiB of B: 16 chunks
  EXPECT_EQ(kc(Isa::avx512, {6, 64}, 49, 512, 4608), 128);   // 36 chunks
  EXPECT_EQ(kc(Isa::avx512, {8, 48}, 32, 3072, 768), 160);   // 160 at most: 5 chunks of 154 -> 160
  EXPECT_EQ(kc(Isa::avx512, {8, 48}, 64, 2048, 512), 128);   // 4 chunks
  EXPECT_EQ(kc(Isa::avx512, {14, 32}, 49, 2048, 1024), 1024);  // a narrower tile
  EXPECT_EQ(kc(Isa::avx512, {6, 64}, 6, 512, 2048), 1024);   // one tile of rows
  EXPECT_EQ(kc(Isa::avx512, {6, 64}, 96, 512, 2048), 1024);  // more rows
  EXPECT_EQ(kc(Isa::avx512, {6, 64}, 49, 64, 1024), 1024);   // 256 KiB of B, under a quarter of L2
  EXPECT_EQ(kc(Isa::avx512, {6, 64}, 49, 512, 100), 100);    // K under one slice
  EXPECT_EQ(kc(Isa::avx512, {8, 48}, 49, 1152, 192), 192);   // and under two
  EXPECT_EQ(kc(Isa::avx512, {8, 48}, 49, 1280, 320), 160);   // two
  EXPECT_EQ(kc(Isa::avx512, {8, 48}, 32, 32000, 512), 512);  // C of 4 MB
  EXPECT_EQ(kc(Isa::avx2, {4, 24}, 49, 512, 2048), 2048);
}

TEST(Gemm, TransposedOperandsAndEpilogues) {
  use_threads(2);
  for (Isa isa : isas()) {
    const gemm::Tile t = gemm::tiles(isa)[0];
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool packed : {false, true}) {
          gemm::GemmParams p = gemm::default_params(isa, t, gemm::CacheSizes::host(), 29, 71, 45, 2);
          p.kc = 16;
          Operands o{29, 71, 45, ta, tb, true, true, {Activation::relu}, {Activation::clip, -0.25f, 0.5f}};
          check_gemm(p, o, packed);
          o.act = {Activation::gelu};
          o.post = {};
          o.residual = false;
          check_gemm(p, o, packed);
          // A ReLU or a Clip alone: applied in the registers as the last K slice's tiles are
          // stored (the earlier slices' sums unclamped), the last panel's partial columns too.
          for (ActivationSpec act : {ActivationSpec{Activation::relu}, ActivationSpec{Activation::clip, -0.25f, 0.5f}}) {
            o.act = act;
            check_gemm(p, o, packed);
            o.bias = false;
            check_gemm(p, o, packed);
            o.bias = true;
          }
        }
    // No K at all: C is the bias, then the epilogue.
    check_gemm(gemm::default_params(isa, t, gemm::CacheSizes::host(), 3, 5, 0, 1),
               {3, 5, 0, false, false, true, true, {Activation::relu}, {}}, false);
    check_gemm(gemm::default_params(isa, t, gemm::CacheSizes::host(), 3, 5, 0, 1),
               {3, 5, 0, false, false, true, false, {Activation::clip, -0.25f, 0.5f}, {}}, false);
  }
}

// A product of at most four rows runs several neighbouring panels of a packed B at once
// (streams_tile): one to five rows (five: a panel at a time again) on every tile, N of several
// groups of panels, a remainder and a partial panel, K over several slices, A in place, packed
// and transposed, one thread and two (chunks of whole groups), and every part of the epilogue:
// the bias, a ReLU or Clip in the registers, a GELU, a residual and a ReLU after it. Then A in
// parts and C in parts, bit for bit what the plain product gets.
TEST(Gemm, FewRowsStreamSeveralPanelsAtOnce) {
  use_threads(2);
  for (Isa isa : isas())
    for (const gemm::Tile& t : gemm::tiles(isa))
      for (int64_t m = 1; m <= 5; ++m) {
        const int64_t n = 19 * t.nr + 7, k = 37;
        for (int threads : {1, 2})
          for (bool pack_a : {false, true}) {
            gemm::GemmParams p = gemm::default_params(isa, t, gemm::CacheSizes::host(), m, n, k, threads);
            p.pack_a = pack_a;
            p.kc = 16;
            for (bool ta : {false, true}) {
              Operands o{m, n, k, ta, false, true, false, {Activation::relu}, {}};
              check_gemm(p, o, true);
              o.act = {Activation::clip, -0.25f, 0.5f};
              check_gemm(p, o, true);
              o.act = {Activation::gelu};
              o.residual = true;
              o.post = {Activation::relu};
              check_gemm(p, o, true);
            }
          }
        // A in two parts (a pointwise convolution over a Concat's inputs) and C in three, one
        // of them plain: each bit-equal to the plain product's.
        const std::vector<int64_t> widths = {t.nr, 16 * t.nr, 5};
        const int64_t nw = widths[0] + widths[1] + widths[2], k0 = 20;
        const Tensor a = noise({m, k}, 1), b = noise({k, nw}, 2), bias = noise({nw}, 3);
        gemm::GemmParams p = gemm::default_params(isa, t, gemm::CacheSizes::host(), m, nw, k, 2);
        p.kc = 16;
        std::vector<float> bp(static_cast<size_t>(gemm::packed_b_floats(k, nw, t.nr)));
        gemm::pack_b(b.data<float>(), nw, false, k, nw, t.nr, bp.data());
        gemm::GemmProblem g{.m = m, .n = nw, .k = k, .a = a.data<float>(), .lda = k, .b = bp.data(), .b_packed = true};
        g.epilogue = gemm::Epilogue{.bias = bias.data<float>(), .act = {Activation::gelu}};
        Tensor ws(DType::u8, {static_cast<int64_t>(gemm::workspace_bytes(p, g)) + 1});
        std::vector<float> whole(static_cast<size_t>(m * nw), std::nanf("")), bare = whole;
        g.c = whole.data();
        g.ldc = nw;
        gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
        g.epilogue.act = {};
        g.c = bare.data();
        gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
        g.epilogue.act = {Activation::gelu};
        std::vector<float> left(static_cast<size_t>(m * k0)), right(static_cast<size_t>(m * (k - k0)));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < k; ++j)
            (j < k0 ? left[static_cast<size_t>(i * k0 + j)] : right[static_cast<size_t>(i * (k - k0) + j - k0)]) =
                a.data<float>()[i * k + j];
        const gemm::APart a_parts[] = {{.begin = 0, .a = left.data(), .lda = k0}, {.begin = k0, .a = right.data(), .lda = k - k0}};
        std::vector<float> joined(whole.size(), std::nanf(""));
        g.a_parts = a_parts;
        g.c = joined.data();
        gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
        for (size_t i = 0; i < whole.size(); ++i) ASSERT_EQ(joined[i], whole[i]) << "A in parts, element " << i << ", " << p.name();
        g.a_parts = {};
        // The GELU after the tiles are stored; a ReLU in the registers, which the plain part skips.
        for (ActivationSpec act : {ActivationSpec{Activation::gelu}, ActivationSpec{Activation::relu}}) {
          g.epilogue.act = act;
          g.c = whole.data();
          gemm::run(p, g, static_cast<std::byte*>(ws.raw()));
          SCOPED_TRACE(p.name() + " " + std::string(activation_name(act.kind)));
          check_column_parts(p, g, widths, whole, bare, static_cast<std::byte*>(ws.raw()));
        }
      }
}

TEST(Gemm, NamesAndValidation) {
  gemm::GemmParams p;
  p.isa = Isa::avx512;
  p.tile = {8, 48};
  p.mc = 128;
  p.nc = 3072;
  p.kc = 768;
  p.tm = 1;
  p.tn = 2;
  EXPECT_EQ(p.name(), "gemm_f32_avx512_8x48_mc128_nc3072_kc768_t1x2");
  EXPECT_EQ(p.invalid(), std::nullopt);
  p.pack_a = false;
  EXPECT_EQ(p.name(), "gemm_f32_avx512_8x48_mc128_nc3072_kc768_t1x2_ua");
  p.tile = {8, 16};
  EXPECT_EQ(p.invalid(), "no 8x16 micro-kernel for avx512");
  p.tile = {8, 48};
  p.mc = 100;
  EXPECT_EQ(p.invalid(), "mc 100 is not a positive multiple of 8");
  p.mc = 128;
  p.tm = 1 << 20;
  EXPECT_TRUE(p.invalid().has_value());
  // Recorded blocks larger than a product never size more than it needs.
  p.tm = 1;
  p.mc = 1 << 30;
  p.kc = int64_t{1} << 40;
  const gemm::GemmParams f = gemm::fit(p, 3, 50, 7);
  EXPECT_EQ(f.mc, 8);
  EXPECT_EQ(f.nc, 96);
  EXPECT_EQ(f.kc, 7);
  // The tile that pads N least.
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 768), (gemm::Tile{8, 48}));
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 1024), (gemm::Tile{6, 64}));
  // A weight past L3 (an LM head) keeps the preferred tile unless it pads N by more than 1 %;
  // so does one in L3 where the tile that pads N least pads M more.
  gemm::CacheSizes caches;
  caches.l3 = 16 << 20;
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 28, 50257, 768, caches), (gemm::Tile{8, 48}));
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 28, 32000, 512, caches), (gemm::Tile{8, 48}));
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 28, 50257, 64, caches), (gemm::Tile{14, 32}));  // 12.9 MB: in L3
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 32, 50257, 64, caches), (gemm::Tile{8, 48}));   // 14x32: 42 rows for 32
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 32, 1024, 8192, caches), (gemm::Tile{6, 64}));  // 8x48 pads 3 %
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 49, 2048, 512, caches), (gemm::Tile{6, 64}));   // 54 rows, 8x48's 56
  // Rows that one preferred tile holds take it where B is in L3 too (4096 columns: 6x64 pads
  // none, 8x48 0.8 %); past them the M-padding rule again.
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 1, 4096, 512, caches), (gemm::Tile{8, 48}));
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 6, 4096, 512, caches), (gemm::Tile{8, 48}));
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 1, 4096, 64, caches), (gemm::Tile{8, 48}));
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 12, 4096, 512, caches), (gemm::Tile{6, 64}));
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 1, 1408, 512, caches), (gemm::Tile{6, 64}));  // 8x48 pads 2.3 %
  EXPECT_EQ(gemm::default_tile(Isa::avx2, 2, 4096, 512, caches), (gemm::Tile{4, 24}));
  EXPECT_EQ(gemm::default_tile(Isa::avx2, 28, 50257, 768, caches), (gemm::Tile{4, 24}));
  // AVX2's preferred 4x24 may pad N by 4 %: 256 columns by 3 %, not 128 by 12 %.
  EXPECT_EQ(gemm::default_tile(Isa::avx2, 196, 256, 1024, caches), (gemm::Tile{4, 24}));
  EXPECT_EQ(gemm::default_tile(Isa::avx2, 784, 128, 512, caches), (gemm::Tile{6, 16}));
  EXPECT_EQ(gemm::default_tile(Isa::avx512, 196, 256, 1024, caches), (gemm::Tile{6, 64}));
}

TEST(Gemm, PackedLayoutDescribesPackB) {
  // pack() through the PackedLayout that a compiled model stores places every element where
  // pack_b does, so any kiln can unpack a stored weight and oneDNN can reorder it. (K = 37:
  // pack_b copies Bᵀ's rows 16 steps at a time, and a last slice of 5.)
  for (bool trans : {false, true})
    for (int nr : {48, 64})
      for (int64_t k : {13, 37}) {
        const int64_t n = 100;
        const Tensor b = noise(trans ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, 5);
        std::vector<float> packed(static_cast<size_t>(gemm::packed_b_floats(k, n, nr)));
        gemm::pack_b(b.data<float>(), trans ? k : n, trans, k, n, nr, packed.data());
        const PackedLayout l = gemm::packed_b_layout(k, n, nr, trans);
        EXPECT_EQ(check_layout(l, b.numel(), packed.size() * 4, 4), std::nullopt);
        const Tensor via = pack(b, l);
        ASSERT_EQ(via.nbytes(), packed.size() * 4);
        EXPECT_EQ(std::memcmp(via.raw(), packed.data(), via.nbytes()), 0)
            << "trans " << trans << " nr " << nr << " k " << k;
        const Tensor back = unpack(via);
        EXPECT_EQ(std::memcmp(back.raw(), b.raw(), b.nbytes()), 0);
      }
}

// A convolution's weight [N, C, KH, KW] in the panels its GEMM reads, in the windows' order:
// pack() through packed_b_windows_layout places every element where in_windows_order then
// pack_b does, and unpack() gives the weight back.
TEST(Gemm, PackedLayoutDescribesTheWindowsOrder) {
  for (int nr : {48, 64}) {
    const int64_t n = 70, c = 5;
    const gemm::ImageWindows win{.h = 9, .w = 9, .c = c, .oh = 9, .ow = 9, .kh = 3, .kw = 2};
    const int64_t taps = win.kh * win.kw, k = taps * c;
    const Tensor w = noise({n, c, win.kh, win.kw}, 6);
    const Tensor ordered = cpu::in_windows_order(w.data<float>(), DType::f32, n, win);
    std::vector<float> packed(static_cast<size_t>(gemm::packed_b_floats(k, n, nr)));
    gemm::pack_b(ordered.data<float>(), k, true, k, n, nr, packed.data());
    const PackedLayout l = gemm::packed_b_windows_layout(n, c, taps, nr);
    EXPECT_EQ(check_layout(l, w.numel(), packed.size() * 4, 4), std::nullopt);
    EXPECT_FALSE(l.same_placement(gemm::packed_b_layout(k, n, nr, true)));
    const Tensor via = pack(w, l);
    ASSERT_EQ(via.nbytes(), packed.size() * 4);
    EXPECT_EQ(std::memcmp(via.raw(), packed.data(), via.nbytes()), 0) << "nr " << nr;
    const Tensor back = unpack(via);
    EXPECT_EQ(std::memcmp(back.raw(), w.raw(), w.nbytes()), 0);
  }
}

// The tiles of a panel (or a group's blocks) fetching the next one: every line of it is asked
// for exactly once, each tile's share within its own fetches, however the lines, tiles and
// fetches a tile makes divide.
TEST(Gemm, PanelPrefetchSharesCoverTheNextPanelOnce) {
  alignas(64) static char panel[64 * 1000];
  for (const auto& [lines, tiles, blocks] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1000, 1, 1}, {1000, 7, 3}, {999, 40, 12}, {5, 40, 12}, {1000, 168, 6}, {64, 3, 100}}) {
    SCOPED_TRACE(std::to_string(lines) + " lines, " + std::to_string(tiles) + " tiles, " + std::to_string(blocks) + " fetches");
    std::vector<int> asked(static_cast<size_t>(lines));
    for (int64_t t = 0; t < tiles; ++t) {
      gemm::PanelPrefetch pf = gemm::PanelPrefetch::share(panel, lines * 64, t, tiles, blocks);
      for (int64_t f = 0; f < blocks; ++f) {
        const char* from = pf.next;
        pf.fetch();
        for (const char* p = from; p < pf.next; p += 64) ++asked[static_cast<size_t>((p - panel) / 64)];
      }
      EXPECT_EQ(pf.next, pf.end) << "tile " << t << " left lines of its share";
    }
    for (int64_t l = 0; l < lines; ++l) ASSERT_EQ(asked[static_cast<size_t>(l)], 1) << "line " << l;
  }
  EXPECT_EQ(gemm::PanelPrefetch::share(nullptr, 64 * 10, 0, 1, 1).next, nullptr);  // nothing next
}

TEST(GemmKernel, MatMulGemmAndFusedForms) {
  for (const auto& [isa, cpu] : isa_paths()) {
    SCOPED_TRACE(isa);
    const std::string name = "kiln.gemm_f32_" + isa;
    // Constant weights (packed in prepare), A's batch folded into M.
    EXPECT_EQ(check({"MatMul", {noise({37, 33}, 1), noise({33, 129}, 2)}, {false, true}}, 1e-5, &cpu), name);
    EXPECT_EQ(check({"MatMul", {noise({2, 7, 64}, 3), noise({64, 48}, 4)}, {false, true}}, 1e-5, &cpu), name);
    // Both operands at run time, batches broadcast both ways.
    EXPECT_EQ(check({"MatMul", {noise({2, 3, 5, 8}, 5), noise({1, 3, 8, 6}, 6)}, {false, false}}, 1e-5, &cpu), name);
    EXPECT_EQ(check({"MatMul", {noise({3, 1, 5, 8}, 7), noise({4, 8, 6}, 8)}, {false, false}}, 1e-5, &cpu), name);
    EXPECT_EQ(check({"MatMul", {noise({5, 8}, 9), noise({3, 8, 70}, 10)}, {false, true}}, 1e-5, &cpu), name);
    // Gemm: transposed operands, C as a row (bias) and as a whole [M, N]; past XNNPACK's sizes.
    for (int64_t ta : {0, 1})
      for (int64_t tb : {0, 1}) {
        Tensor a = noise(ta ? std::vector<int64_t>{19, 41} : std::vector<int64_t>{41, 19}, 11);
        Tensor b = noise(tb ? std::vector<int64_t>{67, 19} : std::vector<int64_t>{19, 67}, 12);
        EXPECT_EQ(check({"Gemm", {a, b, noise({67}, 13)}, {false, true, true}, {attr("transA", ta), attr("transB", tb)}}, 1e-5, &cpu),
                  name);
        EXPECT_EQ(check({"Gemm", {a, b, noise({41, 67}, 14)}, {false, false, false}, {attr("transA", ta), attr("transB", tb)}}, 1e-5, &cpu),
                  name);
      }
    // FusedMatMul: bias, activation, residual, post-activation.
    EXPECT_EQ(check({"FusedMatMul", {noise({3, 11, 40}, 15), noise({40, 100}, 16), noise({100}, 17), noise({3, 11, 100}, 18)},
                     {false, true, true, false},
                     {attr("activation", std::string("Gelu")), attr("post_activation", std::string("Relu"))}},
                    1e-5, &cpu),
              name);
    EXPECT_EQ(check({"FusedMatMul", {noise({4, 2, 9, 16}, 19), noise({4, 1, 16, 33}, 20), Tensor(), noise({4, 2, 9, 33}, 21)},
                     {false, false, false, false},
                     {attr("activation", std::string("Silu"))}},
                    1e-5, &cpu),
              name);
  }
  // Split outputs (a merged Q, K, V projection): each tile written into its output, the last
  // part ragged. Both products would take the preferred tile (AVX-512's 8x48, AVX2's 4x24):
  // split points at 96 and 144 keep it, at 96 and 160 the tile that divides them takes its
  // place (AVX-512's 14x32, AVX2's 6x16).
  for (const auto& [isa, cpu] : isa_paths()) {
    SCOPED_TRACE(isa);
    const std::string name = "kiln.gemm_f32_" + isa;
    for (const std::vector<int64_t>& widths : {std::vector<int64_t>{96, 48, 37}, std::vector<int64_t>{96, 64, 31}}) {
      const int64_t n = widths[0] + widths[1] + widths[2];
      std::string label;
      EXPECT_EQ(check({"FusedMatMul", {noise({3, 13, 40}, 50), noise({40, n}, 51), noise({n}, 52)}, {false, true, true},
                       {attr("splits", widths), attr("activation", std::string("Gelu"))}, {true, true, true}},
                      1e-5, &cpu, nullptr, &label),
                name);
      const std::string tile = widths[1] == 48 ? (isa == "avx2" ? "_4x24_" : "_8x48_") : (isa == "avx2" ? "_6x16_" : "_14x32_");
      EXPECT_NE(label.find(tile), std::string::npos) << label;
    }
    // The activation on some outputs only (`activated`: a gate projection beside plain ones).
    EXPECT_EQ(check({"FusedMatMul", {noise({3, 13, 40}, 55), noise({40, 133}, 56), noise({133}, 57)}, {false, true, true},
                     {attr("splits", std::vector<int64_t>{64, 32, 37}), attr("activation", std::string("Silu")),
                      attr("activated", std::vector<int64_t>{1, 0, 1})},
                     {true, true, true}},
                    1e-5, &cpu),
              name);
    // An f16 weight (`--precision fp16`, then merged): the f16 GEMM where the CPU has it, its
    // split points multiples of 64; the f32 GEMM widens the weight where it has not.
    if (isa == "avx512") {
      const Tensor w16 = to_f16(noise({40, 160}, 58));
      std::string label;
      const std::string want = gemm::lowp_lacks(cpu, gemm::Lowp::f16) ? name : "kiln.gemm_f16_avx512";
      EXPECT_EQ(check({"FusedMatMul", {noise({3, 13, 40}, 59), w16, noise({160}, 60)}, {false, true, true},
                       {attr("splits", std::vector<int64_t>{64, 64, 32}), attr("activation", std::string("Relu")),
                        attr("activated", std::vector<int64_t>{0, 1, 1})},
                       {true, true, true}},
                      2e-3, &cpu),
                want);
    }
    // A bf16 weight (`--precision bf16`, then merged): kiln's bf16 GEMM where the CPU has
    // AVX512-BF16, on AMX tiles where it has those too and on VDPBF16PS, each 16-column vector
    // of C's rows stored in its output: split points that are whole tiles of neither (48 and
    // 80; 32 and 48), rows that are not whole tiles (39), and on two threads rows that the
    // threads share (600 of them by 96 columns).
    if (isa == "avx512" && !gemm::lowp_lacks(cpu, gemm::Lowp::bf16))
      for (bool amx : {false, true}) {
        if (amx && !cpu.amx) continue;
        SCOPED_TRACE(amx ? "bf16 on AMX" : "bf16 on VDPBF16PS");
        CpuFeatures target = cpu;
        target.amx = amx;
        for (const auto& [rows, widths] : {std::pair{int64_t{13}, std::vector<int64_t>{48, 32, 80}}, std::pair{int64_t{200}, std::vector<int64_t>{32, 16, 48}}}) {
          const int64_t n = widths[0] + widths[1] + widths[2];
          std::string label;
          EXPECT_EQ(check({"FusedMatMul", {noise({3, rows, 64}, 65), to_bf16(noise({64, n}, 66)), noise({n}, 67)}, {false, true, true},
                           {attr("splits", widths), attr("activation", std::string("Gelu")), attr("activated", std::vector<int64_t>{1, 0, 1})},
                           {true, true, true}, "", {}, 2},
                          1e-4, &target, nullptr, &label),
                    "kiln.gemm_bf16_avx512");
          EXPECT_EQ(label, amx ? "bf16_amx_tiles" : "bf16_8x48");
        }
      }
    // A gated product (SwiGLU): the tile whose width divides the blocks of 64, batched A rows;
    // an f16 weight widened by this GEMM (the f16 GEMM has no gated form; merge_projections
    // gates f32 weights only).
    std::string gated_label;
    EXPECT_EQ(check({"FusedMatMul", {noise({3, 13, 40}, 61), noise({40, 256}, 62), noise({256}, 63)}, {false, true, true},
                     {attr("gate_block", int64_t{64}), attr("activation", std::string("Silu"))}},
                    1e-5, &cpu, nullptr, &gated_label),
              name);
    EXPECT_EQ(gated_label.find("_8x48_"), std::string::npos) << gated_label;
    if (isa == "avx512") {
      Tensor w16(DType::f16, {40, 128});
      for (int64_t i = 0; i < w16.numel(); ++i) w16.data<half>()[i] = half(0.01f * static_cast<float>(i % 17) - 0.08f);
      EXPECT_EQ(check({"FusedMatMul", {noise({5, 40}, 64), w16}, {false, true}, {attr("gate_block", int64_t{64}), attr("activation", std::string("Silu"))}},
                      2e-3, &cpu),
                name);
    }
    // An omitted output: the reference kernel, which writes the others.
    for (const std::vector<bool>& given : {std::vector<bool>{true, false, true}, std::vector<bool>{false, true, true}})
      EXPECT_EQ(check({"FusedMatMul", {noise({5, 40}, 53), noise({40, 96}, 54)}, {false, true}, {attr("splits", std::vector<int64_t>{32, 32, 32})},
                       given},
                      1e-5, &cpu),
                "ref");
  }
  // X in parts (FusedConv's x_parts, fuse_concat: a Concat's inputs read where they lie): odd
  // widths with a bias, a residual and a post-activation; and, without them, a K past one Kc
  // slice (1,500: two slices of 750, each across two parts). oneDNN cannot read parts: kiln's
  // GEMM takes them even with a piecewise-linear epilogue over many pixels.
  for (const auto& [isa, cpu] : isa_paths()) {
    SCOPED_TRACE(isa);
    auto parts = [](const char* act) {
      return std::vector<Attribute>{attr("channels_last", int64_t{1}), attr("activation", std::string(act)),
                                    attr("post_activation", std::string("Relu")), attr("x_parts", int64_t{3})};
    };
    EXPECT_EQ(check({"FusedConv",
                     {noise({2, 5, 7, 3}, 60), noise({70, 37, 1, 1}, 61), noise({70}, 62), noise({2, 5, 7, 70}, 63), noise({2, 5, 7, 16}, 64),
                      noise({2, 5, 7, 18}, 65)},
                     {false, true, true, false, false, false}, parts("Silu")},
                    1e-5, &cpu),
              "kiln.gemm_f32_" + isa);
    EXPECT_EQ(check({"FusedConv",
                     {noise({1, 3, 5, 700}, 66), noise({24, 1500, 1, 1}, 67, 0.1f), Tensor(), Tensor(), noise({1, 3, 5, 333}, 68),
                      noise({1, 3, 5, 467}, 69)},
                     {false, true, false, false, false, false}, parts("Relu")},
                    1e-5, &cpu),
              "kiln.gemm_f32_" + isa);
  }
  // A pointwise convolution's weight computed at run time (fuse_channel_scale's, scaled per
  // input channel) is packed once a run, whatever the epilogue (oneDNN takes constant weights
  // only): two images of odd widths, with a bias, a residual and ReLU, and without them over
  // 56x56 pixels, on one and two threads (the rows shared out). A 3x3 one's stays with the
  // reference kernel.
  for (const auto& [isa, cpu] : isa_paths())
    for (int threads : {1, 2}) {
      SCOPED_TRACE(isa + " threads=" + std::to_string(threads));
      const std::vector<Attribute> relu = {attr("channels_last", int64_t{1}), attr("activation", std::string("Relu"))};
      EXPECT_EQ(check({"FusedConv", {noise({2, 9, 7, 37}, 70), noise({21, 37, 1, 1}, 71), noise({21}, 72), noise({2, 9, 7, 21}, 73)},
                       {false, false, true, false}, relu, {true}, "", {}, threads},
                      1e-5, &cpu),
                "kiln.gemm_f32_" + isa);
      EXPECT_EQ(check({"FusedConv", {noise({1, 56, 56, 32}, 74), noise({16, 32, 1, 1}, 75)}, {false, false},
                       {attr("channels_last", int64_t{1})}, {true}, "", {}, threads},
                      1e-5, &cpu),
                "kiln.gemm_f32_" + isa);
    }
  for (const auto& [isa, cpu] : isa_paths()) {
    EXPECT_EQ(check({"FusedConv", {noise({1, 9, 7, 8}, 76), noise({16, 8, 3, 3}, 77)}, {false, false}, {attr("channels_last", int64_t{1})}},
                    1e-5, &cpu),
              "ref");
  }
  // Channels-last 1x1 convolutions are products too: with a transcendental activation (bias,
  // residual, post-activation), and on one pixel whatever the epilogue (an SE block).
  for (const auto& [isa, cpu] : isa_paths()) {
    const std::vector<Attribute> last = {attr("channels_last", int64_t{1}), attr("activation", std::string("Silu")),
                                         attr("post_activation", std::string("Relu"))};
    EXPECT_EQ(check({"FusedConv", {noise({2, 5, 7, 37}, 30), noise({70, 37, 1, 1}, 31), noise({70}, 32), noise({2, 5, 7, 70}, 33)},
                     {false, true, true, false}, last},
                    1e-5, &cpu),
              "kiln.gemm_f32_" + isa);
    EXPECT_EQ(check({"FusedConv", {noise({2, 1, 1, 96}, 38), noise({24, 96, 1, 1}, 39), noise({24}, 40)}, {false, true, true},
                     {attr("channels_last", int64_t{1}), attr("activation", std::string("Relu"))}},
                    1e-5, &cpu),
              "kiln.gemm_f32_" + isa);
    // Over many pixels with a piecewise-linear epilogue oneDNN is faster.
    EXPECT_EQ(check({"FusedConv", {noise({1, 5, 7, 16}, 41), noise({8, 16, 1, 1}, 42)}, {false, true},
                     {attr("channels_last", int64_t{1}), attr("activation", std::string("Relu"))}},
                    1e-5, &cpu),
              "onednn.conv");
    // Over 64 pixels or fewer into at least 8 times as many output channels as pixels (a mobile network's
    // last 7x7 expansions, ReLU6), kiln's GEMM at one and two threads; into fewer, oneDNN.
    for (const int64_t out : {400, 384})
      for (const int threads : {1, 2})
        EXPECT_EQ(check({"FusedConv", {noise({1, 7, 7, 40}, 86), noise({out, 40, 1, 1}, 87), noise({out}, 88)}, {false, true, true},
                         {attr("channels_last", int64_t{1}), attr("activation", std::string("Clip")),
                          attr("activation_params", std::vector<double>{0, 6})},
                         {true}, "", {}, threads},
                        1e-5, &cpu),
                  out == 400 ? "kiln.gemm_f32_" + isa : "onednn.conv");
    // A narrow output (48 channels or fewer) from 64 or more over 56x56 pixels or more (a mobile
    // network's first projections, with a residual): kiln's GEMM; over fewer pixels, or from
    // fewer channels, oneDNN.
    EXPECT_EQ(check({"FusedConv", {noise({1, 56, 56, 96}, 51), noise({24, 96, 1, 1}, 52), noise({24}, 53), noise({1, 56, 56, 24}, 54)},
                     {false, true, true, false}, {attr("channels_last", int64_t{1})}},
                    1e-5, &cpu),
              "kiln.gemm_f32_" + isa);
    EXPECT_EQ(check({"FusedConv", {noise({1, 28, 28, 96}, 55), noise({24, 96, 1, 1}, 56)}, {false, true}, {attr("channels_last", int64_t{1})}},
                    1e-5, &cpu),
              "onednn.conv");
    EXPECT_EQ(check({"FusedConv", {noise({1, 56, 56, 32}, 57), noise({16, 32, 1, 1}, 58)}, {false, true}, {attr("channels_last", int64_t{1})}},
                    1e-5, &cpu),
              "onednn.conv");
    // A residual sum into 256 output channels or more, or on one thread 160 or more (a
    // bottleneck's expansion, ResNet's): kiln's GEMM, which sums the product into the residual
    // where it lies; into fewer, oneDNN.
    for (const int64_t out : {256, 160, 96})
      for (const int threads : {1, 2})
        EXPECT_EQ(check({"FusedConv", {noise({1, 14, 14, 64}, 82), noise({out, 64, 1, 1}, 83), noise({out}, 84), noise({1, 14, 14, out}, 85)},
                         {false, true, true, false}, {attr("channels_last", int64_t{1}), attr("post_activation", std::string("Relu"))},
                         {true}, "", {}, threads},
                        1e-5, &cpu),
                  out == 256 || (out == 160 && threads == 1) ? "kiln.gemm_f32_" + isa : "onednn.conv");
    // A weight larger than L2 and than the input streams in each call: kiln's GEMM, whatever the
    // epilogue; as large a weight over more pixels than output channels stays on oneDNN.
    const int64_t l2_floats = static_cast<int64_t>(gemm::CacheSizes::host().l2 / 4);
    const int64_t wide = (l2_floats / 1024 + 15) / 16 * 16, deep = (l2_floats / 64 + 15) / 16 * 16;
    EXPECT_EQ(check({"FusedConv", {noise({1, 3, 3, wide}, 43), noise({1024, wide, 1, 1}, 44), noise({1024}, 45)}, {false, true, true},
                     {attr("channels_last", int64_t{1}), attr("activation", std::string("Relu"))}},
                    1e-5, &cpu),
              "kiln.gemm_f32_" + isa);
    EXPECT_EQ(check({"FusedConv", {noise({1, 9, 9, deep}, 46), noise({64, deep, 1, 1}, 47)}, {false, true},
                     {attr("channels_last", int64_t{1})}},
                    1e-5, &cpu),
              "onednn.conv");
    // A strided 1x1 convolution (ResNet's downsampling) is the product of its pixels gathered
    // into rows: by the same rule, kiln's GEMM for such a weight over few output pixels (strides
    // 2x2 and 2x1 over odd sizes, two images), oneDNN over many.
    for (const std::vector<int64_t>& strides : {std::vector<int64_t>{2, 2}, std::vector<int64_t>{2, 1}})
      EXPECT_EQ(check({"FusedConv", {noise({2, 7, 5, wide}, 48), noise({1024, wide, 1, 1}, 49), noise({1024}, 50)}, {false, true, true},
                       {attr("channels_last", int64_t{1}), attr("strides", strides)}},
                      1e-5, &cpu),
                "kiln.gemm_f32_" + isa);
    EXPECT_EQ(check({"FusedConv", {noise({1, 5, 7, 16}, 34), noise({8, 16, 1, 1}, 35)}, {false, true},
                     {attr("channels_last", int64_t{1}), attr("strides", std::vector<int64_t>{2, 2})}},
                    1e-5, &cpu),
              "onednn.conv");
    // Any other channels-last convolution is the product of its windows, gathered into rows
    // first. Pinned, every geometry matches the reference: 3x3 stride 2 padded over two
    // odd-sized images with a residual and a ReLU after it, on two threads (the rows gathered
    // by both); 3x2 dilated with uneven padding; a padded 1x1.
    const std::string name = "kiln.gemm_f32_" + isa;
    auto pinned = [&name](testing::Case c, const CpuFeatures& on) {  // clang 14 captures no structured binding
      c.kernel = name;
      return check(c, 1e-5, &on);
    };
    EXPECT_EQ(pinned({"FusedConv", {noise({2, 33, 31, 19}, 70), noise({70, 19, 3, 3}, 71), noise({70}, 72), noise({2, 17, 16, 70}, 73)},
                      {false, true, true, false},
                      {attr("channels_last", int64_t{1}), attr("strides", std::vector<int64_t>{2, 2}),
                       attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("post_activation", std::string("Relu"))},
                      {true}, "", {}, 2}, cpu),
              name);
    EXPECT_EQ(pinned({"FusedConv", {noise({1, 8, 9, 5}, 74), noise({33, 5, 3, 2}, 75)}, {false, true},
                      {attr("channels_last", int64_t{1}), attr("dilations", std::vector<int64_t>{2, 3}),
                       attr("pads", std::vector<int64_t>{2, 0, 1, 3})}}, cpu),
              name);
    EXPECT_EQ(pinned({"FusedConv", {noise({1, 4, 5, 16}, 76), noise({8, 16, 1, 1}, 77)}, {false, true},
                      {attr("channels_last", int64_t{1}), attr("pads", std::vector<int64_t>{1, 0, 0, 2})}}, cpu),
              name);
    // By rule, a weight past L2 over a quarter as many pixels as output channels or fewer
    // (ResNet-50's last 3x3 stride-2 layer): 4 pixels of 64 channels, not 25; and on a CPU
    // without AVX-512, windows of 128 input channels or more (oneDNN's AVX2 direct convolution
    // of channels-last tensors is the slower there), not of 64.
    const int64_t c3 = (l2_floats / (64 * 9) + 15) / 16 * 16;
    const std::vector<Attribute> s2 = {attr("channels_last", int64_t{1}), attr("strides", std::vector<int64_t>{2, 2}),
                                       attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
    const bool avx2 = !cpu.avx512f;
    EXPECT_EQ(check({"FusedConv", {noise({1, 3, 4, c3}, 78), noise({64, c3, 3, 3}, 79, 0.1f)}, {false, true}, s2}, 1e-5, &cpu), name);
    EXPECT_EQ(check({"FusedConv", {noise({1, 10, 10, c3}, 80), noise({64, c3, 3, 3}, 81, 0.1f)}, {false, true}, s2}, 1e-5, &cpu) == name,
              avx2);
    EXPECT_EQ(check({"FusedConv", {noise({1, 11, 9, 128}, 86), noise({40, 128, 3, 3}, 87, 0.1f), noise({40}, 88)}, {false, true, true}, s2},
                    1e-5, &cpu) == name,
              avx2);
    EXPECT_EQ(check({"FusedConv", {noise({1, 11, 9, 64}, 89), noise({40, 64, 3, 3}, 95, 0.1f)}, {false, true}, s2}, 1e-5, &cpu), "onednn.conv");
    // Channels-first layouts are convolutions proper.
    EXPECT_NE(check({"Conv", {noise({1, 16, 5, 7}, 36), noise({8, 16, 1, 1}, 37)}, {false, true}}, 1e-5, &cpu).rfind("kiln.gemm", 0), 0u);
  }
  // Alpha other than 1 stays with another kernel.
  EXPECT_NE(check({"Gemm", {noise({4, 5}, 22), noise({5, 6}, 23)}, {false, true}, {attr("alpha", 0.5)}}).rfind("kiln.gemm", 0), 0u);
}

// An image read as it comes (x_channels_first: [N, C, H, W] in, channels-last out) whose windows
// tile it, the filter as large as the stride (a vision transformer's patch embedding): kiln's GEMM
// runs it as one product of its patches, gathered in the weight's own order. Pinned, on every
// ISA path at one and two threads: 16x16 patches of RGB over two images with a bias and a ReLU,
// 4x4 ones of four channels over odd output sizes, 2x5 ones, and a 1x1 stride-1 filter (a
// transpose then a product). By rule, kiln's GEMM from 256 values a window (16x16 of RGB);
// 4x4 patches of RGB, and windows that overlap or lie in padding, stay on kiln.direct_conv.
TEST(GemmKernel, ImagePatchesAreOneProduct) {
  const std::vector<Attribute> first = {attr("channels_last", int64_t{1}), attr("x_channels_first", int64_t{1})};
  auto with = [&first](std::vector<int64_t> strides, std::vector<Attribute> more = {}) {
    std::vector<Attribute> a = first;
    a.push_back(attr("strides", std::move(strides)));
    for (Attribute& m : more) a.push_back(std::move(m));
    return a;
  };
  for (const auto& [isa, cpu] : testing::isa_paths()) {
    const std::string name = "kiln.gemm_f32_" + isa;
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(isa + " threads=" + std::to_string(threads));
      auto pinned = [&name, threads](testing::Case c, const CpuFeatures& on) {  // clang 14 captures no structured binding
        c.kernel = name;
        c.threads = threads;
        return check(c, 1e-5, &on);
      };
      EXPECT_EQ(pinned({"FusedConv", {noise({2, 3, 32, 48}, 90), noise({40, 3, 16, 16}, 91, 0.1f), noise({40}, 92)}, {false, true, true},
                        with({16, 16}, {attr("activation", std::string("Relu"))})}, cpu),
                name);
      EXPECT_EQ(pinned({"FusedConv", {noise({1, 4, 20, 28}, 93), noise({17, 4, 4, 4}, 94)}, {false, true}, with({4, 4})}, cpu), name);
      EXPECT_EQ(pinned({"FusedConv", {noise({1, 3, 6, 15}, 95), noise({24, 3, 2, 5}, 96)}, {false, true}, with({2, 5})}, cpu), name);
      EXPECT_EQ(pinned({"FusedConv", {noise({1, 8, 5, 7}, 97), noise({32, 8, 1, 1}, 98)}, {false, true}, with({1, 1})}, cpu), name);
    }
    SCOPED_TRACE(isa);
    const Tensor rgb = noise({1, 3, 32, 32}, 99);
    EXPECT_EQ(check({"FusedConv", {rgb, noise({32, 3, 16, 16}, 100)}, {false, true}, with({16, 16})}, 1e-5, &cpu), name);
    EXPECT_EQ(check({"FusedConv", {rgb, noise({32, 3, 4, 4}, 101)}, {false, true}, with({4, 4})}, 1e-5, &cpu),
              "kiln.direct_conv_f32_" + isa);
    EXPECT_EQ(check({"FusedConv", {rgb, noise({32, 3, 16, 16}, 102)}, {false, true}, with({8, 8})}, 1e-5, &cpu),
              "kiln.direct_conv_f32_" + isa);
    EXPECT_EQ(check({"FusedConv", {rgb, noise({32, 3, 16, 16}, 103)}, {false, true},
                     with({16, 16}, {attr("pads", std::vector<int64_t>{8, 8, 8, 8})})},
                    1e-5, &cpu),
              "kiln.direct_conv_f32_" + isa);
  }
}

// A residual added before the only activation, post(A·B + bias + Z), is the destination's memory
// when nothing reads it after the product (Kernel::overwrites_input): the plan gives Y Z's place
// and the product is summed into Z where it lies. Not when Z is read later, nor when Z is also
// the product's A; on every ISA path, with K in one slice and in several (Z added on the
// first), the activation in the registers (ReLU) and after the tile (SiLU).
TEST(GemmKernel, ResidualIsSummedIntoWhereItLiesWhenItDies) {
  for (const auto& [isa, cpu] : isa_paths()) {
    for (const int64_t k : {70, 1100})
      for (const char* post : {"Relu", "Silu"})
        for (const char* form : {"dies", "read after", "also A"}) {
          const bool also_a = std::string(form) == "also A", read_after = std::string(form) == "read after";
          if (also_a && k != 70) continue;
          SCOPED_TRACE(isa + " K " + std::to_string(k) + " " + post + " " + form);
          const int64_t m = 23, n = 70;
          Graph g;
          const std::vector<int64_t> x_dims = {m, k}, r_dims = {m, n};
          const ValueId x = g.add_value("x", DType::f32, Shape::of(x_dims)), r = g.add_value("r", DType::f32, Shape::of(r_dims));
          g.inputs = {x, r};
          const ValueId w = g.add_constant("w", noise({k, n}, 2, 0.1f)), b = g.add_constant("b", noise({n}, 3));
          const ValueId z = g.add_value("z", DType::undefined), a = g.add_value("a", DType::undefined);
          const ValueId y = g.add_value("y", DType::undefined), out = g.add_value("out", DType::undefined);
          g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {r}, .outputs = {z}});
          g.add_node(Node{.name = "neg", .op = "Neg", .inputs = {x}, .outputs = {a}});
          Node mm{.name = "mm", .op = "FusedMatMul", .inputs = {also_a ? z : a, w, b, z}, .outputs = {y}};
          mm.set_attr("post_activation", std::string(post));
          g.add_node(std::move(mm));
          if (read_after) g.add_node(Node{.name = "add", .op = "Add", .inputs = {y, z}, .outputs = {out}});
          else g.add_node(Node{.name = "abs", .op = "Abs", .inputs = {y}, .outputs = {out}});
          g.outputs = {out};
          Model model;
          model.graph = g;
          ASSERT_TRUE(infer_graph(model.graph).ok());
          Target target{.cpu = cpu};
          const std::vector<std::vector<int64_t>> shapes = {x_dims, r_dims};
          auto plan = build_plan(model.graph, shapes, PlanOptions{target, default_kernels()});
          ASSERT_TRUE(plan.ok()) << plan.error().message();
          ASSERT_EQ(plan->kernels[2].name, "kiln.gemm_f32_" + isa);
          const bool shared = std::string(form) == "dies";
          EXPECT_EQ(plan->overwrites[2], shared ? 1 : 0);
          const std::vector<int64_t>& off = plan->memory.offset;
          EXPECT_EQ(off[static_cast<size_t>(y)] == off[static_cast<size_t>(z)], shared);
          auto fast = Session::create(model, SessionOptions{.target = target});
          auto ref = Session::create(model, SessionOptions{.reference = true});
          ASSERT_TRUE(fast.ok() && ref.ok());
          const std::vector<Tensor> in = {noise({m, k}, 4), noise({m, n}, 5)};
          auto got = (*fast)->run(in);
          auto want = (*ref)->run(in);
          ASSERT_TRUE(got.ok() && want.ok()) << (got.ok() ? want.error().message() : got.error().message());
          EXPECT_LE(compare_tensors((*got)[0], (*want)[0]).rel_l2_error, 1e-5);
        }
  }
}

TEST(GemmKernel, BatchesAreSharedAmongThreads) {
  // More products than threads: each thread takes whole products (attention's heads).
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    use_threads(threads);
    EXPECT_EQ(check({"MatMul", {noise({12, 17, 64}, 1), noise({12, 64, 17}, 2)}, {false, false}}).rfind("kiln.gemm", 0), 0u);
  }
  use_threads(available_cores());
}

// A 3x3 convolution and a linear layer on kiln's f32 GEMM and (where the CPU has AVX512-FP16)
// its f16 one: prepack_weights stores each weight in the panels its GEMM reads (the
// convolution's in the windows' order), and a plan of the stored model multiplies by those
// bytes where they lie (no reorder while planning), with the same outputs as the plain weight.
TEST(GemmKernel, WeightsAreStoredInTheirPanels) {
  const std::string f32 = std::string("kiln.gemm_f32_") + cpu::isa_name(*cpu::best_isa(CpuFeatures::host()));
  const bool f16 = !gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::f16);
  auto weight = [](const Tensor& w, bool half) { return half ? testing::to_f16(w) : w; };
  for (const bool half : {false, true}) {
    if (half && !f16) continue;
    for (const bool conv : {true, false}) {
      SCOPED_TRACE(std::string(half ? "f16" : "f32") + (conv ? " conv" : " linear"));
      testing::Case c = conv ? testing::Case{"FusedConv",
                                             {noise({1, 7, 7, 24}, 110), weight(noise({40, 24, 3, 3}, 111, 0.1f), half)},
                                             {false, true},
                                             {attr("channels_last", int64_t{1}), attr("pads", std::vector<int64_t>{1, 1, 1, 1})}}
                             : testing::Case{"FusedMatMul", {noise({5, 96}, 112), weight(noise({96, 72}, 113, 0.1f), half)}, {false, true}};
      c.kernel = half ? "kiln.gemm_f16_avx512" : f32;
      const Tensor w = testing::expect_stored_weight_used_in_place(c, 1, half ? 1e-2 : 1e-6);
      ASSERT_TRUE(w.is_packed());
      EXPECT_EQ(w.layout()->packed_for.rfind(half ? "kiln gemm_f16 nr" : "kiln gemm_f32 nr", 0), 0u) << w.layout()->packed_for;
      EXPECT_EQ(w.layout()->packed_for.ends_with(" windows"), conv) << w.layout()->packed_for;
    }
  }
}

TEST(GemmKernel, CompiledModelsRecordAndReuseTheParameters) {
  // A linear layer compiled for two threads records its template; a session on one thread keeps
  // the recorded tile and blocking and grids it again; the packed weight is stored in the
  // tile's layout and read where it is mapped.
  testing::GraphBuilder b;
  const ValueId y = b.op("y", "MatMul", {b.input("x", std::vector<int64_t>{6, 200}), b.constant("w", noise({200, 300}, 2))});
  Model m = b.done({y});
  CompileOptions options;
  options.target.threads = 2;
  auto compiled = compile_model(m, options);
  ASSERT_TRUE(compiled.ok()) << compiled.error().message();
  const Node& node = m.graph.nodes[0];
  ASSERT_EQ(node.kernel.name.rfind("kiln.gemm_f32_", 0), 0u);
  ASSERT_FALSE(node.kernel.params.empty());
  const Tensor& w = m.graph.value(node.inputs[1]).constant;
  ASSERT_NE(w.layout(), nullptr);
  EXPECT_EQ(w.layout()->packed_for.rfind("kiln gemm_f32 nr", 0), 0u);
  Tensor x = noise({6, 200}, 3);
  for (int threads : {1, 2}) {
    SessionOptions so;
    so.target.threads = threads;
    const testing::ModelRuns r = testing::run_model_both(m, {x}, so);
    ASSERT_FALSE(r.fast.empty());
    EXPECT_LE(testing::relative_l2(r.fast[0], r.ref[0]), 1e-6);
    EXPECT_EQ(r.kernels[0].label.rfind("gemm_f32_", 0), 0u);
  }
  // Parameters a hostile file records are refused, naming them.
  m.graph.nodes[0].kernel.params = {{"mr", int64_t{7}}, {"nr", int64_t{7}}, {"mc", int64_t{7}}, {"nc", int64_t{7}}, {"kc", int64_t{7}}};
  auto bad = Session::create(m, SessionOptions{});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("recorded GEMM parameters are invalid"), std::string::npos) << bad.error().message();
}

}  // namespace
}  // namespace kiln
