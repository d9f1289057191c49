// The `kiln run --check-against` rule: tolerances at their edges, NaN and infinities, exact
// integers and bools, dtype and shape mismatches, and the numbers in the result.
#include "runtime/compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kiln {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

CompareResult cmp_f64(double a, double b, CompareOptions o = {}) {
  return compare_tensors(Tensor::from<double>({1}, {a}), Tensor::from<double>({1}, {b}), o);
}

TEST(Compare, EqualTensorsPass) {
  Tensor a = Tensor::from<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  CompareResult r = compare_tensors(a, a.clone());
  EXPECT_TRUE(r.pass);
  EXPECT_EQ(r.kind, CompareResult::Kind::ok);
  EXPECT_EQ(r.mismatches, 0);
  EXPECT_EQ(r.numel, 6);
  EXPECT_EQ(r.max_abs_error, 0);
  EXPECT_EQ(r.rel_l2_error, 0);
  EXPECT_EQ(r.summary, "all 6 elements match (atol 1e-05, rtol 0.001); max abs error 0, relative l2 error 0");
}

TEST(Compare, ToleranceEdges) {
  // |a - b| <= atol + rtol * |b|, with exactly representable numbers so the edge is exact.
  CompareOptions o{0.25, 0.5};
  EXPECT_TRUE(cmp_f64(4 + 2.25, 4, o).pass);     // 2.25 == 0.25 + 0.5 * 4
  EXPECT_FALSE(cmp_f64(4 + 2.375, 4, o).pass);
  EXPECT_TRUE(cmp_f64(4 - 2.25, 4, o).pass);
  // The tolerance scales with |expected|, not |actual|.
  EXPECT_TRUE(cmp_f64(-4 - 2.25, -4, o).pass);
  EXPECT_TRUE(cmp_f64(4, 8, {0, 0.5}).pass);   // |4 - 8| <= 0.5 * 8
  EXPECT_FALSE(cmp_f64(8, 4, {0, 0.5}).pass);  // |8 - 4| > 0.5 * 4 (0.5 * |actual| would allow it)
  // Pure atol (rtol 0) and pure rtol (atol 0).
  EXPECT_TRUE(cmp_f64(1.0 + 1.0 / 1024, 1.0, {1.0 / 1024, 0}).pass);
  EXPECT_FALSE(cmp_f64(1.0 + 1.0 / 512, 1.0, {1.0 / 1024, 0}).pass);
  EXPECT_TRUE(cmp_f64(1024 + 1, 1024, {0, 1.0 / 1024}).pass);
  EXPECT_FALSE(cmp_f64(1024 + 2, 1024, {0, 1.0 / 1024}).pass);
  // Zero tolerance: only exact equality passes.
  EXPECT_TRUE(cmp_f64(3, 3, {0, 0}).pass);
  EXPECT_FALSE(cmp_f64(3, std::nextafter(3.0, 4.0), {0, 0}).pass);
  // Defaults: atol 1e-5 near zero, rtol 1e-3 for large values.
  EXPECT_TRUE(cmp_f64(0.9e-5, 0).pass);
  EXPECT_FALSE(cmp_f64(1.1e-5, 0).pass);
  EXPECT_TRUE(cmp_f64(1000.9, 1000).pass);
  EXPECT_FALSE(cmp_f64(1001.1, 1000).pass);
}

