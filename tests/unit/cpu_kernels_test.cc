// kiln's own kernels (runtime/cpu/) and the attention kernel, against the reference kernels
// on odd and SIMD-multiple sizes, on each ISA path this machine has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/rows.h"
#include "tests/unit/kernel_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::check;
using testing::isa_paths;
using testing::make;
using testing::noise;
using testing::run_both;
using testing::to_f16;
using testing::BothRuns;

TEST(CpuKernels, LayerNormAndRmsNorm) {
  ASSERT_FALSE(isa_paths().empty()) << "this machine has neither AVX2 nor AVX-512";
  for (const auto& [isa, cpu] : isa_paths())
    for (int64_t d : {1, 7, 16, 768, 1001}) {
      SCOPED_TRACE(isa + " d=" + std::to_string(d));
      Tensor x = noise({3, 5, d}, 1, 4.f), scale = noise({d}, 2), bias = noise({d}, 3);
      EXPECT_EQ(check({"LayerNormalization", {x, scale, bias}, {false, true, true}, {attr("epsilon", 1e-5)}}, 1e-5, &cpu),
                "kiln.norm_f32_" + isa);
      EXPECT_EQ(check({"RMSNormalization", {x, scale}, {false, true}, {attr("epsilon", 1e-6)}}, 1e-5, &cpu), "kiln.norm_f32_" + isa);
      // Normalizing the last two dims, no bias.
      EXPECT_EQ(check({"LayerNormalization", {x, noise({5, d}, 4)}, {false, true}, {attr("axis", int64_t{1})}}, 1e-5, &cpu),
                "kiln.norm_f32_" + isa);
    }
  // A scale that broadcasts stays with the reference kernel.
  EXPECT_EQ(check({"LayerNormalization", {noise({2, 3, 4}, 5), noise({1}, 6)}, {false, true}}), kReferenceKernel);
}

TEST(CpuKernels, Activations) {
  auto scalar = [](float v) { return Tensor::from<float>({}, {v}); };
  for (const auto& [isa, cpu] : isa_paths())
    for (int64_t n : {1, 7, 16, 1000, 70001}) {  // 70001: split across threads, with a tail
      SCOPED_TRACE(isa + " n=" + std::to_string(n));
      const std::string name = "kiln.activation_f32_" + isa;
      Tensor x = noise({n}, 7, 24.f);  // [-12, 12]: past erf's and e^x's clamps on both sides
      for (const char* op : {"Relu", "Sigmoid", "Tanh", "HardSwish"}) EXPECT_EQ(check({op, {x}, {false}}, 1e-6, &cpu), name) << op;
      EXPECT_EQ(check({"LeakyRelu", {x}, {false}, {attr("alpha", 0.1)}}, 1e-6, &cpu), name);
      EXPECT_EQ(check({"HardSigmoid", {x}, {false}, {attr("alpha", 0.3), attr("beta", 0.4)}}, 1e-6, &cpu), name);
      EXPECT_EQ(check({"Gelu", {x}, {false}}, 1e-6, &cpu), name);
      // 1e-5: the reference's 1 + tanh(u) cancels where tanh nears -1 (kiln's x·sigmoid(2u) does not).
      EXPECT_EQ(check({"Gelu", {x}, {false}, {attr("approximate", std::string("tanh"))}}, 1e-5, &cpu), name);
      EXPECT_EQ(check({"Clip", {x, scalar(-1.5f), scalar(6.f)}, {false, true, true}}, 0, &cpu), name);
      EXPECT_EQ(check({"Clip", {x, Tensor(), scalar(0.25f)}, {false, false, true}}, 0, &cpu), name);
    }
  // Value by value against the sigmoid in double, over [-120, 120], the extremes, around AVX2's
  // clamp of e^x (±87, where 2^k added into the exponent bits stays a normal float), infinities
  // and NaN: the standalone kernel and the GEMM's epilogue (a FusedMatMul by 1, with a SiLU), the
  // bound growing with |x| on AVX-512 (w = −x·log2 e rounded before it is split, logistic.inc).
  for (const auto& [isa, cpu] : isa_paths()) {
    SCOPED_TRACE(isa);
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> v = {-inf, -1e30f, -3e7f, -88.f, -87.5f, -87.f, -86.9f, 86.6f, 86.9f, 87.f, 87.2f, 87.5f, 88.4f, 3e7f, 1e30f,
                            inf,  nan,    0.f,   -0.f,  1e-30f, -1e-30f};
    for (int i = 0; i <= 4800; ++i) v.push_back(-120.f + 0.05f * static_cast<float>(i));
    const int64_t n = static_cast<int64_t>(v.size());
    Tensor x = Tensor::from<float>({n}, v), column = Tensor::from<float>({n, 1}, v);
    BothRuns sig = run_both({"Sigmoid", {x}, {false}}, &cpu);
    BothRuns silu = run_both({"FusedMatMul", {column, Tensor::from<float>({1, 1}, {1.f})}, {false, true},
                              {attr("activation", std::string("Silu"))}, {true}, "kiln.gemm_f32_" + isa}, &cpu);
    ASSERT_EQ(sig.kernel, "kiln.activation_f32_" + isa);
    ASSERT_EQ(silu.kernel, "kiln.gemm_f32_" + isa);
    for (int64_t i = 0; i < n; ++i) {
      const double xi = v[static_cast<size_t>(i)], s = 1 / (1 + std::exp(-xi));
      const float got_sig = sig.fast[0].data<float>()[i], got_silu = silu.fast[0].data<float>()[i];
      SCOPED_TRACE("x=" + std::to_string(xi));
      if (std::isnan(xi)) {
        if (isa == "avx512") {
          EXPECT_TRUE(std::isnan(got_sig) && std::isnan(got_silu));
        }
        continue;
      }
      if (std::isinf(xi)) {  // SiLU(−∞) is −∞·0: NaN on AVX-512 as in the reference, −∞ on AVX2
        EXPECT_NEAR(got_sig, xi > 0 ? 1.f : 0.f, 2e-38);
        if (xi > 0) {
          EXPECT_EQ(got_silu, xi);
        }
        continue;
      }
      // 3e-7 relative near 0, 8e-8·|x| more past it (half an ulp of w, and log2 e as a float);
      // values near the denormals flush to 0 (SiLU's below −88.7 on AVX-512, where e^-x
      // overflows: 1e-35 at most; AVX2 clamps x to −87 in e^-x, x·1.7e-38 at most).
      const double tol = 3e-7 + std::abs(xi) * 8e-8;
      EXPECT_NEAR(got_sig, s, tol * s + 2e-38);
      EXPECT_NEAR(got_silu, xi * s, std::abs(tol * xi * s) + 1e-35 + (isa == "avx2" ? std::abs(xi) * 1.7e-38 : 0));
    }
  }
  // Near zero, where a relative error shows.
  for (const char* op : {"Gelu", "Tanh", "Sigmoid"})
    EXPECT_EQ(check({op, {noise({4096}, 8, 1e-3f)}, {false}}, 1e-6).rfind("kiln.activation_f32_", 0), 0u) << op;
  // A bound computed at run time stays with the reference kernel.
  Tensor x = noise({8}, 9);
  EXPECT_EQ(check({"Clip", {x, Tensor::from<float>({}, {0.f})}, {false, false}}), kReferenceKernel);
}

TEST(CpuKernels, BinaryElementwise) {
  // Every op; the same shape, scalars either side, broadcasts inner and outer (an SE block's
  // per-channel scale on NHWC), dims of 1 on both sides, and on one and two threads: images of
  // rows shared in runs, a long row in pieces, long rows against one value each, an empty one.
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{7, 33}, {7, 33}}, {{7, 33}, {}}, {{}, {5, 17}}, {{2, 5, 5, 40}, {2, 1, 1, 40}}, {{2, 40, 5, 5}, {1, 40, 1, 1}},
      {{3, 1, 9}, {1, 4, 1}}, {{1, 6, 1, 9}, {5, 1, 7, 1}}, {{70001}, {70001}}, {{300, 257}, {300, 1}},
      {{2, 30, 41, 40}, {2, 1, 1, 40}}, {{3, 20001}, {3, 1}}, {{1, 1, 1}, {1}}, {{2, 0, 3}, {3}}};
  for (const auto& [isa, cpu] : isa_paths())
    for (int threads : {1, 2})
      for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min"})
        for (const auto& [sa, sb] : shapes) {
          SCOPED_TRACE(isa + " " + op + " " + shape_str(sa) + " " + shape_str(sb) + " threads=" + std::to_string(threads));
          Tensor b = noise(sb, 2);
          if (std::string(op) == "Div")  // away from 0
            for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] += b.data<float>()[i] < 0 ? -0.5f : 0.5f;
          EXPECT_EQ(check({op, {noise(sa, 1, 4.f), b}, {false, false}, {}, {true}, "", {}, threads}, 0, &cpu), "kiln.binary_f32_" + isa);
          EXPECT_EQ(check({op, {noise(sa, 3), b}, {false, true}, {}, {true}, "", {}, threads}, 0, &cpu), "kiln.binary_f32_" + isa);
        }
  for (const auto& [isa, cpu] : isa_paths())
    EXPECT_EQ(check({"Pow", {noise({3, 50}, 4, 3.f), Tensor::from<float>({}, {2.f})}, {false, true}}, 0, &cpu), "kiln.binary_f32_" + isa);
  // Other exponents, integer tensors and three-input Max stay with the reference kernels.
  EXPECT_EQ(check({"Pow", {noise({3, 5}, 5), Tensor::from<float>({}, {3.f})}, {false, true}}), kReferenceKernel);
  EXPECT_EQ(check({"Add", {Tensor::from<int64_t>({3}, {1, 2, 3}), Tensor::from<int64_t>({3}, {4, 5, 6})}, {false, false}}),
            kReferenceKernel);
  EXPECT_EQ(check({"Max", {noise({4}, 6), noise({4}, 7), noise({4}, 8)}, {false, false, false}}), kReferenceKernel);
}

TEST(CpuKernels, Softmax) {
  for (const auto& [isa, cpu] : isa_paths())
    for (std::vector<int64_t> shape : std::vector<std::vector<int64_t>>{{1}, {3, 7}, {2, 4, 16}, {5, 1000}, {40, 2049}}) {
      SCOPED_TRACE(isa + " " + shape_str(shape));
      Tensor x = noise(shape, 11, 30.f);
      // 2e-6: e^x within 2e-7, and rows of 2049 summed in another order than the reference.
      EXPECT_EQ(check({"Softmax", {x}, {false}}, 2e-6, &cpu), "kiln.softmax_f32_" + isa);
      EXPECT_EQ(check({"Softmax", {x}, {false}, {attr("axis", static_cast<int64_t>(shape.size()) - 1)}}, 2e-6, &cpu),
                "kiln.softmax_f32_" + isa);
    }
  // Other axes stay with the reference kernel.
  EXPECT_EQ(check({"Softmax", {noise({3, 5}, 12)}, {false}, {attr("axis", int64_t{0})}}), kReferenceKernel);
}

// Behind a large negative mask (BERT's -10000, -1e9, the lowest float, -inf), a softmax gives
// exact zeros, never denormals, even on a thread that does not flush them to zero: denormal
// arithmetic runs many times slower (ONNX Runtime's softmax is about 3x slower there).
TEST(CpuKernels, SoftmaxBehindALargeNegativeMaskMakesNoDenormals) {
  const int64_t n = 67;
  std::vector<float> mask(n, 0.f);
  const float big[] = {-1e4f, -1e9f, std::numeric_limits<float>::lowest(), -std::numeric_limits<float>::infinity(), -90.f};
  for (int64_t i = 3; i < n; i += 2) mask[static_cast<size_t>(i)] = big[i % 5];
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2}) {
    if (cpu::lacks(CpuFeatures::host(), isa)) continue;
    SCOPED_TRACE(cpu::isa_name(isa));
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) row[static_cast<size_t>(i)] = std::sin(static_cast<float>(i)) * 3.f;
    cpu::row_kernels(isa).softmax(row.data(), 1, n, 1.f, mask.data(), 0);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = row[static_cast<size_t>(i)];
      EXPECT_NE(std::fpclassify(v), FP_SUBNORMAL) << i;
      if (mask[static_cast<size_t>(i)] != 0.f) {
        EXPECT_EQ(v, 0.f) << i;
      }
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

