// build_plan on its own, as `kiln compile` uses it: shapes, liveness, arena layout, kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "formats/infer.h"
#include "op_test_util.h"
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

// The graph as a model, its types and shapes inferred.
Model model_of(Graph g) {
  Model m;
  m.graph = std::move(g);
  EXPECT_TRUE(infer_graph(m.graph).ok());
  return m;
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
  // A chain of 64 Relus over 1 KiB tensors needs two buffers, not 63; one where kiln's
  // activation kernel writes each output over its input (the first reads the graph's input).
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
  const bool in_place = plan->kernels[1].name.rfind("kiln.activation_f32_", 0) == 0;
  EXPECT_EQ(plan->memory.planned_values, in_place ? 1u : 63u);
  EXPECT_EQ(plan->memory.unshared_bytes, (in_place ? 1u : 63u) * 1024);
  EXPECT_EQ(plan->memory.arena_bytes, (in_place ? 1u : 2u) * 1024);
  EXPECT_EQ(std::count(plan->overwrites.begin(), plan->overwrites.end(), 1), in_place ? 62 : 0);
}

TEST(Plan, ElementwiseOutputsTakeTheirDyingInputsPlace) {
  // x -> Sigmoid s -> Mul(s, scale [4]) m -> Add(bias [1, 4], m) a -> Relu r -> Add(r, s2) out,
  // with s2 = Tanh(x) read again after: the Sigmoid's output dies at the Mul, which writes over
  // it; the Add over m (its second operand, the first broadcasts); the Relu over a; the last
  // Add cannot write over s2, which Abs reads after it, nor over r, which is a graph output.
  Graph g;
  const std::vector<int64_t> dims = {3, 4};
  ValueId x = g.add_value("x", DType::f32, Shape::of(dims));
  g.inputs = {x};
  auto v = [&](const char* name) { return g.add_value(name, DType::undefined); };
  ValueId s = v("s"), m = v("m"), a = v("a"), r = v("r"), t = v("t"), out = v("out"), u = v("u");
  ValueId scale = g.add_constant("scale", Tensor::from<float>({4}, {1, -2, 3, 0.5f}));
  ValueId bias = g.add_constant("bias", Tensor::from<float>({1, 4}, {0.25f, 0, -1, 2}));
  g.add_node(Node{.name = "sig", .op = "Sigmoid", .inputs = {x}, .outputs = {s}});
  g.add_node(Node{.name = "tanh", .op = "Tanh", .inputs = {x}, .outputs = {t}});
  g.add_node(Node{.name = "mul", .op = "Mul", .inputs = {s, scale}, .outputs = {m}});
  g.add_node(Node{.name = "add", .op = "Add", .inputs = {bias, m}, .outputs = {a}});
  g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {a}, .outputs = {r}});
  g.add_node(Node{.name = "add2", .op = "Add", .inputs = {r, t}, .outputs = {out}});
  g.add_node(Node{.name = "abs", .op = "Abs", .inputs = {t}, .outputs = {u}});
  g.outputs = {out, u, r};
  const Model model = model_of(g);
  Target target;
  const std::vector<std::vector<int64_t>> shapes = {dims};
  auto plan = build_plan(model.graph, shapes, PlanOptions{target, default_kernels()});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  if (plan->kernels[2].name.rfind("kiln.binary_f32_", 0) != 0) GTEST_SKIP() << "no kiln kernels for this CPU";
  EXPECT_EQ(plan->overwrites, (std::vector<char>{0, 0, 1, 1, 0, 0, 0})) << "r is a graph output, out too";
  const std::vector<int64_t>& off = plan->memory.offset;
  EXPECT_EQ(off[static_cast<size_t>(m)], off[static_cast<size_t>(s)]);
  EXPECT_EQ(off[static_cast<size_t>(a)], off[static_cast<size_t>(m)]);
  auto fast = Session::create(model);
  auto ref = Session::create(model, SessionOptions{.reference = true});
  ASSERT_TRUE(fast.ok() && ref.ok());
  Tensor in = Tensor::from<float>({3, 4}, {-3, -1, 0, 1, 2, 5, -0.5f, 0.25f, 7, -7, 0.1f, 3});
  auto got = (*fast)->run({in});
  auto want = (*ref)->run({in});
  ASSERT_TRUE(got.ok() && want.ok());
  for (size_t o = 0; o < want->size(); ++o)
    for (int64_t i = 0; i < 12; ++i) EXPECT_NEAR((*got)[o].data<float>()[i], (*want)[o].data<float>()[i], 1e-6) << o << " " << i;
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
  const Model m = model_of(g);
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  Tensor in(DType::f32, {32});
  for (int i = 0; i < 32; ++i) in.data<float>()[i] = static_cast<float>(i - 16);
  auto y = (*s)->run({in});
  ASSERT_TRUE(y.ok()) << y.error().message();
  for (int i = 0; i < 32; ++i) EXPECT_EQ((*y)[0].data<float>()[i], static_cast<float>(std::max(i - 16, 0))) << i;
}

