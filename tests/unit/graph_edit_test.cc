// Graph editing for passes: the name index, use-lists, replace_all_uses, and subgraphs'
// explicit captures (resolved from names, kept through renames, edits, saves and loads).
#include <gtest/gtest.h>

#include "formats/ir.h"
#include "formats/serialize.h"
#include "kiln_generated.h"
#include "formats/verify.h"
#include "runtime/session.h"
#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

using testing::if_model;
using testing::make;
using testing::node;

const Shape kTwo = Shape::of(std::vector<int64_t>{2});

std::vector<float> run_if(const Model& m, bool cond) {
  auto s = Session::create(m);
  EXPECT_TRUE(s.ok()) << s.error().message();
  auto r = (*s)->run(std::vector<Tensor>{make<bool>({}, {cond}), make<float>({2}, {1, 2})});
  EXPECT_TRUE(r.ok()) << r.error().message();
  if (!r.ok()) return {};
  return {(*r)[0].data<float>()[0], (*r)[0].data<float>()[1]};
}

TEST(GraphEdit, NameIndexFollowsAddsRenamesAndRemovals) {
  Graph g;
  ValueId a = g.add_value("a", DType::f32);
  ValueId b = g.add_value("b", DType::f32);
  EXPECT_EQ(g.find_value("a"), a);
  EXPECT_EQ(g.find_value("b"), b);
  EXPECT_EQ(g.value(g.add_value("a", DType::f32)).name, "a_1");
  EXPECT_EQ(g.value(g.add_value("a", DType::f32)).name, "a_2");
  EXPECT_EQ(g.unique_value_name("a"), "a_3");
  g.rename_value(b, "c");
  EXPECT_EQ(g.find_value("b"), kNoValue);
  EXPECT_EQ(g.find_value("c"), b);
  // Values appended directly (the loaders do) are found too.
  Value d;
  d.name = "d";
  g.values.push_back(d);
  EXPECT_EQ(g.find_value("d"), static_cast<ValueId>(g.values.size() - 1));
  // A name assigned directly is caught on its old name's lookup.
  g.value(a).name = "z";
  EXPECT_EQ(g.find_value("a"), kNoValue);
  EXPECT_EQ(g.find_value("z"), a);
  // Removing values renumbers them; the index follows.
  g.outputs = {g.find_value("d")};
  g.remove_dead();
  ASSERT_EQ(g.values.size(), 1u);
  EXPECT_EQ(g.find_value("d"), 0);
  EXPECT_EQ(g.find_value("z"), kNoValue);
}

TEST(GraphEdit, UsesListNodeInputsAndReadsFromSubgraphs) {
  Model m = if_model();
  Graph& g = m.graph;
  std::vector<std::vector<Use>> u = g.uses();
  EXPECT_EQ(u[static_cast<size_t>(g.find_value("cond"))], (std::vector<Use>{{0, 0}}));
  EXPECT_EQ(u[static_cast<size_t>(g.find_value("x"))], (std::vector<Use>{{0, Use::kCaptured}}));
  EXPECT_TRUE(u[static_cast<size_t>(g.find_value("y"))].empty());
}

TEST(GraphEdit, ReplaceAllUsesMovesCapturesAndLeavesCopiesAlone) {
  Model m = if_model();
  ValueId z = m.graph.add_constant("z", make<float>({2}, {10, 20}));
  Model copy = m;  // shares the branch graphs with m
  m.graph.replace_all_uses(m.graph.find_value("x"), z);
  EXPECT_EQ(m.graph.nodes[0].captures, (std::vector<ValueId>{z}));
  EXPECT_EQ(run_if(m, true), (std::vector<float>{20, 40}));
  EXPECT_EQ(run_if(m, false), (std::vector<float>{7, 8}));
  EXPECT_EQ(run_if(copy, true), (std::vector<float>{2, 4})) << "the copy still reads x";
  EXPECT_EQ(m.graph.uses()[static_cast<size_t>(z)], (std::vector<Use>{{0, Use::kCaptured}}));
  EXPECT_TRUE(m.graph.uses()[static_cast<size_t>(m.graph.find_value("x"))].empty());

  // Node inputs and graph outputs move too.
  Graph& g = copy.graph;
  ValueId cond2 = g.add_constant("cond2", make<bool>({}, {false}));
  ValueId y = g.find_value("y");
  g.replace_all_uses(g.find_value("cond"), cond2);
  EXPECT_EQ(g.nodes[0].inputs[0], cond2);
  ValueId y2 = g.add_value("y2", DType::f32, kTwo);
  g.replace_all_uses(y, y2);
  EXPECT_EQ(g.outputs[0], y2);
}

