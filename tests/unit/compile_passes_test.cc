// The compile passes (compile/passes/) and the pipeline. Every pass gets three kinds of test:
// a golden text test (a small graph, the pass, the expected text form), a before/after test
// (the graph run on the reference kernels before and after the pass, on random inputs, gives
// the same outputs: within relative L2 1e-5 for the folding passes, exactly for the others),
// and the cases the pass must leave alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <sstream>

#include "compile/pass.h"
#include "compile/pipeline.h"
#include "formats/infer.h"
#include "formats/text.h"
#include "formats/verify.h"
#include "runtime/plan.h"
#include "runtime/session.h"
#include "tests/unit/compile_passes_test_util.h"

namespace kiln {
namespace {

using namespace passes_test;

// ---- the pass table ---------------------------------------------------------------------

TEST(CompilePassTable, NamesAreUniqueAndFound) {
  std::set<std::string_view> names;
  for (const PassInfo& p : all_passes()) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
    EXPECT_FALSE(p.summary.empty()) << p.name;
    EXPECT_EQ(find_pass(p.name), &p);
  }
  EXPECT_EQ(names.size(), 27u);
  EXPECT_EQ(find_pass("no_such_pass"), nullptr);
}

// ---- specialize_shapes -------------------------------------------------------------------

// x and y share `batch`; fixing x's shape fixes y's and everything computed from them.
Model shared_batch_model() {
  Builder b;
  ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::known(4)}));
  ValueId y = b.input("y", sym_shape({Dim::sym("batch"), Dim::known(4)}));
  ValueId s = b.op("add", "Add", {x, y}, "s");
  b.output(b.op("relu", "Relu", {s}, "out"));
  return b.done();
}

TEST(CompileSpecializeShapes, BindsASymbolEverywhere) {
  Model m = shared_batch_model();
  PassResult r = run_pass("specialize_shapes", m, {{"x", Shape::of(std::vector<int64_t>{3, 4})}});
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary, "fixed 1 input (batch=3); 4 of 4 values have concrete shapes (0 before)");
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[3,4]\n"
            "  input y: f32[3,4]\n"
            "  value s: f32[3,4]\n"
            "  value out: f32[3,4]\n"
            "  node add: Add(x, y) -> (s) sources=[\"add\"]\n"
            "  node relu: Relu(s) -> (out) sources=[\"relu\"]\n"
            "  output out\n");
}

TEST(CompileSpecializeShapes, SameOutputs) {
  Model before = shared_batch_model();
  Model after = before;
  run_pass("specialize_shapes", after, {{"y", Shape::of(std::vector<int64_t>{3, 4})}});
  expect_same_outputs(before, after, {uniform_f32({3, 4}, 1), uniform_f32({3, 4}, 2)}, 0);
}

TEST(CompileSpecializeShapes, NothingToDoWithoutShapes) {
  Model m = shared_batch_model();
  const std::string text = compact(m.graph);
  EXPECT_FALSE(run_pass("specialize_shapes", m).changed);
  EXPECT_EQ(compact(m.graph), text);
}

TEST(CompileSpecializeShapes, RefusesConflictsAndUnknownInputs) {
  auto refuse = [](std::map<std::string, Shape> shapes, const std::string& fragment) {
    Model m = shared_batch_model();
    Target target;
    PassContext ctx{target, std::move(shapes)};
    Result<PassResult> r = specialize_shapes(m, ctx);
    ASSERT_FALSE(r.ok()) << fragment;
    EXPECT_EQ(r.error().kind, ErrorKind::user);
    EXPECT_NE(r.error().message().find(fragment), std::string::npos) << r.error().message();
  };
  const auto shape = [](std::vector<int64_t> d) { return Shape::of(d); };
  refuse({{"x", shape({2, 4})}, {"y", shape({3, 4})}}, "binds 'batch' to 3 but input 'x' binds it to 2");
  refuse({{"nosuch", shape({2, 4})}}, "input 'nosuch': the model has no input of this name");
  refuse({{"s", shape({2, 4})}}, "input 's': the model has no input of this name");
  refuse({{"x", shape({2, 5})}}, "does not fit the input's shape batchx4");
  refuse({{"x", shape({2, 4, 1})}}, "has rank 3 but the input is batchx4");
  refuse({{"x", sym_shape({Dim::sym("n"), Dim::known(4)})}}, "compile needs a number for every dim");
}

// ---- fold_constants ----------------------------------------------------------------------

// out = Reshape(x * (exp(c1) + c2), Shape(x)): Exp and then Add fold by running them (Add's
// input is folded just before it), Shape(x) from inference.
Model foldable_model() {
  Builder b;
  ValueId x = b.input("x", {2, 3});
  ValueId c1 = b.constant("c1", uniform_f32({2, 3}, 3));
  ValueId c2 = b.constant("c2", uniform_f32({3}, 4));
  ValueId t = b.op("add", "Add", {b.op("exp", "Exp", {c1}, "e"), c2}, "t");
  ValueId y = b.op("mul", "Mul", {x, t}, "y");
  ValueId s = b.op("shape", "Shape", {x}, "s");
  b.output(b.op("reshape", "Reshape", {y, s}, "out"));
  return b.done();
}

TEST(CompileFoldConstants, FoldsConstantNodesAndShapeArithmetic) {
  Model m = foldable_model();
  PassResult r = run_pass("fold_constants", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary, "folded 3 nodes (1 from shape inference), dropped 3 unused values");
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[2,3]\n"
            "  const t: f32[2,3]\n"
            "  value y: f32[2,3]\n"
            "  const s: i64[2]\n"
            "  value out: f32[2,3]\n"
            "  node mul: Mul(x, t) -> (y) sources=[\"mul\"]\n"
            "  node reshape: Reshape(y, s) -> (out) sources=[\"reshape\"]\n"
            "  output out\n");
  EXPECT_EQ(testing::values<int64_t>(m.graph.value(m.graph.find_value("s")).constant), (std::vector<int64_t>{2, 3}));
}

TEST(CompileFoldConstants, SameOutputs) {
  Model before = foldable_model();
  Model after = before;
  run_pass("fold_constants", after);
  expect_same_outputs(before, after, {uniform_f32({2, 3}, 5)}, 1e-5);
}

TEST(CompileFoldConstants, FoldsChainsAndConstantGraphOutputs) {
  Builder b;
  ValueId x = b.input("x", {4});
  ValueId c = b.constant("c", uniform_f32({4}, 6));
  ValueId e = b.op("exp", "Exp", {c}, "e");
  ValueId n = b.op("neg", "Neg", {e}, "n");  // reads a value folded just before it
  b.output(b.op("sub", "Sub", {x, n}, "y"));
  b.output(n);
  Model before = b.done();
  Model after = before;
  EXPECT_EQ(run_pass("fold_constants", after).summary, "folded 2 nodes (0 from shape inference), dropped 2 unused values");
  EXPECT_EQ(count_ops(after.graph, "Sub"), 1u);
  EXPECT_EQ(after.graph.nodes.size(), 1u);
  expect_same_outputs(before, after, {uniform_f32({4}, 7)}, 1e-5);
}

// A big constant that folds into no more bytes than it had (a transposed weight, as GPT-2's
// tied LM head) folds whatever its size.
TEST(CompileFoldConstants, FoldsBigOutputsThatDoNotGrow) {
  Builder b;
  ValueId w = b.constant("w", uniform_f32({1024, 768}, 9));  // 3 MiB
  ValueId t = b.op("transpose", "Transpose", {w}, "wt", {attr("perm", std::vector<int64_t>{1, 0})});
  b.output(t);
  Model before = b.done();
  Model after = before;
  EXPECT_TRUE(run_pass("fold_constants", after).changed);
  EXPECT_EQ(count_ops(after.graph, "Transpose"), 0u);
  expect_same_outputs(before, after, {}, 0);
}

TEST(CompileFoldConstants, KeepsWhatMustNotFold) {
  Builder b;
  ValueId x = b.input("x", {2});
  // Over the size cap: 2 MiB of f32 from a 16-byte shape (more than 1 MiB, and more than its input).
  ValueId big = b.op("fill", "ConstantOfShape", {b.constant("shape", testing::ints({1024, 512}))}, "big");
  // Reads a graph input.
  ValueId r = b.op("relu", "Relu", {x}, "r");
  // Not a core op: nothing says it is pure, and there is no kernel to run it.
  ValueId c = b.constant("c", uniform_f32({2}, 8));
  ValueId custom = b.g().add_value("custom_out", DType::f32, Shape::of(std::vector<int64_t>{2}));
  Node n = testing::node("custom", "Frob", {c}, {custom});
  n.domain = "com.example";
  b.g().add_node(std::move(n));
  b.output(big);
  b.output(r);
  b.output(custom);
  Model m = b.done();
  const std::string text = compact(m.graph);
  PassResult res = run_pass("fold_constants", m);
  EXPECT_FALSE(res.changed);
  EXPECT_EQ(res.summary, "no change (1 node over the size cap)");
  EXPECT_EQ(compact(m.graph), text);
}

TEST(CompileFoldConstants, FoldsSmallGrowthAndLargeShrinks) {
  Builder b;
  // 64 KiB from 16 bytes: under 1 MiB, folded; 2 MiB summed to 4 bytes: folded.
  ValueId small = b.op("fill", "ConstantOfShape", {b.constant("shape", testing::ints({128, 128}))}, "small");
  ValueId sum = b.op("sum", "ReduceSum", {b.constant("w", uniform_f32({1024, 512}, 8))}, "sum",
                     {attr("keepdims", int64_t{0})});
  b.output(small);
  b.output(sum);
  Model m = b.done();
  EXPECT_EQ(run_pass("fold_constants", m).summary, "folded 2 nodes (0 from shape inference), dropped 2 unused values");
  EXPECT_TRUE(m.graph.nodes.empty());
}

// A Reshape whose shape is computed from shapes inference leaves open (a symbolic batch, a
// sequence export left unknown): Concat(Shape(x)[0], Shape(x)[1], 2, 4) as BERT writes it, or
// Shape(x)[:-1] + [2, 4] as GPT-2 does, becomes Reshape(x, [0, 0, 2, 4]): the output's dims are
// known and the shape arithmetic is gone.
Model computed_reshape(bool gpt2_form, ValueId* reshaped = nullptr) {
  Builder b;
  ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::unknown(), Dim::known(8)}));
  ValueId y = b.op("relu", "Relu", {x}, "y");
  ValueId s = b.op("shape", "Shape", {y}, "s");
  ValueId heads = b.constant("heads", testing::ints({2, 4}));
  ValueId target;
  if (gpt2_form) {
    ValueId lead = b.op("lead", "Slice", {s, b.constant("zero", testing::ints({0})), b.constant("minus_one", testing::ints({-1}))}, "lead");
    target = b.op("target", "Concat", {lead, heads}, "target", {attr("axis", int64_t{0})});
  } else {
    ValueId axes = b.constant("axes", testing::ints({0}));
    auto dim = [&](int64_t i) {
      ValueId at = b.constant("at" + std::to_string(i), Tensor::from<int64_t>({}, {i}));
      ValueId d = b.op("gather" + std::to_string(i), "Gather", {s, at}, "d" + std::to_string(i), {attr("axis", int64_t{0})});
      return b.op("unsqueeze" + std::to_string(i), "Unsqueeze", {d, axes}, "u" + std::to_string(i));
    };
    target = b.op("target", "Concat", {dim(0), dim(1), heads}, "target", {attr("axis", int64_t{0})});
  }
  ValueId out = b.op("reshape", "Reshape", {y, target}, "out");
  if (reshaped) *reshaped = out;
  b.output(out);
  return b.done();
}

