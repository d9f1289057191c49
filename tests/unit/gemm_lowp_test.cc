// kiln's lower-precision GEMMs (runtime/cpu/gemm/lowp.h) against exact references: u8·s8
// sums in integers with the dequantizing and requantizing epilogues, bf16 products of the
// bf16-rounded inputs in double; odd sizes in M, N and K, transposed B, one and two threads,
// A's rows in one block and in blocks of 8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "formats/layout.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/linear.h"
#include "runtime/threads.h"

namespace kiln {
namespace {

namespace gemm = cpu::gemm;

struct Dims {
  int64_t m, n, k;
};
const std::vector<Dims> kDims = {{1, 1, 1}, {5, 47, 3}, {8, 48, 4}, {13, 100, 37}, {17, 130, 300}};

// Runs `check` on every size (`dims`), B plain and transposed, on one and two threads.
void for_each_case(const std::function<void(const Dims&, bool, int)>& check, const std::vector<Dims>& dims = kDims) {
  for (int threads : {1, 2}) {
    use_threads(threads);
    for (const Dims& d : dims)
      for (bool trans : {false, true}) {
        SCOPED_TRACE("m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) + " k=" + std::to_string(d.k) +
                     (trans ? " transB" : "") + " threads=" + std::to_string(threads));
        check(d, trans, threads);
      }
  }
  use_threads(available_cores());
}

// The VNNI kernel, and where the CPU has AMX the tiles' path too: rows in whole tiles and past
// them, K in whole 64s of steps and past them (a last group shorter than 4 too), one or two
// column tiles in a block, several blocks of 32 rows, B's column tiles in several groups (a
// group fills half of L2), the threads splitting rows where columns run short.
TEST(GemmLowp, U8S8DequantizedAndRequantized) {
  if (auto why = gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::u8s8)) GTEST_SKIP() << *why;
  std::vector<Dims> dims = kDims;
  dims.insert(dims.end(), {{16, 16, 64}, {33, 47, 128}, {50, 100, 259}, {96, 65, 771}});
  if (CpuFeatures::host().amx) dims.push_back({40, 1200, 1000});  // the AMX path's columns in several groups, K in slices
  std::mt19937 rng(1);
  for (bool amx : {false, true})
  for_each_case([&](const Dims& d, bool trans, int threads) {
    if (amx && !gemm::u8s8_on_amx(CpuFeatures::host(), d.m, d.k)) return;
    SCOPED_TRACE(amx ? "AMX" : "VNNI");
    std::vector<uint8_t> a(static_cast<size_t>(d.m * d.k));
    std::vector<int8_t> b(static_cast<size_t>(d.k * d.n));
    for (auto& v : a) v = static_cast<uint8_t>(rng() % 256);
    for (auto& v : b) v = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
    std::vector<float> scale(static_cast<size_t>(d.n)), bias(static_cast<size_t>(d.n));
    for (int64_t j = 0; j < d.n; ++j) {
      scale[static_cast<size_t>(j)] = 1e-4f * static_cast<float>(1 + j % 7);
      bias[static_cast<size_t>(j)] = 0.01f * static_cast<float>(j % 5) - 0.02f;
    }
    std::vector<int8_t> packed(static_cast<size_t>(gemm::packed_b_s8_bytes(d.k, d.n)));
    std::vector<int32_t> sums(static_cast<size_t>(d.n));
    gemm::pack_b_s8(b.data(), trans ? d.k : d.n, trans, d.k, d.n, packed.data(), sums.data());
    // B as stored: [K, N], or [N, K] when transposed (the same values, read the other way).
    auto bv = [&](int64_t p, int64_t j) { return trans ? b[static_cast<size_t>(j * d.k + p)] : b[static_cast<size_t>(p * d.n + j)]; };
    // ReLU, Clip and GELU on the registers (Clip with a u8 output a clamp of the codes, its
    // bounds' codes saturating: FLT_MAX for no upper bound), SiLU, Sigmoid and Tanh through the
    // row kernels.
    const float big = std::numeric_limits<float>::max();
    for (const ActivationSpec spec :
         std::vector<ActivationSpec>{{Activation::relu}, {Activation::clip, -0.1f, 0.2f}, {Activation::clip, -big, big}, {Activation::gelu},
                                     {Activation::silu}, {Activation::sigmoid}, {Activation::tanh}}) {
      const Activation act = spec.kind;
      SCOPED_TRACE(std::string(activation_name(act)) + " " + std::to_string(spec.a) + " " + std::to_string(spec.b));
      gemm::QuantEpilogue ep{.col_sums = sums.data(), .a_zero = 131, .scale = scale.data(), .bias = bias.data(), .act = spec};
      std::vector<float> y(static_cast<size_t>(d.m * d.n), std::nanf(""));
      gemm::gemm_u8s8(d.m, d.n, d.k, a.data(), d.k, packed.data(), ep, y.data(), d.n, threads, 8, amx);
      std::vector<uint8_t> q(static_cast<size_t>(d.m * d.n), 7);
      ep.out_u8 = true;
      ep.out_scale = 0.003f;
      ep.out_zero = 10;
      gemm::gemm_u8s8(d.m, d.n, d.k, a.data(), d.k, packed.data(), ep, q.data(), d.n, threads, 0, amx);
      for (int64_t i = 0; i < d.m; ++i)
        for (int64_t j = 0; j < d.n; ++j) {
          int64_t s = 0;
          for (int64_t p = 0; p < d.k; ++p) s += (int64_t{a[static_cast<size_t>(i * d.k + p)]} - 131) * bv(p, j);
          const double v = double{scale[static_cast<size_t>(j)]} * static_cast<double>(s) + bias[static_cast<size_t>(j)];
          const double want = act == Activation::relu      ? std::max(0.0, v)
                              : act == Activation::clip    ? std::clamp(v, double{spec.a}, double{spec.b})
                              : act == Activation::sigmoid ? 1 / (1 + std::exp(-v))
                              : act == Activation::silu    ? v / (1 + std::exp(-v))
                              : act == Activation::tanh    ? std::tanh(v)
                                                           : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
          const float got = y[static_cast<size_t>(i * d.n + j)];
          ASSERT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want))) << i << "," << j;
          const double wq = std::clamp(std::nearbyint(want / 0.003) + 10, 0.0, 255.0);
          ASSERT_LE(std::abs(static_cast<double>(q[static_cast<size_t>(i * d.n + j)]) - wq), 1.0) << i << "," << j;
        }
    }
  }, dims);
}

