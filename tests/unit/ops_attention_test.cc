// attention family: Attention, RotaryEmbedding, NegativeLogLikelihoodLoss and
// SoftmaxCrossEntropyLoss reference kernels against hand-computed values and a naive
// formulation written out here (grouped-query heads, KV cache, short and broadcast masks,
// causal, softcap, every qk_matmul_output_mode), 3-D vs 4-D layouts, f16, zero-size inputs
// and user errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::expect_all;
using testing::expect_user_error;
using testing::make;
using testing::run_op;

// Deterministic mixed-sign data; `salt` varies it between tensors.
Tensor data(std::vector<int64_t> shape, int salt, float scale = 0.3f) {
  Tensor t(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * static_cast<float>((i * 7 + salt * 5) % 13 - 6) + 0.05f;
  return t;
}

struct Naive {
  std::vector<double> y, qk;  // y [B, Hq, S, Dv]; qk [B, Hq, S, T] for the requested mode
};

// Straight from the ONNX formulation, 4-D inputs only; mask is [S, Tm] (Tm <= T) or absent.
Naive naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask, const Tensor* pk,
                      const Tensor* pv, double scale, bool causal, double softcap, int mode) {
  const int64_t B = q.dim(0), Hq = q.dim(1), S = q.dim(2), D = q.dim(3), Hkv = k.dim(1), L = k.dim(2), Dv = v.dim(3);
  const int64_t P = pk ? pk->dim(2) : 0, T = P + L;
  auto key = [&](int64_t b, int64_t h, int64_t j, int64_t e) {
    return j < P ? pk->as_double(((b * Hkv + h) * P + j) * D + e) : k.as_double(((b * Hkv + h) * L + j - P) * D + e);
  };
  auto val = [&](int64_t b, int64_t h, int64_t j, int64_t e) {
    return j < P ? pv->as_double(((b * Hkv + h) * P + j) * Dv + e) : v.as_double(((b * Hkv + h) * L + j - P) * Dv + e);
  };
  Naive r;
  r.y.assign(static_cast<size_t>(B * Hq * S * Dv), 0.0);
  r.qk.assign(static_cast<size_t>(B * Hq * S * T), 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> x(static_cast<size_t>(T));
        for (int64_t j = 0; j < T; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += q.as_double(((b * Hq + h) * S + i) * D + e) * key(b, h / (Hq / Hkv), j, e);
          double raw = dot * scale, capped = softcap > 0 ? softcap * std::tanh(raw / softcap) : raw;
          double bias = 0;
          if (mask) bias = j < mask->dim(1) ? mask->as_double(i * mask->dim(1) + j) : -inf;
          if (causal && j > i + P) bias = -inf;
          x[static_cast<size_t>(j)] = capped + bias;
          double out = mode == 0 ? raw : mode == 1 ? capped : capped + bias;
          r.qk[static_cast<size_t>(((b * Hq + h) * S + i) * T + j)] = out;
        }
        double mx = -inf, sum = 0;
        for (double e : x) mx = std::max(mx, e);
        for (double& e : x) sum += (e = std::exp(e - mx));
        for (int64_t j = 0; j < T; ++j) {
          double p = x[static_cast<size_t>(j)] / sum;
          if (mode == 3) r.qk[static_cast<size_t>(((b * Hq + h) * S + i) * T + j)] = p;
          for (int64_t e = 0; e < Dv; ++e) r.y[static_cast<size_t>(((b * Hq + h) * S + i) * Dv + e)] += p * val(b, h / (Hq / Hkv), j, e);
        }
      }
  return r;
}