TEST(CompileFoldConstants, ComputedReshapeShapesBecomeConstant) {
  for (bool gpt2_form : {false, true}) {
    SCOPED_TRACE(gpt2_form ? "GPT-2's Slice" : "BERT's Gathers");
    Model before = computed_reshape(gpt2_form);
    EXPECT_EQ(before.graph.value(before.graph.find_value("out")).shape.str(), "?x?x?x?");
    Model after = before;
    EXPECT_EQ(run_pass("fold_constants", after).summary, "folded 0 nodes (0 from shape inference), gave 1 Reshape a constant shape, dropped " +
                                                             std::string(gpt2_form ? "6" : "10") + " unused values");
    EXPECT_EQ(testing::nodes_text(after.graph),
              "node relu: Relu(x) -> (y) sources=[\"relu\"]\nnode reshape: Reshape(y, target_static) -> (out) sources=[\"reshape\"]\n");
    EXPECT_EQ(testing::values<int64_t>(after.graph.value(after.graph.find_value("target_static")).constant),
              (std::vector<int64_t>{0, 0, 2, 4}));
    EXPECT_EQ(after.graph.value(after.graph.find_value("out")).shape.str(), "batchx?x2x4");
    for (int64_t seq : {1, 3}) expect_same_outputs(before, after, {uniform_f32({2, seq, 8}, 11)}, 0);
  }
}

// A quantized model reads the shape before its QuantizeLinear -> DequantizeLinear pair and
// reshapes the DQ's output, of the same shape: its dims are still copies, and the shape constant.
TEST(CompileFoldConstants, ComputedReshapeShapeReadBeforeQuantization) {
  Builder b;
  ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::unknown(), Dim::known(8)}));
  ValueId y = b.op("relu", "Relu", {x}, "y");
  ValueId s = b.op("shape", "Shape", {y}, "s");
  ValueId lead = b.op("lead", "Slice", {s, b.constant("zero", testing::ints({0})), b.constant("minus_one", testing::ints({-1}))}, "lead");
  ValueId target = b.op("target", "Concat", {lead, b.constant("heads", testing::ints({2, 4}))}, "target", {attr("axis", int64_t{0})});
  ValueId scale = b.constant("scale", Tensor::from<float>({}, {0.05f})), zero = b.constant("zero_point", Tensor::from<uint8_t>({}, {3}));
  ValueId codes = b.op("q", "QuantizeLinear", {y, scale, zero}, "codes");
  ValueId dq = b.op("dq", "DequantizeLinear", {codes, scale, zero}, "dq");
  b.output(b.op("reshape", "Reshape", {dq, target}, "out"));
  Model before = b.done();
  Model after = before;
  EXPECT_TRUE(run_pass("fold_constants", after).changed);
  ASSERT_NE(after.graph.find_value("target_static"), kNoValue);
  EXPECT_EQ(testing::values<int64_t>(after.graph.value(after.graph.find_value("target_static")).constant), (std::vector<int64_t>{0, 0, 2, 4}));
  EXPECT_EQ(after.graph.value(after.graph.find_value("out")).shape.str(), "batchx?x2x4");
  for (int64_t seq : {1, 3}) expect_same_outputs(before, after, {uniform_f32({2, seq, 8}, 14)}, 0);
}

// GPT-2's and LLaMA's positions, Range(0, S, 1) with S = Shape(ids)[1] a symbol: the Range's
// output gets S, which inference cannot compute from the data, and so do the embeddings it
// gathers and the sum with the tokens'. A Range from 1 has S - 1 elements: left unknown.
TEST(CompileFoldConstants, RangeOfASymbolicLengthGetsTheSymbol) {
  for (int64_t start : {0, 1}) {
    SCOPED_TRACE("start " + std::to_string(start));
    Builder b;
    ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::sym("sequence"), Dim::known(4)}));
    ValueId len = b.op("len", "Gather", {b.op("shape", "Shape", {x}, "s"), b.constant("at", make<int64_t>({}, {1}))}, "len_out");
    ValueId pos = b.op("range", "Range", {b.constant("start", make<int64_t>({}, {start})), len, b.constant("one", make<int64_t>({}, {1}))}, "pos");
    ValueId rows = b.op("rows", "Unsqueeze", {pos, b.constant("ax0", testing::ints({0}))}, "rows_out");
    ValueId table = b.op("gather", "Gather", {b.constant("table", uniform_f32({16, 4}, 15)), rows}, "table_rows");
    b.output(b.op("add", "Add", {x, table}, "out"));
    Model before = b.done();
    Model after = before;
    const PassResult r = run_pass("fold_constants", after);
    if (start == 0) {
      EXPECT_EQ(r.summary, "folded 0 nodes (0 from shape inference), gave 1 Range its symbolic length, dropped 0 unused values");
      EXPECT_EQ(after.graph.value(after.graph.find_value("pos")).shape.str(), "sequence");
      EXPECT_EQ(after.graph.value(after.graph.find_value("out")).shape.str(), "batchxsequencex4");
      for (int64_t seq : {1, 5}) expect_same_outputs(before, after, {uniform_f32({2, seq, 4}, 16)}, 0);
    } else {
      EXPECT_FALSE(r.changed);
      EXPECT_EQ(after.graph.value(after.graph.find_value("out")).shape.str(), before.graph.value(before.graph.find_value("out")).shape.str());
    }
  }
}

// LLaMA's grouped-query repeat of K [batch, 2, sequence, 4]: Unsqueeze at 2, Expand to
// Concat(Shape(k)[0], 2, 3, Shape(k)[2], 4), Reshape to Concat(Shape(k)[0], 6, Shape(k)[2], 4).
// The Expand's entries that are the input's own dims become 1s ([1, 2, 3, 1, 4]); then the
// Reshape's batch, k's dim of the symbol its input has there, is a copy and its sequence the one
// entry left to -1 ([0, 6, -1, 4]): the repeat's shape [batch, 6, sequence, 4] is known, as
// fuse_attention wants it. Built from a dim of another symbol, the Expand's shape stays computed.
TEST(CompileFoldConstants, GroupedQueryRepeatGetsConstantShapes) {
  for (bool other_symbol : {false, true}) {
    SCOPED_TRACE(other_symbol ? "another symbol" : "k's own dims");
    Builder b;
    ValueId k = b.input("k", sym_shape({Dim::sym("batch"), Dim::known(2), Dim::sym("sequence"), Dim::known(4)}));
    ValueId other = b.input("other", sym_shape({Dim::sym("batch"), Dim::sym("length")}));
    ValueId ks = b.op("k_shape", "Shape", {k}, "ks");
    auto dim = [&](ValueId shape, int64_t i, const std::string& name) {
      ValueId d = b.op(name, "Gather", {shape, b.constant(name + "_at", make<int64_t>({}, {i}))}, name + "_out");
      return b.op(name + "_1", "Unsqueeze", {d, b.constant(name + "_ax", testing::ints({0}))}, name + "_1d");
    };
    ValueId batch = dim(ks, 0, "batch"), seq = other_symbol ? dim(b.op("o_shape", "Shape", {other}, "os"), 1, "seq") : dim(ks, 2, "seq");
    ValueId wide = b.op("unsq", "Unsqueeze", {k, b.constant("ax2", testing::ints({2}))}, "k5");
    ValueId target5 = b.op("target5", "Concat", {batch, b.constant("two", testing::ints({2})), b.constant("three", testing::ints({3})), seq,
                                                  b.constant("four", testing::ints({4}))}, "t5", {attr("axis", int64_t{0})});
    ValueId repeated = b.op("expand", "Expand", {wide, target5}, "repeated");
    ValueId target4 = b.op("target4", "Concat", {batch, b.constant("six", testing::ints({6})), seq, b.constant("four2", testing::ints({4}))}, "t4",
                           {attr("axis", int64_t{0})});
    b.output(b.op("reshape", "Reshape", {repeated, target4}, "out"));
    Model before = b.done();
    Model after = before;
    run_pass("fold_constants", after);
    const ValueId expand_shape = after.graph.nodes[static_cast<size_t>(after.graph.producers()[after.graph.find_value("repeated")])].inputs[1];
    if (other_symbol) {
      EXPECT_FALSE(after.graph.value(expand_shape).is_constant()) << compact(after.graph);
      continue;
    }
    ASSERT_TRUE(after.graph.value(expand_shape).is_constant()) << compact(after.graph);
    EXPECT_EQ(testing::values<int64_t>(after.graph.value(expand_shape).constant), (std::vector<int64_t>{1, 2, 3, 1, 4}));
    EXPECT_EQ(testing::values<int64_t>(after.graph.value(after.graph.find_value("t4_static")).constant), (std::vector<int64_t>{0, 6, -1, 4}));
    EXPECT_EQ(after.graph.value(after.graph.find_value("out")).shape.str(), "batchx6xsequencex4");
    EXPECT_EQ(count_ops(after.graph, "Shape"), 0u) << compact(after.graph);
    for (auto [n, seq_len] : {std::pair{1, 1}, std::pair{2, 5}})
      expect_same_outputs(before, after, {uniform_f32({n, 2, seq_len, 4}, 17), uniform_f32({n, seq_len}, 18)}, 0);
  }
}

