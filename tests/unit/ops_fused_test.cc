// FusedConv and FusedMatMul (what kiln compile fuses epilogues into) against the chains of
// core ops they replace, for every activation, and their schema checks.
#include <gtest/gtest.h>

#include <cmath>

#include "formats/ops/epilogue.h"
#include "runtime/session.h"
#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::attr;
using testing::make;
using testing::ramp;
using testing::run_op;
using testing::to_bf16;
using testing::to_f16;

Tensor run1(const std::string& op, const std::vector<Tensor>& in, std::vector<Attribute> attrs = {}) {
  auto r = run_op(op, in, std::move(attrs));
  EXPECT_TRUE(r.ok()) << op << ": " << r.error().message();
  return r.ok() ? (*r)[0] : Tensor();
}

Tensor scalar(float v) { return make<float>({}, {v}); }

// The unfused activation as the exporter writes it.
Tensor activate(const ActivationSpec& a, const Tensor& x) {
  switch (a.kind) {
    case Activation::none: return x;
    case Activation::relu: return run1("Relu", {x});
    case Activation::leaky_relu: return run1("LeakyRelu", {x}, {attr("alpha", double{a.a})});
    case Activation::clip: return run1("Clip", {x, scalar(a.a), scalar(a.b)});
    case Activation::sigmoid: return run1("Sigmoid", {x});
    case Activation::tanh: return run1("Tanh", {x});
    case Activation::hard_sigmoid: return run1("HardSigmoid", {x}, {attr("alpha", double{a.a}), attr("beta", double{a.b})});
    case Activation::hard_swish: return run1("HardSwish", {x});
    case Activation::gelu: return run1("Gelu", {x});
    case Activation::gelu_tanh: return run1("Gelu", {x}, {attr("approximate", std::string("tanh"))});
    case Activation::silu: return run1("Mul", {x, run1("Sigmoid", {x})});
  }
  return Tensor();
}

const std::vector<ActivationSpec> kAll = {
    {Activation::none},        {Activation::relu},       {Activation::leaky_relu, 0.1f},
    {Activation::clip, 0, 6},  {Activation::sigmoid},    {Activation::tanh},
    {Activation::hard_sigmoid, 0.2f, 0.5f},              {Activation::hard_swish},
    {Activation::gelu},        {Activation::gelu_tanh},  {Activation::silu}};

std::vector<Attribute> epilogue_attrs(const ActivationSpec& act, const ActivationSpec& post) {
  Node n;
  write_activation(n, "activation", act);
  write_activation(n, "post_activation", post);
  return n.attrs;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5 * (1 + std::abs(want.data<float>()[i])))
        << what << " element " << i;
}