// The u8 epilogues a network's convolutions end with: clamps (none, ReLU, Clip) around an
// 8-bit residual Z, u8 or s8 (a ResNet block's end), and one clamp without Z. Where the CPU has
// AMX, its path (U8s8Clamped: every decision made once a product, a row's two vectors of codes
// in one store, the packs' saturation as the clamp where the codes' bounds are 0 and 255)
// writes the VNNI kernel's codes exactly where there is a Z; all within a step of the exact
// value. Whole and partial pairs of column tiles, K in whole 64s and past them, the output's
// zero point 0 (a ReLU's codes from 0) and 10 (bounds inside 0..255).
TEST(GemmLowp, U8s8ClampedEpilogues) {
  if (auto why = gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::u8s8)) GTEST_SKIP() << *why;
  std::mt19937 rng(5);
  enum ZKind { none, u8, s8 };
  for_each_case([&](const Dims& d, bool trans, int threads) {
    std::vector<uint8_t> a(static_cast<size_t>(d.m * d.k)), zq(static_cast<size_t>(d.m * d.n));
    std::vector<int8_t> b(static_cast<size_t>(d.k * d.n));
    for (auto& v : a) v = static_cast<uint8_t>(rng() % 256);
    for (auto& v : b) v = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
    for (auto& v : zq) v = static_cast<uint8_t>(rng() % 256);
    std::vector<float> scale(static_cast<size_t>(d.n)), bias(static_cast<size_t>(d.n));
    for (int64_t j = 0; j < d.n; ++j) {
      scale[static_cast<size_t>(j)] = 2e-6f * static_cast<float>(1 + j % 7);
      bias[static_cast<size_t>(j)] = 0.01f * static_cast<float>(j % 5) - 0.02f;
    }
    std::vector<int8_t> packed(static_cast<size_t>(gemm::packed_b_s8_bytes(d.k, d.n)));
    std::vector<int32_t> sums(static_cast<size_t>(d.n));
    gemm::pack_b_s8(b.data(), trans ? d.k : d.n, trans, d.k, d.n, packed.data(), sums.data());
    auto bv = [&](int64_t p, int64_t j) { return trans ? b[static_cast<size_t>(j * d.k + p)] : b[static_cast<size_t>(p * d.n + j)]; };
    const std::vector<ActivationSpec> clamps = {{Activation::none}, {Activation::relu}, {Activation::clip, -0.1f, 0.2f}};
    for (ZKind zk : {none, u8, s8})
      for (const ActivationSpec& act : clamps)
        for (const ActivationSpec& post : clamps) {
          if (zk == none && post.kind != Activation::none) continue;
          for (int32_t out_zero : {0, 10}) {
            SCOPED_TRACE("Z " + std::to_string(zk) + " " + std::string(activation_name(act.kind)) + " then " +
                         std::string(activation_name(post.kind)) + " zero " + std::to_string(out_zero));
            gemm::QuantEpilogue ep{.col_sums = sums.data(), .a_zero = 0, .scale = scale.data(), .bias = bias.data(), .act = act};
            if (zk != none) {
              ep.z_q = zq.data(), ep.z_s8 = zk == s8, ep.z_scale = 0.004f, ep.z_zero = zk == s8 ? -3 : 7, ep.ldz = d.n;
              ep.post = post;
            }
            ep.out_u8 = true, ep.out_scale = 0.003f, ep.out_zero = out_zero;
            std::vector<uint8_t> vnni(static_cast<size_t>(d.m * d.n), 7), amx = vnni;
            gemm::gemm_u8s8(d.m, d.n, d.k, a.data(), d.k, packed.data(), ep, vnni.data(), d.n, threads, 0, false);
            const bool on_amx = gemm::u8s8_on_amx(CpuFeatures::host(), d.m, d.k);
            if (on_amx) {
              gemm::gemm_u8s8(d.m, d.n, d.k, a.data(), d.k, packed.data(), ep, amx.data(), d.n, threads, 0, true);
              // Without Z the VNNI kernel folds the scale and bias with the output's (one FMA a
              // code), which may round a code the other way.
              if (zk != none) {
                ASSERT_EQ(amx, vnni);
              }
            }
            auto clamp = [](const ActivationSpec& f, double v) {
              return f.kind == Activation::relu ? std::max(0.0, v) : f.kind == Activation::clip ? std::clamp(v, double{f.a}, double{f.b}) : v;
            };
            for (int64_t i = 0; i < d.m; ++i)
              for (int64_t j = 0; j < d.n; ++j) {
                int64_t s = 0;
                for (int64_t p = 0; p < d.k; ++p) s += int64_t{a[static_cast<size_t>(i * d.k + p)]} * bv(p, j);
                double v = clamp(act, double{scale[static_cast<size_t>(j)]} * static_cast<double>(s) + bias[static_cast<size_t>(j)]);
                if (zk != none) {
                  const uint8_t code = zq[static_cast<size_t>(i * d.n + j)];
                  v = clamp(post, v + 0.004 * ((zk == s8 ? static_cast<int8_t>(code) : code) - ep.z_zero));
                }
                const double want = std::clamp(std::nearbyint(v / 0.003) + out_zero, 0.0, 255.0);
                ASSERT_LE(std::abs(static_cast<double>(vnni[static_cast<size_t>(i * d.n + j)]) - want), 1.0) << i << "," << j;
                if (on_amx) {
                  ASSERT_LE(std::abs(static_cast<double>(amx[static_cast<size_t>(i * d.n + j)]) - want), 1.0) << i << "," << j;
                }
              }
          }
        }
  }, {{16, 32, 64}, {33, 64, 128}, {48, 40, 64}, {32, 17, 100}, {50, 96, 192}, {5, 47, 3}});
}

// A QFusedMatMul weight a compiled model stores packed: packed_b_s8_layout places B's elements
// where pack_b_s8 does (padding zero), and the column sums read back from the panels are the
// ones pack_b_s8 summed, on odd and panel-multiple sizes, both ways round.
TEST(GemmLowp, S8LayoutAndColumnSums) {
  if (auto why = gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::u8s8)) GTEST_SKIP() << *why;
  std::mt19937 rng(5);
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 50}, {64, 48}, {259, 97}, {768, 768}})
    for (bool trans : {false, true}) {
      SCOPED_TRACE(std::to_string(k) + "x" + std::to_string(n) + (trans ? " transposed" : ""));
      Tensor b(DType::i8, trans ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
      for (int64_t i = 0; i < b.numel(); ++i) b.data<int8_t>()[i] = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
      std::vector<int8_t> packed(static_cast<size_t>(gemm::packed_b_s8_bytes(k, n)));
      std::vector<int32_t> sums(static_cast<size_t>(n)), read(static_cast<size_t>(n), -1);
      gemm::pack_b_s8(b.data<int8_t>(), trans ? k : n, trans, k, n, packed.data(), sums.data());
      const Tensor placed = pack(b, gemm::packed_b_s8_layout(k, n, trans));
      ASSERT_EQ(placed.nbytes(), packed.size());
      EXPECT_EQ(std::memcmp(placed.raw(), packed.data(), packed.size()), 0);
      gemm::packed_b_s8_column_sums(packed.data(), k, n, read.data());
      EXPECT_EQ(read, sums);
    }
}