// An entry that is another value's dim becomes -1 when it is the only one; with two such
// entries, or allowzero (0 is then a size, not a copy), the shape stays computed.
TEST(CompileFoldConstants, ComputedReshapeShapesThatStay) {
  auto build = [](int other_dims, int64_t allowzero) {
    Builder b;
    ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::unknown(), Dim::known(8)}));
    ValueId z = b.input("z", sym_shape({Dim::unknown(), Dim::unknown(), Dim::known(8)}));
    // Shape(z)[:n] + Shape(x)[n:2] + [8]: z's dims first, not x's.
    ValueId n = b.constant("n", testing::ints({other_dims}));
    ValueId lead = b.op("lead", "Slice", {b.op("z_shape", "Shape", {z}, "zs"), b.constant("zero", testing::ints({0})), n}, "lead");
    ValueId mid = b.op("mid", "Slice", {b.op("x_shape", "Shape", {x}, "xs"), n, b.constant("two", testing::ints({2}))}, "mid");
    ValueId target = b.op("target", "Concat", {lead, mid, b.constant("rest", testing::ints({8}))}, "target", {attr("axis", int64_t{0})});
    std::vector<Attribute> attrs;
    if (allowzero) attrs.push_back(attr("allowzero", allowzero));
    b.output(b.op("reshape", "Reshape", {x, target}, "out", attrs));
    return b.done();
  };
  Model one = build(1, 0);
  Model before = one;
  EXPECT_TRUE(run_pass("fold_constants", one).changed);
  EXPECT_EQ(testing::values<int64_t>(one.graph.value(one.graph.find_value("target_static")).constant), (std::vector<int64_t>{-1, 0, 8}));
  expect_same_outputs(before, one, {uniform_f32({2, 3, 8}, 12), uniform_f32({2, 5, 8}, 13)}, 0);
  for (auto [other_dims, allowzero] : {std::pair{2, int64_t{0}}, std::pair{1, int64_t{1}}}) {
    Model m = build(other_dims, allowzero);
    const std::string text = compact(m.graph);
    EXPECT_FALSE(run_pass("fold_constants", m).changed) << other_dims << " " << allowzero;
    EXPECT_EQ(compact(m.graph), text);
  }
  // x's own dims out of place ([S, B, 8]) are not copies: two entries for -1, left alone.
  Builder b;
  ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::unknown(), Dim::known(8)}));
  ValueId s = b.op("shape", "Shape", {x}, "s");
  ValueId swapped = b.op("swap", "Gather", {s, b.constant("order", testing::ints({1, 0}))}, "swapped", {attr("axis", int64_t{0})});
  ValueId target = b.op("target", "Concat", {swapped, b.constant("rest", testing::ints({8}))}, "target", {attr("axis", int64_t{0})});
  b.output(b.op("reshape", "Reshape", {x, target}, "out"));
  Model m = b.done();
  EXPECT_FALSE(run_pass("fold_constants", m).changed);
}

// ---- cse ---------------------------------------------------------------------------------

// Two Relu(x), two equal constants each multiplied with x: after merging the constants the
// two Muls are equal too.
Model duplicated_model() {
  Builder b;
  ValueId x = b.input("x", {3, 5});
  ValueId r1 = b.op("relu_a", "Relu", {x}, "r1");
  ValueId r2 = b.op("relu_b", "Relu", {x}, "r2");
  Tensor w = uniform_f32({5}, 9);
  ValueId m1 = b.op("mul_a", "Mul", {x, b.constant("w1", w)}, "m1");
  ValueId m2 = b.op("mul_b", "Mul", {x, b.constant("w2", w.clone())}, "m2");
  ValueId s = b.op("add", "Add", {r1, r2}, "s");
  b.output(b.op("sum", "Sum", {s, m1, m2}, "out"));
  return b.done();
}

TEST(CompileCse, MergesEqualConstantsThenEqualNodes) {
  Model m = duplicated_model();
  PassResult r = run_pass("cse", m);
  EXPECT_EQ(r.summary, "merged 2 duplicate nodes and 1 duplicate constant");
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[3,5]\n"
            "  value r1: f32[3,5]\n"
            "  const w1: f32[5]\n"
            "  value m1: f32[3,5]\n"
            "  value s: f32[3,5]\n"
            "  value out: f32[3,5]\n"
            "  node relu_a: Relu(x) -> (r1) sources=[\"relu_a\", \"relu_b\"]\n"
            "  node mul_a: Mul(x, w1) -> (m1) sources=[\"mul_a\", \"mul_b\"]\n"
            "  node add: Add(r1, r1) -> (s) sources=[\"add\"]\n"
            "  node sum: Sum(s, m1, m1) -> (out) sources=[\"sum\"]\n"
            "  output out\n");
}

TEST(CompileCse, SameOutputs) {
  Model before = duplicated_model();
  Model after = before;
  run_pass("cse", after);
  expect_same_outputs(before, after, {uniform_f32({3, 5}, 10)}, 0);
}

TEST(CompileCse, KeepsNodesThatDiffer) {
  Builder b;
  ValueId x = b.input("x", {4});
  // Different attributes; floats differing only in sign of zero; equal bytes of another dtype.
  ValueId l1 = b.op("leaky_a", "LeakyRelu", {x}, "l1", {attr("alpha", 0.1)});
  ValueId l2 = b.op("leaky_b", "LeakyRelu", {x}, "l2", {attr("alpha", 0.2)});
  ValueId z1 = b.op("zero_a", "LeakyRelu", {x}, "z1", {attr("alpha", 0.0)});
  ValueId z2 = b.op("zero_b", "LeakyRelu", {x}, "z2", {attr("alpha", -0.0)});
  ValueId i1 = b.constant("i1", make<int32_t>({2}, {1, 2}));
  ValueId f1 = b.constant("f1", make<float>({2}, {0, 0}));
  std::memcpy(b.g().value(f1).constant.raw(), b.g().value(i1).constant.raw(), 8);
  ValueId c1 = b.op("cast_i", "Cast", {i1}, "c1", {attr("to", std::string("f64"))});
  ValueId c2 = b.op("cast_f", "Cast", {f1}, "c2", {attr("to", std::string("f64"))});
  // Equal, but both are graph outputs: each name is part of the model's interface.
  ValueId o1 = b.op("exp_a", "Exp", {x}, "o1");
  ValueId o2 = b.op("exp_b", "Exp", {x}, "o2");
  for (ValueId v : {l1, l2, z1, z2, c1, c2, o1, o2}) b.output(v);
  Model m = b.done();
  const std::string text = compact(m.graph);
  EXPECT_FALSE(run_pass("cse", m).changed);
  EXPECT_EQ(compact(m.graph), text);
}

// Constants past 12 KiB are hashed by 4 KiB at their start, middle and end: two that differ in
// one float between those pieces meet in the hash and are compared, and stay apart; an equal
// copy of either is merged.
TEST(CompileCse, LargeConstantsAreComparedWhereTheirHashesMeet) {
  Builder b;
  ValueId x = b.input("x", {8192});
  Tensor w = uniform_f32({8192}, 11), other = w.clone();
  other.data<float>()[2000] += 1.f;  // byte 8000: between the start's piece and the middle's
  ValueId m1 = b.op("mul_a", "Mul", {x, b.constant("w1", w)}, "m1");
  ValueId m2 = b.op("mul_b", "Mul", {x, b.constant("w2", other)}, "m2");
  ValueId m3 = b.op("mul_c", "Mul", {x, b.constant("w3", w.clone())}, "m3");
  b.output(b.op("sum", "Sum", {m1, m2, m3}, "out"));
  Model m = b.done();
  PassResult r = run_pass("cse", m);
  EXPECT_EQ(r.summary, "merged 1 duplicate node and 1 duplicate constant");
  const std::string text = compact(m.graph);
  EXPECT_NE(text.find("Mul(x, w2)"), std::string::npos) << text;
  EXPECT_EQ(text.find("w3"), std::string::npos) << text;
}

TEST(CompileCse, NeverMergesNodesWithSubgraphs) {
  Model m = testing::if_model();
  Graph& g = m.graph;
  // A second If with the very same branches (shared bodies) and condition.
  Node twin = g.nodes[0];
  twin.name = "if_twin";
  ValueId y2 = g.add_value("y2", DType::undefined);
  twin.outputs = {y2};
  g.add_node(std::move(twin));
  ValueId sum = g.add_value("sum", DType::undefined);
  g.add_node(testing::node("add", "Add", {g.find_value("y"), y2}, {sum}));
  g.outputs = {sum};
  ASSERT_TRUE(infer_graph(g).ok());
  EXPECT_FALSE(run_pass("cse", m).changed);
  EXPECT_EQ(count_ops(m.graph, "If"), 2u);
}

// ---- fold_batchnorm ----------------------------------------------------------------------

/// BatchNormalization parameters for `c` channels: random scale, bias and mean, positive var.
std::vector<ValueId> bn_params(Builder& b, int64_t c, uint32_t seed) {
  return {b.constant("gamma", uniform_f32({c}, seed)), b.constant("beta", uniform_f32({c}, seed + 1)),
          b.constant("mean", uniform_f32({c}, seed + 2)), b.constant("var", uniform_f32({c}, seed + 3, 0.5f, 1.5f))};
}

ValueId batchnorm(Builder& b, ValueId x, int64_t c, uint32_t seed) {
  std::vector<ValueId> in{x};
  for (ValueId p : bn_params(b, c, seed)) in.push_back(p);
  return b.op("bn", "BatchNormalization", in, "z", {attr("epsilon", 1e-3)});
}