// Each probability to its own relative precision, not only the row's L2: e^x within 2e-7 for
// |x| <= 1 and the error growing with |x| on AVX-512 (rows.h), so within 5e-7 to x = −1, 1e-6
// to −10 and 6e-6 to −87 (the softmax's sum and division add a few ulp). The softmax over rows
// (a row of 300, e^x a vector at a time along it) and flash attention's register rows (a block
// of 200 keys, the only one: divided by its sum).
TEST(CpuKernels, SoftmaxProbabilitiesKeepTheirPrecision) {
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2}) {
    if (cpu::lacks(CpuFeatures::host(), isa)) continue;
    for (int64_t n : {300, 200}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " n=" + std::to_string(n));
      std::vector<float> row(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) row[static_cast<size_t>(i)] = -87.f * static_cast<float>((i * 37) % n) / static_cast<float>(n - 1);
      row[5] = 0.f;  // the maximum
      double sum = 0;
      for (float v : row) sum += std::exp(double{v});
      std::vector<float> p = row;
      if (n == 300) {
        cpu::row_kernels(isa).softmax(p.data(), 1, n, 1.f, nullptr, 0);
      } else {
        float m = 0, l = 0, o = 0;
        cpu::row_kernels(isa).softmax_block(p.data(), n, 1, n, 1.f, nullptr, nullptr, 0, cpu::kNoCausal, &m, &l, &o, 1, 1, true);
      }
      for (int64_t i = 0; i < n; ++i) {
        const double x = row[static_cast<size_t>(i)], want = std::exp(x) / sum;
        ASSERT_NEAR(p[static_cast<size_t>(i)] / want, 1.0, x >= -1 ? 5e-7 : x >= -10 ? 1e-6 : 6e-6) << "x = " << x;
      }
    }
  }
}

// The row kernels' transpose (flash attention's Kᵀ panels): rows and columns below, at and past
// a block (16x16 on AVX-512, 8x8 on AVX2), strided rows and columns, exact.
TEST(CpuKernels, TransposeRows) {
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2}) {
    if (cpu::lacks(CpuFeatures::host(), isa)) continue;
    for (int64_t rows : {1, 5, 8, 16, 17, 40})
      for (int64_t cols : {1, 7, 12, 64}) {
        SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
        const int64_t ldx = cols + 3, ldy = rows + 5;
        std::vector<float> x(static_cast<size_t>(rows * ldx)), y(static_cast<size_t>(cols * ldy), -1.f);
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f;
        cpu::row_kernels(isa).transpose(x.data(), ldx, rows, cols, y.data(), ldy);
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t r = 0; r < ldy; ++r)
            ASSERT_EQ(y[static_cast<size_t>(c * ldy + r)], r < rows ? x[static_cast<size_t>(r * ldx + c)] : -1.f) << c << "," << r;
      }
  }
}

// Data movement, bit-exact against the reference kernels, f32 and other element sizes.
TEST(CpuKernels, ConcatAndSplit) {
  Tensor a = noise({2, 5, 7, 3}, 1), b = noise({2, 5, 7, 16}, 2), c = noise({2, 5, 7, 1}, 3);
  EXPECT_EQ(check({"Concat", {a, b, c}, {false, false, false}, {attr("axis", int64_t{3})}}, 0), "kiln.concat");
  EXPECT_EQ(check({"Concat", {a, noise({2, 4, 7, 3}, 4)}, {false, true}, {attr("axis", int64_t{-3})}}, 0), "kiln.concat");
  EXPECT_EQ(check({"Concat", {a, noise({1, 5, 7, 3}, 5)}, {false, false}, {attr("axis", int64_t{0})}}, 0), "kiln.concat");
  EXPECT_EQ(check({"Concat", {make<int64_t>({2, 2}, {1, 2, 3, 4}), make<int64_t>({2, 1}, {5, 6})}, {false, false},
                   {attr("axis", int64_t{1})}}, 0),
            "kiln.concat");
  // Big enough to split across threads: YOLO's channel concatenations after channels_last.
  EXPECT_EQ(check({"Concat", {noise({1, 80, 80, 32}, 6), noise({1, 80, 80, 32}, 7)}, {false, false}, {attr("axis", int64_t{3})}}, 0),
            "kiln.concat");
  // Few long rows, shared among threads in chunks: YOLO's boxes of three scales into its output,
  // and a Split of two rows, one piece omitted.
  EXPECT_EQ(check({"Concat", {noise({1, 4800, 85}, 10), noise({1, 1200, 85}, 11), noise({1, 300, 85}, 12)}, {false, false, false},
                   {attr("axis", int64_t{1})}},
                  0),
            "kiln.concat");
  EXPECT_EQ(check({"Split", {noise({2, 100003}, 13), make<int64_t>({3}, {70001, 30000, 2})}, {false, true}, {attr("axis", int64_t{1})},
                   {true, false, true}},
                  0),
            "kiln.split");
  Tensor x = noise({2, 40, 40, 24}, 8);
  EXPECT_EQ(check({"Split", {x, make<int64_t>({3}, {5, 16, 3})}, {false, true}, {attr("axis", int64_t{3})}, {true, true, true}}, 0),
            "kiln.split");
  EXPECT_EQ(check({"Split", {x, make<int64_t>({2}, {10, 30})}, {false, true}, {attr("axis", int64_t{1})}, {false, true}}, 0),
            "kiln.split");
  EXPECT_EQ(check({"Split", {x}, {false}, {attr("axis", int64_t{-1}), attr("num_outputs", int64_t{3})}, {true, true, true}}, 0),
            "kiln.split");
  EXPECT_EQ(check({"Split", {x}, {false}, {attr("axis", int64_t{2}), attr("num_outputs", int64_t{3})}, {true, false, true}}, 0),
            "kiln.split");
  EXPECT_EQ(check({"Split", {make<int8_t>({1, 5}, {1, 2, 3, 4, 5})}, {false}, {attr("axis", int64_t{1}), attr("num_outputs", int64_t{2})},
                   {true, true}}, 0),
            "kiln.split");
}

// ReplaceSlices (fold_split_concat's): bit-exact against the reference, f32 and other element
// sizes, updates at the start, in the middle and at the end of the axis, through threads.
TEST(CpuKernels, ReplaceSlices) {
  auto replace = [](Tensor x, std::vector<Tensor> updates, int64_t axis, std::vector<int64_t> starts) {
    std::vector<Tensor> in = {std::move(x)};
    for (Tensor& u : updates) in.push_back(std::move(u));
    return check({"ReplaceSlices", in, std::vector<bool>(in.size(), false), {attr("axis", axis), attr("starts", starts)}}, 0);
  };
  // YOLO's detection head: the box pieces of [1, 3, 40, 40, 85] decoded, the scores kept.
  EXPECT_EQ(replace(noise({1, 3, 40, 40, 85}, 1), {noise({1, 3, 40, 40, 2}, 2), noise({1, 3, 40, 40, 2}, 3)}, 4, {0, 2}),
            "kiln.replace_slices");
  EXPECT_EQ(replace(noise({2, 9, 5}, 4), {noise({2, 3, 5}, 5), noise({2, 1, 5}, 6)}, -2, {2, 8}), "kiln.replace_slices");
  EXPECT_EQ(replace(noise({4, 3}, 7), {noise({1, 3}, 8)}, 0, {3}), "kiln.replace_slices");
  EXPECT_EQ(replace(make<int8_t>({2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), {make<int8_t>({2, 2}, {-1, -2, -3, -4})}, 1, {1}),
            "kiln.replace_slices");
}

TEST(CpuKernels, Transpose) {
  std::vector<int64_t> perm = {0, 1, 2, 3};
  do {
    SCOPED_TRACE(::testing::PrintToString(perm));
    EXPECT_EQ(check({"Transpose", {noise({2, 3, 17, 5}, 9)}, {false}, {attr("perm", perm)}}, 0), "kiln.transpose");
    EXPECT_EQ(check({"Transpose", {make<int16_t>({2, 3, 1, 5}, std::vector<int16_t>(30, 7))}, {false}, {attr("perm", perm)}}, 0),
              "kiln.transpose");
    // 1-, 2- and 8-byte elements, each one different (the tiles move them as integers).
    std::vector<uint8_t> bytes(2 * 3 * 17 * 5);
    std::vector<int16_t> shorts(bytes.size());
    std::vector<int64_t> longs(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<uint8_t>(i * 7 % 251);
      shorts[i] = static_cast<int16_t>(i * 31 - 700);
      longs[i] = static_cast<int64_t>(i) * 1000003 - (int64_t{1} << 40);
    }
    EXPECT_EQ(check({"Transpose", {make<uint8_t>({2, 3, 17, 5}, bytes)}, {false}, {attr("perm", perm)}}, 0), "kiln.transpose");
    EXPECT_EQ(check({"Transpose", {make<int16_t>({2, 3, 17, 5}, shorts)}, {false}, {attr("perm", perm)}}, 0), "kiln.transpose");
    EXPECT_EQ(check({"Transpose", {make<int64_t>({2, 3, 17, 5}, longs)}, {false}, {attr("perm", perm)}}, 0), "kiln.transpose");
  } while (std::next_permutation(perm.begin(), perm.end()));
  // The image into channels-last and back, big enough for threads; the default (reversed) perm.
  EXPECT_EQ(check({"Transpose", {noise({1, 3, 160, 150}, 10)}, {false}, {attr("perm", std::vector<int64_t>{0, 2, 3, 1})}}, 0),
            "kiln.transpose");
  // Three planes into pixels on every ISA path (AVX-512 permutes 16 pixels at a time): whole
  // vectors, a tail of 3, a batch of two, and fewer pixels than a vector.
  for (const auto& [isa, cpu] : isa_paths()) {
    SCOPED_TRACE(isa);
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 3, 16, 32}, std::vector<int64_t>{1, 3, 17, 19},
                                              std::vector<int64_t>{2, 3, 33, 16}, std::vector<int64_t>{1, 3, 3, 5}})
      EXPECT_EQ(check({"Transpose", {noise(shape, 18)}, {false}, {attr("perm", std::vector<int64_t>{0, 2, 3, 1})}}, 0, &cpu),
                "kiln.transpose");
  }
  // Two and four planes into pixels, a batch of two (the loop over pixels with the planes fixed).
  EXPECT_EQ(check({"Transpose", {noise({2, 4, 9, 7}, 16)}, {false}, {attr("perm", std::vector<int64_t>{0, 2, 3, 1})}}, 0),
            "kiln.transpose");
  EXPECT_EQ(check({"Transpose", {noise({2, 2, 90, 70}, 17)}, {false}, {attr("perm", std::vector<int64_t>{0, 2, 3, 1})}}, 0),
            "kiln.transpose");
  // A quantized image's bytes into pixels on every ISA path (AVX-512 packs 16 pixels of three
  // planes at a time): one to four planes, whole vectors, a tail, a batch of two, fewer pixels
  // than a vector.
  for (const auto& [isa, cpu] : isa_paths()) {
    SCOPED_TRACE(isa);
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{2, 3, 33, 150}, std::vector<int64_t>{1, 3, 16, 32}, std::vector<int64_t>{1, 3, 17, 19},
          std::vector<int64_t>{1, 3, 3, 5}, std::vector<int64_t>{1, 4, 9, 7}, std::vector<int64_t>{2, 2, 5, 7}, std::vector<int64_t>{1, 1, 5, 7}}) {
      std::vector<uint8_t> image(static_cast<size_t>(shape_numel(shape)));
      for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>(i * 13 % 251);
      EXPECT_EQ(check({"Transpose", {make<uint8_t>(shape, image)}, {false}, {attr("perm", std::vector<int64_t>{0, 2, 3, 1})}}, 0, &cpu),
                "kiln.transpose");
    }
  }
  EXPECT_EQ(check({"Transpose", {noise({1, 40, 40, 85}, 11)}, {false}, {attr("perm", std::vector<int64_t>{0, 3, 1, 2})}}, 0),
            "kiln.transpose");
  EXPECT_EQ(check({"Transpose", {noise({7, 33}, 12)}, {false}}, 0), "kiln.transpose");
  EXPECT_EQ(check({"Transpose", {make<float>({}, {3.f})}, {false}}, 0), "kiln.transpose");
  EXPECT_EQ(check({"Transpose", {noise({2, 0, 3}, 13)}, {false}, {attr("perm", std::vector<int64_t>{2, 0, 1})}}, 0), "kiln.transpose");
  EXPECT_EQ(check({"Concat", {noise({2, 0, 3}, 14), noise({2, 2, 3}, 15)}, {false, false}, {attr("axis", int64_t{1})}}, 0), "kiln.concat");
}

// Whole rows moving on two threads: each thread starts its share of the rows partway through
// the outer dims (odd sizes, so the second starts mid-row of every one), then walks them, in
// the output's order or (YOLO's detection head: 3 anchors of 85 values a pixel into the
// anchors' planes) the input's. A Relu after the Transpose makes its output an intermediate
// big enough for a plan of both.
TEST(CpuKernels, TransposeRowsOnTwoThreads) {
  const std::vector<int64_t> odd = {5, 37, 11, 171}, head = {1, 41, 39, 3, 85};
  for (const auto& [shape, perm] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {odd, {2, 0, 1, 3}}, {odd, {1, 2, 0, 3}}, {head, {0, 3, 1, 2, 4}}, {head, {3, 0, 2, 1, 4}}}) {
    SCOPED_TRACE(::testing::PrintToString(shape) + " " + ::testing::PrintToString(perm));
    Model m;
    Graph& g = m.graph;
    const Tensor x = noise(shape, 19);
    const ValueId in = g.add_value("x", DType::f32, Shape::of(x.shape())), t = g.add_value("t", DType::undefined),
                  y = g.add_value("y", DType::undefined);
    g.inputs = {in};
    g.outputs = {y};
    Node tr;
    tr.name = "transpose";
    tr.op = "Transpose";
    tr.inputs = {in};
    tr.outputs = {t};
    tr.set_attr("perm", perm);
    g.add_node(std::move(tr));
    Node relu;
    relu.name = "relu";
    relu.op = "Relu";
    relu.inputs = {t};
    relu.outputs = {y};
    g.add_node(std::move(relu));
    ASSERT_TRUE(infer_graph(g).ok());
    SessionOptions options;
    options.target.threads = 2;
    const testing::ModelRuns r = testing::run_model_both(m, {x}, options);
    ASSERT_FALSE(r.fast.empty());
    EXPECT_EQ(r.kernels[0].name, "kiln.transpose");
    EXPECT_EQ(r.threads, 2);
    EXPECT_EQ(testing::relative_l2(r.fast[0], r.ref[0]), 0.0);
  }
}

