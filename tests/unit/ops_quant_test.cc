// quant family: QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked, round half to
// even, saturation, rank 0, zero-size), DynamicQuantizeLinear, MatMulInteger, QLinearMatMul,
// ConvInteger and QLinearConv against hand-computed values and naive formulas, and user errors.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::expect_all;
using testing::expect_user_error;
using testing::make;
using testing::run_op;
using testing::scalar;

TEST(QuantOps, QuantizeRoundsHalfToEvenAndSaturates) {
  Tensor x = make<float>({7}, {-1.0f, 0.5f, 1.5f, 2.5f, 300.0f, -300.0f, 0.25f});
  auto r = run_op("QuantizeLinear", {x, scalar<float>(1.0f), scalar<uint8_t>(10)});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)[0].dtype(), DType::u8);
  expect_all((*r)[0], {9, 10, 12, 12, 255, 0, 10});
  // Without a zero point the output is u8 with zero point 0.
  auto u = run_op("QuantizeLinear", {make<float>({3}, {-4.0f, 3.0f, 1000.0f}), scalar<float>(2.0f)});
  ASSERT_TRUE(u.ok()) << u.error().message();
  EXPECT_EQ((*u)[0].dtype(), DType::u8);
  expect_all((*u)[0], {0, 2, 255});
}

TEST(QuantOps, QuantizePerAxisAndSixteenBit) {
  Tensor x = make<float>({2, 3}, {1, 1, 1, -3, 3, 5});
  auto r = run_op("QuantizeLinear", {x, make<float>({3}, {1.0f, 0.5f, 2.0f}), make<int8_t>({3}, {0, -1, 1})});
  ASSERT_TRUE(r.ok()) << r.error().message();
  expect_all((*r)[0], {1, 1, 1, -3, 5, 3});  // x / s = {1, 2, 0.5, -3, 6, 2.5}
  auto a0 = run_op("QuantizeLinear", {x, make<float>({2}, {1.0f, 0.25f}), make<int16_t>({2}, {0, 100})},
                   {{"axis", int64_t{0}}});
  ASSERT_TRUE(a0.ok()) << a0.error().message();
  EXPECT_EQ((*a0)[0].dtype(), DType::i16);
  expect_all((*a0)[0], {1, 1, 1, 88, 112, 120});
}