// Conv (3 -> 4 channels, 3x3, bias optional) then BatchNormalization then Relu.
Model conv_bn_model(bool bias) {
  Builder b;
  ValueId x = b.input("x", {2, 3, 5, 7});
  std::vector<ValueId> in{x, b.constant("w", uniform_f32({4, 3, 3, 3}, 11))};
  if (bias) in.push_back(b.constant("b", uniform_f32({4}, 12)));
  ValueId y = b.op("conv", "Conv", in, "y", {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  b.output(b.op("relu", "Relu", {batchnorm(b, y, 4, 13)}, "out"));
  return b.done();
}

TEST(CompileFoldBatchnorm, ConvTakesTheScaleAndBias) {
  Model m = conv_bn_model(false);
  PassResult r = run_pass("fold_batchnorm", m);
  EXPECT_EQ(r.summary, "folded 1 BatchNormalization into Conv");
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[2,3,5,7]\n"
            "  value z: f32[2,4,5,7]\n"
            "  value out: f32[2,4,5,7]\n"
            "  const w_bn: f32[4,3,3,3]\n"
            "  const conv.bias: f32[4]\n"
            "  node conv: Conv(x, w_bn, conv.bias) -> (z) pads=ints[1, 1, 1, 1] sources=[\"conv\", \"bn\"]\n"
            "  node relu: Relu(z) -> (out) sources=[\"relu\"]\n"
            "  output out\n");
}

TEST(CompileFoldBatchnorm, SameOutputsForEveryProducer) {
  const std::vector<Tensor> conv_in{uniform_f32({2, 3, 5, 7}, 20)};
  for (bool bias : {false, true}) {
    Model before = conv_bn_model(bias), after = before;
    EXPECT_TRUE(run_pass("fold_batchnorm", after).changed);
    EXPECT_EQ(count_ops(after.graph, "BatchNormalization"), 0u);
    expect_same_outputs(before, after, conv_in, 1e-5);
  }
  {  // ConvTranspose with 2 groups: W [C_in 4, C_out/group 3, 3, 3], 6 output channels.
    Builder b;
    ValueId x = b.input("x", {1, 4, 5, 5});
    ValueId y = b.op("deconv", "ConvTranspose", {x, b.constant("w", uniform_f32({4, 3, 3, 3}, 21)), b.constant("b", uniform_f32({6}, 22))},
                     "y", {attr("group", int64_t{2}), attr("strides", std::vector<int64_t>{2, 2})});
    b.output(batchnorm(b, y, 6, 23));
    Model before = b.done(), after = before;
    EXPECT_EQ(run_pass("fold_batchnorm", after).summary, "folded 1 BatchNormalization into ConvTranspose");
    expect_same_outputs(before, after, {uniform_f32({1, 4, 5, 5}, 24)}, 1e-5);
  }
  // Gemm: B [N, K] with transB or [K, N] without; C absent, a row, or full [M, N]; alpha, beta.
  struct GemmCase { bool trans_b; std::vector<int64_t> c_shape; };
  for (const GemmCase& gc : {GemmCase{true, {6}}, GemmCase{false, {3, 6}}, GemmCase{false, {}}, GemmCase{true, {3, 1}}}) {
    Builder b;
    ValueId a = b.input("a", {3, 5});
    std::vector<ValueId> in{a, b.constant("w", uniform_f32(gc.trans_b ? std::vector<int64_t>{6, 5} : std::vector<int64_t>{5, 6}, 25))};
    if (!gc.c_shape.empty()) in.push_back(b.constant("c", uniform_f32(gc.c_shape, 26)));
    ValueId y = b.op("gemm", "Gemm", in, "y",
                     {attr("transB", int64_t{gc.trans_b}), attr("alpha", 0.5), attr("beta", 2.0)});
    b.output(batchnorm(b, y, 6, 27));
    Model before = b.done(), after = before;
    EXPECT_EQ(run_pass("fold_batchnorm", after).summary, "folded 1 BatchNormalization into Gemm");
    expect_same_outputs(before, after, {uniform_f32({3, 5}, 28)}, 1e-5);
  }
  {  // MatMul: becomes MatMul then Add of the folded bias.
    Builder b;
    ValueId a = b.input("a", {3, 5});
    ValueId y = b.op("mm", "MatMul", {a, b.constant("w", uniform_f32({5, 6}, 29))}, "y");
    b.output(batchnorm(b, y, 6, 30));
    Model before = b.done(), after = before;
    EXPECT_EQ(run_pass("fold_batchnorm", after).summary, "folded 1 BatchNormalization into MatMul");
    EXPECT_EQ(compact(after.graph),
              "graph\n"
              "  input a: f32[3,5]\n"
              "  value y: f32[3,6]\n"
              "  value z: f32[3,6]\n"
              "  const w_bn: f32[5,6]\n"
              "  const bn.bias: f32[6]\n"
              "  node mm: MatMul(a, w_bn) -> (y) sources=[\"mm\"]\n"
              "  node bn: Add(y, bn.bias) -> (z) sources=[\"bn\"]\n"
              "  output z\n");
    expect_same_outputs(before, after, {uniform_f32({3, 5}, 31)}, 1e-5);
  }
}

TEST(CompileFoldBatchnorm, LeavesWhatItCannotFold) {
  auto unchanged = [](Model m, const char* why) {
    const std::string text = compact(m.graph);
    EXPECT_FALSE(run_pass("fold_batchnorm", m).changed) << why;
    EXPECT_EQ(compact(m.graph), text) << why;
  };
  {  // The Conv's output has a second reader, which needs the unnormalized values.
    Builder b;
    ValueId x = b.input("x", {1, 3, 4, 4});
    ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({4, 3, 1, 1}, 40))}, "y");
    b.output(batchnorm(b, y, 4, 41));
    b.output(b.op("relu", "Relu", {y}, "other"));
    unchanged(b.done(), "second reader");
  }
  {  // The Conv's output is a graph output.
    Builder b;
    ValueId x = b.input("x", {1, 3, 4, 4});
    ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({4, 3, 1, 1}, 42))}, "y");
    b.output(batchnorm(b, y, 4, 43));
    b.output(y);
    unchanged(b.done(), "graph output");
  }
  {  // Weights that are not constant.
    Builder b;
    ValueId x = b.input("x", {1, 3, 4, 4});
    ValueId w = b.input("w", {4, 3, 1, 1});
    b.output(batchnorm(b, b.op("conv", "Conv", {x, w}, "y"), 4, 44));
    unchanged(b.done(), "weights are an input");
  }
  {  // Statistics that are not constant.
    Builder b;
    ValueId x = b.input("x", {1, 3, 4, 4});
    ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({4, 3, 1, 1}, 45))}, "y");
    std::vector<ValueId> p = bn_params(b, 4, 46);
    p[3] = b.input("var", {4});
    b.output(b.op("bn", "BatchNormalization", {y, p[0], p[1], p[2], p[3]}, "z"));
    unchanged(b.done(), "variance is an input");
  }
  {  // MatMul with a 3-D output: BatchNormalization's channel axis 1 is not MatMul's N.
    Builder b;
    ValueId a = b.input("a", {2, 6, 5});
    ValueId y = b.op("mm", "MatMul", {a, b.constant("w", uniform_f32({5, 6}, 47))}, "y");
    b.output(batchnorm(b, y, 6, 48));
    unchanged(b.done(), "3-D MatMul");
  }
}

// ---- drop_linear_reshapes ----------------------------------------------------------------

// GPT-2's linear layer: Reshape(x [2,3,5] -> [6,5]) -> Gemm(w, bias) -> Reshape([2,3,6]) -> + r.
// `back` is the second Reshape's target; `qdq` puts per-tensor Q/DQ pairs after the first
// Reshape and after the product (a quantized model's).
Model rows_linear(std::vector<int64_t> back, bool qdq = false, int64_t trans_b = 0) {
  Builder b;
  ValueId x = b.input("x", {2, 3, 5});
  ValueId rows = b.op("rows", "Reshape", {x, b.constant("rows_shape", make<int64_t>({2}, {-1, 5}))}, "rows_out");
  auto pair = [&](const std::string& name, ValueId v) {
    ValueId q = b.op(name + "_q", "QuantizeLinear", {v, b.constant(name + "_s", make<float>({}, {0.02f})),
                                                      b.constant(name + "_z", make<uint8_t>({}, {120}))}, name + "_codes");
    return b.op(name + "_dq", "DequantizeLinear", {q, b.constant(name + "_s2", make<float>({}, {0.02f})),
                                                   b.constant(name + "_z2", make<uint8_t>({}, {120}))}, name + "_deq");
  };
  if (qdq) rows = pair("in", rows);
  ValueId y = b.op("fc", "Gemm", {rows, b.constant("w", uniform_f32(trans_b ? std::vector<int64_t>{6, 5} : std::vector<int64_t>{5, 6}, 60)),
                                  b.constant("bias", uniform_f32({6}, 61))}, "y", {attr("transB", trans_b)});
  if (qdq) y = pair("out", y);
  ValueId z = b.op("back", "Reshape", {y, b.constant("back_shape", make<int64_t>({static_cast<int64_t>(back.size())}, back))}, "z");
  b.output(b.op("residual", "Add", {z, b.input("r", back)}, "out"));
  return b.done();
}

TEST(CompileDropLinearReshapes, GemmOnRowsBecomesMatMulOfTheInput) {
  Model m = rows_linear({2, 3, 6});
  Model before = m;
  EXPECT_EQ(run_pass("drop_linear_reshapes", m).summary, "made 1 linear layer on 2-D rows between Reshapes a MatMul of the rows' own shape");
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[2,3,5]\n"
            "  input r: f32[2,3,6]\n"
            "  const w: f32[5,6]\n"
            "  const bias: f32[6]\n"
            "  value z: f32[2,3,6]\n"
            "  value out: f32[2,3,6]\n"
            "  value fc_product: f32[2,3,6]\n"
            "  node fc: MatMul(x, w) -> (fc_product) sources=[\"fc\", \"back\"]\n"
            "  node fc_bias: Add(fc_product, bias) -> (z) sources=[\"fc\", \"back\"]\n"
            "  node residual: Add(z, r) -> (out) sources=[\"residual\"]\n"
            "  output out\n");
  expect_same_outputs(before, m, {uniform_f32({2, 3, 5}, 62), uniform_f32({2, 3, 6}, 63)}, 1e-6);
  // Then the bias and the residual fuse into the product, as a BERT layer's do.
  run_pass("fuse_epilogues", m);
  EXPECT_EQ(count_ops(m.graph, "FusedMatMul"), 1u);
  EXPECT_EQ(m.graph.nodes.size(), 1u) << compact(m.graph);
}

TEST(CompileDropLinearReshapes, QuantizedRowsQuantizeTheInputAndTheProduct) {
  Model m = rows_linear({2, 3, 6}, true);
  Model before = m;
  EXPECT_TRUE(run_pass("drop_linear_reshapes", m).changed);
  EXPECT_EQ(count_ops(m.graph, "Reshape"), 0u) << compact(m.graph);
  std::vector<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.push_back(n.op);
  EXPECT_EQ(ops, (std::vector<std::string>{"QuantizeLinear", "DequantizeLinear", "MatMul", "Add", "QuantizeLinear", "DequantizeLinear", "Add"}));
  EXPECT_EQ(m.graph.nodes[0].inputs[0], m.graph.inputs[0]) << "x quantized";
  EXPECT_EQ(m.graph.value(m.graph.nodes[4].outputs[0]).shape.str(), "2x3x6");
  expect_same_outputs(before, m, {uniform_f32({2, 3, 5}, 64), uniform_f32({2, 3, 6}, 65)}, 0);
}

TEST(CompileDropLinearReshapes, LeavesOtherShapes) {
  auto unchanged = [](Model m, const char* why) {
    const std::string text = compact(m.graph);
    EXPECT_FALSE(run_pass("drop_linear_reshapes", m).changed) << why;
    EXPECT_EQ(compact(m.graph), text) << why;
  };
  unchanged(rows_linear({3, 2, 6}), "the second Reshape does not give x's leading dims back");
  unchanged(rows_linear({6, 6}), "nor does a 2-D one");
  unchanged(rows_linear({2, 3, 6}, false, 1), "a transposed weight");
  {  // The rows are read by something else too.
    Model m = rows_linear({2, 3, 6});
    Graph& g = m.graph;
    const ValueId rows = g.find_value("rows_out");
    const ValueId extra = g.add_value("extra", DType::f32, g.value(rows).shape);
    g.add_node(testing::node("relu", "Relu", {rows}, {extra}));
    g.outputs.push_back(extra);
    unchanged(m, "the rows read twice");
  }
  {  // Symbolic leading dims (compile without --input-shape): nothing proves the shapes match.
    Builder b;
    ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::known(3), Dim::known(5)}));
    ValueId rows = b.op("rows", "Reshape", {x, b.constant("rows_shape", make<int64_t>({2}, {-1, 5}))}, "rows_out");
    ValueId y = b.op("fc", "Gemm", {rows, b.constant("w", uniform_f32({5, 6}, 66))}, "y");
    b.output(b.op("back", "Reshape", {y, b.constant("back_shape", make<int64_t>({3}, {-1, 3, 6}))}, "z"));
    unchanged(b.done(), "symbolic batch");
  }
}

