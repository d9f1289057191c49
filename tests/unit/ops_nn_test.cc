// nn family: Conv / ConvTranspose / MatMul / Gemm / pools / Resize / Einsum reference kernels
// against naive direct formulas on odd sizes (7x5 images, 3 channels, stride 2, pads 1,
// dilation 2, groups 3), broadcasting, zero-size operands, f16 through f32, and user errors.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::expect_all;
using testing::ints;
using testing::make;
using testing::run_op;
using testing::to_f16;

// Deterministic, non-zero, mixed-sign data; `salt` varies it between the operands of one test.
// Not testing::ramp (period 11, no salt): these tests' data and tolerances were chosen with it.
Tensor salted_ramp(std::vector<int64_t> shape, float scale = 0.25f, int salt = 0) {
  Tensor t(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * static_cast<float>((i * 7 + salt) % 13 - 6) + 0.05f;
  return t;
}

using I = std::vector<int64_t>;

// Direct 2-D convolution: y[n, m, oh, ow] = b[m] + sum x[n, g*icg + c, oh*s - p + kh*d, ...] * w[m, c, kh, kw].
std::vector<double> naive_conv2d(const Tensor& x, const Tensor& w, const Tensor* b, I s, I d, I p, int64_t group, int64_t OH, int64_t OW) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), M = w.dim(0), KH = w.dim(2), KW = w.dim(3);
  const int64_t icg = C / group, ocg = M / group;
  std::vector<double> y(static_cast<size_t>(N * M * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = b ? b->as_double(m) : 0;
          const int64_t gi = m / ocg;
          for (int64_t c = 0; c < icg; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ih = oh * s[0] - p[0] + kh * d[0], iw = ow * s[1] - p[1] + kw * d[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x.as_double(((n * C + gi * icg + c) * H + ih) * W + iw) * w.as_double(((m * icg + c) * KH + kh) * KW + kw);
              }
          y[static_cast<size_t>(((n * M + m) * OH + oh) * OW + ow)] = acc;
        }
  return y;
}

TEST(NnKernels, ConvGroupsStrideDilationAsymmetricPadsAndBias) {
  // 7x5 image, 3 channels in, 6 out, groups 3, kernel 3x2, stride 2, dilation 2, pads (1, 0, 1, 1).
  Tensor x = salted_ramp({2, 3, 7, 5});
  Tensor w = salted_ramp({6, 1, 3, 2}, 0.5f, 3);
  Tensor b = salted_ramp({6}, 1.0f, 5);
  auto r = run_op("Conv", {x, w, b},
                  {{"group", int64_t{3}}, {"strides", I{2, 2}}, {"dilations", I{2, 2}}, {"pads", I{1, 0, 1, 1}}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  // H: (7 + 2 - 5) / 2 + 1 = 3; W: (5 + 1 - 3) / 2 + 1 = 2.
  ASSERT_EQ((*r)[0].shape(), (I{2, 6, 3, 2}));
  expect_all((*r)[0], naive_conv2d(x, w, &b, {2, 2}, {2, 2}, {1, 0}, 3, 3, 2), 1e-4);
}

TEST(NnKernels, ConvDenseOddSizesAndOneByOne) {
  Tensor x = salted_ramp({1, 3, 7, 5});
  Tensor w = salted_ramp({4, 3, 3, 3}, 0.3f, 1);
  auto r = run_op("Conv", {x, w}, {{"pads", I{1, 1, 1, 1}}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)[0].shape(), (I{1, 4, 7, 5}));
  expect_all((*r)[0], naive_conv2d(x, w, nullptr, {1, 1}, {1, 1}, {1, 1}, 1, 7, 5), 1e-4);
  // A 1x1 conv reads the image directly as the GEMM operand.
  Tensor w1 = salted_ramp({5, 3, 1, 1}, 0.3f, 2);
  auto r1 = run_op("Conv", {x, w1});
  ASSERT_TRUE(r1.ok()) << r1.error().message();
  expect_all((*r1)[0], naive_conv2d(x, w1, nullptr, {1, 1}, {1, 1}, {0, 0}, 1, 7, 5), 1e-4);
}

TEST(NnKernels, ConvDepthwiseAndAutoPad) {
  Tensor x = salted_ramp({1, 4, 6, 5});
  Tensor w = salted_ramp({4, 1, 3, 3}, 0.4f, 4);
  // SAME_UPPER with stride 2: out = ceil(in / 2); total pad (3-1)*2+3-6 = 1 -> (0 before, 1 after) on H,
  // (3-1)*2+3-5 = 2 -> (1, 1) on W.
  auto r = run_op("Conv", {x, w}, {{"group", int64_t{4}}, {"strides", I{2, 2}}, {"auto_pad", std::string("SAME_UPPER")}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)[0].shape(), (I{1, 4, 3, 3}));
  expect_all((*r)[0], naive_conv2d(x, w, nullptr, {2, 2}, {1, 1}, {0, 1}, 4, 3, 3), 1e-4);
  // SAME_LOWER puts the odd pad first.
  auto l = run_op("Conv", {x, w}, {{"group", int64_t{4}}, {"strides", I{2, 2}}, {"auto_pad", std::string("SAME_LOWER")}});
  ASSERT_TRUE(l.ok()) << l.error().message();
  expect_all((*l)[0], naive_conv2d(x, w, nullptr, {2, 2}, {1, 1}, {1, 1}, 4, 3, 3), 1e-4);
}

TEST(NnKernels, Conv1dAnd3dMatchTheir2dEmbedding) {
  // A 1-D conv equals a 2-D conv over a height-1 image.
  Tensor x = salted_ramp({2, 3, 9});
  Tensor w = salted_ramp({2, 3, 3}, 0.3f, 1);
  auto r = run_op("Conv", {x, w}, {{"strides", I{2}}, {"pads", I{1, 2}}, {"dilations", I{2}}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  // (9 + 1 + 2 - 5) / 2 + 1 = 4.
  ASSERT_EQ((*r)[0].shape(), (I{2, 2, 4}));
  expect_all((*r)[0], naive_conv2d(x.reshaped({2, 3, 1, 9}), w.reshaped({2, 3, 1, 3}), nullptr, {1, 2}, {1, 2}, {0, 1}, 1, 1, 4), 1e-4);
  // A 3-D conv with depth kernel 1 equals the 2-D conv applied per depth slice (depth 1 here).
  Tensor x3 = salted_ramp({1, 3, 1, 7, 5});
  Tensor w3 = salted_ramp({2, 3, 1, 3, 3}, 0.3f, 2);
  auto r3 = run_op("Conv", {x3, w3}, {{"pads", I{0, 1, 1, 0, 1, 1}}});
  ASSERT_TRUE(r3.ok()) << r3.error().message();
  expect_all((*r3)[0], naive_conv2d(x3.reshaped({1, 3, 7, 5}), w3.reshaped({2, 3, 3, 3}), nullptr, {1, 1}, {1, 1}, {1, 1}, 1, 7, 5), 1e-4);
}

TEST(NnKernels, ConvF16ComputesThroughF32) {
  Tensor x = salted_ramp({1, 3, 5, 5});
  Tensor w = salted_ramp({2, 3, 3, 3}, 0.25f, 1);
  const Tensor xh = to_f16(x), wh = to_f16(w);
  auto r = run_op("Conv", {xh, wh});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)[0].dtype(), DType::f16);
  expect_all((*r)[0], naive_conv2d(xh, wh, nullptr, {1, 1}, {1, 1}, {0, 0}, 1, 3, 3), 2e-2);
}

TEST(NnKernels, ConvErrorsAreUserErrors) {
  auto r = run_op("Conv", {salted_ramp({1, 4, 5, 5}), salted_ramp({2, 3, 3, 3})});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_NE(r.error().what.find("channels"), std::string::npos) << r.error().what;
  auto big = run_op("Conv", {salted_ramp({1, 3, 2, 2}), salted_ramp({2, 3, 3, 3})});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().kind, ErrorKind::user);
}

TEST(NnKernels, ConvTransposeStridePadsOutputPaddingGroups) {
  // y[n, g*ocg + o, ih*s - p + kh*d] += x[n, g*icg + c, ih] * w[g*icg + c, o, kh] (2-D).
  Tensor x = salted_ramp({1, 4, 3, 4});
  Tensor w = salted_ramp({4, 3, 3, 2}, 0.5f, 2);  // C=4, ocg=3, group 2 -> 6 outputs
  Tensor b = salted_ramp({6}, 1.0f, 1);
  const I s{2, 3}, d{1, 2}, p{1, 0, 0, 1}, op{1, 0};
  auto r = run_op("ConvTranspose", {x, w, b},
                  {{"group", int64_t{2}}, {"strides", s}, {"dilations", d}, {"pads", p}, {"output_padding", op}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  // H: 2*(3-1) + 1 + 3 - 1 - 0 = 7; W: 3*(4-1) + 0 + 3 - 0 - 1 = 11.
  ASSERT_EQ((*r)[0].shape(), (I{1, 6, 7, 11}));
  const int64_t OH = 7, OW = 11;
  std::vector<double> want(6 * OH * OW);
  for (int64_t m = 0; m < 6; ++m)
    for (int64_t i = 0; i < OH * OW; ++i) want[static_cast<size_t>(m * OH * OW + i)] = b.as_double(m);
  for (int64_t gi = 0; gi < 2; ++gi)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t o = 0; o < 3; ++o)
        for (int64_t ih = 0; ih < 3; ++ih)
          for (int64_t iw = 0; iw < 4; ++iw)
            for (int64_t kh = 0; kh < 3; ++kh)
              for (int64_t kw = 0; kw < 2; ++kw) {
                const int64_t oh = ih * s[0] - p[0] + kh * d[0], ow = iw * s[1] - p[1] + kw * d[1];
                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                const int64_t ic = gi * 2 + c;
                want[static_cast<size_t>(((gi * 3 + o) * OH + oh) * OW + ow)] +=
                    x.as_double((ic * 3 + ih) * 4 + iw) * w.as_double(((ic * 3 + o) * 3 + kh) * 2 + kw);
              }
  expect_all((*r)[0], want, 1e-4);
}

std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, int64_t batches, int64_t M, int64_t K, int64_t N, bool a_bcast, bool b_bcast) {
  std::vector<double> y(static_cast<size_t>(batches * M * N));
  for (int64_t t = 0; t < batches; ++t)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += a.as_double((a_bcast ? 0 : t) * M * K + i * K + k) * b.as_double((b_bcast ? 0 : t) * K * N + k * N + j);
        y[static_cast<size_t>((t * M + i) * N + j)] = acc;
      }
  return y;
}

TEST(NnKernels, MatMulBatchedBroadcastAndVectors) {
  Tensor a = salted_ramp({3, 5, 7});
  Tensor b = salted_ramp({7, 9}, 0.5f, 1);
  auto r = run_op("MatMul", {a, b});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)[0].shape(), (I{3, 5, 9}));
  expect_all((*r)[0], naive_matmul(a, b, 3, 5, 7, 9, false, true), 1e-4);
  // A broadcast along the batch: [1, 5, 7] x [3, 7, 2] -> [3, 5, 2].
  Tensor a1 = salted_ramp({1, 5, 7});
  Tensor b3 = salted_ramp({3, 7, 2}, 0.5f, 2);
  auto r2 = run_op("MatMul", {a1, b3});
  ASSERT_TRUE(r2.ok()) << r2.error().message();
  ASSERT_EQ((*r2)[0].shape(), (I{3, 5, 2}));
  expect_all((*r2)[0], naive_matmul(a1, b3, 3, 5, 7, 2, true, false), 1e-4);
  // Both broadcast: [2, 1, 4, 3] x [5, 3, 2] -> [2, 5, 4, 2].
  Tensor a4 = salted_ramp({2, 1, 4, 3});
  Tensor b4 = salted_ramp({5, 3, 2}, 0.5f, 3);
  auto r4 = run_op("MatMul", {a4, b4});
  ASSERT_TRUE(r4.ok()) << r4.error().message();
  ASSERT_EQ((*r4)[0].shape(), (I{2, 5, 4, 2}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t m = 0; m < 4; ++m)
        for (int64_t n = 0; n < 2; ++n) {
          double acc = 0;
          for (int64_t k = 0; k < 3; ++k) acc += a4.as_double((i * 4 + m) * 3 + k) * b4.as_double((j * 3 + k) * 2 + n);
          EXPECT_NEAR((*r4)[0].as_double(((i * 5 + j) * 4 + m) * 2 + n), acc, 1e-4);
        }
  // 1-D operands: [7] x [3, 7, 9] -> [3, 9]; [3, 5, 7] x [7] -> [3, 5]; [7] x [7] -> scalar.
  Tensor v = salted_ramp({7}, 0.5f, 4);
  auto lv = run_op("MatMul", {v, salted_ramp({3, 7, 9})});
  ASSERT_TRUE(lv.ok()) << lv.error().message();
  EXPECT_EQ((*lv)[0].shape(), (I{3, 9}));
  auto rv = run_op("MatMul", {a, v});
  ASSERT_TRUE(rv.ok()) << rv.error().message();
  EXPECT_EQ((*rv)[0].shape(), (I{3, 5}));
  expect_all((*rv)[0], naive_matmul(a, v, 3, 5, 7, 1, false, true), 1e-4);
  auto dot = run_op("MatMul", {v, v});
  ASSERT_TRUE(dot.ok()) << dot.error().message();
  EXPECT_EQ((*dot)[0].rank(), 0);
  expect_all((*dot)[0], naive_matmul(v, v, 1, 1, 7, 1, false, false), 1e-5);
}

