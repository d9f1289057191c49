// gather_rows_early: a ViT-style last block read through its class token computes that token
// alone, and a decoder's last-token Slice runs its head on one row, with the outputs unchanged;
// the nodes whose rows are not row-wise keep the Gather.
#include <limits>
#include <tuple>

#include "tests/unit/compile_passes_test_util.h"

namespace kiln {
namespace {

using namespace passes_test;

struct BlockOptions {
  bool causal = false;              // the Attention masks causally: a query's row depends on its position
  bool output_read_too = false;     // the block's output is also a graph output
  int64_t norm_axis = -1;           // the final LayerNorm's first axis (1: over tokens and features)
  int64_t gather_axis = 1;          // 2: the features, not rows
  std::vector<int64_t> rows = {};   // empty: the scalar 0 (the class token, axis removed)
};

// x [1, 5, 8] -> LN -> Q, K, V products -> Attention (2 heads) -> projection + x -> LN -> fc1
// (GELU) -> fc2 + residual -> LN -> Gather(rows, axis) -> head.
Model block(const BlockOptions& o) {
  Builder b;
  ValueId x = b.input("x", {1, 5, 8});
  uint32_t seed = 20;
  auto weight = [&](const std::string& name, int64_t k, int64_t n) { return b.constant(name, uniform_f32({k, n}, seed++, -0.5f, 0.5f)); };
  auto norm = [&](const std::string& name, ValueId in, int64_t axis) {
    std::vector<int64_t> shape = axis == -1 ? std::vector<int64_t>{8} : std::vector<int64_t>{5, 8};
    return b.op(name, "LayerNormalization", {in, b.constant(name + "_scale", uniform_f32(shape, seed++, 0.5f, 1.5f)),
                                             b.constant(name + "_bias", uniform_f32(shape, seed++))},
                name + "_out", {attr("axis", axis)});
  };
  ValueId h = norm("ln1", x, -1);
  ValueId q = b.op("q", "FusedMatMul", {h, weight("wq", 8, 8)}, "q_out");
  ValueId k = b.op("k", "FusedMatMul", {h, weight("wk", 8, 8)}, "k_out");
  ValueId v = b.op("v", "FusedMatMul", {h, weight("wv", 8, 8)}, "v_out");
  std::vector<Attribute> att = {attr("q_num_heads", int64_t{2}), attr("kv_num_heads", int64_t{2}), attr("scale", 0.5)};
  if (o.causal) att.push_back(attr("is_causal", int64_t{1}));
  ValueId a = b.op("attention", "Attention", {q, k, v}, "attention_out", att);
  ValueId x1 = b.op("proj", "FusedMatMul", {a, weight("wp", 8, 8), b.constant("bp", uniform_f32({8}, seed++)), x}, "x1");
  ValueId f = b.op("fc1", "FusedMatMul", {norm("ln2", x1, -1), weight("w1", 8, 16), b.constant("b1", uniform_f32({16}, seed++))}, "f",
                   {attr("activation", std::string("Gelu"))});
  ValueId x2 = b.op("fc2", "FusedMatMul", {f, weight("w2", 16, 8), b.constant("b2", uniform_f32({8}, seed++)), x1}, "x2");
  ValueId rows = o.rows.empty() ? b.constant("cls", Tensor::from<int64_t>({}, {0})) : b.constant("cls", testing::ints(o.rows));
  ValueId token = b.op("token", "Gather", {norm("ln", x2, o.norm_axis), rows}, "token", {attr("axis", o.gather_axis)});
  const int64_t width = o.gather_axis == 2 ? 5 : 8;
  b.output(b.op("head", "FusedMatMul", {token, weight("wh", width, 3)}, "logits"));
  if (o.output_read_too) b.output(x2);
  return b.done();
}

std::string op_of(const Graph& g, const std::string& value) {
  for (const Node& n : g.nodes)
    for (ValueId out : n.outputs)
      if (out >= 0 && g.value(out).name == value) return n.op;
  return "";
}

TEST(CompileGatherRowsEarly, TheClassTokenAloneRunsThroughTheLastBlock) {
  for (bool scalar : {true, false}) {
    SCOPED_TRACE(scalar ? "the class token, axis removed" : "rows 0 and 3");
    BlockOptions o;
    if (!scalar) o.rows = {0, 3};
    Model before = block(o);
    Model after = before;
    // ln, fc2, fc1, ln2, proj, attention and q: K and V read all of ln1's rows, which stops it.
    EXPECT_EQ(run_pass("gather_rows_early", after).summary, "moved row Gathers / Slices in front of 7 nodes");
    const Graph& g = after.graph;
    const int64_t kept = scalar ? 1 : 2;
    for (const char* value : {"q_out", "attention_out", "x1", "ln2_out", "f", "x2"})
      EXPECT_EQ(g.value(g.find_value(std::string(value) + "_rows")).shape.concrete(), (std::vector<int64_t>{1, kept, value[0] == 'f' ? 16 : 8}))
          << value;
    // K and V, and the first norm, still see every token; the copies of x1's Gather merged.
    EXPECT_EQ(g.value(g.find_value("k_out")).shape.concrete(), (std::vector<int64_t>{1, 5, 8}));
    EXPECT_EQ(op_of(g, "ln1_out_rows"), "Gather");
    EXPECT_EQ(op_of(g, "x1_rows"), "FusedMatMul");
    EXPECT_EQ(count_ops(g, "Gather"), 2u);  // ln1's rows for Q and x's for the residual (x1's two merged, then moved)
    EXPECT_EQ(count_ops(g, "Squeeze"), scalar ? 1u : 0u);
    expect_same_outputs(before, after, {uniform_f32({1, 5, 8}, 3)}, 1e-6);
  }
}

TEST(CompileGatherRowsEarly, StopsWhereRowsAreNotRowWise) {
  {  // causal attention: a query's row depends on where it sits
    BlockOptions o;
    o.causal = true;
    Model before = block(o);
    Model after = before;
    EXPECT_EQ(run_pass("gather_rows_early", after).summary, "moved row Gathers / Slices in front of 5 nodes");
    EXPECT_EQ(after.graph.value(after.graph.find_value("attention_out")).shape.concrete(), (std::vector<int64_t>{1, 5, 8}));
    expect_same_outputs(before, after, {uniform_f32({1, 5, 8}, 4)}, 1e-6);
  }
  {  // every row of the block's output is a graph output: the final norm alone moves
    BlockOptions o;
    o.output_read_too = true;
    Model before = block(o);
    Model after = before;
    EXPECT_EQ(run_pass("gather_rows_early", after).summary, "moved row Gathers / Slices in front of 1 node");
    EXPECT_EQ(op_of(after.graph, "x2_rows"), "Gather");
    expect_same_outputs(before, after, {uniform_f32({1, 5, 8}, 5)}, 1e-6);
  }
  BlockOptions over_tokens, features;
  over_tokens.norm_axis = 1;  // the final norm mixes the tokens
  features.gather_axis = 2;   // a Gather of features, not rows
  for (const BlockOptions& o : {over_tokens, features}) {
    Model m = block(o);
    const std::string text = compact(m.graph);
    EXPECT_FALSE(run_pass("gather_rows_early", m).changed);
    EXPECT_EQ(compact(m.graph), text);
  }
}

// A decoder exported to return the last token's logits: Slice(hidden, -1:, axis 1) after the
// final norm and the LM head; the Slice goes in front of both. A strided Slice (rows 0, 2, 4)
// does the same; a Slice of the features moves nothing.
TEST(CompileGatherRowsEarly, SlicesOfRowsMoveToo) {
  auto build = [](std::vector<int64_t> starts, std::vector<int64_t> ends, int64_t axis, std::vector<int64_t> steps) {
    Builder b;
    ValueId x = b.input("x", {1, 5, 8});
    ValueId h = b.op("norm", "RMSNormalization", {x, b.constant("scale", uniform_f32({8}, 30, 0.5f, 1.5f))}, "h", {attr("axis", int64_t{-1})});
    ValueId logits = b.op("head", "FusedMatMul", {h, b.constant("w", uniform_f32({8, 11}, 31))}, "logits");
    b.output(b.op("last", "Slice", {logits, b.constant("starts", testing::ints(starts)), b.constant("ends", testing::ints(ends)),
                                    b.constant("axes", testing::ints({axis})), b.constant("steps", testing::ints(steps))},
                  "last_logits"));
    return b.done();
  };
  const int64_t end = std::numeric_limits<int64_t>::max();
  for (auto [starts, steps, rows] : {std::tuple{int64_t{-1}, int64_t{1}, int64_t{1}}, std::tuple{int64_t{0}, int64_t{2}, int64_t{3}}}) {
    SCOPED_TRACE("step " + std::to_string(steps));
    Model before = build({starts}, {end}, 1, {steps});
    Model after = before;
    EXPECT_EQ(run_pass("gather_rows_early", after).summary, "moved row Gathers / Slices in front of 2 nodes");
    const Graph& g = after.graph;
    EXPECT_EQ(op_of(g, "x_rows"), "Slice");
    EXPECT_EQ(g.value(g.find_value("x_rows")).shape.concrete(), (std::vector<int64_t>{1, rows, 8}));
    EXPECT_EQ(op_of(g, "last_logits"), "FusedMatMul");
    expect_same_outputs(before, after, {uniform_f32({1, 5, 8}, 7)}, 0);
  }
  Model features = build({0}, {4}, 2, {1});
  EXPECT_FALSE(run_pass("gather_rows_early", features).changed);
}

// Two equal Gathers of one value, one of them a graph output: the moved node writes that one,
// so the graph's outputs keep their names, and the other's reader reads it.
TEST(CompileGatherRowsEarly, EqualGathersMergeIntoTheGraphOutput) {
  Builder b;
  ValueId x = b.input("x", {2, 6, 4});
  ValueId r = b.op("relu", "Relu", {x}, "r");
  ValueId rows = b.constant("rows", testing::ints({1, 4}));
  ValueId first = b.op("first", "Gather", {r, rows}, "first", {attr("axis", int64_t{1})});
  ValueId second = b.op("second", "Gather", {r, rows}, "picked", {attr("axis", int64_t{1})});
  b.output(b.op("neg", "Neg", {first}, "negated"));
  b.output(second);
  Model before = b.done();
  Model after = before;
  EXPECT_EQ(run_pass("gather_rows_early", after).summary, "moved row Gathers / Slices in front of 1 node");
  const Graph& g = after.graph;
  ASSERT_EQ(g.outputs.size(), 2u);
  EXPECT_EQ(g.value(g.outputs[0]).name, "negated");
  EXPECT_EQ(g.value(g.outputs[1]).name, "picked");
  EXPECT_EQ(op_of(g, "picked"), "Relu");
  expect_same_outputs(before, after, {uniform_f32({2, 6, 4}, 6)}, 0);
}

}  // namespace
}  // namespace kiln