TEST(AttentionOps, HandComputedSingleHead) {
  // scores [1, 0] with scale 1 -> softmax [e/(e+1), 1/(e+1)] over V [2, 4].
  Tensor q = make<float>({1, 1, 1, 2}, {1, 0}), k = make<float>({1, 1, 2, 2}, {1, 0, 0, 1}), v = make<float>({1, 1, 2, 1}, {2, 4});
  auto r = run_op("Attention", {q, k, v}, {attr("scale", 1.0)});
  ASSERT_TRUE(r.ok()) << r.error().what;
  const double p = std::exp(1.0) / (std::exp(1.0) + 1);
  expect_all((*r)[0], {2 * p + 4 * (1 - p)}, 1e-6);
  EXPECT_EQ((*r)[0].shape(), (std::vector<int64_t>{1, 1, 1, 1}));
}

TEST(AttentionOps, GroupedQueryPastShortMaskCausalMatchesNaive) {
  // 4 q heads over 2 kv heads, 2 cached + 2 new keys, a [3, 3] mask padded to 4 with -inf.
  Tensor q = data({2, 4, 3, 3}, 1), k = data({2, 2, 2, 3}, 2), v = data({2, 2, 2, 5}, 3);
  Tensor pk = data({2, 2, 2, 3}, 4), pv = data({2, 2, 2, 5}, 5), mask = data({3, 3}, 6, 0.5f);
  auto r = run_op("Attention", {q, k, v, mask, pk, pv}, {attr("is_causal", int64_t{1})}, 4);
  ASSERT_TRUE(r.ok()) << r.error().what;
  Naive n = naive_attention(q, k, v, &mask, &pk, &pv, 1 / std::sqrt(3.0), true, 0, 0);
  expect_all((*r)[0], n.y, 1e-5);
  expect_all((*r)[3], n.qk, 1e-5);
  EXPECT_EQ((*r)[1].shape(), (std::vector<int64_t>{2, 2, 4, 3}));
  EXPECT_EQ((*r)[2].shape(), (std::vector<int64_t>{2, 2, 4, 5}));
  // present = past ++ new along the sequence.
  EXPECT_EQ((*r)[1].as_double(0), pk.as_double(0));
  EXPECT_EQ((*r)[1].as_double(2 * 3), k.as_double(0));
  EXPECT_EQ((*r)[2].as_double(4 * 5 - 1), v.as_double(2 * 5 - 1));
}

TEST(AttentionOps, EveryQkOutputModeWithSoftcap) {
  Tensor q = data({1, 2, 3, 4}, 1, 0.9f), k = data({1, 2, 5, 4}, 2, 0.9f), v = data({1, 2, 5, 2}, 3);
  Tensor mask = data({3, 5}, 7);
  for (int mode = 0; mode < 4; ++mode) {
    auto r = run_op("Attention", {q, k, v, mask},
                    {attr("softcap", 1.5), attr("scale", 0.4), attr("qk_matmul_output_mode", int64_t{mode})}, 4);
    ASSERT_TRUE(r.ok()) << r.error().what;
    Naive n = naive_attention(q, k, v, &mask, nullptr, nullptr, 0.4, false, 1.5, mode);
    expect_all((*r)[0], n.y, 1e-5);
    expect_all((*r)[3], n.qk, 1e-5);
  }
}

TEST(AttentionOps, ThreeDLayoutMatchesFourD) {
  // [B, S, H * D] with q_num_heads 4, kv_num_heads 2, odd sequence lengths.
  const int64_t B = 2, S = 3, L = 5, Hq = 4, Hkv = 2, D = 2, Dv = 3;
  Tensor q3 = data({B, S, Hq * D}, 1), k3 = data({B, L, Hkv * D}, 2), v3 = data({B, L, Hkv * Dv}, 3);
  auto to4 = [](const Tensor& t, int64_t h) {
    const int64_t b = t.dim(0), s = t.dim(1), d = t.dim(2) / h;
    Tensor o(DType::f32, {b, h, s, d});
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t si = 0; si < s; ++si)
        for (int64_t hi = 0; hi < h; ++hi)
          for (int64_t di = 0; di < d; ++di)
            o.data<float>()[((bi * h + hi) * s + si) * d + di] = t.data<float>()[(bi * s + si) * h * d + hi * d + di];
    return o;
  };
  auto r3 = run_op("Attention", {q3, k3, v3}, {attr("q_num_heads", Hq), attr("kv_num_heads", Hkv), attr("is_causal", int64_t{1})});
  auto r4 = run_op("Attention", {to4(q3, Hq), to4(k3, Hkv), to4(v3, Hkv)}, {attr("is_causal", int64_t{1})});
  ASSERT_TRUE(r3.ok()) << r3.error().what;
  ASSERT_TRUE(r4.ok()) << r4.error().what;
  ASSERT_EQ((*r3)[0].shape(), (std::vector<int64_t>{B, S, Hq * Dv}));
  expect_all(to4((*r3)[0], Hq), (*r4)[0].to_double_vector(), 1e-6);
}