TEST(CpuKernels, NearestUpsample) {
  const std::vector<Attribute> torch = {attr("mode", std::string("nearest")), attr("coordinate_transformation_mode", std::string("asymmetric")),
                                        attr("nearest_mode", std::string("floor"))};
  // Channels-last (rows copied whole), channels-first (the last dim resized), by sizes.
  EXPECT_EQ(check({"Resize", {noise({1, 5, 6, 8}, 13), Tensor(), make<float>({4}, {1, 2, 2, 1})}, {false, false, true}, torch}, 0),
            "kiln.upsample_nearest");
  EXPECT_EQ(check({"Resize", {noise({2, 8, 5, 6}, 14), Tensor(), make<float>({4}, {1, 1, 3, 2})}, {false, false, true}, torch}, 0),
            "kiln.upsample_nearest");
  EXPECT_EQ(check({"Resize", {noise({1, 40, 40, 64}, 15), Tensor(), Tensor(), make<int64_t>({4}, {1, 80, 80, 64})},
                   {false, false, false, true}, torch}, 0),
            "kiln.upsample_nearest");
  // Other coordinate rules and fractional factors stay with the reference kernel.
  EXPECT_EQ(check({"Resize", {noise({1, 2, 4, 4}, 16), Tensor(), make<float>({4}, {1, 1, 2, 2})}, {false, false, true},
                   {attr("mode", std::string("nearest"))}}, 0),
            kReferenceKernel);
  EXPECT_EQ(check({"Resize", {noise({1, 2, 4, 4}, 17), Tensor(), make<float>({4}, {1, 1, 1.5f, 1.5f})}, {false, false, true}, torch}, 0),
            kReferenceKernel);
}