TEST(QuantOps, QuantizeBlockedAndZeroSize) {
  Tensor x = make<float>({2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  // Blocks of 2 along axis 1: 3 scales per row (the last block is short).
  Tensor s = make<float>({2, 3}, {1, 2, 4, 1, 2, 4});
  auto r = run_op("QuantizeLinear", {x, s}, {{"axis", int64_t{1}}, {"block_size", int64_t{2}}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  expect_all((*r)[0], {1, 2, 2, 2, 1, 6, 7, 4, 4, 2});
  auto z = run_op("QuantizeLinear", {Tensor(DType::f32, {0, 3}), make<float>({3}, {1, 1, 1}), make<uint8_t>({3}, {1, 2, 3})});
  ASSERT_TRUE(z.ok()) << z.error().message();
  EXPECT_EQ((*z)[0].shape(), (std::vector<int64_t>{0, 3}));
}

TEST(QuantOps, DequantizeVariants) {
  auto r = run_op("DequantizeLinear", {make<uint8_t>({3}, {0, 128, 255}), scalar<float>(0.5f), scalar<uint8_t>(128)});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)[0].dtype(), DType::f32);
  expect_all((*r)[0], {-64, 0, 63.5});
  // Rank-0 input with a per-tensor scale ignores axis; i32 data; output_dtype.
  auto s = run_op("DequantizeLinear", {scalar<int32_t>(-7), scalar<float>(0.25f)}, {{"output_dtype", std::string("f16")}});
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ((*s)[0].dtype(), DType::f16);
  EXPECT_EQ((*s)[0].rank(), 0);
  expect_all((*s)[0], {-1.75});
  auto p = run_op("DequantizeLinear", {make<int8_t>({2, 2}, {1, 2, 3, 4}), make<float>({2}, {1, 10}), make<int8_t>({2}, {1, 0})},
                  {{"axis", int64_t{0}}});
  ASSERT_TRUE(p.ok()) << p.error().message();
  expect_all((*p)[0], {0, 1, 30, 40});
}

TEST(QuantOps, BadParameterShapesAreUserErrors) {
  expect_user_error(run_op("QuantizeLinear", {make<float>({2, 3}, {1, 2, 3, 4, 5, 6}), make<float>({2}, {1, 1})}),
                    "axis 1 of the input has size 3");
  expect_user_error(run_op("DequantizeLinear", {make<uint8_t>({2}, {1, 2}), scalar<float>(1), scalar<int8_t>(0)}),
                    "differs from input type");
  expect_user_error(run_op("QuantizeLinear", {make<float>({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}), make<float>({2, 3}, {1, 1, 1, 1, 1, 1})},
                           {{"block_size", int64_t{2}}}),
                    "needs 2 in dim 1");
}

TEST(QuantOps, DynamicQuantizeLinear) {
  Tensor x = make<float>({5}, {-1.0f, 0.0f, 1.0f, 2.5f, 0.3f});
  auto r = run_op("DynamicQuantizeLinear", {x}, {}, 3);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const float scale = 3.5f / 255.0f;
  const float zp = std::nearbyint(1.0f / scale);
  EXPECT_FLOAT_EQ((*r)[1].data<float>()[0], scale);
  EXPECT_EQ((*r)[2].data<uint8_t>()[0], static_cast<uint8_t>(zp));
  std::vector<double> want;
  for (int64_t i = 0; i < 5; ++i)
    want.push_back(std::max(0.0f, std::min(255.0f, std::nearbyint(x.data<float>()[i] / scale) + zp)));
  expect_all((*r)[0], want);
  // All zeros: scale falls back to 1/255, zero point 0.
  auto z = run_op("DynamicQuantizeLinear", {make<float>({2}, {0, 0})}, {}, 3);
  ASSERT_TRUE(z.ok()) << z.error().message();
  expect_all((*z)[0], {0, 0});
  EXPECT_EQ((*z)[2].data<uint8_t>()[0], 0);
}

// Naive (a - azp) @ (b - bzp) with a per-row a_zp and per-column b_zp.
std::vector<double> naive_int_matmul(const Tensor& a, const Tensor& b, const std::vector<int>& azp, const std::vector<int>& bzp) {
  const int64_t M = a.dim(0), K = a.dim(1), N = b.dim(1);
  std::vector<double> y;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += (a.as_double(i * K + k) - azp[azp.size() == 1 ? 0 : static_cast<size_t>(i)]) *
             (b.as_double(k * N + j) - bzp[bzp.size() == 1 ? 0 : static_cast<size_t>(j)]);
      y.push_back(s);
    }
  return y;
}

TEST(QuantOps, MatMulIntegerPerRowAndColumnZeroPoints) {
  Tensor a = make<uint8_t>({3, 5}, {1, 200, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 255});
  Tensor b = make<int8_t>({5, 2}, {-1, 2, 3, -128, 5, 6, 127, 8, 9, -10});
  auto r = run_op("MatMulInteger", {a, b, make<uint8_t>({3}, {1, 2, 3}), make<int8_t>({2}, {-1, 4})});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)[0].dtype(), DType::i32);
  expect_all((*r)[0], naive_int_matmul(a, b, {1, 2, 3}, {-1, 4}));
  // Broadcast batch: [2, 3, 5] @ [5, 2], no zero points.
  Tensor a3 = make<uint8_t>({2, 3, 5}, std::vector<uint8_t>(30, 2));
  auto r3 = run_op("MatMulInteger", {a3, b});
  ASSERT_TRUE(r3.ok()) << r3.error().message();
  EXPECT_EQ((*r3)[0].shape(), (std::vector<int64_t>{2, 3, 2}));
  expect_all((*r3)[0], {286, -244, 286, -244, 286, -244, 286, -244, 286, -244, 286, -244});  // 2 * column sums
  expect_user_error(run_op("MatMulInteger", {a, b, make<uint8_t>({2}, {1, 2})}), "a_zero_point has 2 elements");
}