TEST(AttentionOps, BoolMaskBroadcastAndNonpadLengths) {
  // A bool mask [B, 1, 1, T] broadcast over heads and queries equals a float 0 / -inf mask, and
  // nonpad_kv_seqlen masks the same keys.
  Tensor q = data({2, 2, 3, 4}, 1), k = data({2, 2, 4, 4}, 2), v = data({2, 2, 4, 3}, 3);
  Tensor bmask(DType::boolean, {2, 1, 1, 4});
  const bool keep[8] = {true, true, true, false, true, true, false, false};
  for (int i = 0; i < 8; ++i) bmask.data<bool>()[i] = keep[i];
  auto rb = run_op("Attention", {q, k, v, bmask});
  auto rn = run_op("Attention", {q, k, v, Tensor(), Tensor(), Tensor(), make<int64_t>({2}, {3, 2})});
  ASSERT_TRUE(rb.ok()) << rb.error().what;
  ASSERT_TRUE(rn.ok()) << rn.error().what;
  expect_all((*rb)[0], (*rn)[0].to_double_vector(), 1e-6);
  // Batch 1 sees only keys 0 and 1: compare with running it on those keys alone.
  Tensor k1(DType::f32, {1, 2, 2, 4}), v1(DType::f32, {1, 2, 2, 3}), q1(DType::f32, {1, 2, 3, 4});
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 8; ++i) k1.data<float>()[h * 8 + i] = k.data<float>()[(2 + h) * 16 + i];
    for (int64_t i = 0; i < 6; ++i) v1.data<float>()[h * 6 + i] = v.data<float>()[(2 + h) * 12 + i];
  }
  for (int64_t i = 0; i < 24; ++i) q1.data<float>()[i] = q.data<float>()[24 + i];
  auto r1 = run_op("Attention", {q1, k1, v1}, {attr("scale", 0.5)});
  auto rs = run_op("Attention", {q, k, v, bmask}, {attr("scale", 0.5)});
  ASSERT_TRUE(r1.ok() && rs.ok());
  for (int64_t i = 0; i < 18; ++i) EXPECT_NEAR((*rs)[0].as_double(18 + i), (*r1)[0].as_double(i), 1e-6);
}

TEST(AttentionOps, FullyMaskedRowIsNaNAsInTheOnnxReference) {
  Tensor q = data({1, 1, 1, 2}, 1), k = data({1, 1, 2, 2}, 2), v = data({1, 1, 2, 2}, 3);
  const float inf = std::numeric_limits<float>::infinity();
  auto r = run_op("Attention", {q, k, v, make<float>({1, 2}, {-inf, -inf})});
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_TRUE(std::isnan((*r)[0].as_double(0)));
}

