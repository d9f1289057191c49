// build_plan on its own, as `kiln compile` uses it: shapes, liveness, arena layout, kernels.
#include <gtest/gtest.h>

#include <algorithm>

#include "formats/infer.h"
#include "runtime/plan.h"
#include "runtime/session.h"

namespace kiln {
namespace {

// x -> Abs a -> Neg b -> Add(a, b) c -> NonZero d -> Identity out: a lives until the Add,
// b is freed there too, c is read by NonZero only, d's size depends on the data.
Graph chain() {
  Graph g;
  const Shape sym({Dim::sym("n"), Dim::known(16)});
  ValueId x = g.add_value("x", DType::f32, sym);
  ValueId a = g.add_value("a", DType::f32, sym);
  ValueId b = g.add_value("b", DType::f32, sym);
  ValueId c = g.add_value("c", DType::f32, sym);
  ValueId d = g.add_value("d", DType::i64, Shape({Dim::known(2), Dim::unknown()}));
  ValueId out = g.add_value("out", DType::i64, Shape({Dim::known(2), Dim::unknown()}));
  g.inputs = {x};
  g.add_node(Node{.name = "abs", .op = "Abs", .inputs = {x}, .outputs = {a}});  // ops without kiln kernels
  g.add_node(Node{.name = "neg", .op = "Neg", .inputs = {a}, .outputs = {b}});
  g.add_node(Node{.name = "add", .op = "Sum", .inputs = {a, b}, .outputs = {c}});
  g.add_node(Node{.name = "nonzero", .op = "NonZero", .inputs = {c}, .outputs = {d}});
  g.add_node(Node{.name = "copy", .op = "Identity", .inputs = {d}, .outputs = {out}});
  g.outputs = {out};
  return g;
}

TEST(Plan, LaysOutTheArenaByLivenessAndChoosesKernels) {
  Graph g = chain();
  Target target;
  std::vector<std::vector<int64_t>> shapes = {{4, 16}};
  auto plan = build_plan(g, shapes, PlanOptions{target, default_kernels()});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  const ExecutionPlan& p = *plan;
  auto id = [&](const char* name) { return static_cast<size_t>(g.find_value(name)); };
  EXPECT_EQ(p.bound.value(g.find_value("c")).shape.str(), "4x16") << "shapes are concrete in the plan";
  EXPECT_EQ(g.value(g.find_value("c")).shape.str(), "nx16") << "the caller's graph is left alone";
  EXPECT_EQ(p.reinfer, (std::vector<char>{0, 0, 0, 1, 1})) << "NonZero and what it feeds infer per run";
  EXPECT_EQ(p.first_use[id("a")], 0);
  EXPECT_EQ(p.last_use[id("a")], 2);
  // a, b and c are placed (256 bytes each); a and b are alive together, c may take a's place
  // only after the Sum has read a, so the three need 3 x 256 without reuse and at most that.
  const MemoryLayout& m = p.memory;
  EXPECT_EQ(m.planned_values, 3u);
  EXPECT_EQ(m.dynamic_values, 2u);
  EXPECT_EQ(m.unshared_bytes, 3u * 256);
  for (const char* v : {"a", "b", "c"}) EXPECT_EQ(m.bytes[id(v)], 256u) << v;
  EXPECT_NE(m.offset[id("a")], m.offset[id("b")]);
  EXPECT_EQ(m.offset[id("d")], -1);
  EXPECT_EQ(m.offset[id("out")], -1);
  EXPECT_LE(m.arena_bytes, m.unshared_bytes);
  ASSERT_EQ(p.kernels.size(), 5u);
  for (const PlannedKernel& k : p.kernels) {
    EXPECT_TRUE(k.kernel);
    EXPECT_EQ(k.name, kReferenceKernel);
  }
}

TEST(Plan, SmallGraphsRunOnOneThread) {
  auto matmul = [](int64_t n) {
    Graph g;
    ValueId a = g.add_value("a", DType::f32, Shape::of(std::vector<int64_t>{n, n}));
    ValueId b = g.add_value("b", DType::f32, Shape::of(std::vector<int64_t>{n, n}));
    ValueId y = g.add_value("y", DType::f32, Shape::of(std::vector<int64_t>{n, n}));
    g.inputs = {a, b};
    g.add_node(Node{.name = "mm", .op = "MatMul", .inputs = {a, b}, .outputs = {y}});
    g.outputs = {y};
    return g;
  };
  Target target;
  target.threads = 2;
  for (auto [n, threads] : {std::pair<int64_t, int>{16, 1}, {256, 2}}) {  // 8 KFLOP; 33.6 MFLOP
    Graph g = matmul(n);
    std::vector<std::vector<int64_t>> shapes = {{n, n}, {n, n}};
    auto plan = build_plan(g, shapes, PlanOptions{target, default_kernels()});
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    EXPECT_EQ(plan->threads, threads) << n;
  }
}

TEST(Plan, ChainsReuseMemory) {
  // A chain of 64 Relus over 1 KiB tensors needs two buffers, not 63.
  Graph g;
  const Shape s = Shape::of(std::vector<int64_t>{256});
  ValueId prev = g.add_value("x", DType::f32, s);
  g.inputs = {prev};
  for (int i = 0; i < 64; ++i) {
    ValueId next = g.add_value("v" + std::to_string(i), DType::f32, s);
    g.add_node(Node{.name = "relu" + std::to_string(i), .op = "Relu", .inputs = {prev}, .outputs = {next}});
    prev = next;
  }
  g.outputs = {prev};
  Target target;
  std::vector<std::vector<int64_t>> shapes = {{256}};
  auto plan = build_plan(g, shapes, PlanOptions{target, default_kernels()});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->memory.planned_values, 63u);
  EXPECT_EQ(plan->memory.unshared_bytes, 63u * 1024);
  EXPECT_EQ(plan->memory.arena_bytes, 2u * 1024);
}

TEST(Plan, ViewsShareTheirInputsMemory) {
  // x -> Relu a [32] -> Reshape b [4, 8] -> Neg c -> Reshape d [32] -> Abs out: b is a's
  // memory and d is c's, so the Reshapes run nothing; a lives until Neg read b, so c cannot
  // take a's place.
  Graph g;
  ValueId x = g.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{32}));
  g.inputs = {x};
  ValueId a = g.add_value("a", DType::undefined), b = g.add_value("b", DType::undefined), c = g.add_value("c", DType::undefined);
  ValueId d = g.add_value("d", DType::undefined), out = g.add_value("out", DType::undefined);
  ValueId s48 = g.add_constant("s48", Tensor::from<int64_t>({2}, {4, 8})), s32 = g.add_constant("s32", Tensor::from<int64_t>({1}, {32}));
  g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {x}, .outputs = {a}});
  g.add_node(Node{.name = "r1", .op = "Reshape", .inputs = {a, s48}, .outputs = {b}});
  g.add_node(Node{.name = "neg", .op = "Neg", .inputs = {b}, .outputs = {c}});
  g.add_node(Node{.name = "r2", .op = "Reshape", .inputs = {c, s32}, .outputs = {d}});
  g.add_node(Node{.name = "abs", .op = "Abs", .inputs = {d}, .outputs = {out}});
  g.outputs = {out};
  Target target;
  std::vector<std::vector<int64_t>> shapes = {{32}};
  auto plan = build_plan(g, shapes, PlanOptions{target, default_kernels()});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->views, (std::vector<char>{0, 1, 0, 1, 0}));
  const std::vector<int64_t>& off = plan->memory.offset;
  EXPECT_EQ(off[static_cast<size_t>(b)], off[static_cast<size_t>(a)]);
  EXPECT_EQ(off[static_cast<size_t>(d)], off[static_cast<size_t>(c)]);
  EXPECT_NE(off[static_cast<size_t>(c)], off[static_cast<size_t>(a)]);
  EXPECT_EQ(plan->memory.planned_values, 2u);
  // And it computes what the nodes say.
  Model m;
  m.graph = g;
  ASSERT_TRUE(infer_graph(m.graph).ok());
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  Tensor in(DType::f32, {32});
  for (int i = 0; i < 32; ++i) in.data<float>()[i] = static_cast<float>(i - 16);
  auto y = (*s)->run({in});
  ASSERT_TRUE(y.ok()) << y.error().message();
  for (int i = 0; i < 32; ++i) EXPECT_EQ((*y)[0].data<float>()[i], static_cast<float>(std::max(i - 16, 0))) << i;
}

TEST(Plan, RejectsTheWrongNumberOfInputShapes) {
  Graph g = chain();
  Target target;
  auto plan = build_plan(g, {}, PlanOptions{target, default_kernels()});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.error().kind, ErrorKind::internal);
}

}  // namespace
}  // namespace kiln
