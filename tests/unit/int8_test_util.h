// What the int8 kernel tests share (int8_kernels_test.cc, int8_conv_kernels_test.cc): int8
// tensors over their whole range, QFusedConv cases, and the one-step comparison against the
// reference kernels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/gemm/lowp.h"
#include "tests/unit/kernel_test_util.h"

namespace kiln {

// Skips a test of int8 products (oneDNN's convolutions, kiln's GEMM) where the CPU lacks VNNI:
// lower_int8 makes neither QFusedConv nor QFusedMatMul for such a CPU.
#define SKIP_WITHOUT_VNNI() \
  if (auto why = cpu::gemm::lowp_lacks(CpuFeatures::host(), cpu::gemm::Lowp::u8s8)) GTEST_SKIP() << *why

using testing::attr;
using testing::Case;
using testing::noise;

// Values spread over the whole of the type's range.
inline Tensor int8_noise(std::vector<int64_t> shape, uint32_t seed, DType t) {
  const Tensor f = noise(std::move(shape), seed);
  Tensor q(t, f.shape());
  for (int64_t i = 0; i < f.numel(); ++i) {
    const float v = f.data<float>()[i];  // in [-0.5, 0.5)
    if (t == DType::u8) q.data<uint8_t>()[i] = static_cast<uint8_t>(std::lround((v + 0.5f) * 255.f));
    else q.data<int8_t>()[i] = static_cast<int8_t>(std::lround(v * 254.f));
  }
  return q;
}

inline Tensor scalar_f32(float v) {
  Tensor t(DType::f32, {});
  t.data<float>()[0] = v;
  return t;
}

inline Tensor scalar_int(DType t, int v) {
  Tensor s(t, {});
  if (t == DType::u8) s.data<uint8_t>()[0] = static_cast<uint8_t>(v);
  else s.data<int8_t>()[0] = static_cast<int8_t>(v);
  return s;
}

// Largest element-wise distance between two int8 tensors of the same type and shape.
inline int max_step(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return static_cast<int>(worst);
}

struct QConv {
  int64_t n = 1, c = 8, h = 7, w = 7, m = 8, k = 3, stride = 1, group = 1;
  DType act = DType::u8;
  bool per_channel = true, bias = true, residual = false, last = true;
  std::string activation, post;
};

// A QFusedConv case: x and z over their whole range, y's scale sized to the output's spread.
inline Case qconv_case(const QConv& s) {
  const int64_t p = s.k / 2, oh = (s.h + 2 * p - s.k) / s.stride + 1, ow = (s.w + 2 * p - s.k) / s.stride + 1;
  const bool u8 = s.act == DType::u8;
  Tensor x = int8_noise(s.last ? std::vector<int64_t>{s.n, s.h, s.w, s.c} : std::vector<int64_t>{s.n, s.c, s.h, s.w}, 1, s.act);
  Tensor w = int8_noise({s.m, s.c / s.group, s.k, s.k}, 2, DType::i8);
  Tensor ws(DType::f32, s.per_channel ? std::vector<int64_t>{s.m} : std::vector<int64_t>{});
  for (int64_t i = 0; i < ws.numel(); ++i) ws.data<float>()[i] = 0.002f + 0.0005f * static_cast<float>(i % 7);
  Tensor wz(DType::i8, ws.shape());
  for (int64_t i = 0; i < wz.numel(); ++i) wz.data<int8_t>()[i] = 0;
  const float sx = 1.f / 64, fan_in = static_cast<float>(s.c / s.group * s.k * s.k);
  const float sy = 0.003f * std::sqrt(fan_in) * 4 / 64;
  std::vector<Tensor> in = {x, scalar_f32(sx), scalar_int(s.act, u8 ? 131 : -3), w, ws, wz, scalar_f32(sy),
                            scalar_int(s.act, u8 ? 17 : 5), s.bias ? noise({s.m}, 3, 0.5f) : Tensor()};
  std::vector<bool> constant = {false, true, true, true, true, true, true, true, true};
  if (s.residual) {
    in.push_back(int8_noise(s.last ? std::vector<int64_t>{s.n, oh, ow, s.m} : std::vector<int64_t>{s.n, s.m, oh, ow}, 4, s.act));
    in.push_back(scalar_f32(sy * 1.5f));
    in.push_back(scalar_int(s.act, u8 ? 120 : -10));
    constant.insert(constant.end(), {false, true, true});
  }
  std::vector<Attribute> a = {attr("pads", std::vector<int64_t>{p, p, p, p}), attr("strides", std::vector<int64_t>{s.stride, s.stride}),
                              attr("group", s.group)};
  if (s.last) a.push_back(attr("channels_last", int64_t{1}));
  if (!s.activation.empty()) a.push_back(attr("activation", s.activation));
  if (s.activation == "Clip") a.push_back(attr("activation_params", std::vector<double>{-0.5, 1.0}));
  if (s.activation == "LeakyRelu") a.push_back(attr("activation_params", std::vector<double>{0.1}));
  if (!s.post.empty()) a.push_back(attr("post_activation", s.post));
  return Case{"QFusedConv", in, constant, a};
}

inline void expect_within_one_step(const Case& c, const std::string& kernel, const CpuFeatures* cpu = nullptr) {
  testing::BothRuns r = testing::run_both(c, cpu);
  EXPECT_EQ(r.kernel, kernel);
  ASSERT_EQ(r.fast.size(), 1u);
  ASSERT_EQ(r.ref.size(), 1u);
  EXPECT_LE(max_step(r.fast[0], r.ref[0]), 1) << r.graph_text;
  // Not trivially equal: the outputs spread over many quantization steps.
  const std::vector<double> v = r.ref[0].to_double_vector();
  EXPECT_GT(*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end()), 20) << r.graph_text;
}

}  // namespace kiln