TEST(AttentionOps, HalfPrecisionAndZeroLengthQuery) {
  Tensor q = data({1, 2, 3, 4}, 1), k = data({1, 2, 3, 4}, 2), v = data({1, 2, 3, 4}, 3);
  auto to_half = [](const Tensor& t) {
    Tensor h(DType::f16, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) h.data<half>()[i] = half(t.data<float>()[i]);
    return h;
  };
  auto r32 = run_op("Attention", {q, k, v});
  auto r16 = run_op("Attention", {to_half(q), to_half(k), to_half(v)});
  ASSERT_TRUE(r32.ok() && r16.ok());
  EXPECT_EQ((*r16)[0].dtype(), DType::f16);
  expect_all((*r16)[0], (*r32)[0].to_double_vector(), 2e-3);
  auto r0 = run_op("Attention", {data({1, 2, 0, 4}, 1), k, v});
  ASSERT_TRUE(r0.ok()) << r0.error().what;
  EXPECT_EQ((*r0)[0].shape(), (std::vector<int64_t>{1, 2, 0, 4}));
}

TEST(AttentionOps, UserErrors) {
  Tensor q = data({1, 3, 2, 4}, 1), k = data({1, 2, 2, 4}, 2), v = data({1, 2, 2, 4}, 3);
  expect_user_error(run_op("Attention", {q, k, v}), "not a multiple of kv heads");
  Tensor q2 = data({1, 2, 2, 4}, 1);
  expect_user_error(run_op("Attention", {q2, k, v, data({2, 3}, 1)}), "longer than the total sequence length");
  expect_user_error(run_op("Attention", {q2, data({1, 2, 2, 3}, 2), v}), "head sizes differ");
  expect_user_error(run_op("Attention", {data({1, 2, 8}, 1), data({1, 2, 8}, 2), data({1, 2, 8}, 3)}), "q_num_heads");
  expect_user_error(run_op("Attention", {q2, k, v, Tensor(), data({1, 2, 1, 4}, 4)}), "given together");
  expect_user_error(run_op("Attention", {q2, k, v}, {attr("qk_matmul_output_mode", int64_t{4})}), "qk_matmul_output_mode");
}