TEST(GraphEdit, CapturesSurviveRenamesAndNamesShadowedInsideABody) {
  Model m = if_model();
  Graph& then_g = *std::get<std::shared_ptr<Graph>>(m.graph.nodes[0].find_attr("then_branch")->value);
  // Renaming the outer x breaks nothing: the body reads it through its capture, not its name.
  m.graph.rename_value(m.graph.find_value("x"), "renamed");
  EXPECT_EQ(run_if(m, true), (std::vector<float>{2, 4}));
  // The then branch defines a "w" of its own; the outer graph's "w" can still be captured.
  ValueId tx = then_g.find_value("x");
  ValueId tw = then_g.add_value("w", DType::f32, kTwo);
  then_g.add_node(node("neg", "Neg", {tx}, {tw}));
  ValueId w = m.graph.add_constant("w", make<float>({2}, {1, 1}));
  m.graph.replace_all_uses(m.graph.find_value("renamed"), w);
  EXPECT_EQ(run_if(m, true), (std::vector<float>{2, 2}));
  EXPECT_TRUE(verify_model(m).ok()) << verify_model(m).error().message();
}

// Outer value "k" read two levels down (an If inside an If): the middle body gets a stand-in
// of its own, captured by the outer If and passed on to the inner one.
TEST(GraphEdit, ResolveCapturesThroughNestedBodies) {
  Model m;
  Graph& g = m.graph;
  const Shape scalar = Shape::of(std::vector<int64_t>{});
  ValueId c = g.add_value("c", DType::boolean, scalar);
  ValueId k = g.add_value("k", DType::f32, kTwo);
  ValueId y = g.add_value("y", DType::f32, kTwo);
  g.inputs = {c, k};
  g.outputs = {y};
  auto inner_then = std::make_shared<Graph>();
  ValueId ik = inner_then->add_value("k", DType::f32, kTwo);
  ValueId iy = inner_then->add_value("iy", DType::f32, kTwo);
  inner_then->add_node(node("neg", "Neg", {ik}, {iy}));
  inner_then->outputs = {iy};
  auto inner_else = std::make_shared<Graph>();
  inner_else->outputs = {inner_else->add_constant("ie", make<float>({2}, {5, 6}))};
  auto middle = std::make_shared<Graph>();
  ValueId mc = middle->add_value("c", DType::boolean, scalar);
  ValueId my = middle->add_value("my", DType::f32, kTwo);
  Node inner = node("inner", "If", {mc}, {my});
  inner.set_attr("then_branch", inner_then);
  inner.set_attr("else_branch", inner_else);
  middle->add_node(std::move(inner));
  middle->outputs = {my};
  auto outer_else = std::make_shared<Graph>();
  outer_else->outputs = {outer_else->add_constant("oe", make<float>({2}, {7, 8}))};
  Node outer = node("outer", "If", {c}, {y});
  outer.set_attr("then_branch", middle);
  outer.set_attr("else_branch", outer_else);
  g.add_node(std::move(outer));
  ASSERT_TRUE(resolve_captures(g).ok());
  EXPECT_EQ(g.nodes[0].captures, (std::vector<ValueId>{c, k}));
  ValueId mk = middle->find_value("k");
  ASSERT_NE(mk, kNoValue) << "the middle body has a stand-in for k";
  EXPECT_EQ(middle->captures, (std::vector<ValueId>{mc, mk}));
  EXPECT_EQ(outer_else->captures, (std::vector<ValueId>{kNoValue, kNoValue}));
  EXPECT_EQ(middle->nodes[0].captures, (std::vector<ValueId>{mk}));
  EXPECT_EQ(inner_then->captures, (std::vector<ValueId>{ik}));
  ASSERT_TRUE(verify_model(m).ok()) << verify_model(m).error().message();

  // Saved and loaded, the captures are the same; the graph runs.
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message();
  auto loaded = load_model_from_bytes({bytes->data(), bytes->size()}, "m.kiln");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  EXPECT_EQ(loaded->graph.nodes[0].captures, g.nodes[0].captures);
  auto s = Session::create(*loaded);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto r = (*s)->run(std::vector<Tensor>{make<bool>({}, {true}), make<float>({2}, {1, 2})});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)[0].data<float>()[0], -1.f);
  EXPECT_EQ((*r)[0].data<float>()[1], -2.f);
}