TEST(NnKernels, MatMulIntegersZeroSizeAndErrors) {
  auto r = run_op("MatMul", {make<int32_t>({2, 3}, {1, -2, 3, 4, 5, -6}), make<int32_t>({3, 1}, {7, 8, 9})});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((std::vector<int32_t>((*r)[0].data<int32_t>(), (*r)[0].data<int32_t>() + 2)), (std::vector<int32_t>{18, 14}));
  // K = 0 gives zeros; M = 0 gives an empty result.
  auto k0 = run_op("MatMul", {Tensor(DType::f32, {2, 0}), Tensor(DType::f32, {0, 3})});
  ASSERT_TRUE(k0.ok()) << k0.error().message();
  expect_all((*k0)[0], std::vector<double>(6, 0.0), 0);
  auto m0 = run_op("MatMul", {Tensor(DType::f32, {0, 4}), salted_ramp({4, 3})});
  ASSERT_TRUE(m0.ok()) << m0.error().message();
  EXPECT_EQ((*m0)[0].shape(), (I{0, 3}));
  auto bad = run_op("MatMul", {salted_ramp({2, 3}), salted_ramp({4, 2})});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::user);
}

TEST(NnKernels, GemmTransposesAlphaBetaAndBroadcastC) {
  Tensor a = salted_ramp({5, 3});  // transA: A^T is [3, 5]
  Tensor b = salted_ramp({4, 5}, 0.5f, 1);  // transB: B^T is [5, 4]
  Tensor c = salted_ramp({4}, 1.0f, 2);
  auto r = run_op("Gemm", {a, b, c}, {{"transA", int64_t{1}}, {"transB", int64_t{1}}, {"alpha", 0.5}, {"beta", 2.0}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)[0].shape(), (I{3, 4}));
  std::vector<double> want(12);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < 5; ++k) acc += a.as_double(k * 3 + i) * b.as_double(j * 5 + k);
      want[static_cast<size_t>(i * 4 + j)] = 0.5 * acc + 2.0 * c.as_double(j);
    }
  expect_all((*r)[0], want, 1e-4);
  // C as [M, 1] and no C at all.
  Tensor c2 = salted_ramp({3, 1}, 1.0f, 3);
  auto r2 = run_op("Gemm", {salted_ramp({3, 5}), salted_ramp({5, 4}, 0.5f, 1), c2});
  ASSERT_TRUE(r2.ok()) << r2.error().message();
  std::vector<double> mm = naive_matmul(salted_ramp({3, 5}), salted_ramp({5, 4}, 0.5f, 1), 1, 3, 5, 4, false, false);
  for (int64_t i = 0; i < 12; ++i) mm[static_cast<size_t>(i)] += c2.as_double(i / 4);
  expect_all((*r2)[0], mm, 1e-4);
  auto r3 = run_op("Gemm", {salted_ramp({3, 5}), salted_ramp({5, 4}, 0.5f, 1)});
  ASSERT_TRUE(r3.ok()) << r3.error().message();
  expect_all((*r3)[0], naive_matmul(salted_ramp({3, 5}), salted_ramp({5, 4}, 0.5f, 1), 1, 3, 5, 4, false, false), 1e-4);
  auto bad = run_op("Gemm", {salted_ramp({3, 5}), salted_ramp({5, 4}), salted_ramp({2, 4})});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::user);
}