TEST(FusedOps, FusedConvMatchesConvBiasActivationResidual) {
  const Tensor x = ramp({1, 3, 6, 5}), w = ramp({4, 3, 3, 3}, 0.21f), b = ramp({4}, 0.5f), z = ramp({1, 4, 6, 5}, 0.3f);
  const std::vector<Attribute> conv_attrs = {attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
  const Tensor conv = run1("Conv", {x, w, b}, conv_attrs);
  for (const ActivationSpec& act : kAll)
    for (const ActivationSpec& post : {ActivationSpec{}, ActivationSpec{Activation::relu}}) {
      const std::string what = std::string(activation_name(act.kind)) + " then " + std::string(activation_name(post.kind));
      std::vector<Attribute> attrs = conv_attrs;
      for (Attribute& a : epilogue_attrs(act, post)) attrs.push_back(a);
      // Without Z the post-activation follows the activation directly.
      expect_close(run1("FusedConv", {x, w, b}, attrs), activate(post, activate(act, conv)), what);
      expect_close(run1("FusedConv", {x, w, b, z}, attrs), activate(post, run1("Add", {activate(act, conv), z})), what + " + Z");
    }
}

TEST(FusedOps, FusedMatMulMatchesMatMulBiasActivationResidual) {
  const Tensor a = ramp({2, 3, 5}), bm = ramp({5, 4}, 0.21f), bias = ramp({4}, 0.5f), z = ramp({2, 3, 4}, 0.3f);
  const Tensor mm = run1("Add", {run1("MatMul", {a, bm}), bias});
  for (const ActivationSpec& act : kAll) {
    const std::string what(activation_name(act.kind));
    expect_close(run1("FusedMatMul", {a, bm, bias}, epilogue_attrs(act, {})), activate(act, mm), what);
    expect_close(run1("FusedMatMul", {a, bm, bias, z}, epilogue_attrs(act, {Activation::gelu})),
                 activate({Activation::gelu}, run1("Add", {activate(act, mm), z})), what + " + Z");
  }
  // No bias: the plain product.
  expect_close(run1("FusedMatMul", {a, bm}), run1("MatMul", {a, bm}), "no bias");
}

TEST(FusedOps, FusedMatMulSplitsItsColumnsIntoOutputs) {
  const Tensor a = ramp({2, 3, 5}), bm = ramp({5, 7}, 0.21f), bias = ramp({7}, 0.5f);
  const Tensor whole = run1("FusedMatMul", {a, bm, bias}, {attr("activation", std::string("Gelu"))});
  const std::vector<int64_t> widths = {2, 4, 1};
  auto parts = run_op("FusedMatMul", {a, bm, bias}, {attr("activation", std::string("Gelu")), attr("splits", widths)}, 3);
  ASSERT_TRUE(parts.ok()) << parts.error().message();
  int64_t begin = 0;
  for (size_t o = 0; o < widths.size(); ++o) {
    Tensor want(DType::f32, {2, 3, widths[o]});
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t c = 0; c < widths[o]; ++c) want.data<float>()[r * widths[o] + c] = whole.data<float>()[r * 7 + begin + c];
    expect_close((*parts)[o], want, "output " + std::to_string(o));
    begin += widths[o];
  }
  // `activated`: the activation on the second output alone, the bias on all three.
  const Tensor plain = run1("FusedMatMul", {a, bm, bias});
  auto some = run_op("FusedMatMul", {a, bm, bias},
                     {attr("activation", std::string("Gelu")), attr("splits", widths), attr("activated", std::vector<int64_t>{0, 1, 0})}, 3);
  ASSERT_TRUE(some.ok()) << some.error().message();
  begin = 0;
  for (size_t o = 0; o < widths.size(); ++o) {
    const Tensor& from = o == 1 ? whole : plain;
    Tensor want(DType::f32, {2, 3, widths[o]});
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t c = 0; c < widths[o]; ++c) want.data<float>()[r * widths[o] + c] = from.data<float>()[r * 7 + begin + c];
    expect_close((*some)[o], want, "activated output " + std::to_string(o));
    begin += widths[o];
  }
}

