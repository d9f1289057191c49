// The op table's traits: FLOP and byte counts, the element types each op accepts (checked
// before inference), prepackable inputs, and consistency of every op's traits with its arity.
#include <gtest/gtest.h>

#include <limits>

#include "formats/op_schema.h"
#include "formats/summary.h"

namespace kiln {
namespace {

Shape dims(std::vector<int64_t> d) { return Shape::of(d); }

// A value of a one-node graph: its shape, and its dtype when it is not the node's.
struct Val {
  Val(Shape s, DType t = DType::undefined) : shape(std::move(s)), dtype(t) {}  // NOLINT: implicit from a shape
  Shape shape;
  DType dtype;
};

// One node `op` with the given inputs (null: omitted) and output, of dtype `dt` unless they say.
Graph one_node(const std::string& op, std::vector<std::optional<Val>> in, Val out, DType dt = DType::f32) {
  auto type = [&](const Val& v) { return v.dtype == DType::undefined ? dt : v.dtype; };
  Graph g;
  Node n{.name = "n", .op = op};
  for (size_t i = 0; i < in.size(); ++i)
    n.inputs.push_back(in[i] ? g.add_value("in" + std::to_string(i), type(*in[i]), in[i]->shape) : kNoValue);
  n.outputs = {g.add_value("y", type(out), out.shape)};
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

  // Not counted: dense ops whose weights are missing (the other ops' models: flop_models_test).
  Graph no_w = one_node("Conv", {dims({1, 8, 16, 16}), std::nullopt}, dims({1, 4, 14, 14}));
  EXPECT_EQ(node_flops(no_w.nodes[0], no_w), 0);
}

TEST(OpTraits, BytesCountEveryInputAndOutputOnce) {
  // Conv: x 1x8x16x16, w 4x8x3x3 and y 1x4x14x14 in f32.
  Graph c = one_node("Conv", {dims({1, 8, 16, 16}), dims({4, 8, 3, 3})}, dims({1, 4, 14, 14}));
  EXPECT_EQ(node_bytes(c.nodes[0], c), (2048 + 288 + 784) * 4);
  Graph mm = one_node("MatMul", {dims({2, 3, 5}), dims({5, 7})}, dims({2, 3, 7}));
  EXPECT_EQ(node_bytes(mm.nodes[0], mm), (30 + 35 + 42) * 4);
  // A broadcast operand is read once, at its own size; a symbolic dim counts as 1.
  Graph add = one_node("Add", {dims({4, 3}), dims({3})}, dims({4, 3}));
  EXPECT_EQ(node_bytes(add.nodes[0], add), (12 + 3 + 12) * 4);
  const Shape batch_by_3({Dim::sym("batch"), Dim::known(3)});
  Graph sym = one_node("Add", {batch_by_3, dims({3})}, batch_by_3);
  EXPECT_EQ(node_bytes(sym.nodes[0], sym), (3 + 3 + 3) * 4);
  // Absurd dims saturate rather than wrap.
  Graph huge = one_node("Relu", {dims({int64_t{1} << 40, int64_t{1} << 40})}, dims({int64_t{1} << 40, int64_t{1} << 40}));
  EXPECT_EQ(node_bytes(huge.nodes[0], huge), std::numeric_limits<int64_t>::max());
}

TEST(OpTraits, BytesOfSelectionsAndShapeReads) {
  // Gather of 10 rows of a 1000x64 table reads those rows and its i64 indices, not the table.
  Graph gather = one_node("Gather", {dims({1000, 64}), Val(dims({2, 5}), DType::i64)}, dims({2, 5, 64}));
  EXPECT_EQ(node_bytes(gather.nodes[0], gather), 640 * 4 + 10 * 8 + 640 * 4);
  // Gathering more than the data (repeated indices) reads at most all of it.
  Graph repeat = one_node("Gather", {dims({2, 4}), Val(dims({100}), DType::i64)}, dims({100, 4}));
  EXPECT_EQ(node_bytes(repeat.nodes[0], repeat), 8 * 4 + 100 * 8 + 400 * 4);
  // Slice x[:, 5:10] of a 10x20 f32: the 50 elements taken, twice, and the i64 starts, ends, axes.
  const Val one_i64(dims({1}), DType::i64);
  Graph slice = one_node("Slice", {dims({10, 20}), one_i64, one_i64, one_i64}, dims({10, 5}));
  EXPECT_EQ(node_bytes(slice.nodes[0], slice), 50 * 4 + 3 * 8 + 50 * 4);
  // Shape reads no data: its output alone.
  Graph shape = one_node("Shape", {dims({2, 3, 4})}, Val(dims({3}), DType::i64));
  EXPECT_EQ(node_bytes(shape.nodes[0], shape), 3 * 8);
}

TEST(OpTraits, InspectSumsTheBytes) {
  Model m;
  m.graph = one_node("Conv", {dims({1, 8, 16, 16}), dims({4, 8, 3, 3})}, dims({1, 4, 14, 14}));
  const ModelSummary s = summarize(m);
  EXPECT_EQ(s.bytes, node_bytes(m.graph.nodes[0], m.graph));
  EXPECT_NE(summary_json(m, s).find("\"bytes\": " + std::to_string(s.bytes)), std::string::npos);
}

#define KILN_DTYPE_VALUE(e, v, n, T) DType::e,
const std::vector<DType> kAllTypes = {KILN_DTYPES(KILN_DTYPE_VALUE)};
#undef KILN_DTYPE_VALUE

std::string name(DType t) { return std::string(dtype_name(t)); }

// The message of inferring one node `op` whose inputs are [2] tensors of the given dtypes
// (undefined: omitted); "" when it is accepted.
std::string type_error(const std::string& op, std::vector<DType> in, std::vector<Attribute> attrs = {}) {
  Graph g;
  Node n{.name = "n", .op = op};
  for (Attribute& a : attrs) n.set_attr(std::move(a.name), std::move(a.value));
  for (size_t i = 0; i < in.size(); ++i)
    n.inputs.push_back(in[i] == DType::undefined ? kNoValue : g.add_value("in" + std::to_string(i), in[i], dims({2})));
  n.outputs = {g.add_value("y", DType::undefined)};
  g.add_node(std::move(n));
  auto r = infer_node(g.nodes[0], g);
  return r.ok() ? "" : r.error().what;
}

TEST(OpTypes, SetsInWords) {
  EXPECT_EQ(types::kFloat.str(), "floating-point types");
  EXPECT_EQ(types::kAny.str(), "numeric types and bool");
  EXPECT_EQ((types::kFloat | DType::i32 | DType::i64).str(), "floating-point types, i32 and i64");
  EXPECT_EQ((types::kFloat | types::kSigned).one_of(), "a floating-point or signed integer type");
  EXPECT_EQ(types::kInt.one_of(), "an integer type");
  EXPECT_EQ(types::kIndex.one_of(), "i32 or i64");
}

TEST(OpTypes, UnaryFloatOp) {
  for (DType t : kAllTypes)
    EXPECT_EQ(type_error("Exp", {t}), is_float(t) ? "" : "Exp does not support " + name(t) + " (it takes floating-point types)");
}

TEST(OpTypes, BinaryNumericOp) {
  for (DType t : kAllTypes)
    EXPECT_EQ(type_error("Add", {t, t}), t != DType::boolean ? "" : "Add does not support bool (it takes numeric types)");
  EXPECT_EQ(type_error("Add", {DType::f32, DType::i32}), "input types differ: f32 and i32");
  // Pow's exponent has a set of its own.
  EXPECT_EQ(type_error("Pow", {DType::f32, DType::u8}), "");
  EXPECT_EQ(type_error("Pow", {DType::f32, DType::boolean}), "the exponent must be a numeric type, got bool");
  EXPECT_EQ(type_error("Pow", {DType::u8, DType::u8}), "Pow does not support u8 (it takes floating-point types, i32 and i64)");
}

TEST(OpTypes, BoolOp) {
  for (DType t : kAllTypes)
    EXPECT_EQ(type_error("And", {t, t}), t == DType::boolean ? "" : "And is bool only, got " + name(t));
}

TEST(OpTypes, Where) {
  for (DType t : kAllTypes) {
    EXPECT_EQ(type_error("Where", {DType::boolean, t, t}), "");
    if (t != DType::boolean) {
      EXPECT_EQ(type_error("Where", {t, t, t}), "condition must be bool, got " + name(t));
    }
  }
  EXPECT_EQ(type_error("Where", {DType::boolean, DType::f32, DType::i64}), "input types differ: f32 and i64");
}

TEST(OpTypes, Cast) {
  for (DType t : kAllTypes) EXPECT_EQ(type_error("Cast", {t}, {{"to", std::string("f16")}}), "");
}

TEST(OpTypes, NamedInputs) {
  EXPECT_EQ(type_error("Gather", {DType::boolean, DType::i32}, {}), "");
  EXPECT_EQ(type_error("Gather", {DType::f32, DType::f32}), "indices must be i32 or i64, got f32");
  EXPECT_EQ(type_error("Conv", {DType::f32, DType::f16}), "W type f16 differs from X type f32");
  EXPECT_EQ(type_error("FusedConv", {DType::f64, DType::f64}), "FusedConv does not support f64 (it takes f32 and bf16)");
}

TEST(OpTraits, EveryOpsTraitsFitItsArity) {
  for (const auto& [domain, schema] : core_ops().all()) {
    const int max_inputs = schema->max_inputs;
    auto fits = [max_inputs](int slot) { return slot >= 0 && (max_inputs == kVariadic || slot < max_inputs); };
    for (int slot : schema->traits.prepack_inputs) EXPECT_TRUE(fits(slot)) << schema->name << " prepacks input " << slot;
    for (const TypeConstraint& c : schema->traits.types) {
      EXPECT_TRUE(fits(c.first)) << schema->name << " constrains input " << c.first;
      EXPECT_TRUE(c.last == kVariadic || (c.last >= c.first && fits(c.last))) << schema->name << " constrains input " << c.last;
      // A constraint is a set or a "same as", never both or neither.
      EXPECT_NE(c.allowed.empty(), c.same_as < 0) << schema->name << " input " << c.first;
      if (c.same_as >= 0) {
        EXPECT_TRUE(fits(c.same_as)) << schema->name << " input " << c.first << " same as " << c.same_as;
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