TEST(NnKernels, MaxPoolIndicesCeilModeAndDilation) {
  Tensor x = salted_ramp({1, 2, 7, 5});
  // kernel 3x2, stride 2, dilation (1, 2), ceil_mode: H (7-3)/2+1 = 3 (ceil 3); W ceil((5-3)/2)+1 = 2.
  auto r = run_op("MaxPool", {x}, {{"kernel_shape", I{3, 2}}, {"strides", I{2, 2}}, {"dilations", I{1, 2}}, {"ceil_mode", int64_t{1}}}, 2);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)[0].shape(), (I{1, 2, 3, 2}));
  ASSERT_EQ((*r)[1].dtype(), DType::i64);
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t oh = 0; oh < 3; ++oh)
      for (int64_t ow = 0; ow < 2; ++ow) {
        double best = -1e30;
        int64_t at = -1;
        for (int64_t kh = 0; kh < 3; ++kh)
          for (int64_t kw = 0; kw < 2; ++kw) {
            int64_t ih = oh * 2 + kh, iw = ow * 2 + kw * 2;
            if (ih >= 7 || iw >= 5) continue;
            int64_t idx = (c * 7 + ih) * 5 + iw;
            if (x.as_double(idx) > best) best = x.as_double(idx), at = idx;
          }
        const int64_t o = (c * 3 + oh) * 2 + ow;
        EXPECT_FLOAT_EQ(static_cast<float>((*r)[0].as_double(o)), static_cast<float>(best));
        EXPECT_EQ((*r)[1].data<int64_t>()[o], at);
      }
}