// kiln's rotary_cos / rotary_sin inputs: the same as RotaryEmbedding on Q and on the new keys
// (cache rows per batch and token) before the Attention; the past keys are not rotated again
// and present_key holds the rotated new keys. 4-D with grouped-query heads and a KV cache, and
// 3-D (sequence-major).
TEST(AttentionRotary, AttentionRotatesQAndTheNewKeys) {
  const int64_t B = 2, S = 3, Hq = 4, Hkv = 2, D = 6;
  Tensor q = data({B, Hq, S, D}, 1), k = data({B, Hkv, S, D}, 2), v = data({B, Hkv, S, 5}, 3);
  Tensor pk = data({B, Hkv, 2, D}, 4), pv = data({B, Hkv, 2, 5}, 5);
  Tensor cs = data({B, S, D / 2}, 6, 0.15f), sn = data({B, S, D / 2}, 7, 0.15f);
  auto rq = run_op("RotaryEmbedding", {q, cs, sn});
  auto rk = run_op("RotaryEmbedding", {k, cs, sn});
  ASSERT_TRUE(rq.ok() && rk.ok());
  auto unfused = run_op("Attention", {(*rq)[0], (*rk)[0], v, Tensor(), pk, pv}, {attr("is_causal", int64_t{1})}, 2);
  auto fused = run_op("Attention", {q, k, v, Tensor(), pk, pv, Tensor(), cs, sn}, {attr("is_causal", int64_t{1})}, 2);
  ASSERT_TRUE(unfused.ok()) << unfused.error().what;
  ASSERT_TRUE(fused.ok()) << fused.error().what;
  expect_all((*fused)[0], (*unfused)[0].to_double_vector(), 1e-6);
  expect_all((*fused)[1], (*unfused)[1].to_double_vector(), 1e-6);
  EXPECT_EQ((*fused)[1].as_double(0), pk.as_double(0));  // past keys as they were

  // 3-D: [B, S, H·D] with the heads' attributes.
  Tensor q3 = data({B, S, Hq * D}, 1), k3 = data({B, S, Hkv * D}, 2), v3 = data({B, S, Hkv * 4}, 3);
  auto rq3 = run_op("RotaryEmbedding", {q3, cs, sn}, {attr("num_heads", Hq)});
  auto rk3 = run_op("RotaryEmbedding", {k3, cs, sn}, {attr("num_heads", Hkv)});
  ASSERT_TRUE(rq3.ok() && rk3.ok());
  const std::vector<Attribute> heads = {attr("q_num_heads", Hq), attr("kv_num_heads", Hkv)};
  auto unfused3 = run_op("Attention", {(*rq3)[0], (*rk3)[0], v3}, heads);
  auto fused3 = run_op("Attention", {q3, k3, v3, Tensor(), Tensor(), Tensor(), Tensor(), cs, sn}, heads);
  ASSERT_TRUE(unfused3.ok() && fused3.ok());
  expect_all((*fused3)[0], (*unfused3)[0].to_double_vector(), 1e-6);

  // Errors: one cache alone, a cache of the wrong shape, keys other than the queries', an odd head.
  expect_user_error(run_op("Attention", {q, k, v, Tensor(), Tensor(), Tensor(), Tensor(), cs}), "given together");
  expect_user_error(run_op("Attention", {q, k, v, Tensor(), Tensor(), Tensor(), Tensor(), data({B, S, D}, 6), sn}),
                    "rotary_cos's last dim is not head_size / 2");
  expect_user_error(run_op("Attention", {q, k, v, Tensor(), Tensor(), Tensor(), Tensor(), data({B, S + 1, D / 2}, 6), sn}),
                    "rotary_cos's sequence length differs from Q's");
  expect_user_error(run_op("Attention", {q, data({B, Hkv, S + 1, D}, 2), data({B, Hkv, S + 1, 5}, 3), Tensor(), Tensor(), Tensor(),
                                         Tensor(), cs, sn}),
                    "as many new keys as queries");
  expect_user_error(run_op("Attention", {data({B, Hq, S, 5}, 1), data({B, Hkv, S, 5}, 2), v, Tensor(), Tensor(), Tensor(), Tensor(),
                                         data({B, S, 2}, 6), data({B, S, 2}, 7)}),
                    "even head size");
  expect_user_error(run_op("Attention", {q, k, v, Tensor(), Tensor(), Tensor(), Tensor(), data({B, S}, 6), data({B, S}, 7)}),
                    "must be 3-D");
}

TEST(Attention, Bf16ProductsRoundOperandsAndProbabilities) {
  // product_type bf16: Q, K and V rounded to bf16, each probability e^(x − max) rounded to bf16
  // before it weighs V, the sum taken unrounded. One query, two keys, values that bf16 moves.
  const float q0 = 1.001f, q1 = 0.5f, k00 = 1.003f, k11 = 0.2f, v0 = 0.3333f, v1 = 0.7777f;
  auto r16 = [](double x) { return static_cast<double>(static_cast<float>(bfloat16(static_cast<float>(x)))); };
  const Tensor q = make<float>({1, 1, 1, 2}, {q0, q1}), k = make<float>({1, 1, 2, 2}, {k00, 0.f, 0.f, k11});
  const Tensor v = make<float>({1, 1, 2, 1}, {v0, v1});
  auto r = run_op("Attention", {q, k, v}, {attr("product_type", std::string("bf16"))});
  ASSERT_TRUE(r.ok()) << r.error().what;
  const double scale = 1 / std::sqrt(2.0);
  const double x0 = r16(q0) * r16(k00) * scale, x1 = r16(q1) * r16(k11) * scale;
  const double e0 = 1.0, e1 = std::exp(x1 - x0);  // x0 is the larger
  expect_all((*r)[0], {(r16(e0) * r16(v0) + r16(e1) * r16(v1)) / (e0 + e1)}, 1e-7);
  auto exact = run_op("Attention", {q, k, v});
  ASSERT_TRUE(exact.ok());
  EXPECT_GT(std::abs((*r)[0].as_double(0) - (*exact)[0].as_double(0)), 1e-5);  // bf16 moved it
  expect_user_error(run_op("Attention", {q, k, v}, {attr("product_type", std::string("f16"))}), "product_type 'f16' is neither f32 nor bf16");
}