TEST(CpuKernels, DepthwiseConv) {
  for (const auto& [isa, cpu] : isa_paths())
    for (int64_t k : {3, 5})
      for (int64_t stride : {1, 2})
        for (int64_t c : {17, 32}) {
          SCOPED_TRACE(isa + " k=" + std::to_string(k) + " stride=" + std::to_string(stride) + " c=" + std::to_string(c));
          const int64_t p = k / 2;
          Tensor x = noise({2, c, 13, 11}, 1), w = noise({c, 1, k, k}, 2, 0.5f), b = noise({c}, 3);
          std::vector<Attribute> a = {attr("group", c), attr("pads", std::vector<int64_t>{p, p, p, p}),
                                      attr("strides", std::vector<int64_t>{stride, stride})};
          const std::string name = "kiln.dwconv_f32_" + isa;
          EXPECT_EQ(check({"Conv", {x, w, b}, {false, true, true}, a}, 1e-5, &cpu), name);
          // Asymmetric pads, no bias.
          std::vector<Attribute> asym = {attr("group", c), attr("pads", std::vector<int64_t>{0, p, p, 0}),
                                         attr("strides", std::vector<int64_t>{stride, stride})};
          EXPECT_EQ(check({"Conv", {x, w}, {false, true}, asym}, 1e-5, &cpu), name);
          // Fused: Clip (Relu6), a residual, HardSwish.
          const int64_t oh = (13 + 2 * p - k) / stride + 1, ow = (11 + 2 * p - k) / stride + 1;
          std::vector<Attribute> fused = a;
          fused.push_back(attr("activation", std::string("Clip")));
          fused.push_back(attr("activation_params", std::vector<double>{0, 6}));
          fused.push_back(attr("post_activation", std::string("HardSwish")));
          EXPECT_EQ(check({"FusedConv", {x, w, b, noise({2, c, oh, ow}, 4)}, {false, true, true, false}, fused}, 1e-5, &cpu), name);
        }
  // Channels-last: x [N, H, W, C], the kernel pinned (the default rule leaves most shapes to
  // oneDNN); channel counts below, at and past the vector widths (the scalar tail, whole vectors
  // and both); widths with edge columns only, and inside columns in blocks of eight, four and
  // fewer; output rows in pairs (3x3 stride 1) and one by one, those at the top and bottom with
  // filter rows in the padding; pads asymmetric and wider than the filter's reach; 7x7 filters
  // through the general form; a SiLU with a residual and a ReLU after it, and a Clip, a SiLU or a
  // Sigmoid alone (in the registers). On two threads too, for 1x8x128 images of 1,000 channels
  // (work enough for a plan of both threads; they share the output rows, or row pairs).
  for (const auto& [isa, cpu] : isa_paths())
    for (int threads : {1, 2})
      for (int64_t k : {3, 5, 7})
        for (int64_t stride : {1, 2})
          for (int64_t c : {5, 16, 40, 1000})
            for (int64_t width : {3, 14, 128}) {
              if ((c == 1000) != (width == 128) || (c == 1000 && (k == 7 || threads == 1))) continue;
              const int64_t images = c == 1000 ? 1 : 2, height = c == 1000 ? 8 : 9;
              SCOPED_TRACE(isa + " channels-last k=" + std::to_string(k) + " stride=" + std::to_string(stride) + " c=" +
                           std::to_string(c) + " w=" + std::to_string(width) + " threads=" + std::to_string(threads));
              const int64_t p = k / 2;
              Tensor x = noise({images, height, width, c}, 21), w = noise({c, 1, k, k}, 22, 0.5f), b = noise({c}, 23);
              const std::string name = "kiln.dwconv_f32_" + isa;
              std::vector<Attribute> a = {attr("group", c), attr("channels_last", int64_t{1}),
                                          attr("pads", std::vector<int64_t>{p, p + 1, 0, p}),
                                          attr("strides", std::vector<int64_t>{stride, stride})};
              EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, a, {true}, name, {}, threads}, 1e-5, &cpu), name);
              const int64_t oh = (height + p - k) / stride + 1, ow = (width + 2 * p + 1 - k) / stride + 1;
              std::vector<Attribute> fused = a;
              fused.push_back(attr("activation", std::string("Silu")));
              fused.push_back(attr("post_activation", std::string("Relu")));
              const Tensor z = noise({images, oh, ow, c}, 24);
              EXPECT_EQ(check({"FusedConv", {x, w, Tensor(), z}, {false, true, false, false}, fused, {true}, name, {}, threads}, 1e-5,
                              &cpu),
                        name);
              // A Clip, a SiLU or a Sigmoid alone, applied in the registers as the sums are stored
              // (the Clip's bounds both met).
              for (const char* act : {"Clip", "Silu", "Sigmoid"}) {
                std::vector<Attribute> alone = a;
                alone.push_back(attr("activation", std::string(act)));
                if (std::string(act) == "Clip") alone.push_back(attr("activation_params", std::vector<double>{0, 0.5}));
                EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, alone, {true}, name, {}, threads}, 1e-5, &cpu), name);
              }
            }
  // The default rule: kiln's kernel for 3x3 and 5x5 filters, stride 1 or 2, on rows with as
  // many columns whose taps all lie inside as edge ones, with a SiLU, and at stride 1 with a
  // ReLU or Clip alone; oneDNN's for no epilogue, a LeakyReLU, a stride-2 Clip, a Clip with a
  // residual or a second activation, 7x7 and shorter rows.
  for (const auto& [isa, cpu] : isa_paths()) {
    auto layer = [isa = isa, cpu = cpu](int64_t k, int64_t stride, int64_t width, const char* act, const char* post = "",
                                        bool residual = false) {
      std::vector<Attribute> a = {attr("group", int64_t{32}), attr("channels_last", int64_t{1}),
                                  attr("pads", std::vector<int64_t>(4, k / 2)),
                                  attr("strides", std::vector<int64_t>{stride, stride})};
      if (*act) a.push_back(attr("activation", std::string(act)));
      if (std::string(act) == "Clip") a.push_back(attr("activation_params", std::vector<double>{0, 6}));
      if (std::string(act) == "LeakyRelu") a.push_back(attr("activation_params", std::vector<double>{0.1}));
      if (*post) a.push_back(attr("post_activation", std::string(post)));
      SCOPED_TRACE(isa + " rule k=" + std::to_string(k) + " stride=" + std::to_string(stride) + " w=" + std::to_string(width) +
                   " " + act + " " + post + (residual ? " with a residual" : ""));
      const Tensor x = noise({1, 10, width, 32}, 25);
      const int64_t ow = (width - 1) / stride + 1, oh = (10 - 1) / stride + 1;
      if (residual)
        return check({"FusedConv", {x, noise({32, 1, k, k}, 26), noise({32}, 27), noise({1, oh, ow, 32}, 28)}, {false, true, true, false}, a},
                     1e-5, &cpu);
      return check({"FusedConv", {x, noise({32, 1, k, k}, 26), noise({32}, 27)}, {false, true, true}, a}, 1e-5, &cpu);
    };
    EXPECT_EQ(layer(3, 1, 14, "Silu"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(5, 1, 20, "Silu"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(3, 1, 14, "Clip"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(5, 1, 14, "Relu"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(3, 2, 28, "Clip"), "onednn.conv");
    EXPECT_EQ(layer(3, 1, 14, "Clip", "", true), "onednn.conv");
    EXPECT_EQ(layer(3, 1, 14, "Relu", "Relu"), "onednn.conv");
    EXPECT_EQ(layer(3, 1, 14, "LeakyRelu"), "onednn.conv");
    EXPECT_EQ(layer(3, 1, 14, ""), "onednn.conv");
    EXPECT_EQ(layer(3, 2, 28, "Silu"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(5, 2, 28, "Silu"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(3, 1, 7, "Silu"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(3, 1, 3, "Silu"), "onednn.conv");
    EXPECT_EQ(layer(5, 1, 7, "Silu"), "onednn.conv");
    EXPECT_EQ(layer(5, 1, 8, "Silu"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(5, 2, 14, "Silu"), "kiln.dwconv_f32_" + isa);
    EXPECT_EQ(layer(7, 1, 20, "Silu"), "onednn.conv");
  }
  // Dilated and grouped-but-not-depthwise convolutions go elsewhere.
  Tensor x = noise({1, 8, 9, 9}, 5);
  EXPECT_NE(check({"Conv", {x, noise({8, 1, 3, 3}, 6)}, {false, true}, {attr("group", int64_t{8}), attr("dilations", std::vector<int64_t>{2, 2})}})
                .rfind("kiln.dwconv", 0),
            0u);
  EXPECT_NE(check({"Conv", {x, noise({8, 2, 3, 3}, 7)}, {false, true}, {attr("group", int64_t{4})}}).rfind("kiln.dwconv", 0), 0u);
}

// kiln.pointwise_depthwise (PointwiseDepthwiseConv, compile's fuse_pointwise_depthwise): the 1x1
// stage's rows computed into the ring as the depthwise rows need them, and the projection's
// rows from the depthwise rows (after the expansion, or of X without one). 3x3 and 5x5 filters at
// stride 1 (3x3 in row pairs) and 2; pads symmetric, asymmetric (rows with filter rows in the
// padding at the top only) and none; input channels below and past a vector, expanded
// channels with a scalar tail and whole vectors; odd widths and heights; two images (the ring
// carried from one image's last rows to the next one's first); without either bias, with
// ReLU6 then SiLU and the reverse; on one and two threads (each its run of output rows, the
// rows at the boundary expanded by both), and 7x7 through the general row kernel.
TEST(CpuKernels, PointwiseDepthwiseConv) {
  for (const auto& [isa, cpu] : isa_paths())
    for (int threads : {1, 2})
      for (int64_t k : {3, 5, 7})
        for (int64_t stride : {1, 2})
          for (const auto& [c, m] : std::vector<std::pair<int64_t, int64_t>>{{3, 21}, {24, 144}, {17, 32}}) {
            if (k == 7 && (stride == 2 || c == 24)) continue;
            const int64_t images = 2, height = 13, width = c == 24 ? 28 : 11, p = k / 2;
            SCOPED_TRACE(isa + " k=" + std::to_string(k) + " stride=" + std::to_string(stride) + " c=" + std::to_string(c) + " m=" +
                         std::to_string(m) + " threads=" + std::to_string(threads));
            const Tensor x = noise({images, height, width, c}, 31), w1 = noise({m, c, 1, 1}, 32, 0.5f), b1 = noise({m}, 33);
            const Tensor w2 = noise({m, 1, k, k}, 34, 0.5f), b2 = noise({m}, 35);
            const std::string name = "kiln.pointwise_depthwise_f32_" + isa;
            std::vector<Attribute> a = {attr("group", m), attr("channels_last", int64_t{1}), attr("kernel_shape", std::vector<int64_t>{k, k}),
                                        attr("pads", std::vector<int64_t>{p, p, p, p}), attr("strides", std::vector<int64_t>{stride, stride}),
                                        attr("pointwise_activation", std::string("Clip")),
                                        attr("pointwise_activation_params", std::vector<double>{0, 6}), attr("activation", std::string("Silu"))};
            EXPECT_EQ(check({"PointwiseDepthwiseConv", {x, w1, b1, w2, b2}, {false, true, true, true, true}, a, {true}, "", {}, threads},
                            1e-5, &cpu),
                      name);
            std::vector<Attribute> asym = {attr("group", m), attr("channels_last", int64_t{1}),
                                           attr("pads", std::vector<int64_t>{p, 0, 0, p + 1}),
                                           attr("strides", std::vector<int64_t>{stride, stride}), attr("pointwise_activation", std::string("Silu")),
                                           attr("activation", std::string("Clip")), attr("activation_params", std::vector<double>{0, 6})};
            EXPECT_EQ(check({"PointwiseDepthwiseConv", {x, w1, Tensor(), w2}, {false, true, false, true}, asym, {true}, "", {}, threads},
                            1e-5, &cpu),
                      name);
            std::vector<Attribute> none = {attr("group", m), attr("channels_last", int64_t{1}),
                                           attr("strides", std::vector<int64_t>{stride, stride})};
            EXPECT_EQ(check({"PointwiseDepthwiseConv", {x, w1, b1, w2}, {false, true, true, true}, none, {true}, "", {}, threads}, 1e-5, &cpu),
                      name);
            // With the projection to `out` channels (a scalar tail, part of a tile, whole tiles):
            // all three stages with ReLU on the projection and its residual Z, and the depthwise
            // convolution of X (m channels) alone before it, without B3.
            const int64_t out = c == 3 ? 5 : c == 24 ? 24 : 48, oh = (height + 2 * p - k) / stride + 1, ow = (width + 2 * p - k) / stride + 1;
            const Tensor w3 = noise({out, m, 1, 1}, 39, 0.3f), b3 = noise({out}, 40), z = noise({images, oh, ow, out}, 41);
            std::vector<Attribute> three = a;
            three.push_back(attr("projection_activation", std::string("Relu")));
            EXPECT_EQ(check({"PointwiseDepthwiseConv", {x, w1, b1, w2, b2, w3, b3, z}, {false, true, true, true, true, true, true, false},
                             three, {true}, "", {}, threads},
                            1e-5, &cpu),
                      name);
            const Tensor xm = noise({images, height, width, m}, 42);
            EXPECT_EQ(check({"PointwiseDepthwiseConv", {xm, Tensor(), Tensor(), w2, b2, w3}, {false, false, false, true, true, true}, a, {true},
                             "", {}, threads},
                            1e-5, &cpu),
                      name);
          }
  // Dilated, stride 3, or weights computed at run time (W1's, W3's): the reference kernel.
  const Tensor x = noise({1, 9, 9, 8}, 36), w1 = noise({16, 8, 1, 1}, 37), w2 = noise({16, 1, 3, 3}, 38);
  EXPECT_EQ(check({"PointwiseDepthwiseConv", {x, w1, Tensor(), w2}, {false, true, false, true},
                   {attr("group", int64_t{16}), attr("channels_last", int64_t{1}), attr("dilations", std::vector<int64_t>{2, 2})}}),
            kReferenceKernel);
  EXPECT_EQ(check({"PointwiseDepthwiseConv", {x, w1, Tensor(), w2}, {false, true, false, true},
                   {attr("group", int64_t{16}), attr("channels_last", int64_t{1}), attr("strides", std::vector<int64_t>{3, 3})}}),
            kReferenceKernel);
  EXPECT_EQ(check({"PointwiseDepthwiseConv", {x, w1, Tensor(), w2}, {false, false, false, true},
                   {attr("group", int64_t{16}), attr("channels_last", int64_t{1})}}),
            kReferenceKernel);
  EXPECT_EQ(check({"PointwiseDepthwiseConv", {x, w1, Tensor(), w2, Tensor(), noise({4, 16, 1, 1}, 39)}, {false, true, false, true, false, false},
                   {attr("group", int64_t{16}), attr("channels_last", int64_t{1})}}),
            kReferenceKernel);
  // f16 weights (`--precision fp16`), widened as they are packed: every stage's, and the
  // depthwise one's alone; the products are the reference's, of the activations as they are.
  for (const auto& [isa, cpu] : isa_paths())
    for (int threads : {1, 2}) {
      SCOPED_TRACE("f16 " + isa + " threads=" + std::to_string(threads));
      const Tensor xf = noise({2, 13, 11, 24}, 43), w1f = noise({144, 24, 1, 1}, 44, 0.5f), w2f = noise({144, 1, 3, 3}, 45, 0.5f);
      const Tensor w3f = noise({24, 144, 1, 1}, 46, 0.3f);
      const std::vector<Attribute> a = {attr("group", int64_t{144}), attr("channels_last", int64_t{1}),
                                        attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("activation", std::string("Clip")),
                                        attr("activation_params", std::vector<double>{0, 6})};
      const std::string name = "kiln.pointwise_depthwise_f32_" + isa;
      EXPECT_EQ(check({"PointwiseDepthwiseConv", {xf, to_f16(w1f), Tensor(), to_f16(w2f), Tensor(), to_f16(w3f)},
                       {false, true, false, true, false, true}, a, {true}, "", {}, threads},
                      1e-5, &cpu),
                name);
      EXPECT_EQ(check({"PointwiseDepthwiseConv", {xf, w1f, Tensor(), to_f16(w2f), Tensor(), w3f}, {false, true, false, true, false, true}, a,
                       {true}, "", {}, threads},
                      1e-5, &cpu),
                name);
    }
}

// kiln.direct_conv on channels-last convolutions of few input channels (an image model's first
// layer): 1 to 4 input channels; output channels of one to five vectors (on AVX-512 a group of
// four and one of one; on AVX2 groups of four and the rest); 3x3 stride 2, 7x7 stride 2 and 1x1
// stride 1 filters; rows with edge columns on both sides, inside columns in whole register
// blocks and a remainder; pads asymmetric; X channels-first (x_channels_first); a Clip, a SiLU or
// a Sigmoid alone (in the registers), a fused SiLU with a residual and a ReLU after it; one and
// two threads (two images of 40x37: work enough for both).
TEST(CpuKernels, DirectConv) {
  struct Filter {
    int64_t k, stride;
    std::vector<int64_t> pads;
  };
  const std::vector<Filter> filters = {{3, 2, {1, 1, 1, 1}}, {7, 2, {3, 2, 3, 4}}, {1, 1, {0, 0, 0, 0}}, {3, 1, {0, 1, 2, 1}}};
  for (const auto& [isa, cpu] : isa_paths())
    for (int threads : {1, 2})
      for (const Filter& f : filters)
        for (int64_t c : {1, 3, 4})
          for (int64_t k : {16, 32, 80}) {
            SCOPED_TRACE(isa + " k=" + std::to_string(f.k) + " stride=" + std::to_string(f.stride) + " c=" + std::to_string(c) +
                         " out=" + std::to_string(k) + " threads=" + std::to_string(threads));
            const int64_t height = 40, width = 37;
            Tensor x = noise({2, height, width, c}, 31), w = noise({k, c, f.k, f.k}, 32, 0.5f), b = noise({k}, 33);
            std::vector<Attribute> a = {attr("channels_last", int64_t{1}), attr("pads", f.pads),
                                        attr("strides", std::vector<int64_t>{f.stride, f.stride})};
            const std::string name = "kiln.direct_conv_f32_" + isa;
            EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, a, {true}, name, {}, threads}, 1e-5, &cpu), name);
            // X channels-first (x_channels_first: an image read as it comes), Y channels-last.
            std::vector<Attribute> first = a;
            first.push_back(attr("x_channels_first", int64_t{1}));
            const Tensor x_first = noise({2, c, height, width}, 35);
            EXPECT_EQ(check({"FusedConv", {x_first, w, b}, {false, true, true}, first, {true}, "", {}, threads}, 1e-5, &cpu), name);
            // A Clip alone, applied in the registers (both bounds within the sums' range).
            std::vector<Attribute> clip = a;
            clip.push_back(attr("activation", std::string("Clip")));
            clip.push_back(attr("activation_params", std::vector<double>{-0.25, 0.5}));
            EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, clip, {true}, name, {}, threads}, 1e-5, &cpu), name);
            // A SiLU or a Sigmoid alone, also in the registers.
            for (const char* act : {"Silu", "Sigmoid"}) {
              std::vector<Attribute> logistic = a;
              logistic.push_back(attr("activation", std::string(act)));
              EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, logistic, {true}, name, {}, threads}, 1e-5, &cpu), name);
            }
            const int64_t oh = (height + f.pads[0] + f.pads[2] - f.k) / f.stride + 1;
            const int64_t ow = (width + f.pads[1] + f.pads[3] - f.k) / f.stride + 1;
            std::vector<Attribute> fused = a;
            fused.push_back(attr("activation", std::string("Silu")));
            fused.push_back(attr("post_activation", std::string("Relu")));
            const Tensor z = noise({2, oh, ow, k}, 34);
            EXPECT_EQ(check({"FusedConv", {x, w, Tensor(), z}, {false, true, false, false}, fused, {true}, "", {}, threads}, 1e-5, &cpu),
                      name);
          }
  // The default rule: kiln's kernel for a SiLU, oneDNN's for a piecewise-linear epilogue or none.
  // Five input channels, a grouped convolution, output channels that are not whole vectors and
  // channels-first layouts go elsewhere even with a SiLU.
  for (const auto& [isa, cpu] : isa_paths()) {
    SCOPED_TRACE(isa);
    const std::vector<Attribute> last = {attr("channels_last", int64_t{1}), attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
    std::vector<Attribute> silu = last, clip = last;
    silu.push_back(attr("activation", std::string("Silu")));
    clip.push_back(attr("activation", std::string("Clip")));
    clip.push_back(attr("activation_params", std::vector<double>{0, 6}));
    const Tensor rgb = noise({1, 8, 8, 3}, 35), w32 = noise({32, 3, 3, 3}, 36);
    EXPECT_EQ(check({"FusedConv", {rgb, w32}, {false, true}, silu}, 1e-5, &cpu), "kiln.direct_conv_f32_" + isa);
    EXPECT_EQ(check({"FusedConv", {rgb, w32}, {false, true}, clip}, 1e-5, &cpu), "onednn.conv");
    EXPECT_EQ(check({"FusedConv", {rgb, w32}, {false, true}, last}, 1e-5, &cpu), "onednn.conv");
    auto elsewhere = [cpu = cpu](const Tensor& x, const Tensor& w, std::vector<Attribute> a) {  // clang 14: no captured bindings
      return check({"FusedConv", {x, w}, {false, true}, std::move(a)}, 1e-5, &cpu).rfind("kiln.direct_conv", 0) != 0;
    };
    EXPECT_TRUE(elsewhere(noise({1, 8, 8, 5}, 37), noise({16, 5, 3, 3}, 38), silu));
    EXPECT_TRUE(elsewhere(rgb, noise({24, 3, 3, 3}, 39), silu));
    std::vector<Attribute> grouped = silu;
    grouped.push_back(attr("group", int64_t{2}));
    EXPECT_TRUE(elsewhere(noise({1, 8, 8, 4}, 40), noise({32, 2, 3, 3}, 41), grouped));
    std::vector<Attribute> first = {attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("activation", std::string("Silu"))};
    EXPECT_TRUE(elsewhere(noise({1, 3, 8, 8}, 42), w32, first));
    // X channels-first beside a channels-last Y: kiln's kernel whatever the epilogue; every
    // other convolution kernel declines it (eight channels: only the reference runs it), but
    // kiln's GEMM where the windows tile the image (a 1x1 stride-1 filter).
    std::vector<Attribute> x_first = clip;
    x_first.push_back(attr("x_channels_first", int64_t{1}));
    EXPECT_EQ(check({"FusedConv", {noise({1, 3, 8, 8}, 43), w32}, {false, true}, x_first}, 1e-5, &cpu), "kiln.direct_conv_f32_" + isa);
    EXPECT_EQ(check({"FusedConv", {noise({1, 8, 8, 8}, 44), noise({32, 8, 3, 3}, 45)}, {false, true}, x_first}, 1e-5, &cpu),
              kReferenceKernel);
    EXPECT_EQ(check({"FusedConv", {noise({1, 8, 8, 8}, 46), noise({32, 8, 1, 1}, 47)}, {false, true},
                     {attr("channels_last", int64_t{1}), attr("x_channels_first", int64_t{1})}}, 1e-5, &cpu),
              "kiln.gemm_f32_" + isa);
  }
}