// gate_block: the product's columns alternate G values and their G gates; Y, half as wide, is
// value · activation(gate), the bias on both.
// x_parts (compile's fuse_concat): X is input 0 and the inputs after Z joined along the
// channels, channels-first or channels-last.
TEST(FusedOps, FusedConvReadsXInParts) {
  const Tensor w = ramp({4, 5, 3, 3}, 0.21f), b = ramp({4}, 0.5f), z = ramp({1, 4, 6, 5}, 0.3f);
  const Tensor x0 = ramp({1, 2, 6, 5}), x1 = ramp({1, 3, 6, 5}, 0.7f);
  std::vector<Attribute> attrs = {attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("activation", std::string("Silu"))};
  const Tensor whole = run1("FusedConv", {run1("Concat", {x0, x1}, {attr("axis", int64_t{1})}), w, b, z}, attrs);
  attrs.push_back(attr("x_parts", int64_t{2}));
  expect_close(run1("FusedConv", {x0, w, b, z, x1}, attrs), whole, "channels-first");
  // Channels-last, no bias or Z: the NHWC parts.
  auto nhwc = [](const Tensor& t) { return run1("Transpose", {t}, {attr("perm", std::vector<int64_t>{0, 2, 3, 1})}); };
  std::vector<Attribute> last = {attr("channels_last", int64_t{1}), attr("x_parts", int64_t{2}), attr("pads", std::vector<int64_t>{1, 1, 1, 1})};
  const Tensor plain = run1("FusedConv", {run1("Concat", {x0, x1}, {attr("axis", int64_t{1})}), w}, {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  expect_close(run1("FusedConv", {nhwc(x0), w, Tensor(), Tensor(), nhwc(x1)}, last), nhwc(plain), "channels-last");
}

// x_channels_first (compile's channels_last, for an image read as it comes): X is [N, C, H, W]
// while Y and Z are channels-last.
TEST(FusedOps, FusedConvReadsXChannelsFirst) {
  const Tensor x = ramp({1, 3, 6, 5}), w = ramp({4, 3, 3, 3}, 0.21f), b = ramp({4}, 0.5f), z = ramp({1, 4, 3, 3}, 0.3f);
  std::vector<Attribute> attrs = {attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("strides", std::vector<int64_t>{2, 2}),
                                  attr("activation", std::string("Silu"))};
  auto nhwc = [](const Tensor& t) { return run1("Transpose", {t}, {attr("perm", std::vector<int64_t>{0, 2, 3, 1})}); };
  const Tensor first = run1("FusedConv", {x, w, b, z}, attrs);
  attrs.push_back(attr("channels_last", int64_t{1}));
  attrs.push_back(attr("x_channels_first", int64_t{1}));
  expect_close(run1("FusedConv", {x, w, b, nhwc(z)}, attrs), nhwc(first), "X channels-first, Y and Z channels-last");
}

TEST(FusedOps, GatedProductMultipliesValuesByTheirGates) {
  const Tensor a = ramp({2, 3, 5}), bm = ramp({5, 8}, 0.21f), bias = ramp({8}, 0.5f);
  const Tensor whole = run1("FusedMatMul", {a, bm, bias});
  auto gated = run_op("FusedMatMul", {a, bm, bias}, {attr("activation", std::string("Silu")), attr("gate_block", int64_t{2})});
  ASSERT_TRUE(gated.ok()) << gated.error().message();
  ASSERT_EQ((*gated)[0].shape(), (std::vector<int64_t>{2, 3, 4}));
  Tensor want(DType::f32, {2, 3, 4});
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 4; ++c) {
      const float v = whole.data<float>()[r * 8 + c / 2 * 4 + c % 2], g = whole.data<float>()[r * 8 + c / 2 * 4 + 2 + c % 2];
      want.data<float>()[r * 4 + c] = v * g / (1 + std::exp(-g));
    }
  expect_close((*gated)[0], want, "gated");
}

TEST(FusedOps, SchemaChecks) {
  const Tensor a = ramp({3, 5}), b = ramp({5, 4});
  auto bad = [](const Result<std::vector<Tensor>>& r, const std::string& fragment) {
    ASSERT_FALSE(r.ok()) << fragment;
    EXPECT_NE(r.error().message().find(fragment), std::string::npos) << r.error().message();
  };
  bad(run_op("FusedMatMul", {a, b}, {attr("activation", std::string("Swish"))}),
      "activation 'Swish' is not one of Relu, LeakyRelu, Clip, Sigmoid, Tanh, HardSigmoid, HardSwish, Gelu, GeluTanh, Silu");
  bad(run_op("FusedMatMul", {a, b}, {attr("activation", std::string("Clip")), attr("activation_params", std::vector<double>{0})}),
      "activation_params has 1 values but Clip takes 2");
  bad(run_op("FusedMatMul", {a, b, ramp({3})}), "bias has 3 elements but the output 3x4 has 4 channels");
  bad(run_op("FusedMatMul", {a, b, Tensor(), ramp({4, 3})}), "the residual input Z 4x3 does not have the output's shape 3x4");
  const auto splits = [](std::vector<int64_t> w) { return attr("splits", std::move(w)); };
  bad(run_op("FusedMatMul", {a, b}, {splits({1, 3})}), "2 splits for 1 outputs");
  bad(run_op("FusedMatMul", {a, b}, {}, 2), "2 outputs without splits; FusedMatMul has one");
  bad(run_op("FusedMatMul", {a, b}, {splits({2, 3})}, 2), "the splits sum to 5 but the product has 4 columns");
  bad(run_op("FusedMatMul", {a, b}, {splits({4, 0})}, 2), "split 0 is not positive");
  bad(run_op("FusedMatMul", {a, b, Tensor(), ramp({3, 4})}, {splits({2, 2})}, 2), "a residual input Z with split outputs");
  const auto activated = [](std::vector<int64_t> on) { return attr("activated", std::move(on)); };
  bad(run_op("FusedMatMul", {a, b}, {activated({1})}), "activated without splits");
  bad(run_op("FusedMatMul", {a, b}, {splits({2, 2}), activated({1})}, 2), "1 activated flags for 2 outputs");
  bad(run_op("FusedMatMul", {a, b}, {splits({2, 2}), activated({1, 2})}, 2), "activated flag 2 is neither 0 nor 1");
  const auto gate = [](int64_t g) { return attr("gate_block", g); };
  bad(run_op("FusedMatMul", {a, b}, {gate(0)}), "gate_block 0 is not positive");
  bad(run_op("FusedMatMul", {a, b}, {gate(2), splits({2, 2})}, 2), "gate_block with split outputs");
  bad(run_op("FusedMatMul", {a, b}, {gate(1)}, 2), "2 outputs of a gated product; it has one");
  bad(run_op("FusedMatMul", {a, b, Tensor(), ramp({3, 2})}, {gate(1)}), "a residual input Z with gate_block");
  bad(run_op("FusedMatMul", {a, b}, {gate(1), attr("post_activation", std::string("Relu"))}), "a post_activation with gate_block");
  bad(run_op("FusedMatMul", {a, b}, {gate(4)}), "the product's 4 columns are not whole blocks of 4 values and 4 gates");
  bad(run_op("FusedConv", {make<double>({1, 1, 3, 3}, std::vector<double>(9, 1.0)), make<double>({1, 1, 1, 1}, {1.0})}),
      "FusedConv does not support f64 (it takes f32 and bf16)");
  const Tensor x = ramp({1, 2, 3, 3}), w = ramp({4, 5, 1, 1});
  bad(run_op("FusedConv", {x, w, Tensor(), Tensor(), ramp({1, 3, 3, 3})}), "inputs after Z need x_parts");
  bad(run_op("FusedConv", {x, w, Tensor(), Tensor(), Tensor()}, {attr("x_parts", int64_t{2})}), "part 1 of X is missing");
  bad(run_op("FusedConv", {x, w, Tensor(), Tensor(), ramp({1, 3, 3, 3})}, {attr("x_parts", int64_t{3})}), "x_parts is 3 but the node has 2 parts of X");
  bad(run_op("FusedConv", {x, w, Tensor(), Tensor(), ramp({1, 3, 3})}, {attr("x_parts", int64_t{2})}), "part 1 of X has rank 3 but part 0 has 4");
  bad(run_op("FusedConv", {x, w, Tensor(), Tensor(), ramp({1, 3, 3, 2})}, {attr("x_parts", int64_t{2})}),
      "part 1 of X has shape 1x3x3x2, which differs from part 0's 1x2x3x3 off the channel axis");
  bad(run_op("FusedConv", {x, w, Tensor(), Tensor(), ramp({1, 2, 3, 3})}, {attr("x_parts", int64_t{2})}), "X has 4 channels but W expects 5");
  const auto first = [](int64_t v) { return attr("x_channels_first", v); };
  const auto last = attr("channels_last", int64_t{1});
  bad(run_op("FusedConv", {x, ramp({4, 2, 1, 1})}, {first(1)}), "x_channels_first needs channels_last = 1");
  bad(run_op("FusedConv", {x, ramp({4, 2, 1, 1})}, {first(2), last}), "x_channels_first 2 must be 0 or 1");
  bad(run_op("FusedConv", {x, w, Tensor(), Tensor(), ramp({1, 3, 3, 3})}, {first(1), last, attr("x_parts", int64_t{2})}),
      "x_channels_first with X in parts");
}

// PointwiseDepthwiseConv is its FusedConvs, channels-first and channels-last, with the
// pointwise stage's activation from pointwise_activation, the depthwise one's window, and the
// projection's activation from projection_activation before its residual Z; with all three
// stages, without the projection, and without the expansion.
TEST(FusedOps, PointwiseDepthwiseConvIsItsStages) {
  const Tensor x = ramp({2, 3, 7, 6}), w1 = ramp({8, 3, 1, 1}, 0.21f), b1 = ramp({8}, 0.5f), w2 = ramp({8, 1, 3, 3}, 0.3f),
               b2 = ramp({8}, 0.7f), w3 = ramp({5, 8, 1, 1}, 0.17f), b3 = ramp({5}, 0.4f);
  const std::vector<Attribute> window = {attr("group", int64_t{8}), attr("pads", std::vector<int64_t>{1, 0, 1, 1}),
                                         attr("strides", std::vector<int64_t>{2, 2})};
  for (int64_t last : {0, 1}) {
    SCOPED_TRACE("channels_last " + std::to_string(last));
    const std::vector<Attribute> perm = {attr("perm", std::vector<int64_t>{0, 2, 3, 1})};
    const Tensor xl = last ? run1("Transpose", {x}, perm) : x;
    std::vector<Attribute> pw = {attr("channels_last", last), attr("activation", std::string("Clip")),
                                 attr("activation_params", std::vector<double>{0, 6})};
    std::vector<Attribute> dw = window;
    dw.push_back(attr("channels_last", last));
    dw.push_back(attr("activation", std::string("Silu")));
    const Tensor want = run1("FusedConv", {run1("FusedConv", {xl, w1, b1}, pw), w2, b2}, dw);
    std::vector<Attribute> fused = dw;
    fused.push_back(attr("pointwise_activation", std::string("Clip")));
    fused.push_back(attr("pointwise_activation_params", std::vector<double>{0, 6}));
    expect_close(run1("PointwiseDepthwiseConv", {xl, w1, b1, w2, b2}, fused), want, "both biases");
    const Tensor plain = run1("FusedConv", {run1("FusedConv", {xl, w1}, pw), w2}, dw);
    expect_close(run1("PointwiseDepthwiseConv", {xl, w1, Tensor(), w2}, fused), plain, "no biases");
    // The projection: a 1x1 FusedConv of the depthwise output with a LeakyRelu, then Z.
    const Tensor z = last ? run1("Transpose", {ramp({2, 5, 4, 3}, 0.9f)}, perm) : ramp({2, 5, 4, 3}, 0.9f);
    const std::vector<Attribute> pj = {attr("channels_last", last), attr("activation", std::string("LeakyRelu")),
                                       attr("activation_params", std::vector<double>{0.25})};
    std::vector<Attribute> three = fused;
    three.push_back(attr("projection_activation", std::string("LeakyRelu")));
    three.push_back(attr("projection_activation_params", std::vector<double>{0.25}));
    expect_close(run1("PointwiseDepthwiseConv", {xl, w1, b1, w2, b2, w3, b3, z}, three), run1("FusedConv", {want, w3, b3, z}, pj),
                 "three stages");
    const Tensor x8 = last ? run1("Transpose", {ramp({2, 8, 7, 6}, 0.6f)}, perm) : ramp({2, 8, 7, 6}, 0.6f);
    expect_close(run1("PointwiseDepthwiseConv", {x8, Tensor(), Tensor(), w2, b2, w3}, three),
                 run1("FusedConv", {run1("FusedConv", {x8, w2, b2}, dw), w3}, pj), "no expansion");
  }
  auto bad = [](const Result<std::vector<Tensor>>& r, const std::string& fragment) {
    ASSERT_FALSE(r.ok()) << fragment;
    EXPECT_NE(r.error().message().find(fragment), std::string::npos) << r.error().message();
  };
  const std::vector<Attribute> g8 = {attr("group", int64_t{8})};
  bad(run_op("PointwiseDepthwiseConv", {x, w1}, g8), "W2 is required");
  bad(run_op("PointwiseDepthwiseConv", {x, Tensor(), Tensor(), w2}, g8), "W1 or W3 is required");
  bad(run_op("PointwiseDepthwiseConv", {x, Tensor(), b1, w2, b2, w3}, g8), "B1 without W1");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, b1, w2, b2, Tensor(), b3}, g8), "B3 or Z without W3");
  bad(run_op("PointwiseDepthwiseConv", {x, ramp({8, 3, 3, 3}), Tensor(), w2}, g8), "W1 8x3x3x3 is not a 1x1 convolution's weight");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, Tensor(), w2, Tensor(), ramp({5, 8, 3, 3})}, g8),
      "W3 5x8x3x3 is not a 1x1 convolution's weight");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, Tensor(), w2, Tensor(), ramp({5, 6, 1, 1})}, g8), "X has 8 channels but W expects 6");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, Tensor(), w2, Tensor(), w3, Tensor(), ramp({2, 5, 4, 4})}, g8),
      "the residual input Z 2x5x4x4 does not have the output's shape 2x5x5x4");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, Tensor(), ramp({8, 2, 3, 3})}, g8), "W2 8x2x3x3 is not a depthwise convolution's weight");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, Tensor(), ramp({4, 1, 3, 3})}, {attr("group", int64_t{4})}), "differ in their channels");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, Tensor(), w2}), "group 1 is not W2's 8 channels");
  bad(run_op("PointwiseDepthwiseConv", {x, ramp({8, 4, 1, 1}), Tensor(), w2}, g8), "X has 3 channels but W expects 4");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, Tensor(), w2}, {attr("group", int64_t{8}), attr("pointwise_activation", std::string("Swish"))}),
      "activation 'Swish' is not one of");
  bad(run_op("PointwiseDepthwiseConv", {x, w1, Tensor(), w2, Tensor(), w3},
             {attr("group", int64_t{8}), attr("projection_activation", std::string("Swish"))}),
      "activation 'Swish' is not one of");
  // f16 weights (`--precision fp16`) are their stages' f16 FusedConvs; bf16 ones, and f16
  // activations, are not the op's.
  const Tensor want16 = run1("FusedConv", {run1("FusedConv", {run1("FusedConv", {x, to_f16(w1)}), to_f16(w2)}, g8), to_f16(w3)});
  expect_close(run1("PointwiseDepthwiseConv", {x, to_f16(w1), Tensor(), to_f16(w2), Tensor(), to_f16(w3)}, g8), want16, "f16 weights");
  bad(run_op("PointwiseDepthwiseConv", {x, to_bf16(w1), Tensor(), w2}, g8), "W1 must be f32 or f16, got bf16");
  bad(run_op("PointwiseDepthwiseConv", {to_f16(x), w1, Tensor(), w2}, g8), "PointwiseDepthwiseConv is f32 only, got f16");
}

TEST(FusedOps, ActivationAttributesRoundTrip) {
  for (const ActivationSpec& spec : kAll) {
    Node n;
    n.name = "n";
    write_activation(n, "activation", spec);
    auto back = read_activation(n, "activation");
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(*back, spec) << activation_name(spec.kind);
  }
}

}  // namespace
}  // namespace kiln