// GPT-2's layers compiled without --input-shape: x [batch, sequence, 5] -> Reshape [-1, 5] ->
// Gemm -> Reshape(Shape(x)[:-1] + [N]), `layers` of them in a row (the second reads the first's
// Relu, whose dims are known only once the first's Reshape is gone); `qdq` puts a Q/DQ pair
// after each product (the shape is still read from x, before its pair).
Model symbolic_rows_linear(int layers, bool qdq) {
  Builder b;
  ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::sym("sequence"), Dim::known(5)}));
  for (int l = 0; l < layers; ++l) {
    const std::string p = "l" + std::to_string(l) + "_";
    ValueId rows = b.op(p + "rows", "Reshape", {x, b.constant(p + "rows_shape", make<int64_t>({2}, {-1, 5}))}, p + "rows_out");
    ValueId y = b.op(p + "fc", "Gemm", {rows, b.constant(p + "w", uniform_f32({5, 5}, 70 + l)), b.constant(p + "bias", uniform_f32({5}, 80 + l))}, p + "y");
    if (qdq) {
      ValueId q = b.op(p + "q", "QuantizeLinear", {y, b.constant(p + "s", make<float>({}, {0.02f})), b.constant(p + "z", make<uint8_t>({}, {120}))}, p + "codes");
      y = b.op(p + "dq", "DequantizeLinear", {q, b.constant(p + "s2", make<float>({}, {0.02f})), b.constant(p + "z2", make<uint8_t>({}, {120}))}, p + "deq");
    }
    ValueId lead = b.op(p + "lead", "Slice", {b.op(p + "shape", "Shape", {x}, p + "s"), b.constant(p + "zero", testing::ints({0})),
                                              b.constant(p + "minus_one", testing::ints({-1}))}, p + "lead_out");
    ValueId target = b.op(p + "target", "Concat", {lead, b.constant(p + "n", testing::ints({5}))}, p + "target_out", {attr("axis", int64_t{0})});
    x = b.op(p + "relu", "Relu", {b.op(p + "back", "Reshape", {y, target}, p + "z")}, p + "out");
  }
  b.output(x);
  return b.done();
}

TEST(CompileDropLinearReshapes, SymbolicDimsReadFromTheInput) {
  for (bool qdq : {false, true}) {
    SCOPED_TRACE(qdq ? "Q/DQ after the products" : "f32");
    Model m = symbolic_rows_linear(2, qdq);
    Model before = m;
    EXPECT_EQ(run_pass("drop_linear_reshapes", m).summary, "made 2 linear layers on 2-D rows between Reshapes a MatMul of the rows' own shape");
    for (const char* gone : {"Reshape", "Shape", "Slice", "Concat"}) EXPECT_EQ(count_ops(m.graph, gone), 0u) << gone << "\n" << compact(m.graph);
    EXPECT_EQ(count_ops(m.graph, "MatMul"), 2u);
    EXPECT_EQ(m.graph.value(m.graph.outputs[0]).shape.str(), "batchxsequencex5");
    for (auto [batch, seq] : {std::pair{1, 1}, std::pair{2, 7}}) expect_same_outputs(before, m, {uniform_f32({batch, seq, 5}, 90 + seq)}, qdq ? 0 : 1e-6);
  }
  // The shape read from another input: its dims are x's where they are the same symbols (one
  // size each in a session), and no proof otherwise.
  for (const char* second : {"sequence", "length"}) {
    SCOPED_TRACE(second);
    Model m = symbolic_rows_linear(1, false);
    Graph& g = m.graph;
    const ValueId other = g.add_value("other", DType::f32, sym_shape({Dim::sym("batch"), Dim::sym(second), Dim::known(5)}));
    g.inputs.push_back(other);
    for (Node& n : g.nodes)
      if (n.op == "Shape") n.inputs[0] = other;
    const std::string text = compact(g);
    EXPECT_EQ(run_pass("drop_linear_reshapes", m).changed, std::string(second) == "sequence");
    if (std::string(second) == "length") {
      EXPECT_EQ(compact(m.graph), text);
    }
  }
}

// ---- fuse_linear_bias --------------------------------------------------------------------

// relu(bias + x @ w), the bias first as torch exports it.
Model linear_model(std::vector<int64_t> x_shape, std::vector<int64_t> bias_shape) {
  Builder b;
  ValueId x = b.input("x", x_shape);
  ValueId y = b.op("mm", "MatMul", {x, b.constant("w", uniform_f32({5, 6}, 50))}, "y");
  ValueId z = b.op("add", "Add", {b.constant("bias", uniform_f32(bias_shape, 51)), y}, "z");
  b.output(b.op("relu", "Relu", {z}, "out"));
  return b.done();
}

TEST(CompileFuseLinearBias, MatMulAndAddBecomeGemm) {
  Model m = linear_model({3, 5}, {6});
  EXPECT_EQ(run_pass("fuse_linear_bias", m).summary, "fused 1 MatMul + Add into Gemm");
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[3,5]\n"
            "  const w: f32[5,6]\n"
            "  const bias: f32[6]\n"
            "  value z: f32[3,6]\n"
            "  value out: f32[3,6]\n"
            "  node mm: Gemm(x, w, bias) -> (z) sources=[\"mm\", \"add\"]\n"
            "  node relu: Relu(z) -> (out) sources=[\"relu\"]\n"
            "  output out\n");
}

TEST(CompileFuseLinearBias, SameOutputs) {
  for (const auto& bias : {std::vector<int64_t>{6}, std::vector<int64_t>{1, 6}}) {
    Model before = linear_model({3, 5}, bias), after = before;
    EXPECT_TRUE(run_pass("fuse_linear_bias", after).changed);
    expect_same_outputs(before, after, {uniform_f32({3, 5}, 52)}, 1e-5);
  }
  // A symbolic batch stays symbolic.
  Builder b;
  ValueId x = b.input("x", sym_shape({Dim::sym("batch"), Dim::known(5)}));
  ValueId y = b.op("mm", "MatMul", {x, b.constant("w", uniform_f32({5, 6}, 53))}, "y");
  b.output(b.op("add", "Add", {y, b.constant("bias", uniform_f32({6}, 54))}, "z"));
  Model before = b.done(), after = before;
  EXPECT_TRUE(run_pass("fuse_linear_bias", after).changed);
  EXPECT_EQ(after.graph.value(after.graph.outputs[0]).shape.str(), "batchx6");
  expect_same_outputs(before, after, {uniform_f32({7, 5}, 55)}, 1e-5);
}

TEST(CompileFuseLinearBias, LeavesOtherShapes) {
  auto unchanged = [](Model m, const char* why) {
    const std::string text = compact(m.graph);
    EXPECT_FALSE(run_pass("fuse_linear_bias", m).changed) << why;
    EXPECT_EQ(compact(m.graph), text) << why;
  };
  unchanged(linear_model({2, 3, 5}, {6}), "3-D input");
  unchanged(linear_model({3, 5}, {3, 6}), "bias is not a row");
  {  // The MatMul's output has a second reader.
    Builder b;
    ValueId x = b.input("x", {3, 5});
    ValueId y = b.op("mm", "MatMul", {x, b.constant("w", uniform_f32({5, 6}, 56))}, "y");
    b.output(b.op("add", "Add", {y, b.constant("bias", uniform_f32({6}, 57))}, "z"));
    b.output(b.op("relu", "Relu", {y}, "other"));
    unchanged(b.done(), "second reader");
  }
  {  // Weights that are not constant.
    Builder b;
    ValueId x = b.input("x", {3, 5});
    ValueId y = b.op("mm", "MatMul", {x, b.input("w", {5, 6})}, "y");
    b.output(b.op("add", "Add", {y, b.constant("bias", uniform_f32({6}, 58))}, "z"));
    unchanged(b.done(), "weights are an input");
  }
}

// ---- merge_projections -------------------------------------------------------------------

// Q, K and V of one input as BERT writes them (products with biases) and the LLaMA block
// (plain MatMuls, K narrower), beside products that must stay apart: two other epilogues (the
// plain products can join one, not two), a width that is not a multiple of 32, a weight
// computed at run time.
Model projections_model() {
  Builder b;
  ValueId x = b.input("x", {2, 5, 16});
  b.output(b.op("q", "FusedMatMul", {x, b.constant("wq", uniform_f32({16, 64}, 80)), b.constant("bq", uniform_f32({64}, 81))}, "q_out"));
  b.output(b.op("k", "MatMul", {x, b.constant("wk", uniform_f32({16, 32}, 82))}, "k_out"));
  b.output(b.op("v", "FusedMatMul", {x, b.constant("wv", uniform_f32({16, 32}, 83)), b.constant("bv", uniform_f32({32}, 84))}, "v_out"));
  b.output(b.op("gate", "FusedMatMul", {x, b.constant("wg", uniform_f32({16, 32}, 85))}, "gate_out", {attr("activation", std::string("Silu"))}));
  b.output(b.op("relu", "FusedMatMul", {x, b.constant("wr", uniform_f32({16, 32}, 89))}, "relu_out", {attr("activation", std::string("Relu"))}));
  b.output(b.op("odd", "MatMul", {x, b.constant("wo", uniform_f32({16, 40}, 86))}, "odd_out"));
  b.output(b.op("dyn", "MatMul", {x, b.input("w", {16, 32})}, "dyn_out"));
  return b.done();
}

TEST(CompileMergeProjections, MergesProductsOfOneInput) {
  Model m = projections_model();
  EXPECT_EQ(run_pass("merge_projections", m).summary, "merged 3 products of a shared input into 1 product with split outputs");
  EXPECT_EQ(count_ops(m.graph, "FusedMatMul"), 3u);
  const std::string text = compact(m.graph);
  EXPECT_NE(text.find("  const wq_merged: f32[16,128]\n  const wq_merged_bias: f32[128]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  node q: FusedMatMul(x, wq_merged, wq_merged_bias) -> (q_out, k_out, v_out) splits=ints[64, 32, 32] "
                      "sources=[\"q\", \"k\", \"v\"]\n"),
            std::string::npos)
      << text;
  for (const char* apart : {"node gate: FusedMatMul(x, wg)", "node relu: FusedMatMul(x, wr)", "node odd: MatMul(x, wo)", "node dyn: MatMul(x, w)"})
    EXPECT_NE(text.find(apart), std::string::npos) << apart << "\n" << text;
  EXPECT_EQ(text.find("const wk:"), std::string::npos) << "the merged weights are dropped";
}