// RowKernels::direct_conv reads its input through strides: the same images channels-first and
// channels-last give the same output, to the bit (the sums in the same order), on the RGB
// stride-2 paths with their constant offsets (planar and channels-last) and on the general one
// (two channels, stride 1).
TEST(CpuKernels, DirectConvReadsChannelsFirstAsChannelsLast) {
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2}) {
    if (cpu::lacks(CpuFeatures::host(), isa)) continue;
    for (const auto& [c, s] : std::vector<std::pair<int64_t, int64_t>>{{3, 2}, {2, 1}}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " c=" + std::to_string(c) + " s=" + std::to_string(s));
      const int64_t n = 2, h = 9, w = 13, k = 32, kh = 3, kw = 3, oh = (h + 2 - kh) / s + 1, ow = (w + 2 - kw) / s + 1;
      const Tensor last = noise({n, h, w, c}, 51), filters = noise({kh, kw, c, k}, 52), bias = noise({k}, 53);
      Tensor first(DType::f32, {n, c, h, w});
      for (int64_t b = 0; b < n; ++b)
        for (int64_t p = 0; p < h * w; ++p)
          for (int64_t ch = 0; ch < c; ++ch) first.data<float>()[(b * c + ch) * h * w + p] = last.data<float>()[(b * h * w + p) * c + ch];
      Tensor y_last(DType::f32, {n, oh, ow, k}), y_first(DType::f32, {n, oh, ow, k});
      const ActivationSpec silu{Activation::silu}, none{};
      const cpu::RowKernels& rk = cpu::row_kernels(isa);
      rk.direct_conv(last.data<float>(), n, h, w, c, h * w * c, w * c, c, 1, filters.data<float>(), bias.data<float>(), k, kh, kw, s, 1,
                     1, y_last.data<float>(), oh, ow, nullptr, silu, none);
      rk.direct_conv(first.data<float>(), n, h, w, c, c * h * w, w, 1, h * w, filters.data<float>(), bias.data<float>(), k, kh, kw, s,
                     1, 1, y_first.data<float>(), oh, ow, nullptr, silu, none);
      for (int64_t i = 0; i < y_last.numel(); ++i) ASSERT_EQ(y_first.data<float>()[i], y_last.data<float>()[i]) << "at " << i;
    }
  }
}

// kiln.global_pool on channels-last GlobalAveragePool and GlobalMaxPool: 1-D to 3-D spatial
// dims, channels below, at and past a vector, one image and three; small (one thread) and large
// enough for the threads to share an image's pixels (at two threads: each its rows, then its
// share of the channels). Channels-first ones stay with oneDNN.
TEST(CpuKernels, GlobalPool) {
  for (const auto& [isa, cpu] : isa_paths())
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"})
      for (int threads : {1, 2})
        for (const std::vector<int64_t>& shape :
             std::vector<std::vector<int64_t>>{{1, 7, 5}, {3, 4, 5, 16}, {1, 112, 112, 32}, {2, 9, 60, 70, 33}, {1, 3, 2, 2, 2}}) {
          SCOPED_TRACE(isa + " " + op + " threads=" + std::to_string(threads) + " rank " + std::to_string(shape.size()));
          const std::string name = "kiln.global_pool_f32_" + isa;
          const double tol = std::string(op) == "GlobalMaxPool" ? 0 : 1e-5;  // the sums in another order; maxima exact
          EXPECT_EQ(check({op, {noise(shape, 51)}, {false}, {attr("channels_last", int64_t{1})}, {true}, "", {}, threads}, tol, &cpu),
                    name);
        }
  EXPECT_EQ(check({"GlobalAveragePool", {noise({1, 32, 14, 14}, 52)}, {false}, {}}), "onednn.pool");
}

// kiln.max_pool on channels-last 2-D MaxPool: channels below, at and past a vector and past
// four (the register blocks and the scalar tail); ResNet-50's 3x3 stride 2 over padding, YOLO's
// 5x5 stride 1, 2x2 stride 2 without padding, asymmetric pads, dilation 2, ceil_mode (the last
// window past the image); two images, their rows shared on two threads. Maxima are exact; NaN
// and signed zeros fall as the reference's comparisons put them (bit for bit). Channels-first
// pools, with or without the Indices output (which only they have), stay with the others.
TEST(CpuKernels, MaxPool) {
  struct Window {
    std::vector<int64_t> kernel, strides, pads, dilations;
    int64_t ceil = 0;
  };
  const std::vector<Window> windows = {{{3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}},   {{5, 5}, {1, 1}, {2, 2, 2, 2}, {1, 1}},
                                       {{2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}},   {{3, 2}, {1, 2}, {0, 1, 2, 0}, {1, 1}},
                                       {{3, 3}, {1, 1}, {2, 2, 2, 2}, {2, 2}},   {{3, 3}, {2, 2}, {0, 0, 1, 1}, {1, 1}, 1}};
  for (const auto& [isa, cpu] : isa_paths())
    for (int threads : {1, 2})
      for (const Window& w : windows)
        for (int64_t c : {1, 8, 17, 64, 101}) {
          SCOPED_TRACE(isa + " kernel " + std::to_string(w.kernel[0]) + "x" + std::to_string(w.kernel[1]) + " c=" + std::to_string(c) +
                       " threads=" + std::to_string(threads));
          const std::vector<Attribute> a = {attr("channels_last", int64_t{1}), attr("kernel_shape", w.kernel), attr("strides", w.strides),
                                            attr("pads", w.pads), attr("dilations", w.dilations), attr("ceil_mode", w.ceil)};
          const std::string name = "kiln.max_pool_f32_" + isa;
          EXPECT_EQ(check({"MaxPool", {noise({2, 23, 30, c}, 53)}, {false}, a, {true}, "", {}, threads}, 0, &cpu), name);
        }
  // NaN first in a window stays, NaN later is passed over; +0 after -0 leaves -0 (and the other
  // way round): the outputs bit for bit, f32 and bf16 alike.
  for (const auto& [isa, cpu] : isa_paths())
    for (DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(isa + " " + std::string(dtype_name(t)));
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> v(2 * 2 * 20);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7) - 3.f;
      // Channels 0-3 and 9-12 lie in vectors, 16-19 in the scalar tail (AVX2 and AVX-512 alike).
      auto at = [&](int64_t pixel, int64_t ch) -> float& { return v[static_cast<size_t>(pixel * 20 + ch)]; };
      for (int64_t ch : {0, 9, 16}) at(0, ch) = nan;  // first in the window
      for (int64_t ch : {1, 10, 17}) at(3, ch) = nan;  // last
      for (int64_t ch : {2, 11, 18}) at(0, ch) = -0.f, at(1, ch) = 0.f, at(2, ch) = at(3, ch) = -1.f;
      for (int64_t ch : {3, 12, 19}) at(0, ch) = 0.f, at(1, ch) = -0.f, at(2, ch) = at(3, ch) = -1.f;
      Tensor x = Tensor::from<float>({1, 2, 2, 20}, v);
      if (t == DType::bf16) {
        Tensor b(DType::bf16, x.shape());
        for (int64_t i = 0; i < x.numel(); ++i) b.data<bfloat16>()[i] = bfloat16(x.data<float>()[i]);
        x = std::move(b);
      }
      const BothRuns r = run_both({"MaxPool", {x}, {false}, {attr("channels_last", int64_t{1}), attr("kernel_shape", std::vector<int64_t>{2, 2})}},
                                  &cpu);
      EXPECT_EQ(r.kernel, "kiln.max_pool_" + std::string(dtype_name(t)) + "_" + isa);
      ASSERT_EQ(r.fast.size(), 1u);
      ASSERT_EQ(r.ref.size(), 1u);
      ASSERT_EQ(r.fast[0].numel(), 20);
      EXPECT_EQ(std::memcmp(r.fast[0].raw(), r.ref[0].raw(), r.ref[0].nbytes()), 0);
      for (int64_t ch : {0, 16}) {
        EXPECT_TRUE(std::isnan(r.fast[0].as_double(ch))) << ch;
        EXPECT_FALSE(std::isnan(r.fast[0].as_double(ch + 1))) << ch;
        EXPECT_TRUE(r.fast[0].as_double(ch + 2) == 0 && std::signbit(r.fast[0].as_double(ch + 2))) << ch;
        EXPECT_TRUE(r.fast[0].as_double(ch + 3) == 0 && !std::signbit(r.fast[0].as_double(ch + 3))) << ch;
      }
    }
  // Channels-first, without and with the Indices output.
  const std::vector<Attribute> a = {attr("kernel_shape", std::vector<int64_t>{3, 3})};
  EXPECT_EQ(check({"MaxPool", {noise({1, 8, 9, 9}, 54)}, {false}, a}).rfind("kiln.max_pool", 0), std::string::npos);
  EXPECT_EQ(check({"MaxPool", {noise({1, 8, 9, 9}, 55)}, {false}, a, {true, true}}).rfind("kiln.max_pool", 0), std::string::npos);
}

// kiln.max_pool_bf16 and kiln.max_pool_int8: the same windows over bf16 images (a `--precision
// bf16` chain's) and u8 / s8 codes (a quantized model's), channels below, at and past a
// vector (16 or 32 bf16, 32 or 64 codes) and past four, one and two threads: the reference's
// outputs bit for bit.
TEST(CpuKernels, MaxPoolOnBf16AndCodes) {
  const std::vector<std::vector<Attribute>> windows = {
      {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}), attr("pads", std::vector<int64_t>{1, 1, 1, 1})},
      {attr("kernel_shape", std::vector<int64_t>{5, 5}), attr("pads", std::vector<int64_t>{2, 2, 2, 2})},
      {attr("kernel_shape", std::vector<int64_t>{3, 2}), attr("strides", std::vector<int64_t>{1, 2}), attr("pads", std::vector<int64_t>{0, 1, 2, 0})},
      {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("dilations", std::vector<int64_t>{2, 2}), attr("pads", std::vector<int64_t>{2, 2, 2, 2})},
      {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}), attr("ceil_mode", int64_t{1})}};
  for (const auto& [isa, cpu] : isa_paths())
    for (DType t : {DType::bf16, DType::u8, DType::i8})
      for (int64_t c : {1, 17, 64, 101, 300})
        for (size_t w = 0; w < windows.size(); ++w)
          for (int threads : {1, 2}) {
            SCOPED_TRACE(isa + " " + std::string(dtype_name(t)) + " window " + std::to_string(w) + " c=" + std::to_string(c) + " threads=" +
                         std::to_string(threads));
            const Tensor f = noise({2, 11, 14, c}, 56 + static_cast<uint32_t>(c));  // in [-0.5, 0.5)
            Tensor x(t, f.shape());
            for (int64_t i = 0; i < f.numel(); ++i) {
              const float v = f.data<float>()[i];
              if (t == DType::bf16) x.data<bfloat16>()[i] = bfloat16(v * 100.f);
              else if (t == DType::u8) x.data<uint8_t>()[i] = static_cast<uint8_t>(std::lround((v + 0.5f) * 255.f));
              else x.data<int8_t>()[i] = static_cast<int8_t>(std::lround(v * 255.f));
            }
            std::vector<Attribute> a = windows[w];
            a.push_back(attr("channels_last", int64_t{1}));
            const BothRuns r = run_both({"MaxPool", {x}, {false}, a, {true}, "", {}, threads}, &cpu);
            EXPECT_EQ(r.kernel, std::string("kiln.max_pool_") + (t == DType::bf16 ? "bf16_" : "int8_") + isa);
            ASSERT_EQ(r.fast.size(), 1u);
            ASSERT_EQ(r.fast[0].dtype(), t);
            ASSERT_EQ(r.fast[0].shape(), r.ref[0].shape());
            EXPECT_EQ(std::memcmp(r.fast[0].raw(), r.ref[0].raw(), r.ref[0].nbytes()), 0);
          }
}