TEST(Compare, NaNAndInfinities) {
  auto one = [](float a, float b) {
    return compare_tensors(Tensor::from<float>({1}, {a}), Tensor::from<float>({1}, {b})).pass;
  };
  EXPECT_TRUE(one(kNaN, kNaN));
  EXPECT_FALSE(one(kNaN, 1));
  EXPECT_FALSE(one(1, kNaN));
  EXPECT_TRUE(one(kInf, kInf));
  EXPECT_TRUE(one(-kInf, -kInf));
  EXPECT_FALSE(one(kInf, -kInf));
  EXPECT_FALSE(one(kInf, 3.0e38f));
  EXPECT_FALSE(one(3.0e38f, kInf));
  EXPECT_FALSE(one(kNaN, kInf));

  CompareResult r = compare_tensors(Tensor::from<float>({3}, {1, kNaN, kInf}),
                                    Tensor::from<float>({3}, {1, 2, kInf}));
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.mismatches, 1);
  EXPECT_EQ(r.worst_index, (std::vector<int64_t>{1}));
  EXPECT_TRUE(std::isinf(r.max_abs_error));
  EXPECT_TRUE(std::isinf(r.rel_l2_error));
  EXPECT_EQ(r.summary,
            "1 of 3 elements differ (atol 1e-05, rtol 0.001); worst at [1]: got nan, expected 2; "
            "max abs error inf, relative l2 error inf");
  // Matching non-finite values do not spoil the error measures of the finite ones.
  CompareResult ok = compare_tensors(Tensor::from<float>({3}, {1, kNaN, -kInf}),
                                     Tensor::from<float>({3}, {1, kNaN, -kInf}));
  EXPECT_TRUE(ok.pass);
  EXPECT_EQ(ok.max_abs_error, 0);
  EXPECT_EQ(ok.rel_l2_error, 0);
}

TEST(Compare, IntegersAndBoolsMustBeExact) {
  CompareResult r = compare_tensors(Tensor::from<int32_t>({4}, {1, 2, 3, 4}), Tensor::from<int32_t>({4}, {1, 2, 3, 5}));
  EXPECT_FALSE(r.pass);  // atol would allow a difference of 1 for floats with a large atol; ints ignore it
  EXPECT_EQ(r.mismatches, 1);
  EXPECT_EQ(r.summary,
            "1 of 4 elements differ (exact match required for i32); worst at [3]: got 4, expected 5; "
            "max abs error 1, relative l2 error 0.160128");
  CompareResult loose = compare_tensors(Tensor::from<int32_t>({1}, {1}), Tensor::from<int32_t>({1}, {2}), {10, 10});
  EXPECT_FALSE(loose.pass);

  CompareResult b = compare_tensors(Tensor::from<bool>({3}, {true, false, true}), Tensor::from<bool>({3}, {true, true, true}));
  EXPECT_FALSE(b.pass);
  EXPECT_EQ(b.worst_index, (std::vector<int64_t>{1}));
  EXPECT_NE(b.summary.find("got false, expected true"), std::string::npos) << b.summary;
  EXPECT_TRUE(compare_tensors(Tensor::from<bool>({2}, {true, false}), Tensor::from<bool>({2}, {true, false})).pass);

  // 64-bit extremes are compared exactly and printed exactly.
  const int64_t big = std::numeric_limits<int64_t>::max();
  CompareResult i64 = compare_tensors(Tensor::from<int64_t>({2}, {big, 0}), Tensor::from<int64_t>({2}, {big - 1, 0}));
  EXPECT_FALSE(i64.pass);
  EXPECT_NE(i64.summary.find("got 9223372036854775807, expected 9223372036854775806"), std::string::npos) << i64.summary;
  CompareResult u64 = compare_tensors(Tensor::from<uint64_t>({1}, {~uint64_t{0}}), Tensor::from<uint64_t>({1}, {0}));
  EXPECT_FALSE(u64.pass);
  EXPECT_NE(u64.summary.find("got 18446744073709551615, expected 0"), std::string::npos) << u64.summary;
  EXPECT_EQ(u64.max_abs_error, 18446744073709551615.0);
  EXPECT_TRUE(compare_tensors(Tensor::from<uint8_t>({2}, {0, 255}), Tensor::from<uint8_t>({2}, {0, 255})).pass);
}