// The vdpbf16ps kernel, and where the CPU has AMX the tiles' path too (rows past whole tiles,
// K past whole 32s and odd, B's columns in several groups), with a bias, GELU, and a residual
// or none.
TEST(GemmLowp, Bf16) {
  if (auto why = gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::bf16)) GTEST_SKIP() << *why;
  std::vector<Dims> dims = kDims;
  dims.insert(dims.end(), {{16, 16, 32}, {33, 47, 64}, {50, 100, 259}, {96, 65, 771}});
  if (CpuFeatures::host().amx) dims.push_back({40, 1200, 1000});  // the AMX path's columns in several groups, K in slices
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (bool amx : {false, true})
  for_each_case([&](const Dims& d, bool trans, int threads) {
    if (amx && !gemm::bf16_on_amx(CpuFeatures::host(), d.k)) return;
    SCOPED_TRACE(amx ? "AMX" : "vdpbf16ps");
    std::vector<float> a(static_cast<size_t>(d.m * d.k)), b(static_cast<size_t>(d.k * d.n)), bias(static_cast<size_t>(d.n));
    std::vector<float> z(static_cast<size_t>(d.m * d.n));
    for (auto& v : a) v = dist(rng);
    for (auto& v : b) v = dist(rng);
    for (auto& v : bias) v = dist(rng);
    for (auto& v : z) v = dist(rng);
    std::vector<uint16_t> packed(static_cast<size_t>(gemm::packed_b_bf16_elements(d.k, d.n)));
    gemm::pack_b_bf16(b.data(), trans ? d.k : d.n, trans, d.k, d.n, packed.data());
    auto bv = [&](int64_t p, int64_t j) { return trans ? b[static_cast<size_t>(j * d.k + p)] : b[static_cast<size_t>(p * d.n + j)]; };
    for (bool residual : {true, false}) {  // GELU alone applies on the AMX path's registers
      SCOPED_TRACE(residual ? "GELU + Z" : "GELU");
      gemm::Epilogue ep{.bias = bias.data(), .z = residual ? z.data() : nullptr, .ldz = d.n, .act = {Activation::gelu}};
      std::vector<std::byte> ws(gemm::bf16_workspace_bytes(d.m, d.k));
      std::vector<float> y(static_cast<size_t>(d.m * d.n), std::nanf(""));
      gemm::gemm_bf16(d.m, d.n, d.k, a.data(), d.k, packed.data(), ep, y.data(), d.n, threads, ws.data(), 8, amx);
      for (int64_t i = 0; i < d.m; ++i)
        for (int64_t j = 0; j < d.n; ++j) {
          double s = bias[static_cast<size_t>(j)];
          for (int64_t p = 0; p < d.k; ++p)
            s += double{gemm::from_bf16(gemm::to_bf16(a[static_cast<size_t>(i * d.k + p)]))} * gemm::from_bf16(gemm::to_bf16(bv(p, j)));
          const double want = 0.5 * s * (1 + std::erf(s / std::sqrt(2.0))) + (residual ? z[static_cast<size_t>(i * d.n + j)] : 0.0);
          ASSERT_NEAR(y[static_cast<size_t>(i * d.n + j)], want, 1e-4 * std::max(1.0, std::abs(s))) << i << "," << j;
        }
    }
  }, dims);
}

// pack_b_bf16 from bf16 bits copies them where it puts the rounded floats: element (p, j) of B
// in panel j / 48, pair p / 2, at (j % 48) * 2 + p % 2, zero past K and N; both ways round,
// on K and N odd, below a panel and past one.
TEST(GemmLowp, Bf16PackedFromBitsWhereFromFloats) {
  constexpr int64_t nr = gemm::kLowpTile.nr;
  for (auto [k, n] : {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {64, 48}, {33, 97}, {130, 50}})
    for (bool trans : {false, true}) {
      SCOPED_TRACE(std::to_string(k) + "x" + std::to_string(n) + (trans ? " trans" : ""));
      std::vector<uint16_t> bits(static_cast<size_t>(k * n));
      std::vector<float> floats(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) {
        bits[i] = static_cast<uint16_t>(0x3f80 + (i * 37) % 200 + (i % 3 ? 0 : 0x8000));  // ±1.0 .. ±3.5 in bf16
        floats[i] = gemm::from_bf16(bits[i]);
      }
      const auto size = static_cast<size_t>(gemm::packed_b_bf16_elements(k, n));
      std::vector<uint16_t> from_bits(size, 0xffff), from_floats(size, 0xffff);
      gemm::pack_b_bf16(bits.data(), trans ? k : n, trans, k, n, from_bits.data());
      gemm::pack_b_bf16(floats.data(), trans ? k : n, trans, k, n, from_floats.data());
      EXPECT_EQ(from_bits, from_floats);
      std::vector<uint16_t> want(size, 0);
      const int64_t pairs = (k + 1) / 2;
      for (int64_t p = 0; p < k; ++p)
        for (int64_t j = 0; j < n; ++j)
          want[static_cast<size_t>((j / nr) * pairs * nr * 2 + (p / 2) * nr * 2 + (j % nr) * 2 + p % 2)] =
              bits[static_cast<size_t>(trans ? j * k + p : p * n + j)];
      EXPECT_EQ(from_bits, want);
    }
}

// The blockings the f16 tests run: rows of A in blocks of 8 (two tiles once rounded up), the
// defaults, and what max-autotune may record: K in passes of 128 steps (one block each) with
// the threads on A's rows, and of 256 with the threads on B's panels.
const gemm::F16Blocking kF16Blockings[] = {
    {.mc = 8},
    {},
    {.mc = 12, .kc = 128, .split = gemm::F16Split::rows},
    {.mc = 30, .kc = 256, .split = gemm::F16Split::panels},
};

