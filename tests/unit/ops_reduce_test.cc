// Reduce family: reductions over leading, middle, trailing and all axes, empty sets, ArgMax
// ties, Softmax along a non-last axis, the normalizations with their optional outputs, CumSum,
// TopK ties, and user errors — each against hand-computed values on odd and even sizes.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::ints;
using testing::make;
using testing::ramp;
using testing::run_op;
using testing::stored_values;

TEST(ReduceKernels, SumOverMiddleAxisAndMeanOverOuterAndInner) {
  Tensor x = ramp({3, 4, 5});
  const float* p = x.data<float>();
  auto sum = run_op("ReduceSum", {x, ints({1})}, {{"keepdims", int64_t{0}}});
  ASSERT_TRUE(sum.ok()) << sum.error().message();
  ASSERT_EQ((*sum)[0].shape(), (std::vector<int64_t>{3, 5}));
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 5; ++k) {
      double want = 0;
      for (int j = 0; j < 4; ++j) want += p[(i * 4 + j) * 5 + k];
      EXPECT_NEAR((*sum)[0].data<float>()[i * 5 + k], want, 1e-5);
    }
  auto mean = run_op("ReduceMean", {x, ints({0, -1})});
  ASSERT_TRUE(mean.ok());
  ASSERT_EQ((*mean)[0].shape(), (std::vector<int64_t>{1, 4, 1}));
  for (int j = 0; j < 4; ++j) {
    double want = 0;
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 5; ++k) want += p[(i * 4 + j) * 5 + k];
    EXPECT_NEAR((*mean)[0].data<float>()[j], want / 15, 1e-6);
  }
}

TEST(ReduceKernels, AllAxesNoopAndEmptySets) {
  Tensor x = make<float>({2, 3}, {1, -2, 3, 4, 5, -6});
  auto all = run_op("ReduceMax", {x}, {{"keepdims", int64_t{0}}});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)[0].rank(), 0);
  EXPECT_EQ((*all)[0].data<float>()[0], 5.f);
  auto noop = run_op("ReduceSum", {x, ints({})}, {{"noop_with_empty_axes", int64_t{1}}});
  ASSERT_TRUE(noop.ok());
  EXPECT_EQ(stored_values<float>((*noop)[0]), stored_values<float>(x));
  auto l1 = run_op("ReduceL1", {x, ints({1})});
  ASSERT_TRUE(l1.ok());
  EXPECT_EQ(stored_values<float>((*l1)[0]), (std::vector<float>{6, 15}));
  Tensor empty(DType::f32, {2, 0});
  auto s = run_op("ReduceSum", {empty, ints({1})}, {{"keepdims", int64_t{0}}});
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(stored_values<float>((*s)[0]), (std::vector<float>{0, 0}));
  auto lse = run_op("ReduceLogSumExp", {empty, ints({1})});
  ASSERT_TRUE(lse.ok());
  EXPECT_EQ((*lse)[0].data<float>()[0], -INFINITY);
  auto big = run_op("ReduceLogSumExp", {make<float>({2}, {1000.f, 1000.f})});
  ASSERT_TRUE(big.ok());
  EXPECT_NEAR((*big)[0].data<float>()[0], 1000.f + std::log(2.f), 1e-3);
  auto prod = run_op("ReduceProd", {make<int32_t>({3}, {65536, 65536, 3})});
  ASSERT_TRUE(prod.ok());
  EXPECT_EQ((*prod)[0].data<int32_t>()[0], 0);  // wraps like int32
}