TEST(Compare, DtypeAndShapeMismatch) {
  CompareResult d = compare_tensors(Tensor::from<float>({2}, {1, 2}), Tensor::from<double>({2}, {1, 2}));
  EXPECT_FALSE(d.pass);
  EXPECT_EQ(d.kind, CompareResult::Kind::dtype_mismatch);
  EXPECT_EQ(d.summary, "dtype mismatch: got f32, expected f64");
  CompareResult s = compare_tensors(Tensor(DType::f32, {2, 3}), Tensor(DType::f32, {3, 2}));
  EXPECT_FALSE(s.pass);
  EXPECT_EQ(s.kind, CompareResult::Kind::shape_mismatch);
  EXPECT_EQ(s.summary, "shape mismatch: got 2x3, expected 3x2");
  CompareResult r = compare_tensors(Tensor(DType::f32, {}), Tensor(DType::f32, {1}));
  EXPECT_EQ(r.summary, "shape mismatch: got scalar, expected 1");
  // .npy has no bf16, so kiln writes bf16 as f32: accepted as the expected side only.
  Tensor bf(DType::bf16, {2});
  bf.data<bfloat16>()[0] = bfloat16(1.5f);
  bf.data<bfloat16>()[1] = bfloat16(-2.0f);
  EXPECT_TRUE(compare_tensors(bf, Tensor::from<float>({2}, {1.5f, -2.0f})).pass);
  EXPECT_FALSE(compare_tensors(Tensor::from<float>({2}, {1.5f, -2.0f}), bf).pass);
}

TEST(Compare, WorstElementAndErrors) {
  // Element [1, 0] exceeds its tolerance the most, although [0, 1] has the larger abs error
  // (its expected value is large, so rtol allows more).
  Tensor a = Tensor::from<float>({2, 2}, {0, 1010, 0.5f, 0});
  Tensor b = Tensor::from<float>({2, 2}, {0, 1000, 0.25f, 0});
  CompareResult r = compare_tensors(a, b);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.mismatches, 2);
  EXPECT_EQ(r.worst_index, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(r.worst_actual, 0.5);
  EXPECT_EQ(r.worst_expected, 0.25);
  EXPECT_DOUBLE_EQ(r.max_abs_error, 10.0);
  EXPECT_NEAR(r.rel_l2_error, std::sqrt(100 + 0.0625) / std::sqrt(1000000 + 0.0625), 1e-12);
  EXPECT_EQ(r.summary,
            "2 of 4 elements differ (atol 1e-05, rtol 0.001); worst at [1, 0]: got 0.5, expected 0.25; "
            "max abs error 10, relative l2 error 0.0100031");
}

TEST(Compare, HalfTypesThroughFloat) {
  Tensor a(DType::f16, {3}), b(DType::f16, {3});
  for (int i = 0; i < 3; ++i) {
    a.data<half>()[i] = half(0.1f * static_cast<float>(i));
    b.data<half>()[i] = half(0.1f * static_cast<float>(i));
  }
  EXPECT_TRUE(compare_tensors(a, b).pass);
  a.data<half>()[2] = half(0.25f);
  CompareResult r = compare_tensors(a, b);
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.summary.find("got 0.25, expected 0.2"), std::string::npos) << r.summary;
  Tensor c(DType::bf16, {1}), d(DType::bf16, {1});
  c.data<bfloat16>()[0] = bfloat16(kNaN);
  d.data<bfloat16>()[0] = bfloat16(kNaN);
  EXPECT_TRUE(compare_tensors(c, d).pass);
}

TEST(Compare, EmptyAndScalar) {
  CompareResult e = compare_tensors(Tensor(DType::f32, {0, 4}), Tensor(DType::f32, {0, 4}));
  EXPECT_TRUE(e.pass);
  EXPECT_FALSE(e.has_worst);
  EXPECT_EQ(e.summary, "no elements to compare (shape 0x4)");
  CompareResult s = compare_tensors(Tensor::from<double>({}, {1.0}), Tensor::from<double>({}, {2.0}));
  EXPECT_FALSE(s.pass);
  EXPECT_TRUE(s.has_worst);
  EXPECT_EQ(index_str(s.worst_index), "[]");
  EXPECT_EQ(s.summary,
            "1 of 1 element differ (atol 1e-05, rtol 0.001); worst at []: got 1, expected 2; "
            "max abs error 1, relative l2 error 0.5");
}

}  // namespace
}  // namespace kiln