// f16 · f16 on AVX512-FP16: against the products of the f16-rounded inputs summed in double.
// The kernel sums in f16 for kF16Block products, and adds kF16Group such sums in f16, so each
// value may be off by what f16 sums of that length lose (a few 2^-11 of their size), never by
// what a sum over all of K in f16 would (K = 1000 and 3300: the f16 sums widened between
// groups and in the middle of one), in each of kF16Blockings.
TEST(GemmLowp, F16) {
  if (auto why = gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::f16)) GTEST_SKIP() << *why;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<Dims> dims = kDims;
  dims.push_back({6, 70, 1000});
  dims.push_back({11, 65, 3300});  // K in three chunks of kF16Kc or less, the sums kept in C between them
  dims.push_back({40, 70, 37});    // N ≤ 2M: the threads split A's rows, each copying its own
  dims.push_back({9, 20, 0});      // no K: C is the bias
  dims.push_back({15, 70, 100});   // blocks of 8 and 7 rows: their last rows as 4 + 4 and 4 + 3
  for (int threads : {1, 2}) {
    use_threads(threads);
    for (const Dims& d : dims)
      for (bool trans : {false, true}) {
        SCOPED_TRACE("m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) + " k=" + std::to_string(d.k) + (trans ? " transB" : "") +
                     " threads=" + std::to_string(threads));
        std::vector<float> a(static_cast<size_t>(d.m * d.k)), bias(static_cast<size_t>(d.n));
        std::vector<uint16_t> b(static_cast<size_t>(d.k * d.n));
        for (auto& v : a) v = dist(rng);
        for (auto& v : b) v = half(dist(rng)).bits;
        for (auto& v : bias) v = dist(rng);
        std::vector<uint16_t> packed(static_cast<size_t>(gemm::packed_b_f16_elements(d.k, d.n)));
        gemm::pack_b_f16(b.data(), trans ? d.k : d.n, trans, d.k, d.n, packed.data());
        auto bv = [&](int64_t p, int64_t j) {
          half h;
          h.bits = trans ? b[static_cast<size_t>(j * d.k + p)] : b[static_cast<size_t>(p * d.n + j)];
          return static_cast<double>(static_cast<float>(h));
        };
        gemm::Epilogue ep{.bias = bias.data(), .act = {Activation::relu}};
        std::vector<std::byte> ws(gemm::f16_workspace_bytes(d.m, d.k));
        for (const gemm::F16Blocking& blocking : kF16Blockings) {
        SCOPED_TRACE("mc=" + std::to_string(blocking.mc) + " kc=" + std::to_string(blocking.kc) + " split=" +
                     std::to_string(static_cast<int>(blocking.split)));
        std::vector<float> y(static_cast<size_t>(d.m * d.n), std::nanf(""));
        gemm::gemm_f16(d.m, d.n, d.k, a.data(), d.k, packed.data(), ep, y.data(), d.n, threads, ws.data(), blocking);
        double err = 0, norm = 0;
        for (int64_t i = 0; i < d.m; ++i)
          for (int64_t j = 0; j < d.n; ++j) {
            double s = bias[static_cast<size_t>(j)], mag = 0;
            for (int64_t p = 0; p < d.k; ++p) {
              const double t = static_cast<float>(half(a[static_cast<size_t>(i * d.k + p)])) * bv(p, j);
              s += t;
              mag += std::abs(t);
            }
            const double want = std::max(0.0, s), got = y[static_cast<size_t>(i * d.n + j)];
            // Each f16 sum rounds at most 2^-11 of the block's magnitude per step.
            ASSERT_NEAR(got, want, 1e-6 + mag * std::ldexp(1.0, -11) * static_cast<double>(gemm::kF16Block) / 4) << i << "," << j;
            err += (got - want) * (got - want);
            norm += want * want;
          }
        EXPECT_LE(std::sqrt(err / std::max(norm, 1e-30)), 3e-3);
        }
      }
  }
  use_threads(available_cores());
}

// B in f32 panels of the f16 GEMM's width (pack_b's for that NR), paired into f16 as
// pack_b_f16 pairs B's f16 rounding: the same bits, K odd or even, N in one panel or past it.
TEST(GemmLowp, F16PackedFromPanels) {
  if (auto why = gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::f16)) GTEST_SKIP() << *why;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);  // past f16's largest: infinities too
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{1, 1}, {2, 64}, {7, 65}, {40, 130}, {41, 200}}) {
    SCOPED_TRACE("k=" + std::to_string(k) + " n=" + std::to_string(n));
    std::vector<float> b(static_cast<size_t>(k * n));
    for (float& v : b) v = dist(rng) * (dist(rng) > 0 ? 1.f : 1e-4f);  // small values rounded too
    std::vector<float> panels(static_cast<size_t>(gemm::packed_b_floats(k, n, gemm::kF16Tile.nr)));
    gemm::pack_b(b.data(), n, false, k, n, gemm::kF16Tile.nr, panels.data());
    std::vector<uint16_t> bits(b.size()), want(static_cast<size_t>(gemm::packed_b_f16_elements(k, n)));
    for (size_t i = 0; i < b.size(); ++i) bits[i] = half(b[i]).bits;
    gemm::pack_b_f16(bits.data(), n, false, k, n, want.data());
    std::vector<uint16_t> got(want.size(), 0xffff);
    gemm::pack_b_f16_from_panels(panels.data(), k, n, got.data());
    EXPECT_EQ(got, want);
  }
}

// The f16 GEMM's block of A's rows (f16_block_rows) on a 2 MiB L2: ResNet-50's 56x56 1x1 product
// to 128 channels in 516 rows (the copy and C a quarter of L2, not the copy alone half: 2,046), a
// transformer's 768- and 3072-column products in 132 (one block of a 128-token sequence), a
// long K held to half of L2 by its copy alone, and never fewer rows than a tile.
TEST(GemmLowp, F16BlockRows) {
  const int64_t l2 = int64_t{2} << 20;
  EXPECT_EQ(gemm::f16_block_rows(128, 256, l2), 516);
  EXPECT_EQ(gemm::f16_block_rows(768, 768, l2), 132);
  EXPECT_EQ(gemm::f16_block_rows(3072, 768, l2), 132);
  EXPECT_EQ(gemm::f16_block_rows(64, 1536, l2), 162);               // 512 KiB / (3 KiB + 256 bytes) = 157 -> 162
  EXPECT_EQ(gemm::f16_block_rows(16, 8192, int64_t{1} << 20), 30);  // the copy alone: 512 KiB / 16 KiB = 32 -> 30
  EXPECT_EQ(gemm::f16_block_rows(64, 4096, 16 << 10), gemm::kF16Tile.mr);
  for (int64_t n : {1, 64, 1000, 4096})
    for (int64_t kc : {2, 128, 1536}) EXPECT_EQ(gemm::f16_block_rows(n, kc, l2) % gemm::kF16Tile.mr, 0) << n << " " << kc;
}

// The int8 GEMM's block of A's rows (u8s8_block_rows) on a 2 MiB L2: the 1024x1024x1024 product
// to f32 in 128 rows (A's and C's rows a quarter of L2: 102, at least 128), a transformer's
// 768-column products in one block of their 128 rows or more, MobileNetV2's 12544x96x16
// expansion to u8 in 4,688 (C's bytes counted), A alone held to half of L2, and never fewer rows
// than a tile.
// pack(w, l) gives the `bytes` at `packed` (what the GEMM's own packing wrote), and unpack()
// gives w back.
void expect_layout_places(const Tensor& w, const PackedLayout& l, const void* packed, size_t bytes) {
  EXPECT_EQ(check_layout(l, w.numel(), bytes, w.nbytes() / static_cast<size_t>(w.numel())), std::nullopt);
  const Tensor placed = pack(w, l);
  ASSERT_EQ(placed.nbytes(), bytes);
  EXPECT_EQ(std::memcmp(placed.raw(), packed, bytes), 0);
  EXPECT_EQ(std::memcmp(unpack(placed).raw(), w.raw(), w.nbytes()), 0);
}