TEST(Attention, QAttentionDequantizesItsOperandsAndQuantizesY) {
  // QAttention (compile's lower_int8 makes it): Attention of (code − zero) · scale for Q, K and
  // V, Y quantized as QuantizeLinear does (divided, rounded half to even, saturated) when y's
  // scale and zero point are given, else f32. One query, two keys, hand-computed.
  auto u8 = [](std::vector<int64_t> shape, std::vector<uint8_t> v) { return make<uint8_t>(std::move(shape), std::move(v)); };
  auto f = [](float v) { return make<float>({}, {v}); };
  const Tensor q = u8({1, 1, 1, 2}, {130, 120}), k = make<int8_t>({1, 1, 2, 2}, {10, -4, -6, 8}), v = u8({1, 1, 2, 1}, {200, 40});
  const Tensor qz = u8({}, {128}), kz = make<int8_t>({}, {2}), vz = u8({}, {100});
  const double qs = 0.5, ks = 0.25, vs = 0.1;
  const double q0 = (130 - 128) * qs, q1 = (120 - 128) * qs;
  const double x0 = (q0 * (10 - 2) * ks + q1 * (-4 - 2) * ks) / std::sqrt(2.0), x1 = (q0 * (-6 - 2) * ks + q1 * (8 - 2) * ks) / std::sqrt(2.0);
  const double e0 = std::exp(x0 - std::max(x0, x1)), e1 = std::exp(x1 - std::max(x0, x1));
  const double y = (e0 * (200 - 100) * vs + e1 * (40 - 100) * vs) / (e0 + e1);
  std::vector<Tensor> in = {q, f(0.5f), qz, k, f(0.25f), kz, v, f(0.1f), vz};
  auto r = run_op("QAttention", in);
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ((*r)[0].dtype(), DType::f32);
  expect_all((*r)[0], {y}, 1e-6);
  in.insert(in.end(), {Tensor(), f(0.05f), u8({}, {128})});
  auto rq = run_op("QAttention", in);
  ASSERT_TRUE(rq.ok()) << rq.error().what;
  ASSERT_EQ((*rq)[0].dtype(), DType::u8);
  EXPECT_EQ((*rq)[0].data<uint8_t>()[0], static_cast<uint8_t>(std::clamp(std::nearbyint(static_cast<float>(y) / 0.05f) + 128.0, 0.0, 255.0)));
  in[1] = make<float>({2}, {0.5f, 0.5f});
  expect_user_error(run_op("QAttention", in), "the scales and zero points must be scalars");
  in[1] = f(0.5f);
  in.pop_back();
  expect_user_error(run_op("QAttention", in), "y_scale and y_zero_point must be given together");
}

TEST(AttentionRotary, HandComputedHalvesAndInterleaved) {
  // One head of 4 features, no position ids: caches [B, S, 2].
  const double c0 = 0.6, s0 = 0.8, c1 = 0.0, s1 = 1.0;
  Tensor x = make<float>({1, 1, 1, 4}, {1, 2, 3, 4});
  Tensor cs = make<float>({1, 1, 2}, {float(c0), float(c1)}), sn = make<float>({1, 1, 2}, {float(s0), float(s1)});
  auto r = run_op("RotaryEmbedding", {x, cs, sn});
  ASSERT_TRUE(r.ok()) << r.error().what;
  // Halves: pairs (x0, x2) and (x1, x3).
  expect_all((*r)[0], {c0 * 1 - s0 * 3, c1 * 2 - s1 * 4, s0 * 1 + c0 * 3, s1 * 2 + c1 * 4}, 1e-6);
  auto ri = run_op("RotaryEmbedding", {x, cs, sn}, {attr("interleaved", int64_t{1})});
  ASSERT_TRUE(ri.ok()) << ri.error().what;
  // Interleaved: pairs (x0, x1) and (x2, x3).
  expect_all((*ri)[0], {c0 * 1 - s0 * 2, s0 * 1 + c0 * 2, c1 * 3 - s1 * 4, s1 * 3 + c1 * 4}, 1e-6);
}