// kiln.winograd on channels-last 3x3 stride-1 convolutions, pinned with each tile (4x4 and
// 2x2 outputs): channels below, at and past a vector (the scalar tail, whole vectors, both) in
// and out; images of whole and partial tiles (the last row and column of tiles outside Y),
// 'same', asymmetric and no padding; with and without a bias; ReLU alone (applied in the output
// transform) and SiLU, a residual and a post-activation (on the output rows); one and two
// threads (the transforms' tiles and the products shared); blocks of tile rows (a tall image
// whose V and M outgrow L2). Winograd reorders the sums: within 1e-5 relative L2.
TEST(CpuKernels, WinogradConv) {
  auto conv = [](std::vector<int64_t> pads) {
    return std::vector<Attribute>{attr("channels_last", int64_t{1}), attr("pads", std::move(pads))};
  };
  struct Layer {
    int64_t c, k, h, w;
    std::vector<int64_t> pads;
  };
  for (const auto& [isa, cpu] : isa_paths())
    for (int64_t tile : {4, 2})
      for (int threads : {1, 2})
        for (const Layer& l : {Layer{5, 7, 9, 11, {1, 1, 1, 1}}, Layer{16, 16, 8, 8, {1, 1, 1, 1}}, Layer{40, 33, 7, 13, {0, 1, 2, 0}},
                               Layer{19, 48, 6, 5, {0, 0, 0, 0}}, Layer{200, 24, 150, 6, {1, 1, 1, 1}}}) {
          SCOPED_TRACE(isa + " tile=" + std::to_string(tile) + " threads=" + std::to_string(threads) + " c=" + std::to_string(l.c) +
                       " k=" + std::to_string(l.k) + " " + std::to_string(l.h) + "x" + std::to_string(l.w));
          const std::string name = "kiln.winograd_f32_" + isa;
          const KernelParams pin = {{"tile", tile}};
          const int64_t oh = l.h + l.pads[0] + l.pads[2] - 2, ow = l.w + l.pads[1] + l.pads[3] - 2;
          const Tensor x = noise({2, l.h, l.w, l.c}, 41), w = noise({l.k, l.c, 3, 3}, 42, 0.5f), b = noise({l.k}, 43);
          if (l.h < 100) {  // the tall image (its blocks of tile rows) with the fused epilogue alone
            EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, conv(l.pads), {true}, name, pin, threads}, 1e-5, &cpu), name);
            EXPECT_EQ(check({"FusedConv", {x, w}, {false, true}, conv(l.pads), {true}, name, pin, threads}, 1e-5, &cpu), name);
            std::vector<Attribute> relu = conv(l.pads);
            relu.push_back(attr("activation", std::string("Relu")));
            EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, relu, {true}, name, pin, threads}, 1e-5, &cpu), name);
          }
          std::vector<Attribute> fused = conv(l.pads);
          fused.push_back(attr("activation", std::string("Silu")));
          fused.push_back(attr("post_activation", std::string("Relu")));
          const Tensor z = noise({2, oh, ow, l.k}, 44);
          EXPECT_EQ(check({"FusedConv", {x, w, b, z}, {false, true, true, false}, fused, {true}, name, pin, threads}, 1e-5, &cpu), name);
        }
  // Both ways two threads share the work, pinned (split=points: the transforms' tiles and the
  // points' products; split=tiles: each thread its own tiles through every step), on layers
  // big enough for a plan of two threads: tile counts that split partway along a tile row, so
  // that each thread's epilogue (SiLU, residual, ReLU) covers part of a row; and each thread's
  // share in several blocks (a 64-channel 36x81 image in 4x4 tiles, whose V and M per tile row
  // leave room for a few rows beside U). The default: tiles where U is under half of L2 (56x56
  // by 64 channels in 4x4 tiles: 590 KB) and each thread has 8 tiles or more, points otherwise.
  for (const auto& [isa, cpu] : isa_paths())
    for (const std::string split : {"points", "tiles"})
      for (const Layer& l : {Layer{40, 33, 34, 27, {1, 0, 1, 2}}, Layer{64, 64, 36, 81, {1, 1, 1, 1}}})
        for (int64_t tile : {4, 2}) {
          if (l.c == 64 && tile == 2) continue;
          SCOPED_TRACE(isa + " split=" + split + " tile=" + std::to_string(tile) + " c=" + std::to_string(l.c));
          const std::string name = "kiln.winograd_f32_" + isa;
          const KernelParams pin = {{"tile", tile}, {"split", split}};
          const int64_t oh = l.h + l.pads[0] + l.pads[2] - 2, ow = l.w + l.pads[1] + l.pads[3] - 2;
          const Tensor x = noise({1, l.h, l.w, l.c}, 61), w = noise({l.k, l.c, 3, 3}, 62, 0.5f), b = noise({l.k}, 63);
          std::vector<Attribute> relu = conv(l.pads);
          relu.push_back(attr("activation", std::string("Relu")));
          std::string label;
          EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, relu, {true}, name, pin, 2}, 1e-5, &cpu, nullptr, &label), name);
          EXPECT_NE(label.find(split + "_split"), std::string::npos) << label;
          std::vector<Attribute> fused = conv(l.pads);
          fused.push_back(attr("activation", std::string("Silu")));
          fused.push_back(attr("post_activation", std::string("Relu")));
          const Tensor z = noise({1, oh, ow, l.k}, 64);
          EXPECT_EQ(check({"FusedConv", {x, w, b, z}, {false, true, true, false}, fused, {true}, name, pin, 2}, 1e-5, &cpu), name);
        }
  for (const auto& [isa, cpu] : isa_paths()) {
    auto split_of = [cpu = cpu](int64_t c, int64_t hw, int threads) {
      const std::vector<Attribute> a = {attr("channels_last", int64_t{1}), attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
      std::string label;
      check({"FusedConv", {noise({1, hw, hw, c}, 65), noise({c, c, 3, 3}, 66, 0.5f)}, {false, true}, a, {true}, "", {}, threads}, 1e-5,
            &cpu, nullptr, &label);
      return label.substr(label.rfind(' ') + 1);
    };
    // U of 64 channels in 4x4 tiles: 590 KB, under half of L2 here (2 MiB); on a CPU with less,
    // the points.
    const std::string fits = 36 * 64 * 64 * 4 < cpu::gemm::CacheSizes::host().l2 / 2 ? "tiles_split" : "points_split";
    EXPECT_EQ(split_of(64, 56, 2), fits);
    EXPECT_EQ(split_of(64, 20, 2), fits);            // 25 tiles of 4x4: 12 or more a thread
    EXPECT_EQ(split_of(64, 20, 4), "points_split");  // fewer than 8 a thread
    EXPECT_EQ(split_of(128, 28, 2), "points_split");
    EXPECT_EQ(split_of(64, 56, 1).find("split"), std::string::npos);
  }
  // An f16 weight (`--precision fp16`): with 2x2 tiles the products on kiln's f16 GEMM where
  // the CPU has AVX512-FP16 (V rounded to f16, sums in f16 over blocks of K); with 4x4 ones, or
  // without it, in f32 on the weight widened. 70 outputs of 41 channels: U in two panels of the
  // f16 GEMM's 64 columns, the second part empty, and the last pair of channels half zeros.
  for (const auto& [k, c] : {std::pair<int64_t, int64_t>{48, 40}, {70, 41}})
    for (int64_t tile : {4, 2})
      for (int threads : {1, 2}) {
        SCOPED_TRACE("f16 k=" + std::to_string(k) + " c=" + std::to_string(c) + " tile=" + std::to_string(tile) + " threads=" +
                     std::to_string(threads));
        const Tensor h = to_f16(noise({k, c, 3, 3}, 47, 0.5f));
        const std::string name = std::string("kiln.winograd_f32_") + (CpuFeatures::host().avx512f ? "avx512" : "avx2");
        std::vector<Attribute> a = {attr("channels_last", int64_t{1}), attr("pads", std::vector<int64_t>{1, 1, 1, 1}),
                                    attr("activation", std::string("Relu"))};
        std::string label;
        EXPECT_EQ(check({"FusedConv", {noise({1, 21, 17, c}, 48), h, noise({k}, 49)}, {false, true, true}, a, {true}, name,
                         {{"tile", tile}}, threads},
                        tile == 2 && CpuFeatures::host().avx512_fp16 ? 3e-3 : 1e-5, nullptr, nullptr, &label),
                  name);
        EXPECT_EQ(label.find("gemm_f16") != std::string::npos, tile == 2 && CpuFeatures::host().avx512_fp16) << label;
      }
  // The default rule (winograd_defers): 32 channels or more in and out with AVX-512, 16 or more
  // on AVX2, 4x4 tiles from 25 of them, 2x2 ones down to 16 (but with AVX-512 a weight that
  // outgrows L2 over fewer than 25 goes to kiln's GEMM over the windows); oneDNN's convolution
  // for fewer channels and smaller images, and for strides, dilations and groups kiln's declines.
  for (const auto& [isa, cpu] : isa_paths()) {
    auto chosen = [cpu = cpu](int64_t c, int64_t hw, std::vector<Attribute> extra = {}, std::string* label = nullptr) {
      std::vector<Attribute> a = {attr("channels_last", int64_t{1}), attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
      a.insert(a.end(), extra.begin(), extra.end());
      const int64_t group = extra.empty() || extra[0].name != "group" ? 1 : 2;
      return check({"FusedConv", {noise({1, hw, hw, c}, 45), noise({c, c / group, 3, 3}, 46, 0.5f)}, {false, true}, a}, 1e-5, &cpu,
                   nullptr, label);
    };
    const std::string name = "kiln.winograd_f32_" + isa;
    std::string label;
    EXPECT_EQ(chosen(64, 56, {}, &label), name);
    EXPECT_EQ(label.rfind("winograd_f4x4_3x3", 0), 0u) << label;
    EXPECT_EQ(chosen(256, 14, {}, &label), name);
    EXPECT_EQ(label.rfind("winograd_f2x2_3x3", 0), 0u) << label;
    EXPECT_EQ(chosen(64, 7), name);
    EXPECT_EQ(chosen(512, 7), isa == "avx2" ? name : "kiln.gemm_f32_avx512");
    EXPECT_EQ(chosen(512, 9), name);
    EXPECT_EQ(chosen(64, 6), "onednn.conv");
    EXPECT_EQ(chosen(16, 56), isa == "avx2" ? name : "onednn.conv");
    EXPECT_EQ(chosen(8, 56), "onednn.conv");
    EXPECT_EQ(chosen(64, 56, {attr("strides", std::vector<int64_t>{2, 2})}), "onednn.conv");
    EXPECT_EQ(chosen(64, 56, {attr("dilations", std::vector<int64_t>{2, 2}), attr("pads", std::vector<int64_t>{2, 2, 2, 2})}),
              "onednn.conv");
    EXPECT_EQ(chosen(64, 56, {attr("group", int64_t{2})}), "onednn.conv");
  }
}

// An f16 weight (`--precision fp16`) that the f16 GEMM's rule leaves to f32, or that no f16
// kernel takes, runs on the f32 kernel the f32 weight would, the weight widened as it is packed
// (the products are the reference's): a pointwise convolution into 32 channels with a SiLU on
// kiln's GEMM, and depthwise ones with a SiLU, strides 1 and 2, on kiln's depthwise kernel. An
// f16 weight computed at run time stays off kiln's GEMM (it widens constants only).
TEST(CpuKernels, F16WeightsComputedInF32TakeTheF32Kernels) {
  for (const auto& [isa, cpu] : isa_paths()) {
    SCOPED_TRACE(isa);
    const std::vector<Attribute> silu = {attr("channels_last", int64_t{1}), attr("activation", std::string("Silu"))};
    const Tensor x = noise({2, 14, 14, 64}, 51), w = to_f16(noise({32, 64, 1, 1}, 52, 0.5f)), b = noise({32}, 53);
    EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, silu, {true}}, 1e-5, &cpu), "kiln.gemm_f32_" + isa);
    EXPECT_NE(check({"FusedConv", {x, w, b}, {false, false, true}, silu, {true}}, 1e-5, &cpu), "kiln.gemm_f32_" + isa);
    for (int64_t stride : {1, 2}) {
      std::vector<Attribute> dw = silu;
      dw.push_back(attr("group", int64_t{48}));
      dw.push_back(attr("pads", std::vector<int64_t>{1, 1, 1, 1}));
      dw.push_back(attr("strides", std::vector<int64_t>{stride, stride}));
      EXPECT_EQ(check({"FusedConv", {noise({2, 13, 11, 48}, 54), to_f16(noise({48, 1, 3, 3}, 55, 0.5f)), noise({48}, 56)},
                       {false, true, true}, dw, {true}},
                      1e-5, &cpu),
                "kiln.dwconv_f32_" + isa);
    }
  }
}

