// The channels_last pass (compile/passes/channels_last.cc): the golden text of a small CNN, a
// symbolic batch, every kind of node it converts against the reference kernels, an image read
// as it comes by kiln.direct_conv, and what it leaves alone.
#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/cpu/rows.h"
#include "runtime/session.h"
#include "tests/unit/compile_passes_test_util.h"

namespace kiln {
namespace {

using namespace passes_test;

// ---- channels_last ------------------------------------------------------------------------

// Conv -> Relu -> Add of a per-channel constant -> GlobalAveragePool, with the Conv's output a
// graph output too (so its Transpose back stays).
Model small_cnn() {
  Builder b;
  ValueId x = b.input("x", {1, 3, 6, 5});
  ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({4, 3, 3, 3}, 81)), b.constant("b", uniform_f32({4}, 82))}, "y",
                   {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  ValueId r = b.op("relu", "Relu", {y}, "r");
  ValueId a = b.op("add", "Add", {r, b.constant("shift", uniform_f32({4, 1, 1}, 83))}, "a");
  b.output(b.op("gap", "GlobalAveragePool", {a}, "out"));
  b.output(y);
  return b.done();
}

TEST(CompileChannelsLast, ConvertsTheRegionWithTransposesAtItsEdges) {
  Model m = small_cnn();
  EXPECT_EQ(run_pass("channels_last", m).summary, "ran 4 nodes channels-last, with 1 transpose in and 2 transposes out");
  run_pass("eliminate_dead", m);
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[1,3,6,5]\n"
            "  const w: f32[4,3,3,3]\n"
            "  const b: f32[4]\n"
            "  value y: f32[1,4,6,5]\n"
            "  value out: f32[1,4,1,1]\n"
            "  value x_nhwc: f32[1,6,5,3]\n"
            "  value y_nhwc: f32[1,6,5,4]\n"
            "  value r_nhwc: f32[1,6,5,4]\n"
            "  const shift_nhwc: f32[1,1,1,4]\n"
            "  value a_nhwc: f32[1,6,5,4]\n"
            "  value out_nhwc: f32[1,1,1,4]\n"
            "  node x_nhwc_transpose: Transpose(x) -> (x_nhwc) perm=ints[0, 2, 3, 1]\n"
            "  node conv: FusedConv(x_nhwc, w, b) -> (y_nhwc) channels_last=1 pads=ints[1, 1, 1, 1] sources=[\"conv\"]\n"
            "  node y_transpose: Transpose(y_nhwc) -> (y) perm=ints[0, 3, 1, 2]\n"
            "  node relu: Relu(y_nhwc) -> (r_nhwc) sources=[\"relu\"]\n"
            "  node add: Add(r_nhwc, shift_nhwc) -> (a_nhwc) sources=[\"add\"]\n"
            "  node gap: GlobalAveragePool(a_nhwc) -> (out_nhwc) channels_last=1 sources=[\"gap\"]\n"
            "  node out_transpose: Transpose(out_nhwc) -> (out) perm=ints[0, 3, 1, 2]\n"
            "  output out\n"
            "  output y\n");
  EXPECT_FALSE(run_pass("channels_last", m).changed) << "a second run finds nothing to convert";
}

// A batch left open (no --input-shape): symbolic dims permute like the others, and the model
// runs on any batch as the channels-first one does.
TEST(CompileChannelsLast, ConvertsWithASymbolicBatch) {
  Builder b;
  ValueId x = b.input("x", sym_shape({Dim::sym("n"), Dim::known(3), Dim::known(6), Dim::known(5)}));
  ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({4, 3, 3, 3}, 81)), b.constant("b", uniform_f32({4}, 82))}, "y",
                   {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  ValueId r = b.op("relu", "Relu", {y}, "r");
  b.output(b.op("gap", "GlobalAveragePool", {r}, "out"));
  Model before = b.done(), after = before;
  EXPECT_EQ(run_pass("channels_last", after).summary, "ran 3 nodes channels-last, with 1 transpose in and 1 transpose out");
  run_pass("eliminate_dead", after);
  EXPECT_EQ(after.graph.value(after.graph.find_value("r_nhwc")).shape.str(), "nx6x5x4");
  for (int64_t n : {1, 3}) {
    const std::vector<Tensor> inputs = {uniform_f32({n, 3, 6, 5}, 99)};
    const std::vector<Tensor> want = run_reference(before, inputs);
    auto s = Session::create(after);
    ASSERT_TRUE(s.ok()) << s.error().message();
    auto got = (*s)->run(inputs);
    ASSERT_TRUE(got.ok()) << got.error().message();
    EXPECT_LE(relative_l2((*got)[0], want[0]), 1e-5) << "batch " << n;
  }
}