TEST(AttentionRotary, PositionIdsPartialDimAnd3D) {
  // 3-D input [B=1, S=2, 2 heads * 6], rotating the first 4 features of each head with rows
  // picked by position_ids; features 4 and 5 pass through.
  Tensor x = data({1, 2, 12}, 1);
  Tensor cs = data({5, 2}, 2), sn = data({5, 2}, 3);
  Tensor pos = make<int64_t>({1, 2}, {4, 1});
  auto r = run_op("RotaryEmbedding", {x, cs, sn, pos}, {attr("num_heads", int64_t{2}), attr("rotary_embedding_dim", int64_t{4})});
  ASSERT_TRUE(r.ok()) << r.error().what;
  const Tensor& y = (*r)[0];
  for (int64_t t = 0; t < 2; ++t) {
    const int64_t p = t == 0 ? 4 : 1;
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t base = t * 12 + h * 6;
      for (int64_t e = 0; e < 2; ++e) {
        const double c = cs.as_double(p * 2 + e), s = sn.as_double(p * 2 + e);
        const double x1 = x.as_double(base + e), x2 = x.as_double(base + e + 2);
        EXPECT_NEAR(y.as_double(base + e), c * x1 - s * x2, 1e-6);
        EXPECT_NEAR(y.as_double(base + e + 2), s * x1 + c * x2, 1e-6);
      }
      EXPECT_EQ(y.as_double(base + 4), x.as_double(base + 4));
      EXPECT_EQ(y.as_double(base + 5), x.as_double(base + 5));
    }
  }
  expect_user_error(run_op("RotaryEmbedding", {x, cs, sn, make<int64_t>({1, 2}, {0, 5})},
                           {attr("num_heads", int64_t{2}), attr("rotary_embedding_dim", int64_t{4})}),
                    "position id 5 is out of range");
  expect_user_error(run_op("RotaryEmbedding", {x, cs, sn, pos}, {attr("num_heads", int64_t{2})}), "rotary_embedding_dim / 2");
  expect_user_error(run_op("RotaryEmbedding", {x, cs, sn, pos}), "num_heads");
}