// kiln.gemm_f16_avx512 on channels-last convolutions with f16 weights (`--precision fp16`),
// pinned: pointwise (A read in place) and through its windows (3x3 "same" with a residual and
// activations, stride 2 with asymmetric pads, a pointwise one whose end padding makes it a
// windowed one, dilated 5x5), C below, at and past a vector. It rounds the activations to f16
// and sums in f16 over blocks of K, which the reference (f32 on the widened weight) does not.
TEST(CpuKernels, F16Convolution) {
  if (!CpuFeatures::host().avx512_fp16) GTEST_SKIP() << "this CPU lacks avx512-fp16";
  const std::string name = "kiln.gemm_f16_avx512";
  auto conv = [](std::vector<int64_t> pads, int64_t stride, int64_t dilation) {
    return std::vector<Attribute>{attr("channels_last", int64_t{1}), attr("pads", std::move(pads)),
                                  attr("strides", std::vector<int64_t>{stride, stride}),
                                  attr("dilations", std::vector<int64_t>{dilation, dilation})};
  };
  struct Layer {
    int64_t c, n, k, stride, dilation;
    std::vector<int64_t> pads;
  };
  for (const Layer& l : {Layer{24, 40, 1, 1, 1, {0, 0, 0, 0}}, Layer{19, 70, 3, 1, 1, {1, 1, 1, 1}},
                         Layer{32, 24, 3, 2, 1, {0, 1, 1, 0}}, Layer{16, 20, 1, 1, 1, {0, 0, 1, 1}},
                         Layer{17, 9, 5, 1, 2, {3, 3, 3, 3}}}) {
    SCOPED_TRACE("c=" + std::to_string(l.c) + " k=" + std::to_string(l.k) + " stride=" + std::to_string(l.stride));
    const Tensor x = noise({2, 9, 11, l.c}, 31), w = to_f16(noise({l.n, l.c, l.k, l.k}, 32, 0.5f)), b = noise({l.n}, 33);
    EXPECT_EQ(check({"FusedConv", {x, w, b}, {false, true, true}, conv(l.pads, l.stride, l.dilation), {true}, name}, 3e-3), name);
    const int64_t span = l.dilation * (l.k - 1) + 1;
    const int64_t oh = (9 + l.pads[0] + l.pads[2] - span) / l.stride + 1, ow = (11 + l.pads[1] + l.pads[3] - span) / l.stride + 1;
    std::vector<Attribute> fused = conv(l.pads, l.stride, l.dilation);
    fused.push_back(attr("activation", std::string("Silu")));
    fused.push_back(attr("post_activation", std::string("Relu")));
    EXPECT_EQ(check({"FusedConv", {x, w, Tensor(), noise({2, oh, ow, l.n}, 34)}, {false, true, false, false}, fused, {true}, name}, 3e-3),
              name);
  }
  // The default rule (f16_defers): oneDNN keeps few input channels, few output channels and the
  // small 3x3 stride-1 ones that its Winograd runs (those kiln's Winograd leaves: 6x6 images),
  // over more than one pixel; the f16 GEMM takes the rest.
  auto chosen = [&](int64_t c, int64_t n, int64_t k, int64_t stride, int64_t hw = 14, int threads = 1) {
    const Tensor x = noise({1, hw, hw, c}, 35), w = to_f16(noise({n, c, k, k}, 36, 0.5f));
    return check({"FusedConv", {x, w}, {false, true}, conv({k / 2, k / 2, k / 2, k / 2}, stride, 1), {true}, "", {}, threads}, 3e-3);
  };
  EXPECT_EQ(chosen(3, 64, 7, 2), "onednn.conv");
  EXPECT_EQ(chosen(64, 32, 1, 1), "onednn.conv");
  EXPECT_EQ(chosen(64, 64, 3, 1, 6), "onednn.conv");
  EXPECT_EQ(chosen(8, 144, 1, 1, 1), name);
  EXPECT_EQ(chosen(144, 8, 1, 1, 1), name);
  EXPECT_EQ(chosen(64, 64, 3, 2), name);
  EXPECT_EQ(chosen(64, 128, 3, 1, 6), name);
  // kiln's Winograd, tried first, takes the 3x3 stride-1 ones over 25 tiles or more, and over
  // 16-24 (7x7 and 8x8 images) on more than one thread.
  EXPECT_EQ(chosen(64, 128, 3, 1), std::string("kiln.winograd_f32_avx512"));
  EXPECT_EQ(chosen(64, 128, 3, 1, 7), name);
  EXPECT_EQ(chosen(64, 128, 3, 1, 8), name);
  EXPECT_EQ(chosen(64, 128, 3, 1, 7, 2), std::string("kiln.winograd_f32_avx512"));
  EXPECT_EQ(chosen(64, 128, 3, 1, 9), std::string("kiln.winograd_f32_avx512"));
  EXPECT_EQ(chosen(64, 48, 1, 1), name);
  // 1x1 ones of 32 or fewer input channels over 28x28 pixels or more stay f32 (oneDNN's or
  // kiln's f32 GEMM, gemm_defers' rule), over fewer pixels or with more channels f16.
  EXPECT_NE(chosen(32, 192, 1, 1, 28), name);
  EXPECT_NE(chosen(16, 96, 1, 1, 56), name);
  EXPECT_EQ(chosen(32, 192, 1, 1, 27), name);
  EXPECT_EQ(chosen(40, 240, 1, 1, 28), name);
  EXPECT_EQ(chosen(64, 256, 1, 1, 56), name);
}

TEST(CpuKernels, Attention) {
  // kiln's flash attention on each ISA path, and oneDNN's attention where kiln's is left out.
  const KernelRegistry without_flash = default_kernels().without({"kiln.attention_f32_avx512", "kiln.attention_f32_avx2"});
  const float neg = -3.4e38f;
  for (const auto& [isa, cpu] : isa_paths())
    for (const KernelRegistry* kernels : {&default_kernels(), &without_flash}) {
      const std::string name = kernels == &without_flash ? "onednn.attention" : "kiln.attention_f32_" + isa;
      SCOPED_TRACE(name);
      auto run = [&, target = &cpu](const testing::Case& c) { return check(c, 1e-5, target, kernels); };
      // BERT-like: a padding mask over the keys, broadcast over heads and rows.
      Tensor pad = noise({2, 1, 1, 9}, 1);
      for (int64_t i = 0; i < pad.numel(); ++i) pad.data<float>()[i] = i % 9 >= 7 ? neg : 0.f;
      EXPECT_EQ(run({"Attention", {noise({2, 3, 9, 16}, 2), noise({2, 3, 9, 16}, 3), noise({2, 3, 9, 16}, 4), pad}, {}, {}}), name);
      // Grouped-query heads with a causal float mask over rows and keys; odd head size.
      Tensor causal(DType::f32, {1, 1, 5, 5});
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 5; ++j) causal.data<float>()[i * 5 + j] = j > i ? neg : 0.f;
      EXPECT_EQ(run({"Attention", {noise({1, 8, 5, 12}, 5), noise({1, 2, 5, 12}, 6), noise({1, 2, 5, 7}, 7), causal}, {}, {}}), name);
      // A boolean mask per batch, head and row; is_causal without a mask; a scale; more keys than queries.
      Tensor keep(DType::boolean, {2, 4, 3, 6});
      for (int64_t i = 0; i < keep.numel(); ++i) keep.data<bool>()[i] = (i * 7) % 5 != 0 || i % 6 == 0;
      EXPECT_EQ(run({"Attention", {noise({2, 4, 3, 8}, 8), noise({2, 4, 6, 8}, 9), noise({2, 4, 6, 8}, 10), keep}, {}, {attr("scale", 0.3)}}),
                name);
      EXPECT_EQ(run({"Attention", {noise({1, 2, 7, 8}, 11), noise({1, 2, 7, 8}, 12), noise({1, 2, 7, 8}, 13)}, {}, {attr("is_causal", int64_t{1})}}),
                name);
    }
  // 3-D (sequence-major) inputs, as fuse_attention hands over the projections: kiln's flash
  // attention reads each head where it lies and writes Y the same way; oneDNN's declines them.
  auto heads = [](int64_t hq, int64_t hkv) { return std::vector<Attribute>{attr("q_num_heads", hq), attr("kv_num_heads", hkv)}; };
  for (const auto& [isa, cpu] : isa_paths()) {
    const std::string name = "kiln.attention_f32_" + isa;
    SCOPED_TRACE(name);
    EXPECT_EQ(check({"Attention", {noise({1, 4, 16}, 14), noise({1, 4, 16}, 15), noise({1, 4, 16}, 16)}, {}, heads(2, 2)}, 1e-5, &cpu), name);
    // Grouped-query heads, an odd head size, V's head size apart from K's, a padding mask.
    Tensor pad = noise({2, 1, 1, 7}, 17);
    for (int64_t i = 0; i < pad.numel(); ++i) pad.data<float>()[i] = i % 7 >= 5 ? neg : 0.f;
    EXPECT_EQ(check({"Attention", {noise({2, 5, 4 * 12}, 18), noise({2, 7, 2 * 12}, 19), noise({2, 7, 2 * 9}, 20), pad}, {}, heads(4, 2)}, 1e-5,
                    &cpu),
              name);
    // Across query and key blocks, causal.
    std::vector<Attribute> causal_heads = heads(3, 3);
    causal_heads.push_back(attr("is_causal", int64_t{1}));
    EXPECT_EQ(check({"Attention", {noise({1, 300, 3 * 64}, 21, 6.f), noise({1, 300, 3 * 64}, 22, 6.f), noise({1, 300, 3 * 48}, 23)}, {},
                     causal_heads},
                    1e-5, &cpu),
              name);
  }
  EXPECT_EQ(check({"Attention", {noise({1, 4, 16}, 14), noise({1, 4, 16}, 15), noise({1, 4, 16}, 16)}, {}, heads(2, 2)}, 1e-5, nullptr,
                  &without_flash),
            kReferenceKernel);
}

TEST(CpuKernels, FlashAttentionRotary) {
  // RoPE folded into attention (rotary_cos / rotary_sin): Q rotated per query block, K a chunk
  // of keys at a time before packing, in both layouts, with grouped-query heads, across query
  // blocks and rotation chunks (300 keys: chunks of 256 and 44), causal and with a mask.
  // oneDNN's attention declines it.
  const KernelRegistry without_flash = default_kernels().without({"kiln.attention_f32_avx512", "kiln.attention_f32_avx2"});
  auto rope = [&](std::vector<Tensor> qkv, int64_t b, int64_t s, int64_t d, int salt) {
    qkv.resize(7);
    qkv.push_back(noise({b, s, d / 2}, salt));
    qkv.push_back(noise({b, s, d / 2}, salt + 1));
    return qkv;
  };
  for (const auto& [isa, cpu] : isa_paths()) {
    const std::string name = "kiln.attention_f32_" + isa;
    SCOPED_TRACE(name);
    EXPECT_EQ(check({"Attention", rope({noise({2, 4, 9, 16}, 1), noise({2, 2, 9, 16}, 2), noise({2, 2, 9, 16}, 3)}, 2, 9, 16, 4), {}, {}},
                    1e-5, &cpu),
              name);
    std::vector<Attribute> attrs = {attr("q_num_heads", int64_t{4}), attr("kv_num_heads", int64_t{2}), attr("is_causal", int64_t{1})};
    EXPECT_EQ(check({"Attention", rope({noise({1, 300, 4 * 64}, 5, 4.f), noise({1, 300, 2 * 64}, 6, 4.f), noise({1, 300, 2 * 48}, 7)}, 1, 300, 64, 8),
                     {}, attrs},
                    1e-5, &cpu),
              name);
    std::vector<Tensor> masked = rope({noise({2, 70, 3 * 10}, 9), noise({2, 70, 3 * 10}, 10), noise({2, 70, 3 * 10}, 11)}, 2, 70, 10, 12);
    masked[3] = noise({2, 1, 1, 70}, 13, 4.f);
    EXPECT_EQ(check({"Attention", masked, {}, {attr("q_num_heads", int64_t{3}), attr("kv_num_heads", int64_t{3})}}, 1e-5, &cpu), name);
  }
  EXPECT_EQ(check({"Attention", rope({noise({1, 2, 5, 8}, 14), noise({1, 2, 5, 8}, 15), noise({1, 2, 5, 8}, 16)}, 1, 5, 8, 17), {}, {}}, 1e-5,
                  nullptr, &without_flash),
            kReferenceKernel);
}

TEST(CpuKernels, FlashAttentionKvCache) {
  // A decoder's step: past keys and values before the new ones (causal from the past length on),
  // present_key / present_value written, in both layouts, grouped-query heads, a mask over all
  // the keys, RoPE on the new keys only, and 300 past keys, so that a chunk of 256 assembled keys
  // ends mid-past and the next one mixes past and new. oneDNN's attention declines a KV cache.
  const KernelRegistry without_flash = default_kernels().without({"kiln.attention_f32_avx512", "kiln.attention_f32_avx2"});
  const std::vector<bool> all = {true, true, true};
  for (const auto& [isa, cpu] : isa_paths()) {
    const std::string name = "kiln.attention_f32_" + isa;
    SCOPED_TRACE(name);
    const Tensor q = noise({2, 4, 3, 16}, 1), k = noise({2, 2, 3, 16}, 2), v = noise({2, 2, 3, 8}, 3);
    const Tensor pk = noise({2, 2, 5, 16}, 4), pv = noise({2, 2, 5, 8}, 5);
    EXPECT_EQ(check({"Attention", {q, k, v, Tensor(), pk, pv}, {}, {attr("is_causal", int64_t{1})}, all}, 1e-5, &cpu), name);
    EXPECT_EQ(check({"Attention", {q, k, v, noise({1, 1, 3, 8}, 6, 4.f), pk, pv}, {}, {}, std::vector<bool>{true, false, true}}, 1e-5, &cpu),
              name);
    EXPECT_EQ(check({"Attention", {q, k, v}, {}, {}, all}, 1e-5, &cpu), name);  // present = the new keys alone
    std::vector<Tensor> in = {noise({1, 3, 4 * 64}, 7), noise({1, 3, 2 * 64}, 8), noise({1, 3, 2 * 48}, 9), Tensor(),
                              noise({1, 2, 300, 64}, 10), noise({1, 2, 300, 48}, 11), Tensor(), noise({1, 3, 32}, 12), noise({1, 3, 32}, 13)};
    EXPECT_EQ(check({"Attention", in, {}, {attr("q_num_heads", int64_t{4}), attr("kv_num_heads", int64_t{2}), attr("is_causal", int64_t{1})}, all},
                    1e-5, &cpu),
              name);
  }
  EXPECT_EQ(check({"Attention", {noise({1, 2, 3, 8}, 14), noise({1, 2, 3, 8}, 15), noise({1, 2, 3, 8}, 16), Tensor(), noise({1, 2, 4, 8}, 17),
                                 noise({1, 2, 4, 8}, 18)},
                   {},
                   {}},
                  1e-5, nullptr, &without_flash),
            kReferenceKernel);
}