TEST(QuantOps, QLinearMatMulRequantizes) {
  Tensor a = make<uint8_t>({2, 3}, {10, 20, 30, 40, 50, 255});
  Tensor b = make<uint8_t>({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 200});
  const float as = 0.05f, bs = 0.1f, ys = 0.3f;
  auto r = run_op("QLinearMatMul", {a, scalar<float>(as), scalar<uint8_t>(12), b, scalar<float>(bs), scalar<uint8_t>(3),
                                    scalar<float>(ys), scalar<uint8_t>(100)});
  ASSERT_TRUE(r.ok()) << r.error().message();
  std::vector<double> acc = naive_int_matmul(a, b, {12}, {3}), want;
  const double mult = static_cast<float>(static_cast<float>(as * bs) / ys);
  for (double v : acc) want.push_back(std::max(0.0, std::min(255.0, std::nearbyint(v * mult) + 100)));
  expect_all((*r)[0], want);
}

// Naive 2-D integer convolution, pads symmetric, stride s, with per-channel w zero points.
std::vector<double> naive_int_conv(const Tensor& x, const Tensor& w, int xzp, const std::vector<int>& wzp, int64_t pad,
                                   int64_t stride, const std::vector<int>& bias) {
  const int64_t C = x.dim(1), H = x.dim(2), W = x.dim(3), M = w.dim(0), KH = w.dim(2), KW = w.dim(3);
  const int64_t OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
  std::vector<double> y;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double s = bias.empty() ? 0 : bias[static_cast<size_t>(m)];
        for (int64_t c = 0; c < C; ++c)
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              int64_t ih = oh * stride - pad + kh, iw = ow * stride - pad + kw;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              s += (x.as_double((c * H + ih) * W + iw) - xzp) *
                   (w.as_double(((m * C + c) * KH + kh) * KW + kw) - wzp[wzp.size() == 1 ? 0 : static_cast<size_t>(m)]);
            }
        y.push_back(s);
      }
  return y;
}

TEST(QuantOps, ConvIntegerWithPaddingAndStride) {
  std::vector<uint8_t> xv;
  for (int i = 0; i < 2 * 5 * 4; ++i) xv.push_back(static_cast<uint8_t>((i * 37) % 251));
  Tensor x = make<uint8_t>({1, 2, 5, 4}, xv);
  std::vector<uint8_t> wv;
  for (int i = 0; i < 3 * 2 * 3 * 3; ++i) wv.push_back(static_cast<uint8_t>((i * 11) % 7));
  Tensor w = make<uint8_t>({3, 2, 3, 3}, wv);
  auto r = run_op("ConvInteger", {x, w, scalar<uint8_t>(5), make<uint8_t>({3}, {1, 2, 3})},
                  {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"strides", std::vector<int64_t>{2, 2}}});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)[0].shape(), (std::vector<int64_t>{1, 3, 3, 2}));
  expect_all((*r)[0], naive_int_conv(x, w, 5, {1, 2, 3}, 1, 2, {}));
}

TEST(QuantOps, QLinearConvPerChannelWithBias) {
  Tensor x = make<int8_t>({1, 1, 3, 3}, {-5, 3, 7, 1, 0, -128, 127, 4, 2});
  Tensor w = make<int8_t>({2, 1, 2, 2}, {1, -2, 3, 4, -5, 6, 7, -8});
  std::vector<float> wscale{0.02f, 0.5f};
  auto r = run_op("QLinearConv", {x, scalar<float>(0.1f), scalar<int8_t>(1), w, make<float>({2}, wscale), make<int8_t>({2}, {0, 0}),
                                  scalar<float>(0.2f), scalar<int8_t>(-3), make<int32_t>({2}, {10, -20})});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)[0].dtype(), DType::i8);
  std::vector<double> acc = naive_int_conv(x, w, 1, {0}, 0, 1, {10, -20}), want;
  for (size_t i = 0; i < acc.size(); ++i) {
    double mult = static_cast<float>(static_cast<float>(0.1f * wscale[i / 4]) / 0.2f);
    want.push_back(std::max(-128.0, std::min(127.0, std::nearbyint(acc[i] * mult) - 3)));
  }
  expect_all((*r)[0], want);
  expect_user_error(run_op("QLinearConv", {x, scalar<float>(0.1f), scalar<int8_t>(1), w, make<float>({3}, {1, 1, 1}), scalar<int8_t>(0),
                                           scalar<float>(0.2f), scalar<int8_t>(-3)}),
                    "w_scale has 3 elements");
}

}  // namespace
}  // namespace kiln
