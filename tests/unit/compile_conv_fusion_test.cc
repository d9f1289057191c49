// The fusion passes for convolutions on kiln's own kernels (compile/passes/): fuse_concat,
// fuse_pointwise_depthwise and fuse_channel_scale. Each gets a golden text test, a
// before/after test on the reference kernels, and a run on the default kernels that checks the
// fused nodes land on the kernel made for them (compile_passes_test.cc has the other passes).
#include <gtest/gtest.h>

#include <algorithm>

#include "compile/pass.h"
#include "runtime/session.h"
#include "tests/unit/compile_passes_test_util.h"

namespace kiln {
namespace {

using namespace passes_test;

// ---- fuse_concat ---------------------------------------------------------------------------

// `after` (a pass's output) on the default kernels: the nodes `names` run on kernels whose
// names start with `prefix`, and its outputs are `before`'s on the reference kernels (within
// float rounding of libm's activations).
void expect_fast_kernels(const Model& before, const Model& after, const std::vector<Tensor>& inputs,
                         const std::vector<std::string>& names, const std::string& prefix) {
  auto fast = Session::create(after);
  ASSERT_TRUE(fast.ok()) << fast.error().message();
  auto got = (*fast)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().message();
  for (const std::string& name : names) {
    const auto at = std::find_if(after.graph.nodes.begin(), after.graph.nodes.end(), [&](const Node& n) { return n.name == name; });
    ASSERT_NE(at, after.graph.nodes.end()) << name;
    const auto n = static_cast<size_t>(at - after.graph.nodes.begin());
    ASSERT_LT(n, (*fast)->kernels().size());
    EXPECT_EQ((*fast)->kernels()[n].name.rfind(prefix, 0), 0u) << name << ": " << (*fast)->kernels()[n].name;
  }
  const std::vector<Tensor> want = run_reference(before, inputs);
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(relative_l2((*got)[i], want[i]), 1e-6) << i;
}


// Channel Concats before channels-last 1x1 convolutions: one with SiLU (a C2f block's end),
// one with ReLU (oneDNN's, which cannot read parts), one also read by a Neg.
Model concat_conv_model() {
  Builder b;
  ValueId a = b.input("a", {1, 4, 4, 3}), c = b.input("c", {1, 4, 4, 5});
  ValueId h = b.op("h", "Relu", {a}, "h");
  ValueId w = b.constant("w", uniform_f32({6, 8, 1, 1}, 96)), bias = b.constant("bias", uniform_f32({6}, 97));
  auto conv = [&](const std::string& name, ValueId x, const char* act) {
    return b.op(name, "FusedConv", {x, w, bias}, name,
                {attr("channels_last", int64_t{1}), attr("kernel_shape", std::vector<int64_t>{1, 1}), attr("activation", std::string(act))});
  };
  ValueId j1 = b.op("j1", "Concat", {h, c}, "j1", {attr("axis", int64_t{3})});
  b.output(conv("silu", j1, "Silu"));
  ValueId j2 = b.op("j2", "Concat", {c, h}, "j2", {attr("axis", int64_t{-1})});
  b.output(conv("relu", j2, "Relu"));
  ValueId j3 = b.op("j3", "Concat", {h, c}, "j3", {attr("axis", int64_t{3})});
  b.output(conv("shared", j3, "Sigmoid"));
  b.output(b.op("neg", "Neg", {j3}, "neg"));
  return b.done();
}

TEST(CompileFuseConcat, Golden) {
  Model m = concat_conv_model();
  PassResult r = run_pass("fuse_concat", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary, "read 1 Concat's inputs where they lie in 1 pointwise convolution");
  const std::string text = testing::nodes_text(m.graph);
  EXPECT_NE(text.find("node silu: FusedConv(h, w, bias, _, c) -> (silu) activation=\"Silu\" channels_last=1 kernel_shape=ints[1, 1] "
                      "x_parts=2 sources=[\"silu\", \"j1\"]\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("node j1:"), std::string::npos) << text;
  EXPECT_NE(text.find("node j2: Concat"), std::string::npos) << text;
  EXPECT_NE(text.find("node j3: Concat"), std::string::npos) << text;
}

TEST(CompileFuseConcat, SameOutputsOnTheReferenceAndOnKilnsGemm) {
  Model before = concat_conv_model(), after = before;
  run_pass("fuse_concat", after);
  const std::vector<Tensor> inputs = {uniform_f32({1, 4, 4, 3}, 98), uniform_f32({1, 4, 4, 5}, 99)};
  expect_same_outputs(before, after, inputs, 0);
  expect_fast_kernels(before, after, inputs, {"silu"}, "kiln.gemm_f32_");
}

// With `--precision fp16`: a SiLU join into 32 channels (which the f16 GEMM's rule leaves to
// f32) reads its parts on kiln's f32 GEMM, the f16 weight widened; one into 64 channels from
// 96 over 8x8 pixels (the f16 GEMM's, which reads no parts) keeps its Concat.
Model f16_concat_model(bool narrow_only) {
  Builder b;
  ValueId a = b.input("a", {1, 8, 8, 48}), c = b.input("c", {1, 8, 8, 48});
  const std::vector<Attribute> silu = {attr("channels_last", int64_t{1}), attr("kernel_shape", std::vector<int64_t>{1, 1}),
                                       attr("activation", std::string("Silu"))};
  ValueId narrow = b.constant("narrow_w", to_f16(uniform_f32({32, 96, 1, 1}, 170)));
  b.output(b.op("to32", "FusedConv", {b.op("j32", "Concat", {a, c}, "j32", {attr("axis", int64_t{3})}), narrow}, "to32", silu));
  if (narrow_only) return b.done();
  ValueId wide = b.constant("wide_w", to_f16(uniform_f32({64, 96, 1, 1}, 171)));
  b.output(b.op("to64", "FusedConv", {b.op("j64", "Concat", {c, a}, "j64", {attr("axis", int64_t{3})}), wide}, "to64", silu));
  return b.done();
}

TEST(CompileFuseConcat, F16WeightsWhereTheConvolutionComputesInF32) {
  Model before = f16_concat_model(false), after = before;
  EXPECT_EQ(run_pass("fuse_concat", after).summary, "read 1 Concat's inputs where they lie in 1 pointwise convolution");
  const std::string text = testing::nodes_text(after.graph);
  EXPECT_NE(text.find("node to32: FusedConv(a, narrow_w, _, _, c) ->"), std::string::npos) << text;
  EXPECT_NE(text.find("node j64: Concat"), std::string::npos) << text;
  const std::vector<Tensor> inputs = {uniform_f32({1, 8, 8, 48}, 172), uniform_f32({1, 8, 8, 48}, 173)};
  expect_same_outputs(before, after, inputs, 0);
  Model narrow = f16_concat_model(true), fused = narrow;
  run_pass("fuse_concat", fused);
  expect_fast_kernels(narrow, fused, inputs, {"to32"}, "kiln.gemm_f32_");
}

TEST(CompileFuseConcat, NotForATargetWithoutAvx2) {
  Model m = concat_conv_model();
  Target baseline;
  baseline.cpu = CpuFeatures{};
  PassContext ctx{baseline, {}};
  auto r = fuse_concat(m, ctx);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->changed);
}

// ---- fuse_pointwise_depthwise --------------------------------------------------------------

// Channels-last 1x1 expansions 24 -> 144 and the depthwise convolutions after them: on 56x56
// (T 1.8 MB) at stride 1 and at stride 2, on 8x8 (T 37 KB), and one whose T a Neg reads too.
Model pointwise_depthwise_model() {
  Builder b;
  ValueId x = b.input("x", {1, 56, 56, 24}), small = b.input("small", {1, 8, 8, 24});
  ValueId w1 = b.constant("w1", uniform_f32({144, 24, 1, 1}, 110)), b1 = b.constant("b1", uniform_f32({144}, 111));
  ValueId w2 = b.constant("w2", uniform_f32({144, 1, 3, 3}, 112)), b2 = b.constant("b2", uniform_f32({144}, 113));
  auto block = [&](const std::string& name, ValueId in, int64_t stride) {
    ValueId t = b.op(name + "_pw", "FusedConv", {in, w1, b1}, name + "_t",
                     {attr("channels_last", int64_t{1}), attr("kernel_shape", std::vector<int64_t>{1, 1}),
                      attr("activation", std::string("Clip")), attr("activation_params", std::vector<double>{0, 6})});
    ValueId y = b.op(name, "FusedConv", {t, w2, b2}, name,
                     {attr("channels_last", int64_t{1}), attr("group", int64_t{144}), attr("kernel_shape", std::vector<int64_t>{3, 3}),
                      attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("strides", std::vector<int64_t>{stride, stride}),
                      attr("activation", std::string("Silu"))});
    return std::make_pair(t, y);
  };
  b.output(block("s1", x, 1).second);
  b.output(block("s2", x, 2).second);
  b.output(block("small", small, 1).second);
  const auto [t, y] = block("shared", x, 1);
  b.output(y);
  b.output(b.op("neg", "Neg", {t}, "neg"));
  return b.done();
}

TEST(CompileFusePointwiseDepthwise, Golden) {
  Model m = pointwise_depthwise_model();
  PassResult r = run_pass("fuse_pointwise_depthwise", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary, "fused 2 pointwise convolutions into the depthwise convolution after it");
  const std::string text = testing::nodes_text(m.graph);
  EXPECT_NE(text.find("node s1: PointwiseDepthwiseConv(x, w1, b1, w2, b2) -> (s1) activation=\"Silu\" channels_last=1 group=144 "
                      "kernel_shape=ints[3, 3] pads=ints[1, 1, 1, 1] pointwise_activation=\"Clip\" "
                      "pointwise_activation_params=floats[0, 6] strides=ints[1, 1] sources=[\"s1_pw\", \"s1\"]\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("node s2: PointwiseDepthwiseConv"), std::string::npos) << text;
  for (const char* kept : {"node s1_pw:", "node s2_pw:"}) EXPECT_EQ(text.find(kept), std::string::npos) << kept << "\n" << text;
  for (const char* kept : {"node small_pw: FusedConv", "node small: FusedConv", "node shared_pw: FusedConv", "node shared: FusedConv"})
    EXPECT_NE(text.find(kept), std::string::npos) << kept << "\n" << text;
}

// At two threads the stride-2 one keeps its T (0.9 MB a thread); without AVX2, nothing fuses.
TEST(CompileFusePointwiseDepthwise, StrideTwoNeedsAMebibyteAThread) {
  Model m = pointwise_depthwise_model();
  Target two;
  two.threads = 2;
  PassContext ctx{two, {}};
  auto r = fuse_pointwise_depthwise(m, ctx);
  ASSERT_TRUE(r.ok());
  const std::string text = testing::nodes_text(m.graph);
  EXPECT_NE(text.find("node s1: PointwiseDepthwiseConv"), std::string::npos) << text;
  EXPECT_NE(text.find("node s2_pw: FusedConv"), std::string::npos) << text;
  Model n = pointwise_depthwise_model();
  Target baseline;
  baseline.cpu = CpuFeatures{};
  PassContext none{baseline, {}};
  auto r2 = fuse_pointwise_depthwise(n, none);
  ASSERT_TRUE(r2.ok());
  EXPECT_FALSE(r2->changed);
}

TEST(CompileFusePointwiseDepthwise, SameOutputsOnTheReferenceAndOnKilnsKernel) {
  Model before = pointwise_depthwise_model(), after = before;
  run_pass("fuse_pointwise_depthwise", after);
  const std::vector<Tensor> inputs = {uniform_f32({1, 56, 56, 24}, 114), uniform_f32({1, 8, 8, 24}, 115)};
  expect_same_outputs(before, after, inputs, 1e-6);
  expect_fast_kernels(before, after, inputs, {"s1", "s2"}, "kiln.pointwise_depthwise_f32_");
}

// Projections (1x1 convolutions of a depthwise convolution's output): MobileNetV2's third block
// (24 -> 144 expansion on 56x56, T 1.8 MB, the depthwise convolution, the projection back to 24
// with X as its residual and a ReLU on it), a depthwise convolution of X (56x56x96: 1.2 MB)
// with the projection to 16 after it, one on 8x8 (D 8 KB, T 8 KB), and one whose depthwise
// output a Neg reads too.
Model projection_model() {
  Builder b;
  ValueId x = b.input("x", {1, 56, 56, 24}), wide = b.input("wide", {1, 56, 56, 96}), small = b.input("small", {1, 8, 8, 32});
  const std::vector<Attribute> pointwise = {attr("channels_last", int64_t{1}), attr("kernel_shape", std::vector<int64_t>{1, 1})};
  auto depthwise = [&](const std::string& name, ValueId in, int64_t c, uint32_t seed) {
    return b.op(name, "FusedConv", {in, b.constant(name + "_w", uniform_f32({c, 1, 3, 3}, seed)), b.constant(name + "_b", uniform_f32({c}, seed + 1))},
                name + "_d",
                {attr("channels_last", int64_t{1}), attr("group", c), attr("kernel_shape", std::vector<int64_t>{3, 3}),
                 attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("activation", std::string("Clip")),
                 attr("activation_params", std::vector<double>{0, 6})});
  };
  ValueId t = b.op("p3_pw", "FusedConv", {x, b.constant("w1", uniform_f32({144, 24, 1, 1}, 120)), b.constant("b1", uniform_f32({144}, 121))},
                   "p3_t", pointwise);
  std::vector<Attribute> relu = pointwise;
  relu.push_back(attr("activation", std::string("Relu")));
  b.output(b.op("p3", "FusedConv", {depthwise("p3_dw", t, 144, 122), b.constant("w3", uniform_f32({24, 144, 1, 1}, 124)),
                                    b.constant("b3", uniform_f32({24}, 125)), x},
                "p3", relu));
  b.output(b.op("p1", "FusedConv", {depthwise("p1_dw", wide, 96, 126), b.constant("w4", uniform_f32({16, 96, 1, 1}, 128))}, "p1", pointwise));
  ValueId w5 = b.constant("w5", uniform_f32({16, 32, 1, 1}, 129));
  b.output(b.op("small", "FusedConv", {depthwise("small_dw", small, 32, 130), w5}, "small", pointwise));
  ValueId d = depthwise("shared_dw", small, 32, 132);
  b.output(b.op("shared", "FusedConv", {d, w5}, "shared", pointwise));
  b.output(b.op("neg", "Neg", {d}, "neg"));
  return b.done();
}

TEST(CompileFusePointwiseDepthwise, Projections) {
  Model m = projection_model();
  PassResult r = run_pass("fuse_pointwise_depthwise", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary,
            "fused 1 pointwise convolution into the depthwise convolution after it; 2 projections into the depthwise convolution "
            "before it");
  const std::string text = testing::nodes_text(m.graph);
  EXPECT_NE(text.find("node p3: PointwiseDepthwiseConv(x, w1, b1, p3_dw_w, p3_dw_b, w3, b3, x) -> (p3) activation=\"Clip\" "
                      "activation_params=floats[0, 6] channels_last=1 group=144 kernel_shape=ints[3, 3] pads=ints[1, 1, 1, 1] "
                      "projection_activation=\"Relu\" sources=[\"p3_pw\", \"p3_dw\", \"p3\"]\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("node p1: PointwiseDepthwiseConv(wide, _, _, p1_dw_w, p1_dw_b, w4) -> (p1) activation=\"Clip\" "
                      "activation_params=floats[0, 6] channels_last=1 group=96 kernel_shape=ints[3, 3] pads=ints[1, 1, 1, 1] "
                      "sources=[\"p1_dw\", \"p1\"]\n"),
            std::string::npos)
      << text;
  for (const char* gone : {"node p3_pw:", "node p3_dw:", "node p1_dw:"}) EXPECT_EQ(text.find(gone), std::string::npos) << gone << "\n" << text;
  for (const char* kept : {"node small_dw: FusedConv", "node small: FusedConv", "node shared_dw: FusedConv", "node shared: FusedConv"})
    EXPECT_NE(text.find(kept), std::string::npos) << kept << "\n" << text;
}

TEST(CompileFusePointwiseDepthwise, ProjectionsSameOutputsOnTheReferenceAndOnKilnsKernel) {
  Model before = projection_model(), after = before;
  run_pass("fuse_pointwise_depthwise", after);
  const std::vector<Tensor> inputs = {uniform_f32({1, 56, 56, 24}, 134), uniform_f32({1, 56, 56, 96}, 135), uniform_f32({1, 8, 8, 32}, 136)};
  expect_same_outputs(before, after, inputs, 1e-6);
  expect_fast_kernels(before, after, inputs, {"p3", "p1"}, "kiln.pointwise_depthwise_f32_");
}

// With `--precision fp16` (f16 weights) a stage fuses where it computes in f32 either way or
// gains least from f16 (gemm::f16_pointwise_fuses): MobileNetV2's third block (24 -> 144 on
// 56x56, the depthwise convolution, the projection back to 24 adding X) fuses whole ("block");
// the expansion of another 24 -> 144 fuses but its projection to 48 channels, which kiln's f16
// GEMM takes, stays apart ("to48"); so does a 56x56 expansion of 96 channels to 192 (T 2.4 MB:
// "wide_pw"); an expansion of 48 channels to 384 over 28x28, which the f16 GEMM would take
// alone, fuses ("mid"); a bf16 weight never fuses (on AMX oneDNN's bf16 nodes were the
// faster: "bf").
Model f16_block_model(bool whole_only) {
  Builder b;
  ValueId x = b.input("x", {1, 56, 56, 24});
  const std::vector<Attribute> pointwise = {attr("channels_last", int64_t{1}), attr("kernel_shape", std::vector<int64_t>{1, 1})};
  uint32_t seed = 150;
  auto conv1x1 = [&](const std::string& name, ValueId in, Tensor w, ValueId z = kNoValue) {
    const int64_t n = w.dim(0);
    std::vector<ValueId> ins = {in, b.constant(name + "_w", std::move(w)), b.constant(name + "_b", uniform_f32({n}, seed++))};
    if (z != kNoValue) ins.push_back(z);
    return b.op(name, "FusedConv", ins, name, pointwise);
  };
  auto depthwise = [&](const std::string& name, ValueId in, Tensor w) {
    const int64_t c = w.dim(0);
    return b.op(name, "FusedConv", {in, b.constant(name + "_w", std::move(w)), b.constant(name + "_b", uniform_f32({c}, seed++))}, name,
                {attr("channels_last", int64_t{1}), attr("group", c), attr("kernel_shape", std::vector<int64_t>{3, 3}),
                 attr("pads", std::vector<int64_t>{1, 1, 1, 1}), attr("activation", std::string("Clip")),
                 attr("activation_params", std::vector<double>{0, 6})});
  };
  auto f16 = [&](std::vector<int64_t> shape) { return to_f16(uniform_f32(std::move(shape), seed++)); };
  ValueId t = conv1x1("block_pw", x, f16({144, 24, 1, 1}));
  b.output(conv1x1("block", depthwise("block_dw", t, f16({144, 1, 3, 3})), f16({24, 144, 1, 1}), x));
  if (whole_only) return b.done();
  b.output(conv1x1("to48", depthwise("to48_dw", conv1x1("to48_pw", x, f16({144, 24, 1, 1})), f16({144, 1, 3, 3})), f16({48, 144, 1, 1})));
  ValueId wide = b.input("wide", {1, 56, 56, 96});
  b.output(depthwise("wide_dw", conv1x1("wide_pw", wide, f16({192, 96, 1, 1})), f16({192, 1, 3, 3})));
  ValueId mid = b.input("mid", {1, 28, 28, 48});
  b.output(depthwise("mid", conv1x1("mid_pw", mid, f16({384, 48, 1, 1})), f16({384, 1, 3, 3})));
  ValueId tb = conv1x1("bf_pw", x, to_bf16(uniform_f32({144, 24, 1, 1}, seed++)));
  b.output(depthwise("bf", tb, to_bf16(uniform_f32({144, 1, 3, 3}, seed++))));
  return b.done();
}

TEST(CompileFusePointwiseDepthwise, F16WeightsWhereTheStagesComputeInF32) {
  Model m = f16_block_model(false), before = m;
  PassResult r = run_pass("fuse_pointwise_depthwise", m);
  EXPECT_EQ(r.summary,
            "fused 3 pointwise convolutions into the depthwise convolution after it; 1 projection into the depthwise convolution "
            "before it");
  const std::string text = testing::nodes_text(m.graph);
  EXPECT_NE(text.find("node block: PointwiseDepthwiseConv(x, block_pw_w, block_pw_b, block_dw_w, block_dw_b, block_w, block_b, x) -> "
                      "(block)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("node to48_dw: PointwiseDepthwiseConv(x, to48_pw_w,"), std::string::npos) << text;
  EXPECT_NE(text.find("node mid: PointwiseDepthwiseConv(mid, mid_pw_w,"), std::string::npos) << text;
  for (const char* kept : {"node to48: FusedConv", "node wide_pw: FusedConv", "node wide_dw: FusedConv", "node bf_pw: FusedConv", "node bf: FusedConv"})
    EXPECT_NE(text.find(kept), std::string::npos) << kept << "\n" << text;
  expect_same_outputs(before, m, {uniform_f32({1, 56, 56, 24}, 160), uniform_f32({1, 56, 56, 96}, 161), uniform_f32({1, 28, 28, 48}, 163)},
                      1e-6);
}

// kiln's kernel runs the fused f16 block (its weights widened as they are packed) as the
// reference runs the three f16 nodes.
TEST(CompileFusePointwiseDepthwise, F16WeightsSameOutputsOnKilnsKernel) {
  Model before = f16_block_model(true), after = before;
  run_pass("fuse_pointwise_depthwise", after);
  expect_fast_kernels(before, after, {uniform_f32({1, 56, 56, 24}, 162)}, {"block"}, "kiln.pointwise_depthwise_f32_");
}

// ---- fuse_channel_scale --------------------------------------------------------------------

// Squeeze-excitation gates (a Sigmoid of [1, 1, 1, 32]) scaling a depthwise output before its
// projection: over 56x56 into 24 channels with a residual (fused), over 56x56 by a rank-1 scale
// (fused), over 8x8 into 24 channels (64 pixels, fewer than 4 a channel: kept), over 56x56 into
// 16 channels (kept: oneDNN's), and a scaled tensor a Neg reads too (kept).
Model channel_scale_model() {
  Builder b;
  ValueId d = b.input("d", {1, 56, 56, 32}), g = b.input("g", {1, 1, 1, 32}), small = b.input("small", {1, 8, 8, 32});
  ValueId z = b.input("z", {1, 56, 56, 24});
  ValueId gates = b.op("gates", "Sigmoid", {g}, "gates");
  ValueId w = b.constant("w", uniform_f32({24, 32, 1, 1}, 140)), bias = b.constant("bias", uniform_f32({24}, 141));
  const std::vector<Attribute> pointwise = {attr("channels_last", int64_t{1}), attr("kernel_shape", std::vector<int64_t>{1, 1})};
  b.output(b.op("proj", "FusedConv", {b.op("se", "Mul", {d, gates}, "se"), w, bias, z}, "proj", pointwise));
  ValueId flat = b.op("flat", "Reshape", {gates, b.constant("flat_shape", Tensor::from<int64_t>({1}, {32}))}, "flat");
  b.output(b.op("proj_flat", "FusedConv", {b.op("se_flat", "Mul", {flat, d}, "se_flat"), w}, "proj_flat", pointwise));
  b.output(b.op("proj_small", "FusedConv", {b.op("se_small", "Mul", {small, gates}, "se_small"), w}, "proj_small", pointwise));
  ValueId w16 = b.constant("w16", uniform_f32({16, 32, 1, 1}, 146));
  b.output(b.op("proj_16", "FusedConv", {b.op("se_16", "Mul", {d, gates}, "se_16"), w16}, "proj_16", pointwise));
  ValueId shared = b.op("se_shared", "Mul", {d, gates}, "se_shared");
  b.output(b.op("proj_shared", "FusedConv", {shared, w}, "proj_shared", pointwise));
  b.output(b.op("neg", "Neg", {shared}, "neg"));
  return b.done();
}

TEST(CompileFuseChannelScale, Golden) {
  Model m = channel_scale_model();
  PassResult r = run_pass("fuse_channel_scale", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary, "moved 2 per-channel scales of a pointwise convolution's input onto its weight");
  const std::string text = testing::nodes_text(m.graph);
  for (const char* want : {"node se_per_input_channel: Reshape(gates, se_per_input_channel_shape) -> (se_per_input_channel) sources=[\"se\"]\n",
                           "node se_weight: Mul(w, se_per_input_channel) -> (w_scaled) sources=[\"se\"]\n",
                           "node proj: FusedConv(d, w_scaled, bias, z) -> (proj) channels_last=1 kernel_shape=ints[1, 1] "
                           "sources=[\"se\", \"proj\"]\n",
                           "node se_flat_per_input_channel: Reshape(flat, se_flat_per_input_channel_shape)",
                           "node proj_flat: FusedConv(d, w_scaled"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  for (const char* gone : {"node se:", "node se_flat:"}) EXPECT_EQ(text.find(gone), std::string::npos) << gone << "\n" << text;
  for (const char* kept : {"node se_small: Mul", "node proj_small: FusedConv(se_small", "node se_16: Mul", "node proj_16: FusedConv(se_16",
                           "node se_shared: Mul", "node proj_shared: FusedConv(se_shared"})
    EXPECT_NE(text.find(kept), std::string::npos) << kept << "\n" << text;
  EXPECT_EQ(m.graph.value(m.graph.find_value("se_per_input_channel")).shape.str(), "1x32x1x1");
}

TEST(CompileFuseChannelScale, SameOutputsOnKilnsGemm) {
  Model before = channel_scale_model(), after = before;
  run_pass("fuse_channel_scale", after);
  const std::vector<Tensor> inputs = {uniform_f32({1, 56, 56, 32}, 142), uniform_f32({1, 1, 1, 32}, 143), uniform_f32({1, 8, 8, 32}, 144),
                                      uniform_f32({1, 56, 56, 24}, 145)};
  expect_same_outputs(before, after, inputs, 1e-6);
  expect_fast_kernels(before, after, inputs, {"proj", "proj_flat"}, "kiln.gemm_f32_");
}

TEST(CompileFuseChannelScale, NotForATargetWithoutAvx2) {
  Model m = channel_scale_model();
  Target baseline;
  baseline.cpu = CpuFeatures{};
  PassContext ctx{baseline, {}};
  auto r = fuse_channel_scale(m, ctx);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->changed);
}

}  // namespace
}  // namespace kiln
