// fuse_epilogues: golden text of what it makes, the fused graph's outputs against the
// original's on the reference kernels, and the patterns it must leave alone.
#include <gtest/gtest.h>

#include "compile/passes/fuse_epilogues.h"
#include "tests/unit/compile_test_util.h"

namespace kiln {
namespace {

using testing::make;
using testing::nodes_text;
using testing::ramp;

// Fuses, checks the graph still verifies and computes what it did (relative L2 <= 1e-6).
EpilogueFusions fuse_and_compare(Model& m, const std::vector<Tensor>& inputs) {
  EpilogueFusions stats;
  testing::expect_same_outputs(
      m,
      [&](Graph& g) {
        auto r = fuse_epilogues(g);
        ASSERT_TRUE(r.ok()) << r.error().message();
        stats = *r;
      },
      inputs, 1e-6);
  return stats;
}

TEST(CompileFuseEpilogues, ConvBiasReluResidualRelu) {
  testing::GraphBuilder b;
  ValueId x = b.input("x", {1, 3, 8, 8}), r = b.input("r", {1, 4, 8, 8});
  ValueId w = b.constant("w", ramp({4, 3, 3, 3}, 0.2f)), cb = b.constant("cb", ramp({4}, 0.3f));
  ValueId shift = b.constant("shift", ramp({4, 1, 1}, 0.5f));
  ValueId c = b.op("conv", "Conv", {x, w, cb}, {testing::attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  ValueId a = b.op("add", "Add", {c, shift});
  ValueId y = b.op("relu", "Relu", {a});
  ValueId s = b.op("res", "Add", {r, y});
  ValueId out = b.op("relu2", "Relu", {s});
  Model m = b.done({out});
  EpilogueFusions st = fuse_and_compare(m, {ramp({1, 3, 8, 8}), ramp({1, 4, 8, 8}, 0.7f)});
  EXPECT_EQ(st.fused, 1u);
  EXPECT_EQ(st.absorbed, 4u);
  EXPECT_EQ(nodes_text(m.graph),
            "node conv: FusedConv(x, w, add_bias, r) -> (relu2) activation=\"Relu\" pads=ints[1, 1, 1, 1] "
            "post_activation=\"Relu\" sources=[\"conv\", \"add\", \"relu\", \"res\", \"relu2\"]\n");
}

TEST(CompileFuseEpilogues, MatMulBiasSilu) {
  testing::GraphBuilder b;
  ValueId x = b.input("x", {2, 5, 6});
  ValueId w = b.constant("w", ramp({6, 8}, 0.2f)), bias = b.constant("bias", ramp({8}, 0.3f));
  ValueId mm = b.op("mm", "MatMul", {x, w});
  ValueId a = b.op("add", "Add", {mm, bias});
  ValueId sg = b.op("sig", "Sigmoid", {a});
  ValueId y = b.op("mul", "Mul", {a, sg});
  Model m = b.done({y});
  EpilogueFusions st = fuse_and_compare(m, {ramp({2, 5, 6})});
  EXPECT_EQ(st.absorbed, 3u);
  EXPECT_EQ(nodes_text(m.graph),
            "node mm: FusedMatMul(x, w, add_bias) -> (mul) activation=\"Silu\" sources=[\"mm\", \"add\", \"sig\", \"mul\"]\n");
}

TEST(CompileFuseEpilogues, GemmTransposedWeightsScaledBiasAndMul) {
  testing::GraphBuilder b;
  ValueId x = b.input("x", {3, 6});
  ValueId w = b.constant("w", ramp({8, 6}, 0.2f)), c = b.constant("c", ramp({8}, 0.3f));
  ValueId scale = b.constant("scale", ramp({8}, 0.9f));
  ValueId gm = b.op("gemm", "Gemm", {x, w, c},
                    {testing::attr("transB", int64_t{1}), testing::attr("beta", 0.5)});
  ValueId y = b.op("mul", "Mul", {gm, scale});
  ValueId z = b.op("clip", "Clip", {y, b.constant("lo", make<float>({}, {0})), b.constant("hi", make<float>({}, {6}))});
  Model m = b.done({z});
  EpilogueFusions st = fuse_and_compare(m, {ramp({3, 6})});
  EXPECT_EQ(st.absorbed, 2u);
  EXPECT_EQ(nodes_text(m.graph),
            "node gemm: FusedMatMul(x, w_t_scaled, mul_bias) -> (clip) activation=\"Clip\" activation_params=floats[0, 6] "
            "sources=[\"gemm\", \"mul\", \"clip\"]\n");
}

TEST(CompileFuseEpilogues, LeavesSharedAndOutputValuesAlone) {
  testing::GraphBuilder b;
  ValueId x = b.input("x", {1, 2, 4, 4});
  ValueId w = b.constant("w", ramp({2, 2, 1, 1}, 0.2f));
  ValueId c = b.op("conv", "Conv", {x, w});
  ValueId r1 = b.op("relu", "Relu", {c});    // c has two readers: nothing fuses into the conv
  ValueId t1 = b.op("tanh", "Tanh", {c});
  ValueId mm = b.op("mm", "MatMul", {r1, b.constant("k", ramp({4, 4}, 0.1f))});
  ValueId s = b.op("sig", "Sigmoid", {mm});  // mm is also a graph output: the Sigmoid stays
  Model m = b.done({t1, s, mm});
  const std::string before = nodes_text(m.graph);
  EpilogueFusions st = fuse_and_compare(m, {ramp({1, 2, 4, 4})});
  EXPECT_EQ(st.fused, 0u);
  EXPECT_EQ(nodes_text(m.graph), before);
}

TEST(CompileFuseEpilogues, EveryActivationAndResidualWithoutActivation) {
  for (const char* op : {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu"}) {
    testing::GraphBuilder b;
    ValueId x = b.input("x", {4, 6}), r = b.input("r", {4, 8});
    ValueId mm = b.op("mm", "MatMul", {x, b.constant("w", ramp({6, 8}, 0.2f))});
    ValueId res = b.op("res", "Add", {mm, r});  // residual first: the activation becomes the post one
    ValueId y = b.op("act", op, {res});
    Model m = b.done({y});
    EpilogueFusions st = fuse_and_compare(m, {ramp({4, 6}), ramp({4, 8}, 0.6f)});
    EXPECT_EQ(st.absorbed, 2u) << op;
    ASSERT_EQ(m.graph.nodes.size(), 1u) << op;
    EXPECT_EQ(m.graph.nodes[0].attr_string("post_activation", ""), op);
    EXPECT_FALSE(m.graph.nodes[0].has_attr("activation")) << op;
  }
}

}  // namespace
}  // namespace kiln
