// Quantization specs and observers against PT2E's documented rules (pt2-anchors.md §1.2–1.3):
// the qparams formulas, eps 2^-12, round half to even, the moving average, per-channel
// reduction, and the histogram observer's upsampled merge and L2 range search.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>

#include "quant/observer.h"
#include "tests/unit/op_test_util.h"

namespace kiln::quant {
namespace {

QuantSpec u8_affine() { return QuantSpec{}; }  // x86 activations: u8 0..255, per-tensor affine

QuantSpec i8_symmetric(int64_t qmin, ObserverKind observer = ObserverKind::min_max) {
  QuantSpec s;
  s.dtype = DType::i8;
  s.qmin = qmin;
  s.qmax = 127;
  s.qscheme = observer == ObserverKind::per_channel_min_max || observer == ObserverKind::moving_average_per_channel_min_max
                  ? QScheme::per_channel_symmetric
                  : QScheme::per_tensor_symmetric;
  s.observer = observer;
  return s;
}

Tensor values(std::vector<int64_t> shape, std::vector<float> v) { return testing::make<float>(std::move(shape), v); }

TEST(QParams, AffineWidensToZeroAndRoundsHalfToEven) {
  QParams q = calculate_qparams({-1.0f}, {3.0f}, u8_affine());
  ASSERT_EQ(q.scale.size(), 1u);
  EXPECT_FLOAT_EQ(q.scale[0], 4.0f / 255);
  EXPECT_EQ(q.zero_point[0], 64);  // 0 − round(−63.75)
  EXPECT_EQ(q.axis, -1);
  // A range above zero still holds zero.
  q = calculate_qparams({2.0f}, {4.0f}, u8_affine());
  EXPECT_FLOAT_EQ(q.scale[0], 4.0f / 255);
  EXPECT_EQ(q.zero_point[0], 0);
  // scale exactly 1, min / scale = −2.5: torch.round gives −2 (half to even), so zp 2, not 3.
  q = calculate_qparams({-2.5f}, {252.5f}, u8_affine());
  EXPECT_FLOAT_EQ(q.scale[0], 1.0f);
  EXPECT_EQ(q.zero_point[0], 2);
  // An all-zero range: the scale is eps, 2^-12 in every built-in PT2E config.
  q = calculate_qparams({0.0f}, {0.0f}, u8_affine());
  EXPECT_FLOAT_EQ(q.scale[0], 1.0f / 4096);
  EXPECT_EQ(q.zero_point[0], 0);
  // Never observed: scale 1, zero point 0.
  const float inf = std::numeric_limits<float>::infinity();
  q = calculate_qparams({inf}, {-inf}, u8_affine());
  EXPECT_FLOAT_EQ(q.scale[0], 1.0f);
  EXPECT_EQ(q.zero_point[0], 0);
}

TEST(QParams, Symmetric) {
  // XNNPACK's weights: −127..127, scale = max|x| / 127.
  QParams q = calculate_qparams({-2.0f}, {1.0f}, i8_symmetric(-127));
  EXPECT_FLOAT_EQ(q.scale[0], 2.0f / 127);
  EXPECT_EQ(q.zero_point[0], 0);
  // x86's weights: −128..127, scale = max|x| / 127.5.
  q = calculate_qparams({-2.0f}, {1.0f}, i8_symmetric(-128));
  EXPECT_FLOAT_EQ(q.scale[0], 2.0f / 127.5f);
  // u8 symmetric with its range given (as PT2E specs always give it): zp = (0 + 255) // 2.
  QuantSpec s = u8_affine();
  s.qscheme = QScheme::per_tensor_symmetric;
  q = calculate_qparams({-1.0f}, {1.0f}, s);
  EXPECT_EQ(q.zero_point[0], 127);
}

TEST(Observers, MinMaxAndMovingAverage) {
  auto plain = make_observer(u8_affine());
  ASSERT_TRUE(plain->observe(values({2}, {-1, 1})).ok());
  ASSERT_TRUE(plain->observe(values({3}, {-3, 5, NAN})).ok());
  EXPECT_EQ(plain->min_vals(), std::vector<float>{-3});
  EXPECT_EQ(plain->max_vals(), std::vector<float>{5});
  EXPECT_FLOAT_EQ(plain->qparams().scale[0], 8.0f / 255);

  QuantSpec s = u8_affine();
  s.observer = ObserverKind::moving_average_min_max;
  auto moving = make_observer(s);
  ASSERT_TRUE(moving->observe(values({2}, {-1, 1})).ok());  // the first batch sets the range
  ASSERT_TRUE(moving->observe(values({2}, {-3, 5})).ok());  // then x ← x + 0.01 (new − x)
  EXPECT_FLOAT_EQ(moving->min_vals()[0], -1.02f);
  EXPECT_FLOAT_EQ(moving->max_vals()[0], 1.04f);
  EXPECT_FALSE(moving->observe(testing::make<int64_t>({1}, {3})).ok());  // floats only
}

TEST(Observers, PerChannelReducesAllButTheAxis) {
  auto obs = make_observer(i8_symmetric(-128, ObserverKind::per_channel_min_max));
  // [2, 3, 2]: channel c of axis 0 holds values c·10 ± something.
  ASSERT_TRUE(obs->observe(values({2, 3, 2}, {1, -2, 3, 0.5f, -4, 2, 10, 11, 12, 9, 8, -1})).ok());
  EXPECT_EQ(obs->min_vals(), (std::vector<float>{-4, -1}));
  EXPECT_EQ(obs->max_vals(), (std::vector<float>{3, 12}));
  QParams q = obs->qparams();
  EXPECT_EQ(q.axis, 0);
  ASSERT_EQ(q.scale.size(), 2u);
  EXPECT_FLOAT_EQ(q.scale[0], 4.0f / 127.5f);
  EXPECT_FLOAT_EQ(q.scale[1], 12.0f / 127.5f);
  EXPECT_FALSE(obs->observe(values({3, 1}, {1, 2, 3})).ok());  // 3 channels after 2

  QuantSpec axis1 = i8_symmetric(-128, ObserverKind::moving_average_per_channel_min_max);
  axis1.ch_axis = 1;
  obs = make_observer(axis1);
  ASSERT_TRUE(obs->observe(values({2, 2}, {1, -1, 3, -5})).ok());
  EXPECT_EQ(obs->min_vals(), (std::vector<float>{1, -5}));
  ASSERT_TRUE(obs->observe(values({1, 2}, {101, -1})).ok());
  EXPECT_FLOAT_EQ(obs->min_vals()[0], 1 + 0.01f * (101 - 1));
  EXPECT_FLOAT_EQ(obs->max_vals()[0], 3 + 0.01f * (101 - 3));
  EXPECT_FALSE(obs->observe(values({4}, {1, 2, 3, 4})).ok());  // no axis 1
}

QuantSpec histogram_spec() {
  QuantSpec s = u8_affine();
  s.observer = ObserverKind::histogram;
  return s;
}

std::vector<float> uniform(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(HistogramObserver, KeepsAUniformRangeAndClipsAnOutlier) {
  HistogramObserver h(histogram_spec());
  std::vector<float> v = uniform(100000, 0, 1, 1);
  ASSERT_TRUE(h.observe(values({static_cast<int64_t>(v.size())}, v)).ok());
  auto [lo, hi] = h.search_range();
  EXPECT_NEAR(lo, 0.0f, 0.01f);
  EXPECT_NEAR(hi, 1.0f, 0.01f);

  HistogramObserver outlier(histogram_spec());
  v = uniform(100000, -1, 1, 2);
  v.push_back(100.0f);
  ASSERT_TRUE(outlier.observe(values({static_cast<int64_t>(v.size())}, v)).ok());
  EXPECT_EQ(outlier.observed_max(), 100.0f);
  std::tie(lo, hi) = outlier.search_range();
  EXPECT_LT(hi, 5.0f);  // the one value at 100 is not worth 99% of the levels
  EXPECT_GE(hi, 1.0f - 0.1f);
  EXPECT_LE(lo, -1.0f + 0.1f);
  EXPECT_NEAR(outlier.qparams().scale[0], (hi - std::min(lo, 0.0f)) / 255, 1e-6);
}

TEST(HistogramObserver, MergesBatchesKeepingTheCount) {
  HistogramObserver h(histogram_spec());
  std::vector<float> a = uniform(4096, 0, 1, 3), b = uniform(4096, 0, 2, 4);
  ASSERT_TRUE(h.observe(values({4096}, a)).ok());
  ASSERT_TRUE(h.observe(values({4096}, b)).ok());
  EXPECT_FLOAT_EQ(h.observed_min(), std::min(*std::min_element(a.begin(), a.end()), *std::min_element(b.begin(), b.end())));
  EXPECT_FLOAT_EQ(h.observed_max(), *std::max_element(b.begin(), b.end()));
  const auto& hist = h.histogram();
  EXPECT_NEAR(std::accumulate(hist.begin(), hist.end(), 0.0), 8192.0, 1e-2);
  // The first batch's values all fall in the lower half of the new range: the upper half holds
  // only the second batch's, about half of its 4096.
  const double upper = std::accumulate(hist.begin() + HistogramObserver::kBins / 2 + 8, hist.end(), 0.0);
  EXPECT_NEAR(upper, 2048.0, 150.0);
  // Same range again: counts add bin by bin.
  HistogramObserver same(histogram_spec());
  ASSERT_TRUE(same.observe(values({2}, {0, 1})).ok());
  ASSERT_TRUE(same.observe(values({3}, {0, 0.5f, 1})).ok());
  EXPECT_EQ(same.histogram().front(), 2.0f);
  EXPECT_EQ(same.histogram().back(), 2.0f);
  EXPECT_EQ(same.histogram()[HistogramObserver::kBins / 2], 1.0f);
}

TEST(HistogramObserver, ConstantFirstBatchInfinitiesAndNaNs) {
  HistogramObserver h(histogram_spec());
  ASSERT_TRUE(h.observe(values({3}, {2, 2, 2})).ok());  // min == max: histc widens to [1, 3]
  EXPECT_NEAR(std::accumulate(h.histogram().begin(), h.histogram().end(), 0.0), 3.0, 1e-6);
  const float inf = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(h.observe(values({4}, {0, 4, inf, NAN})).ok());  // the infinity and the NaN are left out
  EXPECT_EQ(h.observed_min(), 0.0f);
  EXPECT_EQ(h.observed_max(), 4.0f);
  const auto& hist = h.histogram();
  EXPECT_NEAR(std::accumulate(hist.begin(), hist.end(), 0.0), 5.0, 1e-4);
  EXPECT_NEAR(hist[HistogramObserver::kBins / 2], 3.0, 1e-4);  // the three 2s, in 2's bin of [0, 4]
  HistogramObserver empty(histogram_spec());
  EXPECT_FLOAT_EQ(empty.qparams().scale[0], 1.0f);
  EXPECT_TRUE(empty.min_vals().empty());
}

// The histogram as torch.histc's rule gives it one value at a time (the observer bins blocks of
// values as vectors and counts in integers): a batch whose length leaves a partial block, with
// NaNs, infinities, the range's own ends and values of every sign; and the smallest and largest
// as std::minmax_element finds them, -0 or 0 alike.
TEST(HistogramObserver, BinsAsOneValueAtATime) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = uniform(10007, -3, 5, 7);
  for (size_t i = 0; i < v.size(); i += 97) v[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? inf : -inf;
  v[5] = -3.5f, v[6] = 5.25f, v[7] = -0.0f, v[8] = 0.0f;
  HistogramObserver h(histogram_spec());
  ASSERT_TRUE(h.observe(values({static_cast<int64_t>(v.size())}, v)).ok());
  EXPECT_EQ(h.observed_min(), -3.5f);
  EXPECT_EQ(h.observed_max(), 5.25f);
  std::vector<float> want(HistogramObserver::kBins, 0.0f);
  for (float x : v) {
    if (!(x >= -3.5f && x <= 5.25f)) continue;
    const auto b = static_cast<int64_t>((x - -3.5f) * static_cast<float>(HistogramObserver::kBins) / (5.25f - -3.5f));
    want[static_cast<size_t>(std::clamp<int64_t>(b, 0, HistogramObserver::kBins - 1))] += 1;
  }
  EXPECT_EQ(h.histogram(), want);
  for (const auto& [zeros, min_negative, max_negative] :
       {std::tuple{std::vector<float>{-0.0f, 0.0f, 0.0f, -0.0f}, true, true}, {std::vector<float>{0.0f, -0.0f, -0.0f, 0.0f}, false, false}}) {
    std::vector<float> z(40, 0.0f);  // past a block of 16, and a tail
    std::copy(zeros.begin(), zeros.end(), z.begin() + 2);
    std::copy(zeros.begin(), zeros.end(), z.end() - 4);
    z[0] = z[1] = NAN;  // left out
    for (size_t i = 6; i + 4 < z.size(); ++i) z[i] = zeros[i % 2 + 1];
    HistogramObserver zh(histogram_spec());
    ASSERT_TRUE(zh.observe(values({static_cast<int64_t>(z.size())}, z)).ok());
    EXPECT_EQ(std::signbit(zh.observed_min()), min_negative);
    EXPECT_EQ(std::signbit(zh.observed_max()), max_negative);
  }
}

TEST(QuantSpec, ValidateFollowsPT2E) {
  EXPECT_TRUE(validate(u8_affine(), "x").ok());
  EXPECT_TRUE(validate(i8_symmetric(-127, ObserverKind::per_channel_min_max), "w").ok());
  EXPECT_TRUE(validate(histogram_spec(), "x").ok());
  auto fails = [](QuantSpec s, const std::string& what) {
    Status st = validate(s, "edge 'x'");
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_NE(st.error().message().find(what), std::string::npos) << st.error().message();
    EXPECT_NE(st.error().message().find("edge 'x'"), std::string::npos);
  };
  QuantSpec s = u8_affine();
  s.dtype = DType::f32;
  fails(s, "is not one of u8, i8, i32");
  s = u8_affine();
  s.qmin = 10, s.qmax = 5;
  fails(s, "qmin 10 is above qmax 5");
  s = i8_symmetric(-129);
  fails(s, "does not fit i8");
  s = u8_affine();
  s.qscheme = QScheme::per_channel_affine;
  fails(s, "a per-channel scheme needs a per-channel observer");
  s = u8_affine();
  s.observer = ObserverKind::per_channel_min_max;
  fails(s, "a per-channel observer needs a per-channel scheme");
  s = u8_affine();
  s.ch_axis = -1;
  fails(s, "ch_axis -1");
  s = histogram_spec();
  s.is_dynamic = true;
  fails(s, "cannot be dynamic");
  s = u8_affine();
  s.observer = ObserverKind::placeholder;
  fails(s, "placeholder observer is for dynamic specs");
  s = u8_affine();
  s.is_dynamic = true;
  fails(s, "its observer is the placeholder");
  s.observer = ObserverKind::placeholder;
  EXPECT_TRUE(validate(s, "x").ok());
  EXPECT_EQ(make_observer(s), nullptr);
}

}  // namespace
}  // namespace kiln::quant