TEST(CompileMergeProjections, SameOutputs) {
  Model before = projections_model(), after = before;
  EXPECT_TRUE(run_pass("merge_projections", after).changed);
  expect_same_outputs(before, after, {uniform_f32({2, 5, 16}, 87), uniform_f32({16, 32}, 88)}, 0);
}

// The LLaMA block's MLP: up (plain) and gate (SiLU) projections of one input, then their
// product: one gated product (gate_block 64), its weight's columns in blocks of 64 up then 64
// gate ones, writing up · SiLU(gate) itself. Left as a product with split outputs: halves of
// 32 columns (not whole blocks of 64), and an up projection read elsewhere too.
TEST(CompileMergeProjections, MergesGateAndUpProjections) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    const int64_t width = variant == 1 ? 32 : 128;
    Builder b;
    ValueId x = b.input("x", {2, 5, 16});
    ValueId up = b.op("up", "MatMul", {x, b.constant("wu", uniform_f32({16, width}, 100))}, "up_out");
    ValueId gate = b.op("gate", "FusedMatMul", {x, b.constant("wg", uniform_f32({16, width}, 101))}, "gate_out",
                        {attr("activation", std::string("Silu"))});
    b.output(b.op("mul", "Mul", {gate, up}, "y"));
    if (variant == 2) b.output(up);
    Model before = b.done(), after = before;
    const std::string merged = "merged 2 products of a shared input into 1 product with split outputs";
    if (variant == 0) {
      EXPECT_EQ(run_pass("merge_projections", after).summary, merged + "; gated 1 product (up · act(gate), the Mul in the GEMM)");
      const std::string gated = compact(after.graph);
      EXPECT_NE(gated.find("  node up: FusedMatMul(x, wu_merged_gated) -> (y) activation=\"Silu\" gate_block=64 "
                           "sources=[\"up\", \"gate\", \"mul\"]\n"),
                std::string::npos)
          << gated;
      EXPECT_EQ(count_ops(after.graph, "Mul"), 0u);
    } else {
      EXPECT_EQ(run_pass("merge_projections", after).summary, merged);
      const std::string split = compact(after.graph);
      EXPECT_NE(split.find("  node up: FusedMatMul(x, wu_merged) -> (up_out, gate_out) activated=ints[0, 1] activation=\"Silu\" splits=ints[" +
                           std::to_string(width) + ", " + std::to_string(width) + "] sources=[\"up\", \"gate\"]\n"),
                std::string::npos)
          << split;
      EXPECT_EQ(count_ops(after.graph, "Mul"), 1u);
    }
    expect_same_outputs(before, after, {uniform_f32({2, 5, 16}, 102)}, 1e-6);
  }
}

// With `--precision fp16` or `bf16`, products by f16 or bf16 weights merge among their own type
// (kiln's f16 GEMM, and its bf16 one, which stores each 16-column vector where its output
// lies), at multiples of 64 and 32 columns, never with f32 ones.
TEST(CompileMergeProjections, MergesLowerPrecisionWeightsApart) {
  for (DType type : {DType::f16, DType::bf16}) {
    const std::string name(dtype_name(type));
    SCOPED_TRACE(name);
    const int64_t align = type == DType::f16 ? 64 : 32;
    auto lowered = [&](const Tensor& t) { return type == DType::f16 ? to_f16(t) : to_bf16(t); };
    Builder b;
    ValueId x = b.input("x", {2, 5, 16});
    b.output(b.op("q", "FusedMatMul", {x, b.constant("wq", lowered(uniform_f32({16, 64}, 110))), b.constant("bq", uniform_f32({64}, 115))}, "q_out"));
    b.output(b.op("k", "FusedMatMul", {x, b.constant("wk", lowered(uniform_f32({16, 2 * align}, 111)))}, "k_out"));
    b.output(b.op("narrow", "FusedMatMul", {x, b.constant("wn", lowered(uniform_f32({16, align / 2}, 112)))}, "narrow_out"));
    b.output(b.op("f32", "MatMul", {x, b.constant("wf", uniform_f32({16, 64}, 113))}, "f32_out"));
    Model before = b.done(), after = before;
    EXPECT_EQ(run_pass("merge_projections", after).summary, "merged 2 products of a shared input into 1 product with split outputs");
    const std::string text = compact(after.graph), n = std::to_string(64 + 2 * align);
    EXPECT_NE(text.find("  const wq_merged: " + name + "[16," + n + "]\n  const wq_merged_bias: f32[" + n + "]\n"), std::string::npos) << text;
    EXPECT_NE(text.find("  node q: FusedMatMul(x, wq_merged, wq_merged_bias) -> (q_out, k_out) splits=ints[64, " + std::to_string(2 * align) +
                        "] sources=[\"q\", \"k\"]\n"),
              std::string::npos)
        << text;
    for (const char* apart : {"node narrow: FusedMatMul(x, wn)", "node f32: MatMul(x, wf)"})
      EXPECT_NE(text.find(apart), std::string::npos) << apart << "\n" << text;
    expect_same_outputs(before, after, {uniform_f32({2, 5, 16}, 114)}, 0);
  }
}

// GPT-2's packed projection (a 2-D product, a Reshape back to [batch, seq, ·], a Split with
// sizes) and ViT's (a Split into equal parts along axis -1; with `symbolic`, of a product whose
// batch and sequence are symbolic, as compiled without --input-shape).
Model packed_projections_model(bool symbolic = false) {
  Builder b;
  ValueId x = b.input("x", {10, 16});
  ValueId qkv = b.op("c_attn", "FusedMatMul", {x, b.constant("w", uniform_f32({16, 96}, 90)), b.constant("bias", uniform_f32({96}, 91))}, "qkv");
  ValueId r = b.op("reshape", "Reshape", {qkv, b.constant("shape", testing::ints({2, 5, 96}))}, "qkv3");
  for (ValueId p : b.split("split", {r, b.constant("sizes", testing::ints({32, 32, 32}))}, {"q", "k", "v"}, {attr("axis", int64_t{2})}))
    b.output(p);
  const ValueId in = symbolic ? b.input("y", sym_shape({Dim::sym("batch"), Dim::sym("sequence"), Dim::known(8)})) : b.input("y", {2, 3, 8});
  ValueId y = b.op("proj", "MatMul", {in, b.constant("w2", uniform_f32({8, 64}, 92))}, "y2");
  const std::vector<ValueId> halves = b.split("halves", {y}, {"h0", "h1"}, {attr("axis", int64_t{-1})});
  b.output(b.op("relu", "Relu", {halves[0]}, "h0_relu"));
  b.output(halves[1]);
  return b.done();
}

TEST(CompileMergeProjections, FoldsSplitsOfAProductsColumns) {
  for (bool symbolic : {false, true}) {
    SCOPED_TRACE(symbolic ? "symbolic batch and sequence" : "concrete");
    Model before = packed_projections_model(symbolic), after = before;
    EXPECT_EQ(run_pass("merge_projections", after).summary, "folded 2 Splits of a product's columns into it");
    EXPECT_EQ(count_ops(after.graph, "Split"), 0u);
    const std::string text = compact(after.graph);
    EXPECT_NE(text.find("  node c_attn: FusedMatMul(x, w, bias) -> (q_part, k_part, v_part) splits=ints[32, 32, 32] "
                        "sources=[\"c_attn\", \"reshape\", \"split\"]\n"
                        "  node q_reshape: Reshape(q_part, q_shape) -> (q) sources=[\"reshape\"]\n"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("  node proj: FusedMatMul(y, w2) -> (h0, h1) splits=ints[32, 32] sources=[\"proj\", \"halves\"]\n"),
              std::string::npos)
        << text;
    expect_same_outputs(before, after, {uniform_f32({10, 16}, 93), uniform_f32({2, 3, 8}, 94)}, 0);
  }
}

TEST(CompileMergeProjections, LeavesWhatItCannotMerge) {
  auto unchanged = [](Model m, const char* why) {
    const std::string text = compact(m.graph);
    EXPECT_FALSE(run_pass("merge_projections", m).changed) << why;
    EXPECT_EQ(compact(m.graph), text) << why;
  };
  auto split_of = [](std::vector<int64_t> sizes, int64_t axis, bool second_reader) {
    Builder b;
    ValueId y = b.op("mm", "MatMul", {b.input("x", {4, 16}), b.constant("w", uniform_f32({16, 64}, 95))}, "y");
    for (ValueId p : b.split("split", {y, b.constant("sizes", testing::ints(std::move(sizes)))}, {"p0", "p1"}, {attr("axis", axis)}))
      b.output(p);
    if (second_reader) b.output(b.op("relu", "Relu", {y}, "r"));
    return b.done();
  };
  unchanged(split_of({40, 24}, 1, false), "a split point that is not a multiple of 32");
  unchanged(split_of({2, 2}, 0, false), "a split along rows");
  unchanged(split_of({32, 32}, 1, true), "a product read by another node too");
  {
    Builder b;
    ValueId x = b.input("x", {3, 16});
    b.output(b.op("a", "MatMul", {x, b.constant("wa", uniform_f32({16, 32}, 96))}, "ya"));
    b.output(b.op("b", "FusedMatMul", {x, b.constant("wb", uniform_f32({16, 32}, 97)), kNoValue,
                                         b.input("z", {3, 32})},
                  "yb"));
    unchanged(b.done(), "a product with a residual");
  }
}

// ---- eliminate_dead ----------------------------------------------------------------------

Model dead_code_model() {
  Builder b;
  ValueId x = b.input("x", {4});
  b.constant("unused", uniform_f32({4}, 60));
  ValueId dead = b.op("dead_exp", "Exp", {x}, "dead");
  b.op("dead_neg", "Neg", {dead}, "dead2");
  b.output(b.op("relu", "Relu", {x}, "out"));
  return b.done();
}

TEST(CompileEliminateDead, DropsUnreadNodesAndConstants) {
  Model m = dead_code_model();
  EXPECT_EQ(run_pass("eliminate_dead", m).summary, "dropped 2 nodes and 3 values (1 constant)");
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[4]\n"
            "  value out: f32[4]\n"
            "  node relu: Relu(x) -> (out) sources=[\"relu\"]\n"
            "  output out\n");
}

TEST(CompileEliminateDead, SameOutputs) {
  Model before = dead_code_model(), after = before;
  run_pass("eliminate_dead", after);
  expect_same_outputs(before, after, {uniform_f32({4}, 61)}, 0);
}

TEST(CompileEliminateDead, KeepsConstantsSubgraphsRead) {
  Model before = testing::if_model();
  Graph& g = before.graph;
  ASSERT_TRUE(infer_graph(g).ok());
  // The then-branch captures k: no node input refers to it.
  ValueId k = g.add_constant("k", make<float>({2}, {10, 20}));
  g.replace_all_uses(g.find_value("x"), k);
  Model after = before;
  EXPECT_FALSE(run_pass("eliminate_dead", after).changed);
  EXPECT_NE(after.graph.find_value("k"), kNoValue);
  for (bool cond : {true, false})
    expect_same_outputs(before, after, {make<bool>({}, {cond}), uniform_f32({2}, 62)}, 0);
}

