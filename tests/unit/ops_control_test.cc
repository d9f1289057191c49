// control family: If (both branches, outer-scope reads, constant branch outputs), Loop (trip
// count, early exit through the body's condition, carried values, scan outputs, zero
// iterations), Scan (state, reverse directions, non-zero axes) on hand-built subgraphs, the
// shapes their inference gives, and user errors.
#include <gtest/gtest.h>

#include "formats/infer.h"
#include "runtime/session.h"
#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::if_model;
using testing::make;
using testing::node;

// Within 4 ULPs (EXPECT_DOUBLE_EQ), where testing::expect_all compares with an absolute tolerance.
void expect_all_double_eq(const Tensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_DOUBLE_EQ(got.as_double(i), want[static_cast<size_t>(i)]) << "element " << i;
}

TEST(ControlOps, IfRunsTheChosenBranch) {
  Model m = if_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  Tensor x = make<float>({2}, {1.5f, -2});
  auto t = (*s)->run(std::vector<Tensor>{make<bool>({}, {true}), x});
  ASSERT_TRUE(t.ok()) << t.error().message();
  expect_all_double_eq((*t)[0], {3, -4});
  auto f = (*s)->run(std::vector<Tensor>{make<bool>({}, {false}), x});
  ASSERT_TRUE(f.ok()) << f.error().message();
  expect_all_double_eq((*f)[0], {7, 8});
  // Inference merges the branches' shapes (both [2]).
  Value& y = m.graph.value(m.graph.outputs[0]);
  y.dtype = DType::undefined;
  y.shape = Shape::unknown_rank();
  auto k = infer_graph(m.graph);
  ASSERT_TRUE(k.ok()) << k.error().message();
  EXPECT_EQ(m.graph.value(m.graph.outputs[0]).shape.str(), "2");
  EXPECT_EQ(m.graph.value(m.graph.outputs[0]).dtype, DType::f32);
}

