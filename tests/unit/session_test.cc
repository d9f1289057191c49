// Executor: input binding (symbolic dims, conflicts), memory planning by liveness, outputs.
#include <gtest/gtest.h>

#include "runtime/session.h"

namespace kiln {
namespace {

// y = Relu(Relu(Relu(a + b))) over [batch, 4]: a chain whose intermediates can share memory.
Model chain_model() {
  Model m;
  Graph& g = m.graph;
  Shape s({Dim::sym("batch"), Dim::known(4)});
  ValueId a = g.add_value("a", DType::f32, s);
  ValueId b = g.add_value("b", DType::f32, s);
  g.inputs = {a, b};
  ValueId prev = g.add_value("sum", DType::f32, s);
  g.add_node(Node{.name = "add", .op = "Add", .inputs = {a, b}, .outputs = {prev}});
  for (int i = 0; i < 3; ++i) {
    ValueId next = g.add_value("r" + std::to_string(i), DType::f32, s);
    g.add_node(Node{.name = "relu" + std::to_string(i), .op = "Relu", .inputs = {prev}, .outputs = {next}});
    prev = next;
  }
  g.outputs = {prev};
  return m;
}

Tensor filled(std::vector<int64_t> shape, float start) {
  Tensor t(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + static_cast<float>(i) * (i % 2 ? -1.f : 1.f);
  return t;
}

TEST(Session, RunsAChainAndReusesMemory) {
  Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  Tensor a = filled({3, 4}, 0.5f), b = filled({3, 4}, -1.0f);
  auto out = (*s)->run(std::vector<Tensor>{a, b});
  ASSERT_TRUE(out.ok()) << out.error().message();
  ASSERT_EQ((*out)[0].shape(), (std::vector<int64_t>{3, 4}));
  for (int64_t i = 0; i < 12; ++i)
    EXPECT_FLOAT_EQ((*out)[0].data<float>()[i], std::max(a.data<float>()[i] + b.data<float>()[i], 0.f));
  const MemoryPlanStats& st = (*s)->memory_stats();
  EXPECT_EQ(st.planned_values, 3u);                // sum, r0, r1 (r2 is the output)
  EXPECT_LT(st.arena_bytes, st.unshared_bytes);    // liveness lets them share
  EXPECT_EQ(st.signatures, 1u);
  // A second shape signature gets its own plan; the first result is not overwritten.
  auto out2 = (*s)->run(std::vector<Tensor>{filled({5, 4}, 1.f), filled({5, 4}, 2.f)});
  ASSERT_TRUE(out2.ok());
  EXPECT_EQ((*s)->memory_stats().signatures, 2u);
  EXPECT_FLOAT_EQ((*out)[0].data<float>()[0], std::max(0.5f - 1.0f, 0.f));
}

TEST(Session, ConflictingSymbolicDimsAreAUserError) {
  Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  auto out = (*s)->run(std::vector<Tensor>{filled({3, 4}, 0.f), filled({2, 4}, 0.f)});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().kind, ErrorKind::user);
  EXPECT_EQ(out.error().where, "input 'b'");
  EXPECT_NE(out.error().what.find("dim 'batch' is 2 here but 3 in input 'a'"), std::string::npos) << out.error().what;
}

TEST(Session, WrongDtypeRankAndMissingInputsAreUserErrors) {
  Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  Tensor ints(DType::i32, {3, 4});
  auto r1 = (*s)->run(std::vector<Tensor>{ints, filled({3, 4}, 0.f)});
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.error().what.find("expected f32 but got i32"), std::string::npos);
  auto r2 = (*s)->run(std::vector<Tensor>{filled({12}, 0.f), filled({3, 4}, 0.f)});
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().what.find("expected shape batchx4"), std::string::npos) << r2.error().what;
  auto r3 = (*s)->run(std::map<std::string, Tensor>{{"a", filled({3, 4}, 0.f)}});
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.error().where, "input 'b'");
}

TEST(Session, UnknownOpHasNoKernel) {
  Model m = chain_model();
  m.graph.nodes[1].op = "NoSuchOp";
  auto s = Session::create(m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().what.find("no kernel for op 'NoSuchOp'"), std::string::npos);
}

}  // namespace
}  // namespace kiln
