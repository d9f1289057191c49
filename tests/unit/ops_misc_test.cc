// misc family: RNN / GRU (both linear_before_reset variants) / LSTM (peepholes, reverse,
// sequence_lens) against hand-written one-unit recurrences, NonMaxSuppression, windows, DFT
// (forward, one-sided, inverse round trip), Det (batched, singular, pivoting) and user errors.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::expect_all;
using testing::expect_user_error;
using testing::make;
using testing::run_op;
using testing::scalar;

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// One hidden unit, one input feature, 3 steps, batch 1: [seq, batch, input] = [3, 1, 1].
const std::vector<float> kXs{0.5f, -1.0f, 2.0f};

TEST(MiscOps, RnnMatchesTheRecurrence) {
  auto r = run_op("RNN", {make<float>({3, 1, 1}, kXs), make<float>({1, 1, 1}, {0.7f}), make<float>({1, 1, 1}, {-0.4f}),
                          make<float>({1, 2}, {0.1f, 0.2f})},
                  {{"hidden_size", int64_t{1}}}, 2);
  ASSERT_TRUE(r.ok()) << r.error().message();
  double h = 0;
  std::vector<double> ys;
  for (float x : kXs) ys.push_back(h = std::tanh(0.7 * x - 0.4 * h + 0.3));
  expect_all((*r)[0], ys, 1e-5);
  expect_all((*r)[1], {h}, 1e-5);
}

TEST(MiscOps, GruBothResetVariants) {
  // Gates z, r, h: W = {wz, wr, wh}, R = {rz, rr, rh}, B = {Wb..., Rb...}.
  const double w[3] = {0.3, -0.6, 0.9}, rr[3] = {0.5, 0.4, -0.7}, wb[3] = {0.1, -0.1, 0.2}, rb[3] = {0.05, 0.3, -0.25};
  for (int64_t lbr : {0, 1}) {
    auto r = run_op("GRU", {make<float>({3, 1, 1}, kXs), make<float>({1, 3, 1}, {0.3f, -0.6f, 0.9f}), make<float>({1, 3, 1}, {0.5f, 0.4f, -0.7f}),
                            make<float>({1, 6}, {0.1f, -0.1f, 0.2f, 0.05f, 0.3f, -0.25f}), Tensor(), make<float>({1, 1, 1}, {0.2f})},
                    {{"hidden_size", int64_t{1}}, {"linear_before_reset", lbr}}, 2);
    ASSERT_TRUE(r.ok()) << r.error().message();
    double h = 0.2;
    std::vector<double> ys;
    for (float x : kXs) {
      double z = sigmoid(w[0] * x + rr[0] * h + wb[0] + rb[0]);
      double rg = sigmoid(w[1] * x + rr[1] * h + wb[1] + rb[1]);
      double hh = lbr ? std::tanh(w[2] * x + rg * (rr[2] * h + rb[2]) + wb[2]) : std::tanh(w[2] * x + rr[2] * (rg * h) + rb[2] + wb[2]);
      ys.push_back(h = (1 - z) * hh + z * h);
    }
    expect_all((*r)[0], ys, 1e-5);
  }
}

TEST(MiscOps, LstmReverseWithPeepholesAndSequenceLens) {
  // Batch 2: batch 0 uses all 3 steps, batch 1 only the first 2 (outputs past it stay 0).
  std::vector<float> x{0.5f, 1.0f, -1.0f, 0.25f, 2.0f, 9.0f};  // [seq=3, batch=2, 1]
  const double W[4] = {0.2, -0.3, 0.4, 0.6}, R[4] = {0.1, 0.5, -0.2, 0.3}, P[3] = {0.05, -0.1, 0.2};  // i o f c / i o f
  auto r = run_op("LSTM", {make<float>({3, 2, 1}, x), make<float>({1, 4, 1}, {0.2f, -0.3f, 0.4f, 0.6f}),
                           make<float>({1, 4, 1}, {0.1f, 0.5f, -0.2f, 0.3f}), Tensor(), make<int32_t>({2}, {3, 2}), Tensor(), Tensor(),
                           make<float>({1, 3}, {0.05f, -0.1f, 0.2f})},
                  {{"hidden_size", int64_t{1}}, {"direction", std::string("reverse")}}, 3);
  ASSERT_TRUE(r.ok()) << r.error().message();
  std::vector<double> y(6, 0.0), yh(2), yc(2);
  for (int b = 0; b < 2; ++b) {
    int len = b == 0 ? 3 : 2;
    double h = 0, c = 0;
    for (int t = len - 1; t >= 0; --t) {
      double xv = x[static_cast<size_t>(t * 2 + b)];
      double i = sigmoid(W[0] * xv + R[0] * h + P[0] * c);
      double f = sigmoid(W[2] * xv + R[2] * h + P[2] * c);
      double cc = std::tanh(W[3] * xv + R[3] * h);
      c = f * c + i * cc;
      double o = sigmoid(W[1] * xv + R[1] * h + P[1] * c);
      h = o * std::tanh(c);
      y[static_cast<size_t>(t * 2 + b)] = h;
    }
    yh[static_cast<size_t>(b)] = h;
    yc[static_cast<size_t>(b)] = c;
  }
  expect_all((*r)[0], y, 1e-5);
  expect_all((*r)[1], yh, 1e-5);
  expect_all((*r)[2], yc, 1e-5);
  expect_user_error(run_op("LSTM", {make<float>({3, 2, 1}, x), make<float>({1, 4, 1}, {1, 1, 1, 1}), make<float>({1, 4, 1}, {1, 1, 1, 1}),
                                    Tensor(), make<int32_t>({2}, {4, 1})},
                           {{"hidden_size", int64_t{1}}}, 1),
                    "sequence_lens[0] = 4 is out of range");
}