TEST(NnKernels, AveragePoolCountIncludePadAndLpPool) {
  Tensor x = salted_ramp({1, 1, 5, 4});
  const I k{3, 3}, s{2, 2}, p{1, 1, 1, 1};
  auto exc = run_op("AveragePool", {x}, {{"kernel_shape", k}, {"strides", s}, {"pads", p}});
  auto inc = run_op("AveragePool", {x}, {{"kernel_shape", k}, {"strides", s}, {"pads", p}, {"count_include_pad", int64_t{1}}});
  auto lp = run_op("LpPool", {x}, {{"kernel_shape", k}, {"strides", s}, {"pads", p}, {"p", int64_t{3}}});
  ASSERT_TRUE(exc.ok() && inc.ok() && lp.ok());
  ASSERT_EQ((*exc)[0].shape(), (I{1, 1, 3, 2}));
  for (int64_t oh = 0; oh < 3; ++oh)
    for (int64_t ow = 0; ow < 2; ++ow) {
      double sum = 0, sum3 = 0;
      int n = 0;
      for (int64_t kh = 0; kh < 3; ++kh)
        for (int64_t kw = 0; kw < 3; ++kw) {
          int64_t ih = oh * 2 - 1 + kh, iw = ow * 2 - 1 + kw;
          if (ih < 0 || ih >= 5 || iw < 0 || iw >= 4) continue;
          sum += x.as_double(ih * 4 + iw);
          sum3 += std::pow(std::fabs(x.as_double(ih * 4 + iw)), 3);
          ++n;
        }
      EXPECT_NEAR((*exc)[0].as_double(oh * 2 + ow), sum / n, 1e-5);
      EXPECT_NEAR((*inc)[0].as_double(oh * 2 + ow), sum / 9, 1e-5);
      EXPECT_NEAR((*lp)[0].as_double(oh * 2 + ow), std::cbrt(sum3), 1e-5);
    }
}