// pack() through packed_b_f16_layout places every element where pack_b_f16 does, and unpack()
// gives the weight back. (No AVX512-FP16 needed: the packing is plain code.)
TEST(GemmLowp, F16Layout) {
  std::mt19937 rng(9);
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 50}, {64, 64}, {259, 97}})
    for (bool trans : {false, true}) {
      SCOPED_TRACE(std::to_string(k) + "x" + std::to_string(n) + (trans ? " transposed" : ""));
      Tensor b(DType::f16, trans ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
      for (int64_t i = 0; i < b.numel(); ++i) b.data<half>()[i] = half(static_cast<float>(rng() % 2001) / 1000.f - 1.f);
      std::vector<uint16_t> packed(static_cast<size_t>(gemm::packed_b_f16_elements(k, n)));
      gemm::pack_b_f16(static_cast<const uint16_t*>(b.raw()), trans ? k : n, trans, k, n, packed.data());
      expect_layout_places(b, gemm::packed_b_f16_layout(k, n, trans), packed.data(), packed.size() * 2);
    }
}

// pack() through packed_b_f16_windows_layout and packed_b_s8_windows_layout places a
// convolution's weight [N, C, KH, KW] where in_windows_order then pack_b_f16 / pack_b_s8 do;
// neither describes a C whose pairs (f16) or groups of 4 (s8) of K steps would span two taps.
TEST(GemmLowp, WindowsLayouts) {
  std::mt19937 rng(11);
  for (const bool f16 : {true, false})
    for (const int64_t c : {2, 4, 5, 24, 64, 70}) {
      SCOPED_TRACE(std::string(f16 ? "f16" : "s8") + " C=" + std::to_string(c));
      const int64_t n = 50;
      const gemm::ImageWindows win{.h = 9, .w = 9, .c = c, .oh = 9, .ow = 9, .kh = 3, .kw = 3};
      const int64_t taps = win.kh * win.kw, k = win.k();
      const std::optional<PackedLayout> l =
          f16 ? gemm::packed_b_f16_windows_layout(n, c, taps) : gemm::packed_b_s8_windows_layout(n, c, taps);
      ASSERT_EQ(l.has_value(), c % (f16 ? 2 : 4) == 0);
      if (!l) continue;
      Tensor w(f16 ? DType::f16 : DType::i8, {n, c, win.kh, win.kw});
      std::vector<std::byte> packed;
      if (f16) {
        for (int64_t i = 0; i < w.numel(); ++i) w.data<half>()[i] = half(static_cast<float>(rng() % 2001) / 1000.f - 1.f);
        const Tensor ordered = cpu::in_windows_order(static_cast<const uint16_t*>(w.raw()), DType::u16, n, win);
        packed.resize(static_cast<size_t>(gemm::packed_b_f16_elements(k, n)) * 2);
        gemm::pack_b_f16(static_cast<const uint16_t*>(ordered.raw()), k, true, k, n, reinterpret_cast<uint16_t*>(packed.data()));
      } else {
        for (int64_t i = 0; i < w.numel(); ++i) w.data<int8_t>()[i] = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
        const Tensor ordered = cpu::in_windows_order(w.data<int8_t>(), DType::i8, n, win);
        packed.resize(static_cast<size_t>(gemm::packed_b_s8_bytes(k, n)));
        std::vector<int32_t> sums(static_cast<size_t>(n));
        gemm::pack_b_s8(ordered.data<int8_t>(), k, true, k, n, reinterpret_cast<int8_t*>(packed.data()), sums.data());
      }
      expect_layout_places(w, *l, packed.data(), packed.size());
    }
}

TEST(GemmLowp, U8s8BlockRows) {
  const int64_t l2 = int64_t{2} << 20;
  EXPECT_EQ(gemm::u8s8_block_rows(1024, 1024, 4, l2), 128);
  EXPECT_EQ(gemm::u8s8_block_rows(768, 768, 1, l2), 344);     // 512 KiB / 1,536 bytes = 341 -> 344
  EXPECT_EQ(gemm::u8s8_block_rows(3072, 768, 4, l2), 128);    // 85 -> at least 128
  EXPECT_EQ(gemm::u8s8_block_rows(16, 96, 1, l2), 4688);      // 512 KiB / 112 bytes = 4,681 -> 4,688
  EXPECT_EQ(gemm::u8s8_block_rows(16384, 16, 1, l2), 64);     // A alone: 1 MiB / 16 KiB
  EXPECT_EQ(gemm::u8s8_block_rows(4096, 64, 4, 16 << 10), gemm::kLowpTile.mr);
  for (int64_t n : {1, 48, 1000})
    for (int64_t k : {1, 64, 3000}) EXPECT_EQ(gemm::u8s8_block_rows(k, n, 1, l2) % gemm::kLowpTile.mr, 0) << n << " " << k;
}

// gemm_f16 with C in parts (split outputs, each beginning at a multiple of 64 columns): each
// part bit for bit what the whole C gets, the plain one without the activation, nothing past a
// part's rows; the threads splitting B's panels (few rows) and A's rows (130, in one block or in
// blocks of 8), K in one chunk and in three, and no K.
TEST(GemmLowp, F16ColumnParts) {
  if (auto why = gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::f16)) GTEST_SKIP() << *why;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const std::vector<int64_t> widths = {128, 64, 37};
  const int64_t n = 229;
  for (int threads : {1, 2})
    for (const Dims& d : {Dims{13, n, 37}, Dims{130, n, 37}, Dims{3, n, 3300}, Dims{9, n, 0}})
      for (int64_t mc : {int64_t{0}, int64_t{8}}) {
        use_threads(threads);
        SCOPED_TRACE("m=" + std::to_string(d.m) + " k=" + std::to_string(d.k) + " mc=" + std::to_string(mc) + " threads=" + std::to_string(threads));
        std::vector<float> a(static_cast<size_t>(d.m * std::max<int64_t>(d.k, 1))), bias(static_cast<size_t>(n));
        std::vector<uint16_t> b(static_cast<size_t>(d.k * n));
        for (auto& v : a) v = dist(rng);
        for (auto& v : b) v = half(dist(rng)).bits;
        for (auto& v : bias) v = dist(rng);
        std::vector<uint16_t> packed(static_cast<size_t>(std::max<int64_t>(gemm::packed_b_f16_elements(d.k, n), 1)));
        gemm::pack_b_f16(b.data(), n, false, d.k, n, packed.data());
        std::vector<std::byte> ws(gemm::f16_workspace_bytes(d.m, d.k) + 64);
        std::vector<float> whole(static_cast<size_t>(d.m * n), std::nanf("")), bare = whole;
        gemm::gemm_f16(d.m, n, d.k, a.data(), d.k, packed.data(), gemm::Epilogue{.bias = bias.data()}, bare.data(), n, threads, ws.data(), {.mc = mc});
        gemm::gemm_f16(d.m, n, d.k, a.data(), d.k, packed.data(), gemm::Epilogue{.bias = bias.data(), .act = {Activation::gelu}}, whole.data(),
                       n, threads, ws.data(), {.mc = mc});
        std::vector<std::vector<float>> out;
        std::vector<gemm::ColumnPart> parts;
        int64_t begin = 0;
        for (int64_t w : widths) {
          out.emplace_back(static_cast<size_t>(d.m * (w + 3)), std::nanf(""));  // 3 floats past each row: untouched
          parts.push_back({.begin = begin, .c = out.back().data(), .ldc = w + 3, .plain = parts.size() == 1});
          begin += w;
        }
        gemm::gemm_f16(d.m, n, d.k, a.data(), d.k, packed.data(), gemm::Epilogue{.bias = bias.data(), .act = {Activation::gelu}}, nullptr, 0,
                       threads, ws.data(), {.mc = mc}, parts);
        for (size_t q = 0; q < parts.size(); ++q)
          for (int64_t i = 0; i < d.m; ++i)
            for (int64_t j = 0; j < widths[q] + 3; ++j) {
              const float got = out[q][static_cast<size_t>(i * (widths[q] + 3) + j)];
              if (j >= widths[q]) EXPECT_TRUE(std::isnan(got)) << "part " << q << " wrote past its row " << i;
              else ASSERT_EQ(got, (parts[q].plain ? bare : whole)[static_cast<size_t>(i * n + parts[q].begin + j)]) << "part " << q << " at " << i << ", " << j;
            }
      }
  use_threads(available_cores());
}