// Files of schema 1.0 have no captures: their bodies read by name, which the loader resolves.
// A newer file without captures is malformed.
TEST(GraphEdit, FilesOfSchema10ReadByName) {
  Model m = if_model();
  m.graph.nodes[0].captures.clear();
  for (Attribute& a : m.graph.nodes[0].attrs) std::get<std::shared_ptr<Graph>>(a.value)->captures.clear();
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message();
  auto rejected = load_model_from_bytes({bytes->data(), bytes->size()}, "m.kiln");
  ASSERT_FALSE(rejected.ok());
  EXPECT_NE(rejected.error().message().find("input 0 'x' has no source"), std::string::npos) << rejected.error().message();
  auto* root = flatbuffers::GetMutableSizePrefixedRoot<flatbuffers::Table>(bytes->data());
  ASSERT_TRUE(root->SetField<uint16_t>(fb::Model::VT_SCHEMA_MINOR, 0, 0));
  auto loaded = load_model_from_bytes({bytes->data(), bytes->size()}, "m.kiln");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  EXPECT_EQ(loaded->graph.nodes[0].captures, (std::vector<ValueId>{loaded->graph.find_value("x")}));
  EXPECT_EQ(run_if(*loaded, true), (std::vector<float>{2, 4}));
}

TEST(GraphEdit, ResolveCapturesNamesAValueNoGraphDefines) {
  Model m = if_model();
  Graph& then_g = *std::get<std::shared_ptr<Graph>>(m.graph.nodes[0].find_attr("then_branch")->value);
  then_g.rename_value(then_g.find_value("x"), "nowhere");
  Status s = resolve_captures(m.graph);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(), "node 'if': a subgraph reads value 'nowhere', which no enclosing graph defines");
}

TEST(GraphEdit, VerifyChecksCaptures) {
  Model m = if_model();
  Graph& then_g = *std::get<std::shared_ptr<Graph>>(m.graph.nodes[0].find_attr("then_branch")->value);
  auto expect_bad = [&](const std::string& fragment) {
    Status s = verify_model(m);
    ASSERT_FALSE(s.ok()) << fragment;
    EXPECT_NE(s.error().message().find(fragment), std::string::npos) << s.error().message();
  };
  then_g.captures.clear();
  expect_bad("the subgraph binds 0 captured values but its node captures 1");
  then_g.captures = {then_g.find_value("then_y")};
  expect_bad("stands for a captured value but is also defined in the subgraph");
  then_g.captures = {then_g.find_value("x")};
  m.graph.nodes[0].captures = {m.graph.find_value("cond")};
  expect_bad("the value is f32 but stands for 'cond', which is bool");
  m.graph.nodes[0].captures = {99};
  expect_bad("captured value 0 refers to value 99");
  m.graph.nodes[0].captures = {m.graph.find_value("x")};
  then_g.captures = {kNoValue};
  expect_bad("input 0 'x' has no source");
}

}  // namespace
}  // namespace kiln