TEST(CpuKernels, RotaryEmbedding) {
  // The rotate-half form on each ISA path: 4-D and 3-D inputs, caches per token or indexed by
  // position ids, a partial rotary dim (the rest copied), head sizes off the vector width.
  for (const auto& [isa, cpu] : isa_paths()) {
    const std::string name = "kiln.rotary_f32_" + isa;
    SCOPED_TRACE(name);
    EXPECT_EQ(check({"RotaryEmbedding", {noise({2, 3, 5, 64}, 1), noise({2, 5, 32}, 2), noise({2, 5, 32}, 3)}, {}, {}}, 1e-5, &cpu), name);
    EXPECT_EQ(check({"RotaryEmbedding", {noise({1, 7, 2 * 22}, 4), noise({1, 7, 11}, 5), noise({1, 7, 11}, 6)}, {}, {attr("num_heads", int64_t{2})}},
                    1e-5, &cpu),
              name);
    Tensor pos = make<int64_t>({1, 4}, {3, 0, 9, 3});
    EXPECT_EQ(check({"RotaryEmbedding", {noise({1, 2, 4, 40}, 7), noise({10, 12}, 8), noise({10, 12}, 9), pos}, {},
                     {attr("rotary_embedding_dim", int64_t{24})}},
                    1e-5, &cpu),
              name);
    // Interleaved pairs stay with the reference kernel.
    EXPECT_EQ(check({"RotaryEmbedding", {noise({1, 2, 3, 8}, 10), noise({1, 3, 4}, 11), noise({1, 3, 4}, 12)}, {}, {attr("interleaved", int64_t{1})}},
                    1e-5, &cpu),
              kReferenceKernel);
  }
  // Position ids are data: one past the caches is a user error on the run that has it.
  auto r = testing::run_op("RotaryEmbedding", {noise({1, 2, 4, 8}, 13), noise({3, 4}, 14), noise({3, 4}, 15), make<int64_t>({1, 4}, {0, 1, 3, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("position id 3 is out of range for a cache of 3 positions"), std::string::npos) << r.error().what;
}

TEST(CpuKernels, FlashAttentionAcrossBlocks) {
  // Sequences longer than a query block (64) and a key block (192), with tails: the online
  // softmax carries its running maximum and sum across key blocks, causal masks skip and cut
  // blocks, masks broadcast over heads and rows, grouped-query heads share packed K and V.
  for (const auto& [isa, cpu] : isa_paths()) {
    const std::string name = "kiln.attention_f32_" + isa;
    SCOPED_TRACE(name);
    for (int64_t s : {65, 300})
      for (int64_t t : {s, int64_t{400}}) {
        SCOPED_TRACE("s=" + std::to_string(s) + " t=" + std::to_string(t));
        // Scores of both signs and large spread, so that a later key block raises the maximum.
        Tensor q = noise({1, 4, s, 64}, 1, 6.f), k = noise({1, 2, t, 64}, 2, 6.f), v = noise({1, 2, t, 48}, 3);
        EXPECT_EQ(check({"Attention", {q, k, v}, {}, {}}, 1e-5, &cpu), name);
        EXPECT_EQ(check({"Attention", {q, k, v}, {}, {attr("is_causal", int64_t{1})}}, 1e-5, &cpu), name);
        Tensor mask = noise({4, 1, t}, 4, 8.f);  // per head, broadcast over rows and the batch
        EXPECT_EQ(check({"Attention", {q, k, v, mask}, {}, {}}, 1e-5, &cpu), name);
        Tensor keep(DType::boolean, {1, 1, s, t});  // per row, with whole rows masked out
        for (int64_t i = 0; i < keep.numel(); ++i) keep.data<bool>()[i] = (i / t) % 7 != 3 && (i * 13) % 11 != 0;
        EXPECT_EQ(check({"Attention", {q, k, v, keep}, {}, {attr("is_causal", int64_t{1})}}, 1e-5, &cpu), name);
      }
  }
  // On two threads: KV heads that do not share evenly (1, 3: packed once, the query blocks
  // shared) and that do (6: each thread packs a head at a time into its own buffer), one block
  // of keys and several, grouped-query heads.
  for (const auto& [isa, cpu] : isa_paths()) {
    const std::string name = "kiln.attention_f32_" + isa;
    for (int64_t kv : {1, 3, 6})
      for (int64_t t : {70, 600}) {
        SCOPED_TRACE(name + " two threads, kv heads " + std::to_string(kv) + " t=" + std::to_string(t));
        Tensor q = noise({1, 6, 70, 32}, 5, 6.f), k = noise({1, kv, t, 32}, 6, 6.f), v = noise({1, kv, t, 24}, 7);
        EXPECT_EQ(check({"Attention", {q, k, v}, {}, {}, {true}, "", {}, 2}, 1e-5, &cpu), name);
        EXPECT_EQ(check({"Attention", {q, k, v}, {}, {attr("is_causal", int64_t{1})}, {true}, "", {}, 2}, 1e-5, &cpu), name);
      }
  }
}

TEST(CpuKernels, FlashAttentionSoftcapAndSequenceLengths) {
  // Softcap (c·tanh(s·scale / c) before the mask) and each batch's count of keys
  // (nonpad_kv_seqlen), across key blocks of 256 (600 keys), with causal and a mask; a length of 0
  // leaves the batch nothing to attend to (NaN, as the reference), one past the keys is all of
  // them; a mask shorter than the keys (450 of 600: ONNX pads it with −∞) cuts them too. On each
  // ISA path and, where the CPU has AMX, with bf16 products. oneDNN's attention declines all three.
  const KernelRegistry without_flash = default_kernels().without({"kiln.attention_f32_avx512", "kiln.attention_f32_avx2"});
  const Tensor q = noise({2, 4, 70, 64}, 1, 6.f), k = noise({2, 2, 600, 64}, 2, 6.f), v = noise({2, 2, 600, 48}, 3);
  const Tensor mask = noise({4, 1, 600}, 4, 8.f), short_mask = noise({1, 70, 450}, 5, 8.f);
  const Attribute cap = attr("softcap", 5.0), causal = attr("is_causal", int64_t{1});
  struct Path {
    std::string name;
    CpuFeatures cpu;
    std::vector<Attribute> extra;  // the node's other attributes on this path
    double tol;
  };
  std::vector<Path> paths;
  for (const auto& [isa, cpu] : isa_paths()) paths.push_back({"kiln.attention_f32_" + isa, cpu, {}, 1e-5});
  if (CpuFeatures::host().amx)
    paths.push_back({"kiln.attention_bf16_amx", CpuFeatures::host(), {attr("product_type", std::string("bf16"))}, 3e-3});
  for (const Path& path : paths) {
    const std::string& name = path.name;
    const CpuFeatures& cpu = path.cpu;
    const double tol = path.tol;
    SCOPED_TRACE(name);
    auto with = [&path](std::vector<Attribute> a) {
      a.insert(a.end(), path.extra.begin(), path.extra.end());
      return a;
    };
    for (const std::vector<int64_t>& lengths : {std::vector<int64_t>{300, 601}, std::vector<int64_t>{0, 37}}) {
      const Tensor len = make<int64_t>({2}, lengths);
      EXPECT_EQ(check({"Attention", {q, k, v, Tensor(), Tensor(), Tensor(), len}, {}, with({})}, tol, &cpu), name);
      EXPECT_EQ(check({"Attention", {q, k, v, mask, Tensor(), Tensor(), len}, {}, with({cap, causal})}, tol, &cpu), name);
    }
    EXPECT_EQ(check({"Attention", {q, k, v}, {}, with({cap})}, tol, &cpu), name);
    EXPECT_EQ(check({"Attention", {q, k, v, mask}, {}, with({cap})}, tol, &cpu), name);
    EXPECT_EQ(check({"Attention", {q, k, v, short_mask}, {}, with({})}, tol, &cpu), name);
    EXPECT_EQ(check({"Attention", {q, k, v, short_mask, Tensor(), Tensor(), make<int64_t>({2}, {500, 200})}, {}, with({causal})}, tol, &cpu),
              name);
  }
  EXPECT_EQ(check({"Attention", {q, k, v}, {}, {cap}}, 1e-5, nullptr, &without_flash), kReferenceKernel);
  EXPECT_EQ(check({"Attention", {q, k, v, short_mask}, {}, {}}, 1e-5, nullptr, &without_flash), kReferenceKernel);
  EXPECT_EQ(check({"Attention", {q, k, v, Tensor(), Tensor(), Tensor(), make<int64_t>({2}, {3, 4})}, {}, {}}, 1e-5, nullptr, &without_flash),
            kReferenceKernel);
}

TEST(CpuKernels, FlashAttentionBf16ProductsOnAmx) {
  // product_type bf16 (`compile --precision bf16` on a CPU with AMX): Q, K, V and the softmax's
  // probabilities rounded to bf16, the two products on AMX tiles with f32 sums. Against the
  // reference, which rounds the same values: a head size off the tiles (80 steps padded to 96, 48
  // values: an odd count of 16-column tiles), 37 query rows (padded to 48: a pair of row tiles,
  // then one), 45 keys (padded to 64), grouped-query heads, causal, an additive mask per head, a
  // bool mask with whole rows out; 600 keys, in blocks of 256 where a later block raises the
  // maximum (the kernel rounds a probability against the running maximum, the reference against
  // the row's: 3e-3 there; elsewhere an e^x a few ulp off can round a probability, or a sum in
  // another order a score, to the neighbouring bf16: 2e-4); 3-D heads with RoPE, a KV cache and the
  // presents. A CPU without AMX runs such a node on the reference kernel: the f32 kernels, kiln's
  // and oneDNN's, decline bf16 products.
  const bool amx = CpuFeatures::host().amx;
  const std::string name = amx ? "kiln.attention_bf16_amx" : std::string(kReferenceKernel);
  const Attribute bf16 = attr("product_type", std::string("bf16"));
  const Tensor q = noise({2, 4, 37, 80}, 1, 4.f), k = noise({2, 2, 45, 80}, 2, 4.f), v = noise({2, 2, 45, 48}, 3);
  EXPECT_EQ(check({"Attention", {q, k, v}, {}, {bf16}}, 2e-4), name);
  EXPECT_EQ(check({"Attention", {q, k, v, noise({4, 1, 45}, 4, 8.f)}, {}, {bf16, attr("is_causal", int64_t{1})}}, 2e-4), name);
  Tensor keep(DType::boolean, {1, 1, 37, 45});
  for (int64_t i = 0; i < keep.numel(); ++i) keep.data<bool>()[i] = (i / 45) % 7 != 3 && (i * 13) % 11 != 0;
  EXPECT_EQ(check({"Attention", {q, k, v, keep}, {}, {bf16}}, 2e-4), name);
  const Tensor lq = noise({1, 2, 200, 64}, 5, 6.f), lk = noise({1, 1, 600, 64}, 6, 6.f), lv = noise({1, 1, 600, 64}, 7);
  EXPECT_EQ(check({"Attention", {lq, lk, lv}, {}, {bf16}}, 3e-3), name);
  EXPECT_EQ(check({"Attention", {lq, lk, lv}, {}, {bf16, attr("is_causal", int64_t{1})}}, 3e-3), name);
  std::vector<Tensor> in = {noise({1, 3, 4 * 64}, 8), noise({1, 3, 2 * 64}, 9), noise({1, 3, 2 * 48}, 10), Tensor(),
                            noise({1, 2, 300, 64}, 11), noise({1, 2, 300, 48}, 12), Tensor(), noise({1, 3, 32}, 13), noise({1, 3, 32}, 14)};
  EXPECT_EQ(check({"Attention", in, {}, {bf16, attr("q_num_heads", int64_t{4}), attr("kv_num_heads", int64_t{2}), attr("is_causal", int64_t{1})},
                   {true, true, true}},
                  2e-4),
            name);
  // Values of 8 (not whole tiles) and a CPU without AMX: the reference kernel.
  EXPECT_EQ(check({"Attention", {noise({1, 2, 5, 32}, 15), noise({1, 2, 5, 32}, 16), noise({1, 2, 5, 8}, 17)}, {}, {bf16}}), kReferenceKernel);
  const CpuFeatures no_amx = *CpuFeatures::named("avx512-fp16");
  EXPECT_EQ(check({"Attention", {q, k, v}, {}, {bf16}}, 1e-5, &no_amx), kReferenceKernel);
  // The reference does round: bf16 products differ from f32 ones, within bf16's precision.
  const testing::BothRuns f32 = testing::run_both({"Attention", {q, k, v}, {}, {}}), rounded = testing::run_both({"Attention", {q, k, v}, {}, {bf16}});
  ASSERT_FALSE(f32.ref.empty() || rounded.ref.empty());
  const double diff = testing::relative_l2(rounded.ref[0], f32.ref[0]);
  EXPECT_GT(diff, 1e-4);
  EXPECT_LT(diff, 1e-2);
}

}  // namespace
}  // namespace kiln