// A convolution as gemm_f16_windows runs it (channels-last images, weight [K, KH, KW, C]):
// against the f16-rounded inputs convolved in double with zero padding, on filter sizes,
// strides, dilations and paddings that leave windows partly outside the image, C a vector
// multiple or not, K above kF16Kc, a residual (and a ReLU after it on every other geometry), one
// and two threads, A's rows in blocks of 8 (two 6-row tiles once rounded up) and in the default
// blocks.
TEST(GemmLowp, F16Windows) {
  if (auto why = gemm::lowp_lacks(CpuFeatures::host(), gemm::Lowp::f16)) GTEST_SKIP() << *why;
  struct Geometry {
    int64_t images, h, w, c, n, kh, kw, stride, dilation, pad;
  };
  const std::vector<Geometry> geometries = {
      {2, 7, 9, 19, 70, 3, 3, 1, 1, 1},   // 3x3 "same", C not a multiple of 16, two images
      {1, 8, 8, 16, 33, 3, 3, 2, 1, 1},   // stride 2
      {1, 9, 7, 33, 130, 1, 1, 2, 1, 0},  // a strided pointwise convolution (ResNet's downsample)
      {1, 11, 6, 5, 24, 5, 5, 1, 2, 3},   // dilated: the taps of a window row apart in the image
      {1, 12, 12, 3, 8, 7, 7, 2, 1, 3},   // ResNet's stem
      {1, 5, 6, 200, 40, 3, 3, 1, 1, 1},  // K = 1800: two chunks
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (const Geometry& g : geometries)
    for (int threads : {1, 2})
      for (int64_t mc : {int64_t{8}, int64_t{0}}) {
        SCOPED_TRACE("c=" + std::to_string(g.c) + " k=" + std::to_string(g.kh) + " stride=" + std::to_string(g.stride) +
                     " threads=" + std::to_string(threads) + " mc=" + std::to_string(mc));
        use_threads(threads);
        const int64_t span_h = g.dilation * (g.kh - 1) + 1, span_w = g.dilation * (g.kw - 1) + 1;
        gemm::ImageWindows win{.h = g.h, .w = g.w, .c = g.c, .oh = (g.h + 2 * g.pad - span_h) / g.stride + 1,
                               .ow = (g.w + 2 * g.pad - span_w) / g.stride + 1, .kh = g.kh, .kw = g.kw, .sh = g.stride,
                               .sw = g.stride, .dh = g.dilation, .dw = g.dilation, .pt = g.pad, .pl = g.pad};
        const int64_t m = g.images * win.oh * win.ow, k = win.k();
        std::vector<float> x(static_cast<size_t>(g.images * g.h * g.w * g.c)), bias(static_cast<size_t>(g.n)),
            z(static_cast<size_t>(m * g.n));
        std::vector<uint16_t> wt(static_cast<size_t>(g.n * k));  // [N, KH, KW, C]
        for (auto& v : x) v = dist(rng);
        for (auto& v : wt) v = half(dist(rng)).bits;
        for (auto& v : bias) v = dist(rng);
        for (auto& v : z) v = dist(rng);
        std::vector<uint16_t> packed(static_cast<size_t>(gemm::packed_b_f16_elements(k, g.n)));
        gemm::pack_b_f16(wt.data(), k, true, k, g.n, packed.data());
        // ReLU before the residual, and after it on every other geometry (a ResNet block's
        // epilogue, which the tiles finish in registers).
        const bool post = (&g - geometries.data()) % 2 == 1;
        gemm::Epilogue ep{.bias = bias.data(), .z = z.data(), .ldz = g.n, .act = {Activation::relu}};
        if (post) ep.post = {Activation::relu};
        std::vector<std::byte> ws(gemm::f16_workspace_bytes(m, k));
        std::vector<float> y(static_cast<size_t>(m * g.n), std::nanf(""));
        gemm::gemm_f16_windows(m, g.n, win, x.data(), packed.data(), ep, y.data(), g.n, threads, ws.data(), {.mc = mc});
        double err = 0, norm = 0;
        for (int64_t i = 0; i < m; ++i) {
          const int64_t image = i / (win.oh * win.ow), oy = i / win.ow % win.oh, ox = i % win.ow;
          for (int64_t j = 0; j < g.n; ++j) {
            double s = bias[static_cast<size_t>(j)], mag = 0;
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t iy = oy * g.stride - g.pad + ky * g.dilation, ix = ox * g.stride - g.pad + kx * g.dilation;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                for (int64_t ch = 0; ch < g.c; ++ch) {
                  half wv;
                  wv.bits = wt[static_cast<size_t>(((j * g.kh + ky) * g.kw + kx) * g.c + ch)];
                  const double t = static_cast<float>(half(x[static_cast<size_t>(((image * g.h + iy) * g.w + ix) * g.c + ch)])) *
                                   static_cast<double>(static_cast<float>(wv));
                  s += t;
                  mag += std::abs(t);
                }
              }
            // The epilogue: the activation, then the residual, then the post-activation.
            const double summed = std::max(0.0, s) + z[static_cast<size_t>(i * g.n + j)];
            const double want = post ? std::max(0.0, summed) : summed, got = y[static_cast<size_t>(i * g.n + j)];
            ASSERT_NEAR(got, want, 1e-5 + mag * std::ldexp(1.0, -11) * static_cast<double>(gemm::kF16Block) / 4) << i << "," << j;
            err += (got - want) * (got - want);
            norm += want * want;
          }
        }
        EXPECT_LE(std::sqrt(err / std::max(norm, 1e-30)), 3e-3);
      }
  use_threads(available_cores());
}