TEST(ControlOps, IfConditionMustHaveOneElement) {
  Model m = if_model();
  m.graph.value(m.graph.inputs[0]).shape = Shape::of(std::vector<int64_t>{2});
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  auto r = (*s)->run(std::vector<Tensor>{make<bool>({2}, {true, false}), make<float>({2}, {1, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_NE(r.error().what.find("one element"), std::string::npos) << r.error().what;
}

// Loop(M, cond, acc): body acc' = acc + step (outer value), cond' = iter < limit; scans acc'.
Model loop_model(bool with_cond_limit) {
  Model m;
  Graph& g = m.graph;
  ValueId M = g.add_value("M", DType::i64, Shape::of(std::vector<int64_t>{}));
  ValueId acc0 = g.add_value("acc0", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId step = g.add_value("step", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId acc = g.add_value("acc", DType::undefined), scan = g.add_value("scan", DType::undefined);
  g.inputs = {M, acc0, step};
  g.outputs = {acc, scan};
  auto body = std::make_shared<Graph>();
  ValueId it = body->add_value("it", DType::i64, Shape::of(std::vector<int64_t>{}));
  ValueId c = body->add_value("c", DType::boolean, Shape::of(std::vector<int64_t>{}));
  ValueId a = body->add_value("a", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId bstep = body->add_value("step", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId a2 = body->add_value("a2", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId a3 = body->add_value("a3", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId cout = body->add_value("cout", DType::boolean, Shape::of(std::vector<int64_t>{}));
  body->inputs = {it, c, a};
  body->add_node(node("add", "Add", {a, bstep}, {a2}));
  body->add_node(node("copy", "Identity", {a2}, {a3}));
  if (with_cond_limit) {
    ValueId limit = body->add_constant("limit", make<int64_t>({}, {1}));
    body->add_node(node("less", "Less", {it, limit}, {cout}));
  } else {
    body->add_node(node("keep", "Identity", {c}, {cout}));
  }
  body->outputs = {cout, a2, a3};
  Node n = node("loop", "Loop", {M, kNoValue, acc0}, {acc, scan});
  n.set_attr("body", body);
  g.add_node(std::move(n));
  EXPECT_TRUE(resolve_captures(g).ok());  // the body reads the outer "step"
  return m;
}

TEST(ControlOps, LoopCarriesAndStacks) {
  Model m = loop_model(false);
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  Tensor acc0 = make<float>({2}, {1, 10}), step = make<float>({2}, {0.5f, -1});
  auto r = (*s)->run(std::vector<Tensor>{make<int64_t>({}, {3}), acc0, step});
  ASSERT_TRUE(r.ok()) << r.error().message();
  expect_all_double_eq((*r)[0], {2.5, 7});
  EXPECT_EQ((*r)[1].shape(), (std::vector<int64_t>{3, 2}));
  expect_all_double_eq((*r)[1], {1.5, 9, 2, 8, 2.5, 7});
  // Zero iterations: the initial value passes through and the scan output is empty.
  auto z = (*s)->run(std::vector<Tensor>{make<int64_t>({}, {0}), acc0, step});
  ASSERT_TRUE(z.ok()) << z.error().message();
  expect_all_double_eq((*z)[0], {1, 10});
  EXPECT_EQ((*z)[1].shape(), (std::vector<int64_t>{0, 2}));
}

TEST(ControlOps, LoopStopsWhenTheBodySaysSo) {
  Model m = loop_model(true);
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto r = (*s)->run(std::vector<Tensor>{make<int64_t>({}, {10}), make<float>({2}, {0, 0}), make<float>({2}, {1, 2})});
  ASSERT_TRUE(r.ok()) << r.error().message();
  // Iteration 0 continues (0 < 1), iteration 1 stops (1 < 1 is false) after producing its outputs.
  expect_all_double_eq((*r)[0], {2, 4});
  EXPECT_EQ((*r)[1].shape(), (std::vector<int64_t>{2, 2}));
}

// Scan with one state (running sum) over x along `axis`, direction `dir`, output along out_axis.
Model scan_model(int64_t axis, int64_t dir, int64_t out_axis, int64_t out_dir) {
  Model m;
  Graph& g = m.graph;
  ValueId s0 = g.add_value("s0", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId x = g.add_value("x", DType::f32, Shape::of(axis == 0 ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 3}));
  ValueId sf = g.add_value("sf", DType::undefined), ys = g.add_value("ys", DType::undefined);
  g.inputs = {s0, x};
  g.outputs = {sf, ys};
  auto body = std::make_shared<Graph>();
  ValueId bs = body->add_value("s", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId bx = body->add_value("xi", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId bn = body->add_value("sn", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId by = body->add_value("y", DType::f32, Shape::of(std::vector<int64_t>{2}));
  body->inputs = {bs, bx};
  body->add_node(node("sum", "Add", {bs, bx}, {bn}));
  body->add_node(node("out", "Identity", {bn}, {by}));
  body->outputs = {bn, by};
  Node n = node("scan", "Scan", {s0, x}, {sf, ys});
  n.set_attr("body", body);
  n.set_attr("num_scan_inputs", int64_t{1});
  n.set_attr("scan_input_axes", std::vector<int64_t>{axis});
  n.set_attr("scan_input_directions", std::vector<int64_t>{dir});
  n.set_attr("scan_output_axes", std::vector<int64_t>{out_axis});
  n.set_attr("scan_output_directions", std::vector<int64_t>{out_dir});
  g.add_node(std::move(n));
  return m;
}

TEST(ControlOps, ScanForwardAndReverse) {
  Tensor s0 = make<float>({2}, {0, 100});
  {
    Model m = scan_model(0, 0, 0, 0);
    auto k = infer_graph(m.graph);
    ASSERT_TRUE(k.ok()) << k.error().message();
    EXPECT_EQ(m.graph.value(m.graph.outputs[1]).shape.str(), "3x2");
    auto s = Session::create(m);
    ASSERT_TRUE(s.ok());
    auto r = (*s)->run(std::vector<Tensor>{s0, make<float>({3, 2}, {1, 2, 3, 4, 5, 6})});
    ASSERT_TRUE(r.ok()) << r.error().message();
    expect_all_double_eq((*r)[0], {9, 112});
    expect_all_double_eq((*r)[1], {1, 102, 4, 106, 9, 112});
  }
  {
    // Scan x [2, 3] along axis 1 in reverse; stack the outputs along axis 1, prepending.
    Model m = scan_model(1, 1, 1, 1);
    auto s = Session::create(m);
    ASSERT_TRUE(s.ok());
    auto r = (*s)->run(std::vector<Tensor>{s0, make<float>({2, 3}, {1, 2, 3, 4, 5, 6})});
    ASSERT_TRUE(r.ok()) << r.error().message();
    expect_all_double_eq((*r)[0], {6, 115});
    EXPECT_EQ((*r)[1].shape(), (std::vector<int64_t>{2, 3}));
    // Iterations see columns 2, 1, 0: sums {3,106}, {5,111}, {6,115}; prepending reverses them.
    expect_all_double_eq((*r)[1], {6, 5, 3, 115, 111, 106});
  }
}

TEST(ControlOps, ScanRejectsBadAxes) {
  Model m = scan_model(0, 0, 0, 0);
  m.graph.nodes[0].set_attr("scan_input_axes", std::vector<int64_t>{5});
  auto k = infer_graph(m.graph);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.error().kind, ErrorKind::user);
  EXPECT_NE(k.error().what.find("scan_input_axes entry 5 is out of range"), std::string::npos) << k.error().what;
}

}  // namespace
}  // namespace kiln