// Every kind of node the pass converts: an SE block (pool, 1x1 convs, broadcast Mul), a
// residual FusedConv whose Z comes from outside the region, a depthwise conv, MaxPool,
// AveragePool, Split, Concat, Resize by scales and by sizes, a rank-1 constant broadcast along
// W, Clip with bounds. On the reference kernels the outputs are bit-equal (the channels-last
// reference kernels transpose around the same code); on the default kernels (oneDNN's NHWC
// kernels) within 1e-5.
Model layout_zoo() {
  Builder b;
  ValueId x = b.input("x", {2, 8, 10, 12});
  ValueId skip = b.input("skip", {2, 8, 10, 12});
  auto conv = [&](const std::string& name, ValueId in, int64_t cin, int64_t cout, int64_t k, int64_t group, uint32_t seed) {
    const int64_t p = k / 2;
    return b.op(name, "Conv", {in, b.constant(name + "_w", uniform_f32({cout, cin / group, k, k}, seed, -0.3f, 0.3f))}, name + "_y",
                {attr("pads", std::vector<int64_t>{p, p, p, p}), attr("group", group)});
  };
  ValueId c1 = conv("c1", x, 8, 8, 3, 1, 90);
  Node& fused = b.g().nodes.back();  // a residual FusedConv: Z from a graph input
  fused.op = "FusedConv";
  fused.inputs.push_back(b.constant("c1_b", uniform_f32({8}, 91)));
  fused.inputs.push_back(skip);
  fused.set_attr("activation", std::string("Relu"));
  ValueId dw = conv("dw", c1, 8, 8, 3, 8, 92);
  ValueId se = b.op("se_pool", "GlobalAveragePool", {dw}, "se_pool_y");
  ValueId se1 = b.op("se_sig", "Sigmoid", {conv("se_c", se, 8, 8, 1, 1, 93)}, "se_sig_y");
  ValueId scaled = b.op("se_mul", "Mul", {dw, se1}, "se_mul_y");
  ValueId mp = b.op("mp", "MaxPool", {scaled}, "mp_y",
                    {attr("kernel_shape", std::vector<int64_t>{3, 3}), attr("strides", std::vector<int64_t>{2, 2}),
                     attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  ValueId ap = b.op("ap", "AveragePool", {scaled}, "ap_y",
                    {attr("kernel_shape", std::vector<int64_t>{2, 2}), attr("strides", std::vector<int64_t>{2, 2})});
  ValueId cat = b.op("cat", "Concat", {mp, ap}, "cat_y", {attr("axis", int64_t{1})});
  ValueId split_sizes = b.constant("split_sizes", make<int64_t>({2}, {5, 11}));
  ValueId part = b.op("split", "Split", {cat, split_sizes}, "split_a", {attr("axis", int64_t{-3})});
  b.g().nodes.back().outputs.push_back(b.g().add_value("split_b", DType::undefined));
  const ValueId part_b = b.g().nodes.back().outputs[1];
  ValueId up = b.op("up", "Resize", {part, kNoValue, b.constant("scales", make<float>({4}, {1, 1, 2, 2}))}, "up_y");
  ValueId up2 = b.op("up2", "Resize", {part_b, kNoValue, kNoValue, b.constant("sizes", make<int64_t>({4}, {2, 11, 7, 9}))}, "up2_y",
                     {attr("mode", std::string("linear"))});
  ValueId w_bias = b.op("wbias", "Sub", {up, b.constant("per_w", uniform_f32({12}, 94))}, "wbias_y");
  ValueId clipped = b.op("clip", "Clip", {w_bias, b.constant("lo", make<float>({}, {-0.5f})), b.constant("hi", make<float>({}, {0.5f}))},
                         "clip_y");
  b.output(clipped);
  b.output(up2);
  b.output(c1);
  return b.done();
}

TEST(CompileChannelsLast, SameOutputs) {
  Model before = layout_zoo(), after = before;
  PassResult r = run_pass("channels_last", after);
  EXPECT_EQ(r.summary, "ran 14 nodes channels-last, with 2 transposes in and 3 transposes out");
  run_pass("eliminate_dead", after);
  for (const Node& n : after.graph.nodes) {  // every node but the Transposes reads channels-last activations
    if (n.op != "Transpose") {
      EXPECT_NE(after.graph.value(n.inputs[0]).name.find("_nhwc"), std::string::npos) << n.name;
    }
  }
  EXPECT_EQ(count_ops(after.graph, "Transpose"), 5u);
  const std::vector<Tensor> inputs = {uniform_f32({2, 8, 10, 12}, 95), uniform_f32({2, 8, 10, 12}, 96)};
  expect_same_outputs(before, after, inputs, 0);
  std::vector<Tensor> want = run_reference(before, inputs);
  auto s = Session::create(after);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto got = (*s)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().message();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(relative_l2((*got)[i], want[i]), 1e-5) << "output " << i;
}

// An image model's first layer that kiln.direct_conv runs reads the graph input as it comes
// (x_channels_first): no Transpose in, the outputs as before (on the reference kernels bit for
// bit, on the chosen kernel within 1e-5). Eight input channels (past the kernel's four), an
// input that is not the graph's, a target without AVX2 (no such kernel) and --precision bf16
// on AMX (the first layer on bf16 tiles) keep the Transpose.
Model image_cnn(int64_t channels, bool computed_input = false, int64_t window = 3, bool open_batch = false) {
  Builder b;
  ValueId x = open_batch ? b.input("x", Shape({Dim::sym("N"), Dim::known(channels), Dim::known(16), Dim::known(15)}))
                         : b.input("x", {1, channels, 16, 15});
  if (computed_input) x = b.op("neg", "Neg", {x}, "x_neg");
  const int64_t pad = window / 2;
  ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({32, channels, window, window}, 84)), b.constant("b", uniform_f32({32}, 85))},
                   "y", {attr("pads", std::vector<int64_t>{pad, pad, pad, pad}), attr("strides", std::vector<int64_t>{2, 2})});
  ValueId r = b.op("relu", "Relu", {y}, "r");
  b.output(b.op("gap", "GlobalAveragePool", {r}, "out"));
  return b.done();
}