// A Concat's inputs computed straight into their parts of its output: x [1, 16] -> Abs a, Neg
// n -> Reshape b (n's memory) -> Concat(a, b) c [1, 32] -> Relu e; then Tanh t, Exp p ->
// Reshape q -> Concat(t, q) out [1, 32], a graph output, and Relu(t) r after it (read by Neg),
// which may not write over t (out's part). Both Concats run nothing; the results are the reference's, also
// for a second run while the caller holds the first's output.
TEST(Plan, ConcatInputsAreComputedInTheirPartsOfItsOutput) {
  Graph g;
  ValueId x = g.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{1, 16}));
  g.inputs = {x};
  auto v = [&](const char* name) { return g.add_value(name, DType::undefined); };
  ValueId a = v("a"), n = v("n"), b = v("b"), c = v("c"), e = v("e"), t = v("t"), p = v("p"), q = v("q"), out = v("out"), r = v("r"), z = v("z");
  ValueId s116 = g.add_constant("s116", Tensor::from<int64_t>({2}, {1, 16}));
  g.add_node(Node{.name = "abs", .op = "Abs", .inputs = {x}, .outputs = {a}});
  g.add_node(Node{.name = "neg", .op = "Neg", .inputs = {x}, .outputs = {n}});
  g.add_node(Node{.name = "view", .op = "Reshape", .inputs = {n, s116}, .outputs = {b}});
  g.add_node(Node{.name = "cat", .op = "Concat", .inputs = {a, b}, .outputs = {c}, .attrs = {attr("axis", int64_t{1})}});
  g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {c}, .outputs = {e}});
  g.add_node(Node{.name = "tanh", .op = "Tanh", .inputs = {x}, .outputs = {t}});
  g.add_node(Node{.name = "exp", .op = "Exp", .inputs = {x}, .outputs = {p}});
  g.add_node(Node{.name = "view2", .op = "Reshape", .inputs = {p, s116}, .outputs = {q}});
  g.add_node(Node{.name = "cat2", .op = "Concat", .inputs = {t, q}, .outputs = {out}, .attrs = {attr("axis", int64_t{-1})}});
  g.add_node(Node{.name = "relu2", .op = "Relu", .inputs = {t}, .outputs = {r}});
  g.add_node(Node{.name = "neg2", .op = "Neg", .inputs = {r}, .outputs = {z}});
  g.outputs = {e, out, z};
  const Model model = model_of(g);
  Target target;
  const std::vector<std::vector<int64_t>> shapes = {{1, 16}};
  auto plan = build_plan(model.graph, shapes, PlanOptions{target, default_kernels()});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  EXPECT_EQ(plan->in_place, (std::vector<char>{0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(plan->overwrites[9], 0) << "t is a part of a graph output";
  const std::vector<int64_t>& off = plan->memory.offset;
  auto at = [&](ValueId id) { return off[static_cast<size_t>(id)]; };
  ASSERT_GE(at(c), 0);
  EXPECT_EQ(at(a), at(c));
  EXPECT_EQ(at(n), at(c) + 64);
  EXPECT_EQ(at(b), at(c) + 64);
  EXPECT_EQ(plan->memory.bytes[static_cast<size_t>(a)], 64u);
  for (ValueId id : {t, p, q}) EXPECT_EQ(at(id), -1) << "parts of the graph output";
  ASSERT_EQ(plan->output_parts.size(), 1u);
  EXPECT_EQ(plan->output_parts[0].output, out);
  EXPECT_EQ(plan->output_parts[0].step, 5) << "made when Tanh writes its part";
  EXPECT_EQ(plan->output_parts[0].parts, (std::vector<std::pair<ValueId, size_t>>{{t, 0}, {p, 64}, {q, 64}}));
  // The reference plan keeps its Concats.
  auto ref_plan = build_plan(model.graph, shapes, PlanOptions{target, default_kernels(), true});
  ASSERT_TRUE(ref_plan.ok());
  EXPECT_EQ(std::count(ref_plan->in_place.begin(), ref_plan->in_place.end(), 1), 0);

  auto fast = Session::create(model);
  auto ref = Session::create(model, SessionOptions{.reference = true});
  ASSERT_TRUE(fast.ok() && ref.ok());
  std::vector<Tensor> held;
  for (float shift : {0.f, 0.5f, -1.f}) {
    Tensor in(DType::f32, {1, 16});
    for (int i = 0; i < 16; ++i) in.data<float>()[i] = 0.3f * static_cast<float>(i - 8) + shift;
    auto got = (*fast)->run({in});
    auto want = (*ref)->run({in});
    ASSERT_TRUE(got.ok() && want.ok());
    ASSERT_EQ(got->size(), 3u);
    for (size_t o = 0; o < 3; ++o)
      for (int64_t i = 0; i < (*want)[o].numel(); ++i)
        EXPECT_NEAR((*got)[o].data<float>()[i], (*want)[o].data<float>()[i], 1e-6) << shift << " " << o << " " << i;
    if (!held.empty()) {  // the previous run's output, held while this one ran, is as it was
      for (int i = 0; i < 32; ++i) EXPECT_EQ(held[0].data<float>()[i], held[1].data<float>()[i]) << i;
    }
    held = {(*got)[1], (*got)[1].clone()};
  }
}

TEST(Plan, ConcatsNotInPlace) {
  // Each of these Concats copies: parts that are not whole runs of the output (a batch of 2
  // before the axis), one value twice, a graph input, a part not starting on 64 bytes.
  struct Case {
    const char* what;
    std::vector<int64_t> x;
    bool twice, input;
  };
  for (const Case& k : {Case{"batch of 2", {2, 16}, false, false}, Case{"one value twice", {1, 16}, true, false},
                        Case{"a graph input", {1, 16}, false, true}, Case{"12-byte parts", {1, 3}, false, false}}) {
    SCOPED_TRACE(k.what);
    Graph g;
    ValueId x = g.add_value("x", DType::f32, Shape::of(k.x));
    g.inputs = {x};
    ValueId a = g.add_value("a", DType::undefined), b = g.add_value("b", DType::undefined), c = g.add_value("c", DType::undefined);
    ValueId e = g.add_value("e", DType::undefined);
    g.add_node(Node{.name = "abs", .op = "Abs", .inputs = {x}, .outputs = {a}});
    g.add_node(Node{.name = "neg", .op = "Neg", .inputs = {x}, .outputs = {b}});
    const ValueId first = k.input ? x : a, second = k.twice ? a : b;
    g.add_node(Node{.name = "cat", .op = "Concat", .inputs = {first, second}, .outputs = {c}, .attrs = {attr("axis", int64_t{1})}});
    g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {c}, .outputs = {e}});
    g.outputs = {e};
    const Model model = model_of(g);
    Target target;
    const std::vector<std::vector<int64_t>> shapes = {k.x};
    auto plan = build_plan(model.graph, shapes, PlanOptions{target, default_kernels()});
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    EXPECT_EQ(plan->in_place[2], 0);
    EXPECT_TRUE(plan->output_parts.empty());
  }
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