TEST(MiscOps, NonMaxSuppressionSelectsGreedily) {
  // Boxes 0 and 1 overlap (IoU 0.81), box 2 is apart; scores prefer 1, then 0, then 2.
  Tensor boxes = make<float>({1, 3, 4}, {0, 0, 1, 1, 0, 0.1f, 1, 1.0f, 5, 5, 6, 6});
  Tensor scores = make<float>({1, 1, 3}, {0.8f, 0.9f, 0.3f});
  auto r = run_op("NonMaxSuppression", {boxes, scores, scalar<int64_t>(3), scalar<float>(0.5f), scalar<float>(0.0f)});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)[0].shape(), (std::vector<int64_t>{2, 3}));
  expect_all((*r)[0], {0, 0, 1, 0, 0, 2});
  // No max_output_boxes_per_class: nothing is selected.
  auto none = run_op("NonMaxSuppression", {boxes, scores});
  ASSERT_TRUE(none.ok()) << none.error().message();
  EXPECT_EQ((*none)[0].shape(), (std::vector<int64_t>{0, 3}));
  expect_user_error(run_op("NonMaxSuppression", {make<float>({1, 3, 3}, std::vector<float>(9, 0)), scores}), "expected [batch, boxes, 4]");
}

TEST(MiscOps, Windows) {
  auto h = run_op("HannWindow", {scalar<int64_t>(4)});
  ASSERT_TRUE(h.ok()) << h.error().message();
  expect_all((*h)[0], {0, 0.5, 1, 0.5}, 1e-6);
  auto s = run_op("HannWindow", {scalar<int64_t>(3)}, {{"periodic", int64_t{0}}, {"output_datatype", std::string("f64")}});
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ((*s)[0].dtype(), DType::f64);
  expect_all((*s)[0], {0, 1, 0}, 1e-12);
  auto b = run_op("BlackmanWindow", {scalar<int64_t>(5)}, {{"periodic", int64_t{0}}});
  ASSERT_TRUE(b.ok());
  expect_all((*b)[0], {0, 0.34, 1, 0.34, 0}, 1e-6);
  auto m = run_op("HammingWindow", {scalar<int64_t>(1)});
  ASSERT_TRUE(m.ok());
  expect_all((*m)[0], {25.0 / 46 - 21.0 / 46}, 1e-6);
}

TEST(MiscOps, DftForwardOnesidedAndInverse) {
  Tensor x = make<float>({1, 4, 1}, {1, 2, 3, 4});
  auto f = run_op("DFT", {x});
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ((*f)[0].shape(), (std::vector<int64_t>{1, 4, 2}));
  expect_all((*f)[0], {10, 0, -2, 2, -2, 0, -2, -2}, 1e-5);
  auto o = run_op("DFT", {x, Tensor(), scalar<int64_t>(1)}, {{"onesided", int64_t{1}}});
  ASSERT_TRUE(o.ok()) << o.error().message();
  expect_all((*o)[0], {10, 0, -2, 2, -2, 0}, 1e-5);
  auto inv = run_op("DFT", {(*f)[0]}, {{"inverse", int64_t{1}}});
  ASSERT_TRUE(inv.ok()) << inv.error().message();
  expect_all((*inv)[0], {1, 0, 2, 0, 3, 0, 4, 0}, 1e-5);
  // irfft of the one-sided spectrum gives the real signal back (last dim 1).
  auto ir = run_op("DFT", {(*o)[0]}, {{"inverse", int64_t{1}}, {"onesided", int64_t{1}}});
  ASSERT_TRUE(ir.ok()) << ir.error().message();
  EXPECT_EQ((*ir)[0].shape(), (std::vector<int64_t>{1, 4, 1}));
  expect_all((*ir)[0], {1, 2, 3, 4}, 1e-5);
  // Zero-padded to dft_length 5 (odd).
  auto p = run_op("DFT", {x, scalar<int64_t>(5)});
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ((*p)[0].shape(), (std::vector<int64_t>{1, 5, 2}));
  EXPECT_NEAR((*p)[0].data<float>()[0], 10, 1e-5);
  expect_user_error(run_op("DFT", {x, Tensor(), scalar<int64_t>(2)}), "real/imaginary dim");
}

TEST(MiscOps, DetBatchedSingularAndPivoted) {
  Tensor x = make<double>({3, 3, 3}, {2, 0, 0, 0, 3, 0, 0, 0, 4,      // 24
                                      0, 1, 0, 1, 0, 0, 0, 0, 1,      // row swap: -1
                                      1, 2, 3, 4, 5, 6, 7, 8, 9});    // singular
  auto r = run_op("Det", {x});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)[0].shape(), (std::vector<int64_t>{3}));
  expect_all((*r)[0], {24, -1, 0}, 1e-9);
  auto e = run_op("Det", {make<float>({2, 3}, {1, 2, 3, 4, 5, 6})});
  expect_user_error(e, "matrices must be square");
}

}  // namespace
}  // namespace kiln