// 32 rows or fewer on the tiles with each thread's share of a bf16 weight past
// amx_stream_bytes() (a language model's head): B streams through a panel at a time, its three
// column tiles a block, one or two tiles of rows (lowp_amx.cc). Their C is bit for bit the same
// rows of a taller A's on one thread, which takes B in groups and K in slices, checked against
// exact sums above: K past whole chunks, N past whole panels and tiles, one and two threads
// (whose shares of B's columns may start inside a panel), a bias.
TEST(GemmLowp, AmxStreamsAWideWeight) {
  if (!CpuFeatures::host().amx) GTEST_SKIP() << "the CPU has no AMX";
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const int64_t tall = 48, k = 1030;
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    const int64_t n = (gemm::amx_stream_bytes() * threads / (2 * k) + 100) / 48 * 48 + 37;
    std::vector<float> a(static_cast<size_t>(tall * k)), b(static_cast<size_t>(k * n)), bias(static_cast<size_t>(n));
    for (auto& v : a) v = dist(rng);
    for (auto& v : b) v = dist(rng);
    for (auto& v : bias) v = dist(rng);
    std::vector<uint16_t> packed(static_cast<size_t>(gemm::packed_b_bf16_elements(k, n)));
    gemm::pack_b_bf16(b.data(), n, false, k, n, packed.data());
    const gemm::Epilogue ep{.bias = bias.data()};
    std::vector<std::byte> ws(gemm::bf16_workspace_bytes(tall, k));
    std::vector<float> want(static_cast<size_t>(tall * n));
    use_threads(1);
    gemm::gemm_bf16(tall, n, k, a.data(), k, packed.data(), ep, want.data(), n, 1, ws.data(), 0, true);
    use_threads(threads);
    for (int64_t m : {16, 32}) {
      SCOPED_TRACE("m=" + std::to_string(m));
      std::vector<float> y(static_cast<size_t>(m * n), std::nanf(""));
      gemm::gemm_bf16(m, n, k, a.data(), k, packed.data(), ep, y.data(), n, threads, ws.data(), 0, true);
      EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0);
    }
  }
  use_threads(available_cores());
}