// ---- select_kernels ----------------------------------------------------------------------

// The Conv (constant weights) goes to oneDNN, the LayerNormalization to kiln's own kernel for
// the target's ISA, the BatchNormalization to its reference kernel; the target records the ISA
// those kernels need.
Model select_model() {
  Builder b;
  ValueId x = b.input("x", {1, 3, 6, 8});
  ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({4, 3, 3, 3}, 31))}, "y",
                   {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  ValueId z = batchnorm(b, y, 4, 32);
  b.output(b.op("norm", "LayerNormalization", {z, b.constant("scale", uniform_f32({8}, 33))}, "out"));
  return b.done();
}

TEST(CompileSelectKernels, RecordsKernelsTargetAndMemoryPlan) {
  Model m = select_model();
  Target target;
  target.cpu = *CpuFeatures::named("avx2");
  target.threads = 2;
  PassContext ctx{target, {}};
  auto r = find_pass("select_kernels")->run(m, ctx);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(r->changed);
  EXPECT_EQ(r->summary.rfind("2 nodes on library or kiln kernels, 1 node on reference kernels; arena ", 0), 0u) << r->summary;
  std::vector<std::string> kernels;
  for (const Node& n : m.graph.nodes) kernels.push_back(n.name + "=" + n.kernel.name);
  EXPECT_EQ(kernels, (std::vector<std::string>{"conv=onednn.conv", "bn=ref", "norm=kiln.norm_f32_avx2"}));
  ASSERT_TRUE(m.target);
  EXPECT_EQ(*m.target, (TargetRecord{"cpu", {"avx2", "fma"}, 2}));
  ASSERT_TRUE(m.memory_plan);
  EXPECT_EQ(m.memory_plan->input_shapes, (std::vector<std::vector<int64_t>>{{1, 3, 6, 8}}));
  EXPECT_EQ(m.memory_plan->values.size(), 2u) << "y and z live in the arena";
  EXPECT_TRUE(verify_model(m).ok());
  // The recorded kernels compute what the reference kernels do. The session plans the recorded
  // input shapes when it is created, and the run uses that plan.
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ((*s)->memory_stats().signatures, 1u);
  EXPECT_EQ((*s)->memory_stats().arena_bytes, m.memory_plan->arena_bytes);
  Tensor in = uniform_f32({1, 3, 6, 8}, 34);
  auto got = (*s)->run(std::vector<Tensor>{in});
  ASSERT_TRUE(got.ok()) << got.error().message();
  EXPECT_EQ((*s)->memory_stats().signatures, 1u) << "no second plan";
  EXPECT_LE(relative_l2((*got)[0], run_reference(m, {in})[0]), 1e-5);
}

TEST(CompileSelectKernels, NeedsConcreteInputShapes) {
  Builder b;
  ValueId x = b.input("x", Shape({Dim::sym("batch"), Dim::known(4)}));
  b.output(b.op("relu", "Relu", {x}, "out"));
  Model m = b.done();
  PassResult r = run_pass("select_kernels", m);
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(r.summary, "input 'x' has shape batchx4: give --input-shape to choose kernels");
  EXPECT_FALSE(m.target);
  EXPECT_TRUE(m.graph.nodes[0].kernel.empty());
}

// ---- hoist_activations ---------------------------------------------------------------------

// A detection head: a 1x1 convolution's output reshaped to [N, anchors, outputs, H, W],
// transposed to [N, anchors, H, W, outputs], then a Sigmoid; a Relu after a Flatten whose input
// another node reads too (stays); a Tanh after a Transpose of a graph input (moves: the input is
// read by the Transpose alone).
Model hoist_model() {
  Builder b;
  ValueId x = b.input("x", {1, 8, 4, 5});
  ValueId c = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({12, 8, 1, 1}, 93))}, "c");
  ValueId r = b.op("split", "Reshape", {c, b.constant("s5", Tensor::from<int64_t>({5}, {1, 3, 4, 4, 5}))}, "r");
  ValueId t = b.op("head", "Transpose", {r}, "t", {attr("perm", std::vector<int64_t>{0, 1, 3, 4, 2})});
  b.output(b.op("sig", "Sigmoid", {t}, "p"));
  ValueId u = b.input("u", {2, 3, 4});
  ValueId f = b.op("flat", "Flatten", {u}, "f");
  b.output(b.op("relu", "Relu", {f}, "rf"));
  b.output(b.op("neg", "Neg", {u}, "nu"));
  ValueId v = b.input("v", {2, 3});
  ValueId tv = b.op("tv", "Transpose", {v}, "tvv", {});
  b.output(b.op("tanh", "Tanh", {tv}, "th"));
  return b.done();
}

TEST(CompileHoistActivations, Golden) {
  Model m = hoist_model();
  PassResult r = run_pass("hoist_activations", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary, "moved 3 activations ahead of a Reshape, Transpose, Flatten, Squeeze or Unsqueeze");
  EXPECT_EQ(testing::nodes_text(m.graph),
            "node conv: Conv(x, w) -> (c) sources=[\"conv\"]\n"
            "node sig: Sigmoid(c) -> (r) sources=[\"sig\"]\n"
            "node split: Reshape(r, s5) -> (t) sources=[\"split\"]\n"
            "node head: Transpose(t) -> (p) perm=ints[0, 1, 3, 4, 2] sources=[\"head\"]\n"
            "node flat: Flatten(u) -> (f) sources=[\"flat\"]\n"
            "node relu: Relu(f) -> (rf) sources=[\"relu\"]\n"
            "node neg: Neg(u) -> (nu) sources=[\"neg\"]\n"
            "node tanh: Tanh(v) -> (tvv) sources=[\"tanh\"]\n"
            "node tv: Transpose(tvv) -> (th) sources=[\"tv\"]\n");
  // Then the convolution takes the Sigmoid as its epilogue.
  EXPECT_EQ(run_pass("fuse_epilogues", m).summary, "made 1 fused conv/matmul absorbing 1 node");
}

TEST(CompileHoistActivations, SameOutputs) {
  Model before = hoist_model(), after = before;
  run_pass("hoist_activations", after);
  expect_same_outputs(before, after, {uniform_f32({1, 8, 4, 5}, 94), uniform_f32({2, 3, 4}, 95), uniform_f32({2, 3}, 96)}, 0);
}

// ---- merge_transposes ----------------------------------------------------------------------

// A detection head as the layout pass leaves it: a channels-last output brought back to NCHW,
// reshaped to [N, anchors, outputs, H, W] and transposed to [N, anchors, H, W, outputs]; two
// Transposes that cancel; and a vision transformer's patch embedding, its channels-last output
// brought back to NCHW, flattened to [N, C, H·W] and transposed to [N, H·W, C].
Model head_model() {
  Builder b;
  ValueId x = b.input("x", {1, 4, 5, 12});  // NHWC, 12 = 3 anchors x 4 outputs
  ValueId nchw = b.op("to_nchw", "Transpose", {x}, "nchw", {attr("perm", std::vector<int64_t>{0, 3, 1, 2})});
  ValueId r = b.op("split", "Reshape", {nchw, b.constant("s5", Tensor::from<int64_t>({5}, {1, 3, 4, 4, 5}))}, "r");
  b.output(b.op("head", "Transpose", {r}, "y", {attr("perm", std::vector<int64_t>{0, 1, 3, 4, 2})}));
  ValueId u = b.input("u", {2, 3, 4});
  ValueId t = b.op("t1", "Transpose", {u}, "t", {attr("perm", std::vector<int64_t>{2, 0, 1})});
  b.output(b.op("t2", "Transpose", {t}, "back", {attr("perm", std::vector<int64_t>{1, 2, 0})}));
  ValueId v = b.input("v", {1, 2, 3, 8});  // NHWC
  ValueId planes = b.op("v_nchw", "Transpose", {v}, "planes", {attr("perm", std::vector<int64_t>{0, 3, 1, 2})});
  ValueId flat = b.op("flatten", "Reshape", {planes, b.constant("s3", Tensor::from<int64_t>({3}, {1, 8, 6}))}, "flat");
  b.output(b.op("tokens", "Transpose", {flat}, "z", {attr("perm", std::vector<int64_t>{0, 2, 1})}));
  return b.done();
}

TEST(CompileMergeTransposes, Golden) {
  Model m = head_model();
  PassResult r = run_pass("merge_transposes", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary, "merged 3 pairs of Transposes (2 around a Reshape)");
  // The head: X's last dim split into [3, 4], then one Transpose moving rows of 4; the pair
  // that cancels: a Reshape to the same shape; the patches: V's H and W merged, the tokens
  // as they lie.
  EXPECT_EQ(testing::nodes_text(m.graph),
            "node head_split: Reshape(x, head_split_shape) -> (x_split) sources=[\"to_nchw\", \"split\", \"head\"]\n"
            "node head: Transpose(x_split) -> (y) perm=ints[0, 3, 1, 2, 4] sources=[\"to_nchw\", \"split\", \"head\"]\n"
            "node t2: Reshape(u, t2_shape) -> (back) sources=[\"t1\", \"t2\"]\n"
            "node tokens: Reshape(v, tokens_shape) -> (z) sources=[\"v_nchw\", \"flatten\", \"tokens\"]\n");
}

TEST(CompileMergeTransposes, SameOutputs) {
  Model before = head_model(), after = before;
  run_pass("merge_transposes", after);
  expect_same_outputs(before, after, {uniform_f32({1, 4, 5, 12}, 91), uniform_f32({2, 3, 4}, 92), uniform_f32({1, 2, 3, 8}, 93)}, 0);
}

TEST(CompileMergeTransposes, LeavesWhatItCannotMerge) {
  // A Reshape that merges dims the input has in the other order; an intermediate that is read
  // elsewhere.
  Builder b;
  ValueId x = b.input("x", {2, 3, 4});
  ValueId t = b.op("t1", "Transpose", {x}, "t", {attr("perm", std::vector<int64_t>{1, 0, 2})});
  ValueId r = b.op("merge", "Reshape", {t, b.constant("s", Tensor::from<int64_t>({2}, {6, 4}))}, "r");
  b.output(b.op("t2", "Transpose", {r}, "y", {attr("perm", std::vector<int64_t>{1, 0})}));
  ValueId u = b.input("u", {2, 3});
  ValueId tu = b.op("u1", "Transpose", {u}, "tu", {});
  b.output(b.op("u2", "Transpose", {tu}, "back", {}));
  b.output(tu);
  Model m = b.done();
  PassResult r2 = run_pass("merge_transposes", m);
  EXPECT_FALSE(r2.changed);
  EXPECT_EQ(r2.summary, "");
}

// ---- fold_split_concat ---------------------------------------------------------------------

