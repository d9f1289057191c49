// Graph editing for passes: the name index, use-lists, and replace_all_uses reaching into the
// subgraphs that read a value by name.
#include <gtest/gtest.h>

#include "formats/ir.h"
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

TEST(GraphEdit, ReplaceAllUsesReachesIntoSubgraphsAndLeavesCopiesAlone) {
  Model m = if_model();
  ValueId z = m.graph.add_constant("z", make<float>({2}, {10, 20}));
  Model copy = m;  // shares the branch graphs with m
  ASSERT_TRUE(m.graph.replace_all_uses(m.graph.find_value("x"), z).ok());
  EXPECT_EQ(run_if(m, true), (std::vector<float>{20, 40}));
  EXPECT_EQ(run_if(m, false), (std::vector<float>{7, 8}));
  EXPECT_EQ(run_if(copy, true), (std::vector<float>{2, 4})) << "the copy still reads x";
  EXPECT_EQ(m.graph.uses()[static_cast<size_t>(z)], (std::vector<Use>{{0, Use::kCaptured}}));
  EXPECT_TRUE(m.graph.uses()[static_cast<size_t>(m.graph.find_value("x"))].empty());

  // Node inputs and graph outputs move too.
  Graph& g = copy.graph;
  ValueId cond2 = g.add_constant("cond2", make<bool>({}, {false}));
  ValueId y = g.find_value("y");
  ASSERT_TRUE(g.replace_all_uses(g.find_value("cond"), cond2).ok());
  EXPECT_EQ(g.nodes[0].inputs[0], cond2);
  ValueId y2 = g.add_value("y2", DType::f32, kTwo);
  ASSERT_TRUE(g.replace_all_uses(y, y2).ok());
  EXPECT_EQ(g.outputs[0], y2);
}

TEST(GraphEdit, ReplaceAllUsesRefusesABodyThatShadowsTheNewName) {
  Model m = if_model();
  Graph& then_g = *std::get<std::shared_ptr<Graph>>(m.graph.nodes[0].find_attr("then_branch")->value);
  // The then branch defines its own "w" (-x) and adds it: it cannot also read an outer "w".
  ValueId tx = then_g.find_value("x");
  ValueId tw = then_g.add_value("w", DType::f32, kTwo);
  then_g.add_node(node("neg", "Neg", {tx}, {tw}));
  ValueId w = m.graph.add_constant("w", make<float>({2}, {1, 1}));
  Status s = m.graph.replace_all_uses(m.graph.find_value("x"), w);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("a subgraph defines its own value of this name"), std::string::npos)
      << s.error().message();
  EXPECT_EQ(then_g.value(tx).name, "x") << "nothing changed";
}

}  // namespace
}  // namespace kiln