// gemm_bf16_tiles between bf16 activations: A's rows bf16 or f32, C's bf16 or f32, B in panels
// of K up to a whole tile. Against the f32 product of the bf16-rounded inputs in double (each
// bf16 output within one rounding of it) for every K, and bit for bit gemm_bf16's rounded where
// K is a whole number of tiles (the same tiles' sums). K below a tile, past one and in place;
// rows short of a tile, rows in several of the copy's chunks; 24 columns (a masked tile) and
// more; the clamps finished on the registers (none, ReLU, Clip; an f32 or bf16 residual between
// two), a SiLU through the block's values (a bf16 residual widened beside it); one and two
// threads.
TEST(GemmLowp, Bf16TilesOnBf16Rows) {
  if (!CpuFeatures::host().amx) GTEST_SKIP() << "the CPU has no AMX";
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  struct Epi {
    const char* name;
    ActivationSpec act;
    bool z, z16 = false;  // an f32 residual, a bf16 one (with a bf16 C), then a ReLU
  };
  const Epi epis[] = {{"none", {}, false},
                      {"ReLU", {Activation::relu}, false},
                      {"Clip", {Activation::clip, 0.f, 0.5f}, false},
                      {"SiLU", {Activation::silu}, false},
                      {"ReLU, Z, ReLU", {Activation::relu}, true},
                      {"Clip, bf16 Z, ReLU", {Activation::clip, 0.f, 0.5f}, true, true},
                      {"SiLU, bf16 Z, ReLU", {Activation::silu}, true, true}};
  for (const Dims& d : {Dims{63, 48, 16}, Dims{30, 24, 24}, Dims{100, 96, 40}, Dims{1000, 64, 64}, Dims{1300, 40, 200}, Dims{17, 130, 96}})
    for (int threads : {1, 2}) {
      use_threads(threads);
      SCOPED_TRACE("m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) + " k=" + std::to_string(d.k) + " threads=" + std::to_string(threads));
      const int64_t steps = gemm::bf16_tile_steps(d.k);
      std::vector<float> a(static_cast<size_t>(d.m * d.k)), b(static_cast<size_t>(d.k * d.n)), bias(static_cast<size_t>(d.n));
      std::vector<float> z(static_cast<size_t>(d.m * d.n));
      for (auto& v : b) v = gemm::from_bf16(gemm::to_bf16(dist(rng)));
      for (auto& v : bias) v = dist(rng);
      for (auto& v : z) v = gemm::from_bf16(gemm::to_bf16(dist(rng)));
      std::vector<uint16_t> a16(a.size()), b16(b.size()), z16(z.size());
      for (size_t i = 0; i < z.size(); ++i) z16[i] = gemm::to_bf16(z[i]);
      for (size_t i = 0; i < a.size(); ++i) a16[i] = gemm::to_bf16(a[i] = dist(rng)), a[i] = gemm::from_bf16(a16[i]);
      for (size_t i = 0; i < b.size(); ++i) b16[i] = gemm::to_bf16(b[i]);
      std::vector<uint16_t> packed(static_cast<size_t>(gemm::packed_b_bf16_elements(d.k, d.n, steps)), 0xffff);
      gemm::pack_b_bf16(b16.data(), d.n, false, d.k, d.n, packed.data(), steps);
      std::vector<uint16_t> plain_packed(static_cast<size_t>(gemm::packed_b_bf16_elements(d.k, d.n)));
      gemm::pack_b_bf16(b16.data(), d.n, false, d.k, d.n, plain_packed.data());
      std::vector<std::byte> ws(std::max(gemm::bf16_tiles_workspace_bytes(d.m, d.k, threads), gemm::bf16_workspace_bytes(d.m, d.k)));
      for (const Epi& e : epis) {
        SCOPED_TRACE(e.name);
        const gemm::Epilogue ep{.bias = bias.data(), .z = e.z ? z.data() : nullptr, .ldz = d.n, .act = e.act,
                                .post = {e.z ? Activation::relu : Activation::none}};
        gemm::Epilogue ep16 = ep;  // the same with the residual in bf16
        ep16.z = nullptr;
        std::vector<float> exact(static_cast<size_t>(d.m * d.n));
        for (int64_t i = 0; i < d.m; ++i)
          for (int64_t j = 0; j < d.n; ++j) {
            double s = bias[static_cast<size_t>(j)];
            for (int64_t p = 0; p < d.k; ++p) s += double{a[static_cast<size_t>(i * d.k + p)]} * b[static_cast<size_t>(p * d.n + j)];
            double y = e.act.kind == Activation::relu   ? std::max(s, 0.0)
                       : e.act.kind == Activation::clip ? std::clamp(s, 0.0, 0.5)
                       : e.act.kind == Activation::silu ? s / (1 + std::exp(-s))
                                                        : s;
            if (e.z) y = std::max(y + z[static_cast<size_t>(i * d.n + j)], 0.0);
            exact[static_cast<size_t>(i * d.n + j)] = static_cast<float>(y);
          }
        // gemm_bf16's f32 C where the tiles take all of K alike (A f32, already bf16's values).
        std::vector<float> same;
        if (d.k == steps) {
          same.assign(exact.size(), std::nanf(""));
          gemm::gemm_bf16(d.m, d.n, d.k, a.data(), d.k, plain_packed.data(), ep, same.data(), d.n, threads, ws.data(), 0, true);
        }
        for (bool a_bf16 : {true, false})
          for (bool c_bf16 : {true, false}) {
            if (e.z16 && !c_bf16) continue;  // a bf16 residual beside a bf16 C only
            SCOPED_TRACE(std::string(a_bf16 ? "bf16 A" : "f32 A") + (c_bf16 ? ", bf16 C" : ", f32 C"));
            std::vector<uint16_t> c16(exact.size(), 0xffff);
            std::vector<float> c32(exact.size(), std::nanf(""));
            void* c = c_bf16 ? static_cast<void*>(c16.data()) : static_cast<void*>(c32.data());
            gemm::gemm_bf16_tiles(d.m, d.n, d.k, a_bf16 ? static_cast<const void*>(a16.data()) : static_cast<const void*>(a.data()), a_bf16,
                                  d.k, packed.data(), e.z16 ? ep16 : ep, c, c_bf16, d.n, threads, ws.data(), e.z16 ? z16.data() : nullptr);
            for (size_t i = 0; i < exact.size(); ++i) {
              const float got = c_bf16 ? gemm::from_bf16(c16[i]) : c32[i];
              // f32 sums off the double's by a few ulp of the terms; a bf16 C by one rounding more.
              const double tol = (c_bf16 ? std::ldexp(std::abs(exact[i]), -8) : 0.0) + 1e-5 * std::sqrt(double(d.k));
              ASSERT_NEAR(got, exact[i], tol) << "row " << i / static_cast<size_t>(d.n) << " column " << i % static_cast<size_t>(d.n);
              if (!same.empty()) {
                const float want = c_bf16 ? gemm::from_bf16(gemm::to_bf16(same[i])) : same[i];
                ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "row " << i / static_cast<size_t>(d.n) << " column " << i % static_cast<size_t>(d.n);
              }
            }
          }
      }
    }
  use_threads(available_cores());
}

// pack_b_bf16 into panels of more steps than K: each panel as pack_b_bf16's, zeros past K, and
// what packed_b_bf16_layout describes (a compiled model stores it so).
TEST(GemmLowp, Bf16PanelsOfWholeTiles) {
  for (auto [k, n] : {std::pair<int64_t, int64_t>{16, 96}, {24, 50}, {40, 48}, {7, 5}})
    for (bool trans : {false, true}) {
      SCOPED_TRACE(std::to_string(k) + "x" + std::to_string(n) + (trans ? " trans" : ""));
      const int64_t steps = gemm::bf16_tile_steps(k), nr = gemm::kLowpTile.nr;
      ASSERT_EQ(steps % 32, 0);
      Tensor b(DType::bf16, trans ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
      for (int64_t i = 0; i < b.numel(); ++i) b.data<bfloat16>()[i] = bfloat16(0.25f * static_cast<float>(i % 13) - 1.f);
      const auto* bits = static_cast<const uint16_t*>(b.raw());
      std::vector<uint16_t> tiles(static_cast<size_t>(gemm::packed_b_bf16_elements(k, n, steps)), 0xffff);
      std::vector<uint16_t> plain(static_cast<size_t>(gemm::packed_b_bf16_elements(k, n)));
      gemm::pack_b_bf16(bits, trans ? k : n, trans, k, n, tiles.data(), steps);
      gemm::pack_b_bf16(bits, trans ? k : n, trans, k, n, plain.data());
      const int64_t pairs = (k + 1) / 2, panels = (n + nr - 1) / nr;
      ASSERT_EQ(tiles.size(), static_cast<size_t>(panels * steps * nr));
      for (int64_t p = 0; p < panels; ++p) {
        const uint16_t* panel = tiles.data() + p * steps * nr;
        EXPECT_EQ(std::memcmp(panel, plain.data() + p * pairs * 2 * nr, static_cast<size_t>(pairs * 2 * nr) * 2), 0) << "panel " << p;
        EXPECT_TRUE(std::all_of(panel + pairs * 2 * nr, panel + steps * nr, [](uint16_t v) { return v == 0; })) << "panel " << p;
      }
      const Tensor packed = pack(b, gemm::packed_b_bf16_layout(k, n, trans, steps));
      ASSERT_EQ(packed.nbytes(), tiles.size() * 2);
      EXPECT_EQ(std::memcmp(packed.raw(), tiles.data(), packed.nbytes()), 0);
      const Tensor back = unpack(packed);
      EXPECT_EQ(std::memcmp(back.raw(), b.raw(), b.nbytes()), 0);
    }
}

TEST(GemmLowp, Bf16Rounding) {
  EXPECT_EQ(gemm::to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(gemm::from_bf16(gemm::to_bf16(1.00390625f)), 1.0f);      // halfway: ties to even (down)
  EXPECT_EQ(gemm::from_bf16(gemm::to_bf16(1.01171875f)), 1.015625f);  // halfway: ties to even (up)
  EXPECT_TRUE(std::isnan(gemm::from_bf16(gemm::to_bf16(std::nanf("")))));
}

// Widening a weight: every f16 bit pattern (normals, subnormals, zeros, infinities, NaNs) in
// one tensor whose size leaves a tail, exactly as half's conversion; bf16 too; a packed one.
TEST(GemmLowp, WidenedToF32) {
  Tensor h(DType::f16, {65536 + 7});
  for (int64_t i = 0; i < h.numel(); ++i) h.data<half>()[i].bits = static_cast<uint16_t>(i * 40503u);
  const Tensor w = gemm::widened_to_f32(h);
  ASSERT_EQ(w.dtype(), DType::f32);
  ASSERT_EQ(w.shape(), h.shape());
  for (int64_t i = 0; i < h.numel(); ++i) {
    const float want = static_cast<float>(h.data<half>()[i]), got = w.data<float>()[i];
    ASSERT_TRUE(std::isnan(want) ? std::isnan(got) : std::memcmp(&got, &want, 4) == 0) << i << ": bits " << h.data<half>()[i].bits;
  }
  Tensor b(DType::bf16, {3, 5});
  for (int64_t i = 0; i < b.numel(); ++i) b.data<bfloat16>()[i] = bfloat16(0.3f * static_cast<float>(i) - 2.f);
  const Tensor wb = gemm::widened_to_f32(b);
  for (int64_t i = 0; i < b.numel(); ++i) EXPECT_EQ(wb.data<float>()[i], static_cast<float>(b.data<bfloat16>()[i])) << i;
  const Tensor packed = pack(b, gemm::packed_b_bf16_layout(3, 5, false));
  ASSERT_TRUE(packed.is_packed());
  const Tensor wp = gemm::widened_to_f32(packed);
  EXPECT_EQ(std::memcmp(wp.raw(), wb.raw(), wb.nbytes()), 0);
}

}  // namespace
}  // namespace kiln