TEST(NnKernels, GlobalPoolsAndLrn) {
  Tensor x = salted_ramp({2, 3, 5, 3});
  auto avg = run_op("GlobalAveragePool", {x});
  auto mx = run_op("GlobalMaxPool", {x});
  ASSERT_TRUE(avg.ok() && mx.ok());
  ASSERT_EQ((*avg)[0].shape(), (I{2, 3, 1, 1}));
  for (int64_t nc = 0; nc < 6; ++nc) {
    double s = 0, m = -1e30;
    for (int64_t i = 0; i < 15; ++i) s += x.as_double(nc * 15 + i), m = std::max(m, x.as_double(nc * 15 + i));
    EXPECT_NEAR((*avg)[0].as_double(nc), s / 15, 1e-5);
    EXPECT_NEAR((*mx)[0].as_double(nc), m, 0);
  }
  auto lrn = run_op("LRN", {x}, {{"size", int64_t{2}}, {"alpha", 0.1}, {"beta", 0.5}, {"bias", 2.0}});
  ASSERT_TRUE(lrn.ok()) << lrn.error().message();
  // size 2: channels c (and c+1) — floor((2-1)/2) = 0 before, 1 after.
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 15; ++i) {
        double sq = 0;
        for (int64_t j = c; j <= std::min<int64_t>(2, c + 1); ++j) sq += std::pow(x.as_double((n * 3 + j) * 15 + i), 2);
        const int64_t at = (n * 3 + c) * 15 + i;
        EXPECT_NEAR((*lrn)[0].as_double(at), x.as_double(at) / std::sqrt(2.0 + 0.1 / 2 * sq), 1e-5);
      }
}