// YOLO's detection head after the Sigmoid: the box pieces decoded, the class scores passed on
// (`scores` read by the Concat only); and a C2f block: the split halves joined with what the
// bottleneck made of the second one.
Model split_concat_model() {
  Builder b;
  ValueId x = b.input("x", {1, 3, 4, 5, 9});
  ValueId p = b.op("sig", "Sigmoid", {x}, "p");
  const std::vector<ValueId> pieces =
      b.split("split", {p, b.constant("sizes", Tensor::from<int64_t>({3}, {2, 2, 5}))}, {"xy", "wh", "scores"}, {attr("axis", int64_t{4})});
  const ValueId xy = pieces[0], wh = pieces[1], scores = pieces[2];
  ValueId two = b.constant("two", Tensor::from<float>({}, {2.f}));
  ValueId xy2 = b.op("xy2", "Mul", {xy, two}, "xy2"), wh2 = b.op("wh2", "Mul", {wh, wh}, "wh2");
  ValueId boxes = b.op("boxes", "Concat", {xy2, wh2, scores}, "boxes", {attr("axis", int64_t{-1})});
  b.output(b.op("out", "Neg", {boxes}, "out"));
  ValueId u = b.input("u", {1, 4, 4, 6});
  ValueId h = b.op("h", "Relu", {u}, "h");
  const std::vector<ValueId> halves = b.split("halves", {h}, {"h0", "h1"}, {attr("axis", int64_t{3}), attr("num_outputs", int64_t{2})});
  const ValueId h0 = halves[0], h1 = halves[1];
  ValueId m = b.op("m", "Tanh", {h1}, "m");
  b.output(b.op("c2f", "Concat", {h0, h1, m}, "c2f", {attr("axis", int64_t{3})}));
  return b.done();
}

TEST(CompileFoldSplitConcat, Golden) {
  Model m = split_concat_model();
  PassResult r = run_pass("fold_split_concat", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary, "made 1 ReplaceSlices (1 piece passed through uncopied); read 1 Split's input in place of all their pieces");
  // The head: the Split writes the box pieces only, ReplaceSlices puts them over its input. The
  // C2f block: the Concat reads h whole; the first half leaves the Split (the second is still
  // the bottleneck's).
  EXPECT_EQ(testing::nodes_text(m.graph),
            "node sig: Sigmoid(x) -> (p) sources=[\"sig\"]\n"
            "node split: Split(p, sizes) -> (xy, wh, _) axis=4 sources=[\"split\"]\n"
            "node xy2: Mul(xy, two) -> (xy2) sources=[\"xy2\"]\n"
            "node wh2: Mul(wh, wh) -> (wh2) sources=[\"wh2\"]\n"
            "node boxes: ReplaceSlices(p, xy2, wh2) -> (boxes) axis=4 starts=ints[0, 2] sources=[\"boxes\"]\n"
            "node out: Neg(boxes) -> (out) sources=[\"out\"]\n"
            "node h: Relu(u) -> (h) sources=[\"h\"]\n"
            "node halves: Split(h) -> (_, h1) axis=3 num_outputs=2 sources=[\"halves\"]\n"
            "node m: Tanh(h1) -> (m) sources=[\"m\"]\n"
            "node c2f: Concat(h, m) -> (c2f) axis=3 sources=[\"c2f\"]\n");
}

TEST(CompileFoldSplitConcat, SameOutputsAndTheUpdatesGoOverTheInput) {
  Model before = split_concat_model(), after = before;
  run_pass("fold_split_concat", after);
  const std::vector<Tensor> inputs = {uniform_f32({1, 3, 4, 5, 9}, 93), uniform_f32({1, 4, 4, 6}, 94)};
  expect_same_outputs(before, after, inputs, 0);
  // The plan puts ReplaceSlices' output over the Sigmoid's, which dies there: only the updates
  // move. And the fast kernels compute what the reference does (their Sigmoid and Tanh within
  // float rounding of libm's).
  Target target;
  const std::vector<std::vector<int64_t>> shapes = {{1, 3, 4, 5, 9}, {1, 4, 4, 6}};
  auto plan = build_plan(after.graph, shapes, PlanOptions{target, default_kernels()});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  const auto at = std::find_if(after.graph.nodes.begin(), after.graph.nodes.end(), [](const Node& n) { return n.op == "ReplaceSlices"; });
  ASSERT_NE(at, after.graph.nodes.end());
  const auto n = static_cast<size_t>(at - after.graph.nodes.begin());
  EXPECT_EQ(plan->kernels[n].name, "kiln.replace_slices");
  EXPECT_EQ(plan->overwrites[n], 1);
  EXPECT_EQ(plan->memory.offset[static_cast<size_t>(at->inputs[0])], plan->memory.offset[static_cast<size_t>(at->outputs[0])]);
  auto fast = Session::create(after);
  ASSERT_TRUE(fast.ok()) << fast.error().message();
  auto got = (*fast)->run(inputs);
  ASSERT_TRUE(got.ok()) << got.error().message();
  const std::vector<Tensor> want = run_reference(before, inputs);
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(relative_l2((*got)[i], want[i]), 1e-6) << i;
}

TEST(CompileFoldSplitConcat, LeavesWhatItCannotFold) {
  // A piece read elsewhere too; a Split along another axis; pieces out of order.
  Builder b;
  ValueId x = b.input("x", {2, 6});
  const std::vector<ValueId> pieces = b.split("split", {x}, {"a", "c"}, {attr("axis", int64_t{1}), attr("num_outputs", int64_t{2})});
  const ValueId a = pieces[0], c = pieces[1];
  ValueId a2 = b.op("a2", "Neg", {a}, "a2");
  b.output(b.op("shared", "Concat", {a2, c}, "shared", {attr("axis", int64_t{1})}));
  b.output(b.op("reads_c", "Abs", {c}, "reads_c"));
  b.output(b.op("other_axis", "Concat", {a, c}, "other_axis", {attr("axis", int64_t{0})}));
  b.output(b.op("swapped", "Concat", {c, a}, "swapped", {attr("axis", int64_t{1})}));
  Model m = b.done();
  PassResult r = run_pass("fold_split_concat", m);
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(r.summary, "");
}

TEST(CompileFoldSplitConcat, AConcatOfEveryPieceIsTheInput) {
  Builder b;
  ValueId x = b.input("x", {3, 8});
  ValueId y = b.op("neg", "Neg", {x}, "y");
  const std::vector<ValueId> pieces = b.split("split", {y, b.constant("sizes", Tensor::from<int64_t>({2}, {5, 3}))}, {"a", "c"}, {attr("axis", int64_t{-1})});
  b.output(b.op("join", "Concat", pieces, "join", {attr("axis", int64_t{1})}));
  Model before = b.done(), after = before;
  EXPECT_TRUE(run_pass("fold_split_concat", after).changed);
  EXPECT_EQ(testing::nodes_text(after.graph),
            "node neg: Neg(x) -> (y) sources=[\"neg\"]\n"
            "node join: Identity(y) -> (join) sources=[\"join\"]\n");
  expect_same_outputs(before, after, {uniform_f32({3, 8}, 95)}, 0);
}

// ---- the pipeline ------------------------------------------------------------------------

TEST(CompilePipeline, RunsEveryPassInTableOrderAndRecordsTheCompile) {
  Model before = conv_bn_model(true), m = before;
  CompileOptions options;
  options.command_line = "kiln compile m.kiln -o c.kiln";
  options.input_file = "m.kiln";
  options.input_sha256 = std::string(64, 'a');
  options.print_after = {"fold_batchnorm", "cse"};
  std::vector<std::string> seen;
  options.after_pass = [&](const PassRecord& r) { seen.push_back(r.name); };
  auto report = compile_model(m, options);
  ASSERT_TRUE(report.ok()) << report.error().message();
  std::vector<std::string> table;
  for (const PassInfo& p : all_passes()) table.emplace_back(p.name);
  EXPECT_EQ(seen, table);
  ASSERT_EQ(report->passes.size(), table.size());
  for (const PassRecord& r : report->passes) {
    EXPECT_GE(r.ms, 0.0);
    // Text is kept for the passes asked for, when they changed something.
    EXPECT_EQ(r.has_text, r.name == "fold_batchnorm") << r.name;
  }
  EXPECT_NE(report->passes[3].text_after.find("model stage=exported"), std::string::npos);
  EXPECT_EQ(m.stage, Stage::compiled);
  ASSERT_EQ(m.provenance.size(), 1u);
  EXPECT_EQ(m.provenance[0].tool, "kiln compile");
  EXPECT_EQ(m.provenance[0].input_file, "m.kiln");
  EXPECT_EQ(m.provenance[0].command, options.command_line);
  expect_same_outputs(before, m, {uniform_f32({2, 3, 5, 7}, 70)}, 1e-5);
}

TEST(CompilePipeline, RunsTheChosenPassesInTheGivenOrder) {
  Model m = dead_code_model();
  CompileOptions options;
  options.passes = {"eliminate_dead", "cse", "eliminate_dead"};
  auto report = compile_model(m, options);
  ASSERT_TRUE(report.ok()) << report.error().message();
  ASSERT_EQ(report->passes.size(), 3u);
  EXPECT_TRUE(report->passes[0].result.changed);
  EXPECT_EQ(report->passes[1].name, "cse");
  EXPECT_FALSE(report->passes[2].result.changed);
}

TEST(CompilePipeline, UnknownPassesAreUserErrors) {
  Model m = dead_code_model();
  CompileOptions options;
  options.passes = {"cse", "frobnicate"};
  auto r = compile_model(m, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_EQ(r.error().what,
            "--passes: unknown pass 'frobnicate' (known passes: specialize_shapes, fold_constants, cse, fold_batchnorm, drop_linear_reshapes, "
            "fuse_linear_bias, fuse_layer_norm, fuse_rms_norm, fuse_gelu, fuse_rotary, fuse_attention, hoist_activations, fuse_epilogues, gather_rows_early, channels_last, lower_int8, lower_precision, merge_projections, merge_transposes, fold_split_concat, "
            "fuse_concat, fuse_pointwise_depthwise, fuse_channel_scale, eliminate_dead, "
            "select_kernels, autotune_kernels, prepack_weights)");
  EXPECT_EQ(m.stage, Stage::exported) << "nothing ran";
  options.passes.clear();
  options.print_after = {"nope"};
  EXPECT_FALSE(check_pass_names(options).ok());
  options.print_after = {"all"};
  EXPECT_TRUE(check_pass_names(options).ok());
}

TEST(CompilePipeline, PassUserErrorsComeBackAsTheyAre) {
  Model m = shared_batch_model();
  CompileOptions options;
  options.input_shapes = {{"nosuch", Shape::of(std::vector<int64_t>{1, 4})}};
  auto r = compile_model(m, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_EQ(r.error().where, "input 'nosuch'");
}

}  // namespace
}  // namespace kiln