TEST(CompileChannelsLast, AnImageIsReadAsItComes) {
  if (!cpu::best_isa(CpuFeatures::host())) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
  Model before = image_cnn(3), after = before;
  EXPECT_EQ(run_pass("channels_last", after).summary, "ran 3 nodes channels-last, with 0 transposes in and 1 transpose out");
  run_pass("eliminate_dead", after);
  EXPECT_EQ(count_ops(after.graph, "Transpose"), 1u) << "the pooled output's, back";
  const auto conv = std::find_if(after.graph.nodes.begin(), after.graph.nodes.end(), [](const Node& n) { return n.name == "conv"; });
  ASSERT_NE(conv, after.graph.nodes.end());
  EXPECT_EQ(conv->attr_int("x_channels_first", 0), 1);
  EXPECT_EQ(after.graph.value(conv->inputs[0]).name, "x");
  const std::vector<Tensor> inputs = {uniform_f32({1, 3, 16, 15}, 86)};
  expect_same_outputs(before, after, inputs, 0);
  auto s = Session::create(after);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto got = (*s)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().message();
  bool direct = false;
  for (const NodeKernel& k : (*s)->kernels()) direct = direct || k.name.rfind("kiln.direct_conv", 0) == 0;
  EXPECT_TRUE(direct) << "the first layer runs on kiln.direct_conv, the one kernel that reads it";
  EXPECT_LE(relative_l2((*got)[0], run_reference(before, inputs)[0]), 1e-5);
  // The Transpose stays: eight channels, a computed input, a target without AVX2.
  for (Model m : {image_cnn(8), image_cnn(3, true)})
    EXPECT_NE(run_pass("channels_last", m).summary.find("with 1 transpose in"), std::string::npos) << compact(m.graph);
  Model old = image_cnn(3);
  Target plain;
  plain.cpu = CpuFeatures{};
  PassContext ctx{plain, {}};
  Result<PassResult> r = find_pass("channels_last")->run(old, ctx);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_NE(r->summary.find("with 1 transpose in"), std::string::npos) << r->summary;
  // --precision bf16 on AMX: a first layer whose window fills the tiles (7x7 over RGB, 147
  // steps) goes to bf16 tiles after the Transpose instead (a CPU told it has AMX; f16, bf16
  // without AMX and a 3x3 window of 27 steps keep the direct read).
  for (DType precision : {DType::bf16, DType::f16})
    for (bool amx : {true, false})
      for (int64_t k : {7, 3}) {
        Model m = image_cnn(3, false, k);
        Target t;
        t.cpu = CpuFeatures::host();
        t.cpu.amx = amx;
        PassContext c{t, {}};
        c.precision = precision;
        Result<PassResult> got = find_pass("channels_last")->run(m, c);
        ASSERT_TRUE(got.ok()) << got.error().message();
        const bool transposed = precision == DType::bf16 && amx && k == 7;
        EXPECT_EQ(got->summary.find("with 1 transpose in") != std::string::npos, transposed)
            << dtype_name(precision) << (amx ? " with AMX, " : " without AMX, ") << k << "x" << k << ": " << got->summary;
      }
}