TEST(NnKernels, MaxUnpoolScattersAndChecksIndices) {
  Tensor x = make<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  auto r = run_op("MaxUnpool", {x, make<int64_t>({1, 1, 2, 2}, {0, 3, 9, 14})}, {{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)[0].shape(), (I{1, 1, 4, 4}));
  std::vector<double> want(16, 0);
  want[0] = 1, want[3] = 2, want[9] = 3, want[14] = 4;
  expect_all((*r)[0], want, 0);
  auto bad = run_op("MaxUnpool", {x, make<int64_t>({1, 1, 2, 2}, {0, 3, 9, 16})}, {{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::user);
  EXPECT_NE(bad.error().what.find("index 16 is out of range for an unpooled tensor of 16 elements"), std::string::npos) << bad.error().what;
}

TEST(NnKernels, ResizeNearestLinearAndSizesWithAxes) {
  Tensor x = make<float>({1, 1, 2, 3}, {1, 2, 3, 4, 5, 6});
  // Nearest, asymmetric, floor: x2 in both dims repeats each element.
  auto n = run_op("Resize", {x, Tensor(), make<float>({4}, {1, 1, 2, 2})},
                  {{"coordinate_transformation_mode", std::string("asymmetric")}, {"nearest_mode", std::string("floor")}});
  ASSERT_TRUE(n.ok()) << n.error().message();
  ASSERT_EQ((*n)[0].shape(), (I{1, 1, 4, 6}));
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t w = 0; w < 6; ++w) EXPECT_EQ((*n)[0].as_double(h * 6 + w), x.as_double((h / 2) * 3 + w / 2));
  // Linear, align_corners, sizes [3, 5] on axes (2, 3): x_in = x_out * (in - 1) / (out - 1).
  auto l = run_op("Resize", {x, Tensor(), Tensor(), ints({3, 5})},
                  {{"mode", std::string("linear")}, {"coordinate_transformation_mode", std::string("align_corners")}, {"axes", I{2, 3}}});
  ASSERT_TRUE(l.ok()) << l.error().message();
  ASSERT_EQ((*l)[0].shape(), (I{1, 1, 3, 5}));
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t w = 0; w < 5; ++w) {
      const double fh = h * 0.5, fw = w * 0.5;  // (2-1)/(3-1), (3-1)/(5-1)
      // The input is affine (1 + 3h + w), so bilinear interpolation reproduces it exactly.
      EXPECT_NEAR((*l)[0].as_double(h * 5 + w), 1 + 3 * fh + fw, 1e-6);
    }
  auto bad = run_op("Resize", {x, Tensor(), make<float>({2}, {2, 2})});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::user);
}