TEST(AttentionLoss, NllWeightsIgnoreIndexAndReductions) {
  // input [N=2, C=3, D=2]; targets [[0, 2], [1, 1]] with class 1 ignored.
  Tensor x = make<float>({2, 3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  Tensor t = make<int64_t>({2, 2}, {0, 2, 1, 1});
  Tensor w = make<float>({3}, {0.5f, 2, 4});
  // Picked: (n0,d0,c0) = 1 w .5; (n0,d1,c2) = 6 w 4; the n1 ones are ignored.
  auto none = run_op("NegativeLogLikelihoodLoss", {x, t, w}, {attr("reduction", std::string("none")), attr("ignore_index", int64_t{1})});
  ASSERT_TRUE(none.ok()) << none.error().what;
  expect_all((*none)[0], {-0.5, -24, 0, 0});
  auto sum = run_op("NegativeLogLikelihoodLoss", {x, t, w}, {attr("reduction", std::string("sum")), attr("ignore_index", int64_t{1})});
  ASSERT_TRUE(sum.ok());
  expect_all((*sum)[0], {-24.5});
  EXPECT_EQ((*sum)[0].rank(), 0);
  auto mean = run_op("NegativeLogLikelihoodLoss", {x, t, w}, {attr("ignore_index", int64_t{1})});
  ASSERT_TRUE(mean.ok());
  expect_all((*mean)[0], {-24.5 / 4.5}, 1e-6);
  // No weight, no ignore: mean over all four picks 1, 6, 9, 10 (n1 picks class 1: 9, 10).
  auto plain = run_op("NegativeLogLikelihoodLoss", {x, make<int32_t>({2, 2}, {0, 2, 1, 1})});
  ASSERT_TRUE(plain.ok()) << plain.error().what;
  expect_all((*plain)[0], {-(1 + 6 + 9 + 10) / 4.0}, 1e-6);
  // Every target ignored: mean is 0 / 0.
  auto nan = run_op("NegativeLogLikelihoodLoss", {x, make<int64_t>({2, 2}, {1, 1, 1, 1})}, {attr("ignore_index", int64_t{1})});
  ASSERT_TRUE(nan.ok());
  EXPECT_TRUE(std::isnan((*nan)[0].as_double(0)));
}

TEST(AttentionLoss, SoftmaxCrossEntropyMatchesLogSoftmaxAndLogProb) {
  Tensor x = data({3, 5}, 1, 0.7f);
  Tensor t = make<int64_t>({3}, {4, 0, 2});
  auto r = run_op("SoftmaxCrossEntropyLoss", {x, t}, {attr("reduction", std::string("none"))}, 2);
  ASSERT_TRUE(r.ok()) << r.error().what;
  std::vector<double> lp(15), loss(3);
  for (int n = 0; n < 3; ++n) {
    double mx = -1e30, sum = 0;
    for (int c = 0; c < 5; ++c) mx = std::max(mx, x.as_double(n * 5 + c));
    for (int c = 0; c < 5; ++c) sum += std::exp(x.as_double(n * 5 + c) - mx);
    for (int c = 0; c < 5; ++c) lp[static_cast<size_t>(n * 5 + c)] = x.as_double(n * 5 + c) - mx - std::log(sum);
    loss[static_cast<size_t>(n)] = -lp[static_cast<size_t>(n * 5 + t.data<int64_t>()[n])];
  }
  expect_all((*r)[0], loss, 1e-6);
  expect_all((*r)[1], lp, 1e-6);
  EXPECT_EQ((*r)[1].shape(), x.shape());
  auto mean = run_op("SoftmaxCrossEntropyLoss", {x, t});
  ASSERT_TRUE(mean.ok());
  expect_all((*mean)[0], {(loss[0] + loss[1] + loss[2]) / 3}, 1e-6);
}

TEST(AttentionLoss, ZeroSizeAndUserErrors) {
  auto empty = run_op("NegativeLogLikelihoodLoss", {Tensor(DType::f32, {0, 3}), Tensor(DType::i64, {0})},
                      {attr("reduction", std::string("none"))});
  ASSERT_TRUE(empty.ok()) << empty.error().what;
  EXPECT_EQ((*empty)[0].numel(), 0);
  Tensor x = data({2, 3}, 1);
  expect_user_error(run_op("NegativeLogLikelihoodLoss", {x, make<int64_t>({2}, {0, 3})}), "target value 3 is out of range for 3 classes");
  expect_user_error(run_op("SoftmaxCrossEntropyLoss", {x, make<int64_t>({2}, {-1, 0})}), "target value -1 is out of range");
  expect_user_error(run_op("NegativeLogLikelihoodLoss", {x, make<int64_t>({2}, {0, 1})}, {attr("reduction", std::string("avg"))}),
                    "reduction 'avg'");
  expect_user_error(run_op("NegativeLogLikelihoodLoss", {x, make<int64_t>({2, 1}, {0, 1})}), "rank");
  expect_user_error(run_op("NegativeLogLikelihoodLoss", {x, make<int64_t>({2}, {0, 1}), data({4}, 2)}), "classes");
}

}  // namespace
}  // namespace kiln