// The same with the batch open (compiled without --input-shape): the kernel is asked with the
// batch at 1, and each batch's plan, an empty one's too, runs what the shaped compile runs.
TEST(CompileChannelsLast, AnImageOfOpenBatchIsReadAsItComes) {
  if (!cpu::best_isa(CpuFeatures::host())) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
  Model before = image_cnn(3, false, 3, true), after = before;
  EXPECT_EQ(run_pass("channels_last", after).summary, "ran 3 nodes channels-last, with 0 transposes in and 1 transpose out");
  run_pass("eliminate_dead", after);
  const auto conv = std::find_if(after.graph.nodes.begin(), after.graph.nodes.end(), [](const Node& n) { return n.name == "conv"; });
  ASSERT_NE(conv, after.graph.nodes.end());
  EXPECT_EQ(conv->attr_int("x_channels_first", 0), 1);
  auto s = Session::create(after);
  ASSERT_TRUE(s.ok()) << s.error().message();
  for (int64_t batch : {2, 0, 1}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const std::vector<Tensor> inputs = {uniform_f32({batch, 3, 16, 15}, 87)};
    auto got = (*s)->run(inputs);
    ASSERT_TRUE(got.ok()) << got.error().message();
    EXPECT_EQ((*got)[0].shape(), (std::vector<int64_t>{batch, 32, 1, 1}));
    if (batch == 0) continue;
    bool direct = false;
    for (const NodeKernel& k : (*s)->kernels()) direct = direct || k.name.rfind("kiln.direct_conv", 0) == 0;
    EXPECT_TRUE(direct);
    EXPECT_LE(relative_l2((*got)[0], run_reference(before, inputs)[0]), 1e-5);
  }
}
TEST(CompileChannelsLast, LeavesWhatItCannotConvert) {
  auto unchanged = [](Model m, const char* why) {
    const std::string text = compact(m.graph);
    EXPECT_FALSE(run_pass("channels_last", m).changed) << why;
    EXPECT_EQ(compact(m.graph), text) << why;
  };
  {
    Builder b;
    b.output(b.op("conv", "Conv", {b.input("x", {1, 2, 9}), b.constant("w", uniform_f32({3, 2, 3}, 97))}, "y"));
    unchanged(b.done(), "a 1-D convolution");
  }
  {
    Builder b;
    b.output(b.op("conv", "Conv", {b.input("x", Shape::unknown_rank()), b.constant("w", uniform_f32({3, 2, 3, 3}, 98))}, "y"));
    unchanged(b.done(), "an input of unknown rank");
  }
  {
    Builder b;
    ValueId y = b.op("mp", "MaxPool", {b.input("x", {1, 2, 4, 4})}, "y", {attr("kernel_shape", std::vector<int64_t>{2, 2})});
    b.g().nodes.back().outputs.push_back(b.g().add_value("indices", DType::undefined));
    b.output(y);
    b.output(b.g().nodes.back().outputs[1]);
    unchanged(b.done(), "MaxPool's Indices");
  }
  {
    Builder b;
    b.output(b.op("relu", "Relu", {b.input("x", {1, 2, 4, 4})}, "y"));
    unchanged(b.done(), "no convolution or pool to start a region");
  }
}

}  // namespace
}  // namespace kiln