TEST(ReduceKernels, ArgMaxTiesAndArgMinAxis) {
  Tensor x = make<float>({2, 3}, {1, 3, 3, 2, 0, 2});
  auto first = run_op("ArgMax", {x}, {{"axis", int64_t{1}}, {"keepdims", int64_t{0}}});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(stored_values<int64_t>((*first)[0]), (std::vector<int64_t>{1, 0}));
  auto last = run_op("ArgMax", {x}, {{"axis", int64_t{1}}, {"select_last_index", int64_t{1}}});
  ASSERT_TRUE(last.ok());
  EXPECT_EQ((*last)[0].shape(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(stored_values<int64_t>((*last)[0]), (std::vector<int64_t>{2, 2}));
  auto amin = run_op("ArgMin", {x}, {{"axis", int64_t{0}}});
  ASSERT_TRUE(amin.ok());
  EXPECT_EQ(stored_values<int64_t>((*amin)[0]), (std::vector<int64_t>{0, 1, 1}));
}

TEST(ReduceKernels, SoftmaxAlongAMiddleAxisAndLogSoftmax) {
  Tensor x = ramp({2, 3, 5}, 2.f);
  auto sm = run_op("Softmax", {x}, {{"axis", int64_t{1}}});
  ASSERT_TRUE(sm.ok());
  auto lsm = run_op("LogSoftmax", {x}, {{"axis", int64_t{-1}}});
  ASSERT_TRUE(lsm.ok());
  const float* p = x.data<float>();
  for (int o = 0; o < 2; ++o)
    for (int k = 0; k < 5; ++k) {
      double z = 0;
      for (int i = 0; i < 3; ++i) z += std::exp(p[(o * 3 + i) * 5 + k]);
      for (int i = 0; i < 3; ++i)
        EXPECT_NEAR((*sm)[0].data<float>()[(o * 3 + i) * 5 + k], std::exp(p[(o * 3 + i) * 5 + k]) / z, 1e-6);
    }
  for (int r = 0; r < 6; ++r) {
    double z = 0;
    for (int k = 0; k < 5; ++k) z += std::exp(p[r * 5 + k]);
    for (int k = 0; k < 5; ++k) EXPECT_NEAR((*lsm)[0].data<float>()[r * 5 + k], p[r * 5 + k] - std::log(z), 1e-5);
  }
  auto hm = run_op("Hardmax", {make<float>({2, 3}, {1, 4, 4, 0, -1, -2})});
  ASSERT_TRUE(hm.ok());
  EXPECT_EQ(stored_values<float>((*hm)[0]), (std::vector<float>{0, 1, 0, 1, 0, 0}));
}

TEST(ReduceKernels, LayerNormWithStatisticsOutputs) {
  Tensor x = ramp({3, 7});
  Tensor scale = ramp({7}, 0.5f), bias = ramp({7}, -0.25f);
  auto out = run_op("LayerNormalization", {x, scale, bias}, {{"epsilon", 1e-3}}, 3);
  ASSERT_TRUE(out.ok()) << out.error().message();
  ASSERT_EQ((*out)[1].shape(), (std::vector<int64_t>{3, 1}));
  ASSERT_EQ((*out)[1].dtype(), DType::f32);
  for (int r = 0; r < 3; ++r) {
    const float* row = x.data<float>() + r * 7;
    double mean = 0, var = 0;
    for (int i = 0; i < 7; ++i) mean += row[i];
    mean /= 7;
    for (int i = 0; i < 7; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= 7;
    double inv = 1 / std::sqrt(var + 1e-3);
    EXPECT_NEAR((*out)[1].data<float>()[r], mean, 1e-6);
    EXPECT_NEAR((*out)[2].data<float>()[r], inv, 1e-4);
    for (int i = 0; i < 7; ++i)
      EXPECT_NEAR((*out)[0].data<float>()[r * 7 + i],
                  (row[i] - mean) * inv * scale.data<float>()[i] + bias.data<float>()[i], 1e-5);
  }
}

TEST(ReduceKernels, BatchAndGroupNormalization) {
  Tensor x = ramp({2, 4, 3});
  Tensor scale = make<float>({4}, {1, 2, 0.5f, -1}), b = make<float>({4}, {0, 1, -1, 0.5f});
  Tensor mean = make<float>({4}, {0.1f, -0.2f, 0.3f, 0}), var = make<float>({4}, {1, 4, 0.25f, 2});
  auto bn = run_op("BatchNormalization", {x, scale, b, mean, var}, {{"epsilon", 0.0}});
  ASSERT_TRUE(bn.ok()) << bn.error().message();
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 4; ++c)
      for (int s = 0; s < 3; ++s) {
        int i = (n * 4 + c) * 3 + s;
        float want = (x.data<float>()[i] - mean.data<float>()[c]) / std::sqrt(var.data<float>()[c]) *
                         scale.data<float>()[c] + b.data<float>()[c];
        EXPECT_NEAR((*bn)[0].data<float>()[i], want, 1e-5);
      }
  auto gn = run_op("GroupNormalization", {x, scale, b}, {{"num_groups", int64_t{2}}, {"epsilon", 0.0}});
  ASSERT_TRUE(gn.ok()) << gn.error().message();
  for (int n = 0; n < 2; ++n)
    for (int g = 0; g < 2; ++g) {
      const float* blk = x.data<float>() + (n * 4 + g * 2) * 3;
      double m = 0, v = 0;
      for (int i = 0; i < 6; ++i) m += blk[i];
      m /= 6;
      for (int i = 0; i < 6; ++i) v += (blk[i] - m) * (blk[i] - m);
      v /= 6;
      for (int i = 0; i < 6; ++i) {
        int c = g * 2 + i / 3;
        double want = (blk[i] - m) / std::sqrt(v) * scale.data<float>()[c] + b.data<float>()[c];
        EXPECT_NEAR((*gn)[0].data<float>()[(n * 4 + g * 2) * 3 + i], want, 1e-5);
      }
    }
  auto bad = run_op("GroupNormalization", {x, scale, b}, {{"num_groups", int64_t{3}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().what, "4 channels do not divide into 3 groups");
}

TEST(ReduceKernels, CumSumExclusiveReverse) {
  Tensor x = make<int32_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  auto plain = run_op("CumSum", {x, make<int64_t>({}, {1})});
  ASSERT_TRUE(plain.ok()) << plain.error().message();
  EXPECT_EQ(stored_values<int32_t>((*plain)[0]), (std::vector<int32_t>{1, 3, 6, 4, 9, 15}));
  auto er = run_op("CumSum", {x, make<int32_t>({1}, {-1})}, {{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}});
  ASSERT_TRUE(er.ok());
  EXPECT_EQ(stored_values<int32_t>((*er)[0]), (std::vector<int32_t>{5, 3, 0, 11, 6, 0}));
  auto col = run_op("CumSum", {x, make<int64_t>({}, {0})});
  ASSERT_TRUE(col.ok());
  EXPECT_EQ(stored_values<int32_t>((*col)[0]), (std::vector<int32_t>{1, 2, 3, 5, 7, 9}));
}

TEST(ReduceKernels, TopKTiesTakeTheSmallerIndex) {
  Tensor x = make<float>({2, 5}, {3, 1, 3, 2, 3, 0, 5, -1, 5, 4});
  auto out = run_op("TopK", {x, make<int64_t>({1}, {3})}, {}, 2);
  ASSERT_TRUE(out.ok()) << out.error().message();
  EXPECT_EQ(stored_values<float>((*out)[0]), (std::vector<float>{3, 3, 3, 5, 5, 4}));
  EXPECT_EQ(stored_values<int64_t>((*out)[1]), (std::vector<int64_t>{0, 2, 4, 1, 3, 4}));
  auto small = run_op("TopK", {x, make<int64_t>({1}, {2})}, {{"largest", int64_t{0}}, {"axis", int64_t{0}}}, 2);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(stored_values<int64_t>((*small)[1]), (std::vector<int64_t>{1, 0, 1, 0, 0, 0, 1, 0, 1, 1}));
  auto bad = run_op("TopK", {x, make<int64_t>({1}, {6})}, {}, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::user);
  EXPECT_EQ(bad.error().what, "K 6 is larger than the axis size 5");
}

TEST(ReduceKernels, InvalidAxesAreUserErrors) {
  auto dup = run_op("ReduceSum", {ramp({2, 3}), ints({1, -1})});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().what, "axis -1 is given twice");
  auto range = run_op("ReduceMean", {ramp({2, 3}), ints({2})});
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.error().kind, ErrorKind::user);
  EXPECT_EQ(range.error().what, "axis 2 is out of range for rank 2");
  auto sm = run_op("Softmax", {ramp({2, 3})}, {{"axis", int64_t{-3}}});
  ASSERT_FALSE(sm.ok());
  EXPECT_EQ(sm.error().what, "axis -3 is out of range for rank 2");
  auto arg = run_op("ArgMax", {Tensor(DType::f32, {2, 0})}, {{"axis", int64_t{1}}});
  ASSERT_FALSE(arg.ok());
  EXPECT_EQ(arg.error().what, "cannot take ArgMax over an empty axis");
}

}  // namespace
}  // namespace kiln
