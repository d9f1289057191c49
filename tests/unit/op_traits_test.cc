// The op table's traits: FLOP counts of the dense ops in their float, integer and QLinear
// forms, prepackable inputs, and consistency of every op's traits with its arity.
#include <gtest/gtest.h>

#include "formats/op_schema.h"
#include "formats/summary.h"

namespace kiln {
namespace {

Shape dims(std::vector<int64_t> d) { return Shape::of(d); }

// One node `op` with the given input shapes (null: omitted) and output shape.
Graph one_node(const std::string& op, std::vector<std::optional<Shape>> in, Shape out, DType dt = DType::f32) {
  Graph g;
  Node n{.name = "n", .op = op};
  for (size_t i = 0; i < in.size(); ++i)
    n.inputs.push_back(in[i] ? g.add_value("in" + std::to_string(i), dt, *in[i]) : kNoValue);
  n.outputs = {g.add_value("y", dt, std::move(out))};
  g.add_node(std::move(n));
  return g;
}

TEST(OpTraits, DenseOpsCountTwoFlopsPerMultiplyAccumulate) {
  // Conv 1x8x16x16 -> 1x4x14x14 with 4x8x3x3 weights: 784 outputs x 72 MACs.
  const int64_t conv = 2 * 4 * 14 * 14 * 8 * 3 * 3;
  Graph c = one_node("Conv", {dims({1, 8, 16, 16}), dims({4, 8, 3, 3})}, dims({1, 4, 14, 14}));
  EXPECT_EQ(node_flops(c.nodes[0], c), conv);
  Graph ci = one_node("ConvInteger", {dims({1, 8, 16, 16}), dims({4, 8, 3, 3})}, dims({1, 4, 14, 14}), DType::i32);
  EXPECT_EQ(node_flops(ci.nodes[0], ci), conv);
  Shape s = dims({});
  Graph qc = one_node("QLinearConv", {dims({1, 8, 16, 16}), s, s, dims({4, 8, 3, 3}), s, s, s, s}, dims({1, 4, 14, 14}), DType::u8);
  EXPECT_EQ(node_flops(qc.nodes[0], qc), conv);

  // MatMul 2x3x5 @ 5x7: 42 outputs x 5 MACs; Gemm with transA takes K from A's dim 0.
  Graph mm = one_node("MatMul", {dims({2, 3, 5}), dims({5, 7})}, dims({2, 3, 7}));
  EXPECT_EQ(node_flops(mm.nodes[0], mm), 2 * 42 * 5);
  Graph qm = one_node("QLinearMatMul", {dims({2, 3, 5}), s, s, dims({5, 7}), s, s, s, s}, dims({2, 3, 7}), DType::u8);
  EXPECT_EQ(node_flops(qm.nodes[0], qm), 2 * 42 * 5);
  Graph gemm = one_node("Gemm", {dims({5, 3}), dims({5, 7})}, dims({3, 7}));
  gemm.nodes[0].set_attr("transA", int64_t{1});
  EXPECT_EQ(node_flops(gemm.nodes[0], gemm), 2 * 21 * 5);

  // Not counted: elementwise ops, and dense ops whose weights are missing.
  Graph relu = one_node("Relu", {dims({4})}, dims({4}));
  EXPECT_EQ(node_flops(relu.nodes[0], relu), 0);
  Graph no_w = one_node("Conv", {dims({1, 8, 16, 16}), std::nullopt}, dims({1, 4, 14, 14}));
  EXPECT_EQ(node_flops(no_w.nodes[0], no_w), 0);
}

TEST(OpTraits, EveryOpsTraitsFitItsArity) {
  for (const auto& [domain, schema] : core_ops().all()) {
    for (int slot : schema->traits.prepack_inputs) {
      EXPECT_GE(slot, 0) << schema->name;
      if (schema->max_inputs != kVariadic) {
        EXPECT_LT(slot, schema->max_inputs) << schema->name;
      }
    }
    if (schema->traits.pass_through != OpTraits::PassThrough::none) {
      EXPECT_GE(schema->max_outputs, 1) << schema->name;
    }
  }
  const OpSchema* conv = core_ops().find("", "Conv");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->traits.prepack_inputs, std::vector<int>{1});
  EXPECT_EQ(core_ops().find("", "QLinearMatMul")->traits.prepack_inputs, std::vector<int>{3});
  EXPECT_EQ(core_ops().find("", "Reshape")->traits.pass_through, OpTraits::PassThrough::first);
  EXPECT_NE(core_ops().find("", "Gather")->traits.index_bound, nullptr);
}

}  // namespace
}  // namespace kiln