TEST(NnKernels, EinsumGeneralEquations) {
  Tensor a = salted_ramp({3, 4});
  Tensor b = salted_ramp({4, 5}, 0.5f, 1);
  auto mm = run_op("Einsum", {a, b}, {{"equation", std::string("ij,jk->ik")}});
  ASSERT_TRUE(mm.ok()) << mm.error().message();
  expect_all((*mm)[0], naive_matmul(a, b, 1, 3, 4, 5, false, false), 1e-5);
  // Implicit output: sorted labels that appear once ("ik").
  auto imp = run_op("Einsum", {a, b}, {{"equation", std::string("ij,jk")}});
  ASSERT_TRUE(imp.ok()) << imp.error().message();
  expect_all((*imp)[0], naive_matmul(a, b, 1, 3, 4, 5, false, false), 1e-5);
  // Diagonal and trace.
  Tensor sq = salted_ramp({4, 4});
  auto diag = run_op("Einsum", {sq}, {{"equation", std::string("ii->i")}});
  auto trace = run_op("Einsum", {sq}, {{"equation", std::string("ii")}});
  ASSERT_TRUE(diag.ok() && trace.ok());
  double tr = 0;
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_NEAR((*diag)[0].as_double(i), sq.as_double(i * 5), 0);
    tr += sq.as_double(i * 5);
  }
  EXPECT_EQ((*trace)[0].rank(), 0);
  EXPECT_NEAR((*trace)[0].as_double(0), tr, 1e-5);
  // Ellipsis with broadcasting batch dims: [2, 1, 3, 4] x [5, 4, 2] -> [2, 5, 3, 2].
  Tensor e1 = salted_ramp({2, 1, 3, 4});
  Tensor e2 = salted_ramp({5, 4, 2}, 0.5f, 2);
  auto ell = run_op("Einsum", {e1, e2}, {{"equation", std::string("...ij,...jk->...ik")}});
  ASSERT_TRUE(ell.ok()) << ell.error().message();
  ASSERT_EQ((*ell)[0].shape(), (I{2, 5, 3, 2}));
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t q = 0; q < 5; ++q)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t k = 0; k < 2; ++k) {
          double acc = 0;
          for (int64_t j = 0; j < 4; ++j) acc += e1.as_double((p * 3 + i) * 4 + j) * e2.as_double((q * 4 + j) * 2 + k);
          EXPECT_NEAR((*ell)[0].as_double(((p * 5 + q) * 3 + i) * 2 + k), acc, 1e-5);
        }
  // Three operands, integer type.
  auto three = run_op("Einsum", {make<int64_t>({2}, {1, 2}), make<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6}), make<int64_t>({3}, {1, 0, -1})},
                      {{"equation", std::string("i,ij,j->")}});
  ASSERT_TRUE(three.ok()) << three.error().message();
  // sum_ij a_i B_ij c_j = 1*(1-3) + 2*(4-6) = -6.
  EXPECT_EQ((*three)[0].data<int64_t>()[0], -6);
  auto bad = run_op("Einsum", {a, b}, {{"equation", std::string("ij,jk,kl->il")}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::user);
}

}  // namespace
}  // namespace kiln
