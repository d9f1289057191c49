// Executor: input binding (symbolic dims, conflicts), memory planning by liveness, outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>

#include "runtime/session.h"
#include "runtime/threads.h"
#include "tests/unit/proc_self_test_util.h"

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

Tensor zigzag(std::vector<int64_t> shape, float start) {
  Tensor t(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + static_cast<float>(i) * (i % 2 ? -1.f : 1.f);
  return t;
}

TEST(Session, RunsAChainAndReusesMemory) {
  Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  Tensor a = zigzag({3, 4}, 0.5f), b = zigzag({3, 4}, -1.0f);
  auto out = (*s)->run(std::vector<Tensor>{a, b});
  ASSERT_TRUE(out.ok()) << out.error().message();
  ASSERT_EQ((*out)[0].shape(), (std::vector<int64_t>{3, 4}));
  for (int64_t i = 0; i < 12; ++i)
    EXPECT_FLOAT_EQ((*out)[0].data<float>()[i], std::max(a.data<float>()[i] + b.data<float>()[i], 0.f));
  const MemoryPlanStats& st = (*s)->memory_stats();
  // sum, r0, r1 (r2 is the output): liveness lets them share, or kiln's activation kernel writes
  // each Relu over its input, which dies there, and all three are one place.
  const bool in_place = (*s)->kernels()[1].name.rfind("kiln.activation_f32_", 0) == 0;
  EXPECT_EQ(st.planned_values, in_place ? 1u : 3u);
  if (!in_place) {
    EXPECT_LT(st.arena_bytes, st.unshared_bytes);
  }
  EXPECT_EQ(st.signatures, 1u);
  // A second shape signature gets its own plan; the first result is not overwritten.
  auto out2 = (*s)->run(std::vector<Tensor>{zigzag({5, 4}, 1.f), zigzag({5, 4}, 2.f)});
  ASSERT_TRUE(out2.ok());
  EXPECT_EQ((*s)->memory_stats().signatures, 2u);
  EXPECT_FLOAT_EQ((*out)[0].data<float>()[0], std::max(0.5f - 1.0f, 0.f));
}

TEST(Session, ConflictingSymbolicDimsAreAUserError) {
  Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  auto out = (*s)->run(std::vector<Tensor>{zigzag({3, 4}, 0.f), zigzag({2, 4}, 0.f)});
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
  auto r1 = (*s)->run(std::vector<Tensor>{ints, zigzag({3, 4}, 0.f)});
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.error().what.find("expected f32 but got i32"), std::string::npos);
  auto r2 = (*s)->run(std::vector<Tensor>{zigzag({12}, 0.f), zigzag({3, 4}, 0.f)});
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().what.find("expected shape batchx4"), std::string::npos) << r2.error().what;
  auto r3 = (*s)->run(std::map<std::string, Tensor>{{"a", zigzag({3, 4}, 0.f)}});
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

TEST(Session, RepeatedRunsReuseThePlanAndNeverAliasOutputs) {
  Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  auto first = (*s)->run(std::vector<Tensor>{zigzag({2, 4}, 1.f), zigzag({2, 4}, 1.f)});
  auto second = (*s)->run(std::vector<Tensor>{zigzag({2, 4}, -5.f), zigzag({2, 4}, -5.f)});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ((*s)->memory_stats().signatures, 1u);
  EXPECT_EQ((*s)->memory_stats().reinferred_nodes, 0u);
  EXPECT_NE((*first)[0].raw(), (*second)[0].raw());
  EXPECT_FLOAT_EQ((*first)[0].data<float>()[0], 2.f);
  EXPECT_FLOAT_EQ((*second)[0].data<float>()[0], 0.f);
}

TEST(Session, OutputBuffersTheCallerLetGoOfAreUsedAgain) {
  Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  const std::vector<Tensor> in = {zigzag({2, 4}, 1.f), zigzag({2, 4}, 1.f)};
  const void* first;
  {
    auto r = (*s)->run(in);
    ASSERT_TRUE(r.ok());
    first = (*r)[0].raw();
  }
  // Released: the next run writes into the same buffer (all of it, as kernels write arena values).
  auto again = (*s)->run(in);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].raw(), first);
  EXPECT_FLOAT_EQ((*again)[0].data<float>()[0], 2.f);
  // Held: a run never writes into a result the caller still has, two of them either.
  auto held2 = (*s)->run(std::vector<Tensor>{zigzag({2, 4}, 3.f), zigzag({2, 4}, 3.f)});
  ASSERT_TRUE(held2.ok());
  EXPECT_NE((*held2)[0].raw(), (*again)[0].raw());
  auto held3 = (*s)->run(in);
  ASSERT_TRUE(held3.ok());
  EXPECT_NE((*held3)[0].raw(), (*again)[0].raw());
  EXPECT_NE((*held3)[0].raw(), (*held2)[0].raw());
  EXPECT_FLOAT_EQ((*again)[0].data<float>()[0], 2.f);
  EXPECT_FLOAT_EQ((*held2)[0].data<float>()[0], 6.f);
  // A view of a result holds it too.
  const Tensor view = (*held3)[0].reshaped({8});
  const void* viewed = view.raw();
  held3 = Error{};
  auto after = (*s)->run(in);
  ASSERT_TRUE(after.ok());
  EXPECT_NE((*after)[0].raw(), viewed);
}

// y = Relu(NonZero(x)) as float, then + 1: NonZero's count depends on the data, so it and
// everything after it infer their shapes on each run; the nodes before do not.
TEST(Session, DataDependentShapesAreInferredOnEachRun) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, Shape({Dim::known(6)}));
  ValueId r = g.add_value("r", DType::f32, Shape({Dim::known(6)}));
  ValueId nz = g.add_value("nz", DType::i64, Shape::unknown_rank());
  ValueId f = g.add_value("f", DType::f32, Shape::unknown_rank());
  ValueId y = g.add_value("y", DType::f32, Shape::unknown_rank());
  ValueId one = g.add_constant("one", Tensor::from<float>({}, {1.f}));
  g.inputs = {x};
  g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {x}, .outputs = {r}});
  g.add_node(Node{.name = "nonzero", .op = "NonZero", .inputs = {r}, .outputs = {nz}});
  Node cast{.name = "cast", .op = "Cast", .inputs = {nz}, .outputs = {f}};
  cast.set_attr("to", std::string("f32"));
  g.add_node(cast);
  g.add_node(Node{.name = "add", .op = "Add", .inputs = {f, one}, .outputs = {y}});
  g.outputs = {y};
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto a = (*s)->run(std::vector<Tensor>{Tensor::from<float>({6}, {1, -1, 2, 0, 3, -4})});
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ((*s)->memory_stats().reinferred_nodes, 3u);
  ASSERT_EQ((*a)[0].shape(), (std::vector<int64_t>{1, 3}));
  EXPECT_FLOAT_EQ((*a)[0].data<float>()[2], 5.f);
  auto b = (*s)->run(std::vector<Tensor>{Tensor::from<float>({6}, {0, 0, 0, 0, 0, 7})});
  ASSERT_TRUE(b.ok()) << b.error().message();
  ASSERT_EQ((*b)[0].shape(), (std::vector<int64_t>{1, 1}));
  EXPECT_FLOAT_EQ((*b)[0].data<float>()[0], 6.f);
  EXPECT_EQ((*a)[0].shape(), (std::vector<int64_t>{1, 3}));
}

// Records what an observer sees.
struct Recorder : ExecutionObserver {
  std::vector<std::string> events;
  void on_node_begin(const NodeEvent& e) override {
    events.push_back("begin " + e.node.name + " " + std::string(e.kernel) + " " +
                     (e.outputs[0]->defined() ? shape_str(e.outputs[0]->shape()) : "?"));
  }
  void on_node_end(const NodeEvent& e) override {
    events.push_back("end " + std::to_string(e.index) + " " + std::to_string(e.outputs[0]->data<float>()[0]));
  }
};

TEST(Session, ObserverSeesEveryNodeInOrder) {
  Model m = chain_model();
  auto s = Session::create(m, SessionOptions{.reference = true});
  ASSERT_TRUE(s.ok());
  Recorder rec;
  (*s)->set_observer(&rec);
  ASSERT_TRUE((*s)->run(std::vector<Tensor>{zigzag({1, 4}, 2.f), zigzag({1, 4}, -1.f)}).ok());
  EXPECT_EQ(rec.events, (std::vector<std::string>{"begin add ref 1x4", "end 0 1.000000", "begin relu0 ref 1x4",
                                                  "end 1 1.000000", "begin relu1 ref 1x4", "end 2 1.000000",
                                                  "begin relu2 ref 1x4", "end 3 1.000000"}));
  (*s)->set_observer(nullptr);
  ASSERT_TRUE((*s)->run(std::vector<Tensor>{zigzag({1, 4}, 2.f), zigzag({1, 4}, -1.f)}).ok());
  EXPECT_EQ(rec.events.size(), 8u);
}

// A plan's arena of 2 MiB or more asks for huge pages where the machine gives them quickly (a
// region marked hg, or nh past pages that came slowly); a smaller one does not.
TEST(Session, ArenaAsksForHugePages) {
  if (!huge_pages_enabled(transparent_huge_pages()) || !std::filesystem::exists("/proc/self/smaps"))
    GTEST_SKIP() << "transparent huge pages are off: '" << transparent_huge_pages() << "'";
  if (!huge_pages_quick_so_far()) GTEST_SKIP() << "this process's huge pages came slowly: it asks for no more";
  struct Intermediate : ExecutionObserver {
    const void* sum = nullptr;
    void on_node_end(const NodeEvent& e) override {
      if (e.node.name == "add") sum = e.outputs[0]->raw();
    }
  };
  const Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  Intermediate seen;
  (*s)->set_observer(&seen);
  const int64_t rows = int64_t{1} << 18;  // 4 MiB a value
  auto big = (*s)->run(std::vector<Tensor>{zigzag({rows, 4}, 2.f), zigzag({rows, 4}, -1.f)});
  ASSERT_TRUE(big.ok()) << big.error().message();
  ASSERT_NE(seen.sum, nullptr);
  const std::string flags = vm_flags(seen.sum);
  EXPECT_TRUE(flags.find(" hg") != std::string::npos || flags.find(" nh") != std::string::npos) << flags;
  EXPECT_EQ((*big)[0].data<float>()[2], 5.f);  // relu(relu(relu((2 + 2) + (-1 + 2))))
  auto small = (*s)->run(std::vector<Tensor>{zigzag({2, 4}, 2.f), zigzag({2, 4}, -1.f)});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(vm_flags(seen.sum).find(" hg"), std::string::npos) << vm_flags(seen.sum);
}

TEST(Session, AFailedRunLeavesTheSessionUsable) {
  Model m;
  Graph& g = m.graph;
  ValueId a = g.add_value("a", DType::i32, Shape({Dim::sym("n")}));
  ValueId b = g.add_value("b", DType::i32, Shape({Dim::sym("n")}));
  ValueId q = g.add_value("q", DType::i32, Shape({Dim::sym("n")}));
  g.inputs = {a, b};
  g.add_node(Node{.name = "div", .op = "Div", .inputs = {a, b}, .outputs = {q}});
  g.outputs = {q};
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  auto bad = (*s)->run(std::vector<Tensor>{Tensor::from<int32_t>({2}, {4, 6}), Tensor::from<int32_t>({2}, {2, 0})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("division by zero"), std::string::npos) << bad.error().message();
  auto good = (*s)->run(std::vector<Tensor>{Tensor::from<int32_t>({2}, {4, 6}), Tensor::from<int32_t>({2}, {2, 3})});
  ASSERT_TRUE(good.ok()) << good.error().message();
  EXPECT_EQ((*good)[0].data<int32_t>()[1], 2);
}

// Kernels for the registry tests: Relu computed through the workspace it asks for, and one
// that only takes inputs of at most 4 elements per row.
class WorkspaceRelu final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds& needs) override {
    if (!q.inputs[0].shape.is_concrete()) return internal_error(q.node.where(), "shapes not concrete at prepare");
    bytes_ = static_cast<size_t>(shape_numel(q.inputs[0].shape.concrete())) * sizeof(float);
    needs.workspace_bytes = bytes_;
    return {};
  }
  Status run(KernelContext& ctx) override {
    std::span<std::byte> ws = ctx.workspace();
    if (ws.size() < bytes_ || reinterpret_cast<uintptr_t>(ws.data()) % kTensorAlignment != 0)
      return ctx.error("workspace too small or misaligned");
    float* tmp = reinterpret_cast<float*>(ws.data());
    const Tensor& x = ctx.input(0);
    for (int64_t i = 0; i < x.numel(); ++i) tmp[i] = std::max(x.data<float>()[i], 0.f);
    std::copy_n(tmp, x.numel(), ctx.output(0).data<float>());
    return {};
  }

 private:
  size_t bytes_ = 0;
};

KernelRegistry test_registry(std::vector<std::string>* prepared_constants = nullptr) {
  KernelRegistry r;
  r.add("Relu", "cpu",
        KernelImpl{"narrow",
                   [](const KernelQuery& q) -> std::optional<std::string> {
                     const Shape& s = q.inputs[0].shape;
                     if (!s.is_concrete() || s.concrete().back() > 4) return "rows longer than 4 (" + s.str() + ")";
                     return std::nullopt;
                   },
                   [](const KernelQuery&) -> std::unique_ptr<Kernel> { return std::make_unique<WorkspaceRelu>(); }});
  r.add("Add", "cpu",
        KernelImpl{"sees_constants",
                   [prepared_constants](const KernelQuery& q) -> std::optional<std::string> {
                     if (prepared_constants && q.inputs[1].value)
                       prepared_constants->push_back(q.node.name + " b[0]=" + std::to_string(q.inputs[1].value->data<float>()[0]));
                     return "only looks";
                   },
                   [](const KernelQuery&) -> std::unique_ptr<Kernel> { return nullptr; }});
  const KernelRegistry& all = default_kernels();  // their reference kernels, whatever this CPU has
  for (const char* op : {"Relu", "Add"})
    for (const KernelImpl& k : all.find(op, "cpu"))
      if (k.name == kReferenceKernel) r.add(op, "cpu", k);
  return r;
}

TEST(Session, KernelsAreChosenAndPreparedOnConcreteShapes) {
  Model m = chain_model();
  KernelRegistry reg = test_registry();
  auto s = Session::create(m, SessionOptions{.kernels = &reg});
  ASSERT_TRUE(s.ok()) << s.error().message();
  Tensor a = zigzag({3, 4}, 0.5f), b = zigzag({3, 4}, -1.0f);
  auto small = (*s)->run(std::vector<Tensor>{a, b});
  ASSERT_TRUE(small.ok()) << small.error().message();
  std::span<const NodeKernel> k = (*s)->kernels();
  ASSERT_EQ(k.size(), 4u);
  EXPECT_EQ(k[0].name, "ref");
  ASSERT_EQ(k[0].declined.size(), 1u);
  EXPECT_EQ(k[0].declined[0], (std::pair<std::string, std::string>{"sees_constants", "only looks"}));
  EXPECT_EQ(k[1].name, "narrow");
  EXPECT_TRUE(k[1].declined.empty());
  for (int64_t i = 0; i < 12; ++i)
    EXPECT_FLOAT_EQ((*small)[0].data<float>()[i], std::max(a.data<float>()[i] + b.data<float>()[i], 0.f));
}

TEST(Session, KernelChoiceFollowsTheShapesOfEachSignature) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, Shape({Dim::sym("n"), Dim::sym("w")}));
  ValueId y = g.add_value("y", DType::f32, Shape({Dim::sym("n"), Dim::sym("w")}));
  g.inputs = {x};
  g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {x}, .outputs = {y}});
  g.outputs = {y};
  KernelRegistry reg = test_registry();
  auto s = Session::create(m, SessionOptions{.kernels = &reg});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->run(std::vector<Tensor>{zigzag({2, 3}, 1.f)}).ok());
  EXPECT_EQ((*s)->kernels()[0].name, "narrow");
  auto wide = (*s)->run(std::vector<Tensor>{zigzag({2, 9}, 1.f)});
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ((*s)->kernels()[0].name, "ref");
  ASSERT_EQ((*s)->kernels()[0].declined.size(), 1u);
  EXPECT_EQ((*s)->kernels()[0].declined[0].second, "rows longer than 4 (2x9)");
  ASSERT_TRUE((*s)->run(std::vector<Tensor>{zigzag({1, 2}, 1.f)}).ok());
  EXPECT_EQ((*s)->kernels()[0].name, "narrow");

  // A recorded choice (a compiled model) pins the implementation, and must be able to run.
  m.graph.nodes[0].kernel.name = "ref";
  auto pinned = Session::create(m, SessionOptions{.kernels = &reg});
  ASSERT_TRUE(pinned.ok());
  ASSERT_TRUE((*pinned)->run(std::vector<Tensor>{zigzag({2, 3}, 1.f)}).ok());
  EXPECT_EQ((*pinned)->kernels()[0].name, "ref");
  m.graph.nodes[0].kernel.name = "narrow";
  auto narrow = Session::create(m, SessionOptions{.kernels = &reg});
  ASSERT_TRUE(narrow.ok());
  auto refused = (*narrow)->run(std::vector<Tensor>{zigzag({2, 9}, 1.f)});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind, ErrorKind::user);
  EXPECT_NE(refused.error().message().find("the model chose kernel 'narrow', which declines here: rows longer than 4"),
            std::string::npos) << refused.error().message();
  m.graph.nodes[0].kernel.name = "gone";
  auto gone = Session::create(m, SessionOptions{.kernels = &reg});
  ASSERT_TRUE(gone.ok());
  auto missing = (*gone)->run(std::vector<Tensor>{zigzag({2, 3}, 1.f)});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("the model chose kernel 'gone', which this kiln does not have"), std::string::npos)
      << missing.error().message();
}

TEST(Session, KernelsSeeConstantInputsWhenChosen) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, Shape({Dim::known(2)}));
  ValueId b = g.add_constant("b", Tensor::from<float>({2}, {3.f, 4.f}));
  ValueId y = g.add_value("y", DType::f32, Shape({Dim::known(2)}));
  g.inputs = {x};
  g.add_node(Node{.name = "add", .op = "Add", .inputs = {x, b}, .outputs = {y}});
  g.outputs = {y};
  std::vector<std::string> seen;
  KernelRegistry reg = test_registry(&seen);
  auto s = Session::create(m, SessionOptions{.kernels = &reg});
  ASSERT_TRUE(s.ok());
  auto r = (*s)->run(std::vector<Tensor>{Tensor::from<float>({2}, {1.f, 1.f})});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(seen, std::vector<std::string>{"add b[0]=3.000000"});
  EXPECT_FLOAT_EQ((*r)[0].data<float>()[1], 5.f);
}

// t = -x is read only by the If's then branch (a capture), after a chain of Relus that would
// reuse t's memory if t died when no node input read it any more.
TEST(Session, ValuesCapturedBySubgraphsLiveUntilTheirNode) {
  Model m;
  Graph& g = m.graph;
  const Shape s({Dim::known(4)});
  ValueId cond = g.add_value("cond", DType::boolean, Shape::of(std::vector<int64_t>{}));
  ValueId x = g.add_value("x", DType::f32, s);
  g.inputs = {cond, x};
  ValueId t = g.add_value("t", DType::f32, s);
  g.add_node(Node{.name = "neg", .op = "Neg", .inputs = {x}, .outputs = {t}});
  ValueId prev = x;
  for (int i = 0; i < 3; ++i) {
    ValueId next = g.add_value("r" + std::to_string(i), DType::f32, s);
    g.add_node(Node{.name = "relu" + std::to_string(i), .op = "Relu", .inputs = {prev}, .outputs = {next}});
    prev = next;
  }
  auto then_g = std::make_shared<Graph>();
  ValueId tt = then_g->add_value("t", DType::f32, s);
  ValueId ty = then_g->add_value("then_y", DType::f32, s);
  then_g->add_node(Node{.name = "double", .op = "Add", .inputs = {tt, tt}, .outputs = {ty}});
  then_g->outputs = {ty};
  auto else_g = std::make_shared<Graph>();
  ValueId er = else_g->add_value("r2", DType::f32, s);
  ValueId ey = else_g->add_value("else_y", DType::f32, s);
  else_g->add_node(Node{.name = "copy", .op = "Identity", .inputs = {er}, .outputs = {ey}});
  else_g->outputs = {ey};
  ValueId y = g.add_value("y", DType::f32, s);
  Node n{.name = "if", .op = "If", .inputs = {cond}, .outputs = {y}};
  n.set_attr("then_branch", then_g);
  n.set_attr("else_branch", else_g);
  g.add_node(std::move(n));
  g.outputs = {y};
  ASSERT_TRUE(resolve_captures(g).ok());
  // Attributes are sorted by name: the else branch is resolved first.
  EXPECT_EQ(g.nodes[4].captures, (std::vector<ValueId>{prev, t}));
  EXPECT_EQ(then_g->captures, (std::vector<ValueId>{kNoValue, tt}));
  EXPECT_EQ(else_g->captures, (std::vector<ValueId>{er, kNoValue}));

  auto session = Session::create(m);
  ASSERT_TRUE(session.ok()) << session.error().message();
  Tensor xs = Tensor::from<float>({4}, {1, -2, 3, -4});
  auto r = (*session)->run(std::vector<Tensor>{Tensor::from<bool>({}, {true}), xs});
  ASSERT_TRUE(r.ok()) << r.error().message();
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ((*r)[0].data<float>()[i], -2 * xs.data<float>()[i]);
  auto e = (*session)->run(std::vector<Tensor>{Tensor::from<bool>({}, {false}), xs});
  ASSERT_TRUE(e.ok()) << e.error().message();
  for (int64_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ((*e)[0].data<float>()[i], std::max(xs.data<float>()[i], 0.f));
  // The Relus not read by name share memory: t and r2 are kept, r0 and r1 reuse one slot (or,
  // where kiln's activation kernel writes r1 over r0 and r2 over r1, those three are one place).
  const MemoryPlanStats& st = (*session)->memory_stats();
  const bool in_place = (*session)->kernels()[2].name.rfind("kiln.activation_f32_", 0) == 0;
  EXPECT_EQ(st.planned_values, in_place ? 2u : 4u);
  if (!in_place) {
    EXPECT_LT(st.arena_bytes, st.unshared_bytes);
  }
}

TEST(Session, KeepsTheMostRecentlyUsedPlansOnly) {
  Model m = chain_model();
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok());
  auto run_batch = [&](int64_t n) {
    auto r = (*s)->run(std::vector<Tensor>{zigzag({n, 4}, 0.5f), zigzag({n, 4}, -1.f)});
    ASSERT_TRUE(r.ok()) << r.error().message();
  };
  const size_t cap = Session::kMaxCachedPlans;
  for (size_t n = 1; n <= cap; ++n) run_batch(static_cast<int64_t>(n));
  EXPECT_EQ((*s)->memory_stats().cached_plans, cap);
  run_batch(1);  // batch 1 is now the most recent; batch 2 the least
  for (size_t n = cap + 1; n <= cap + 4; ++n) run_batch(static_cast<int64_t>(n));
  EXPECT_EQ((*s)->memory_stats().cached_plans, cap);
  EXPECT_EQ((*s)->memory_stats().signatures, cap + 4);
  run_batch(1);
  EXPECT_EQ((*s)->memory_stats().signatures, cap + 4) << "batch 1 stayed planned";
  run_batch(2);
  EXPECT_EQ((*s)->memory_stats().signatures, cap + 5) << "batch 2 was evicted and planned again";
}

// Scales x's rows by a constant weight it "packs" (copies, padded) on prepare: to a layout of 4
// elements for batches up to 4, of 8 (padded) past that. `packs` counts the packings.
class PackingScale final : public Kernel {
 public:
  explicit PackingScale(int* packs) : packs_(packs) {}
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    const Tensor& w = *q.inputs[1].value;
    const int64_t padded = q.inputs[0].shape.concrete()[0] > 4 ? 8 : 4;
    const PackedLayout layout{.dims = {4}, .padded_dims = {padded}, .strides = {1}, .packed_for = "test"};
    w_ = packed_before(q, w, layout, DType::f32);
    if (!w_.defined()) {
      Tensor storage(DType::f32, {padded});
      std::copy_n(w.data<float>(), 4, storage.data<float>());
      w_ = storage.as_packed(DType::f32, w.shape(), layout);
      ++*packs_;
      keep_packed(q, w, w_);
    }
    return {};
  }
  Status run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const auto* w = static_cast<const float*>(w_.raw());
    for (int64_t i = 0; i < x.numel(); ++i) ctx.output(0).data<float>()[i] = x.data<float>()[i] * w[i % 4];
    return {};
  }

 private:
  int* packs_;
  Tensor w_;
};

TEST(Session, PlansShareTheWeightsTheirKernelsPacked) {
  Model m;
  Graph& g = m.graph;
  const ValueId x = g.add_value("x", DType::f32, Shape({Dim::sym("batch"), Dim::known(4)}));
  const ValueId w = g.add_constant("w", Tensor::from<float>({4}, {1.f, -2.f, 3.f, 0.5f}));  // `scale` below
  const ValueId y = g.add_value("y", DType::f32, Shape({Dim::sym("batch"), Dim::known(4)}));
  g.inputs = {x};
  g.add_node(Node{.name = "scale", .op = "Mul", .inputs = {x, w}, .outputs = {y}});
  g.outputs = {y};
  int packs = 0;
  KernelRegistry reg;
  reg.add("Mul", "cpu",
          KernelImpl{"packs", [](const KernelQuery&) -> std::optional<std::string> { return std::nullopt; },
                     [&packs](const KernelQuery&) -> std::unique_ptr<Kernel> { return std::make_unique<PackingScale>(&packs); }});
  auto s = Session::create(m, SessionOptions{.kernels = &reg});
  ASSERT_TRUE(s.ok()) << s.error().message();
  const float scale[4] = {1.f, -2.f, 3.f, 0.5f};
  auto run_batch = [&](int64_t n) {
    Tensor in = zigzag({n, 4}, 0.5f);
    auto r = (*s)->run(std::vector<Tensor>{in});
    ASSERT_TRUE(r.ok()) << r.error().message();
    for (int64_t i = 0; i < in.numel(); ++i) ASSERT_FLOAT_EQ((*r)[0].data<float>()[i], in.data<float>()[i] * scale[i % 4]);
  };
  for (int64_t n : {1, 2, 3}) run_batch(n);
  EXPECT_EQ(packs, 1) << "three plans, one packing";
  EXPECT_EQ((*s)->packed_weight_forms(), 1u);
  EXPECT_EQ((*s)->packed_weight_bytes(), 4 * sizeof(float));
  for (int64_t n : {5, 6, 7}) run_batch(n);
  EXPECT_EQ(packs, 2) << "the other layout packed once";
  EXPECT_EQ((*s)->packed_weight_forms(), 2u);
  EXPECT_EQ((*s)->packed_weight_bytes(), 12 * sizeof(float));
  // Plans of batches 1, 2 and 3 dropped (the session keeps 8): nothing holds the 4-element form.
  static_assert(Session::kMaxCachedPlans == 8);
  for (int64_t n : {8, 9, 10, 11, 12}) run_batch(n);
  EXPECT_EQ(packs, 2);
  EXPECT_EQ((*s)->packed_weight_forms(), 1u);
  run_batch(1);
  EXPECT_EQ(packs, 3) << "packed again once no plan held it";
  EXPECT_EQ((*s)->packed_weight_forms(), 2u);
}

// x · W with W read as stored: column-major (the test's packed layout), which it checks.
class ColumnMajorMatMul final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    w_ = *q.inputs[1].value;
    if (!w_.is_packed() || w_.layout()->strides != std::vector<int64_t>{1, 4}) return internal_error(q.node.where(), "W is not packed");
    return {};
  }
  Status run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const auto* w = static_cast<const float*>(w_.raw());
    const int64_t rows = x.shape()[0];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        float sum = 0;
        for (int64_t p = 0; p < 4; ++p) sum += x.data<float>()[i * 4 + p] * w[j * 4 + p];
        ctx.output(0).data<float>()[i * 3 + j] = sum;
      }
    return {};
  }

 private:
  Tensor w_;
};

// A model compiled without its input shapes may store a weight packed for the kernels it
// expects and record none: the plan keeps it packed for an implementation that reads packed
// weights, and hands a chosen one that does not (here the reference kernel, past 4 rows) the
// weight unpacked, once for every plan.
TEST(Session, StoredPackedWeightsGoPlainToKernelsThatReadThemPlain) {
  Model m;
  Graph& g = m.graph;
  const ValueId x = g.add_value("x", DType::f32, Shape({Dim::sym("batch"), Dim::known(4)}));
  const std::vector<float> w_rows = {1, 2, 3, -1, 0, 1, 2, 2, -3, 0.5f, 1, 1};  // W [4, 3], row-major
  std::vector<float> columns(12);
  for (int p = 0; p < 4; ++p)
    for (int j = 0; j < 3; ++j) columns[static_cast<size_t>(j * 4 + p)] = w_rows[static_cast<size_t>(p * 3 + j)];
  const PackedLayout layout{.dims = {4, 3}, .padded_dims = {4, 3}, .strides = {1, 4}, .packed_for = "test"};
  const ValueId w = g.add_constant("w", Tensor::from<float>({12}, columns).as_packed(DType::f32, {4, 3}, layout));
  const ValueId y = g.add_value("y", DType::f32, Shape({Dim::sym("batch"), Dim::known(3)}));
  g.inputs = {x};
  g.add_node(Node{.name = "mm", .op = "MatMul", .inputs = {x, w}, .outputs = {y}});
  g.outputs = {y};
  KernelRegistry reg;
  reg.add("MatMul", "cpu",
          KernelImpl{"column_major",
                     [](const KernelQuery& q) -> std::optional<std::string> {
                       if (q.inputs[0].shape.concrete()[0] > 4) return "more than 4 rows";
                       return std::nullopt;
                     },
                     [](const KernelQuery&) -> std::unique_ptr<Kernel> { return std::make_unique<ColumnMajorMatMul>(); },
                     {}, /*reads_packed=*/true});
  for (const KernelImpl& k : default_kernels().find("MatMul", "cpu"))
    if (k.name == kReferenceKernel) reg.add("MatMul", "cpu", k);
  auto s = Session::create(m, SessionOptions{.kernels = &reg});
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto run_batch = [&](int64_t n, const char* kernel) {
    Tensor in = zigzag({n, 4}, 0.5f);
    auto r = (*s)->run(std::vector<Tensor>{in});
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_EQ((*s)->kernels()[0].name, kernel);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        float want = 0;
        for (int64_t p = 0; p < 4; ++p) want += in.data<float>()[i * 4 + p] * w_rows[static_cast<size_t>(p * 3 + j)];
        ASSERT_FLOAT_EQ((*r)[0].data<float>()[i * 3 + j], want) << i << "," << j;
      }
  };
  run_batch(2, "column_major");
  EXPECT_EQ((*s)->packed_weight_forms(), 0u) << "read where it is stored";
  run_batch(6, "ref");
  EXPECT_EQ((*s)->packed_weight_forms(), 1u) << "the plain form, kept";
  run_batch(7, "ref");
  EXPECT_EQ((*s)->packed_weight_forms(), 1u) << "and used again";
  run_batch(2, "column_major");
}

TEST(Session, ReferenceRunsEveryNodeOnItsReferenceKernel) {
  Model m = chain_model();
  m.graph.nodes[1].kernel.name = "narrow";  // a recorded choice does not bind the oracle
  KernelRegistry reg = test_registry();
  auto s = Session::create(m, SessionOptions{.kernels = &reg, .reference = true});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->run(std::vector<Tensor>{zigzag({3, 4}, 0.5f), zigzag({3, 4}, -1.f)}).ok());
  for (const NodeKernel& k : (*s)->kernels()) {
    EXPECT_EQ(k.name, kReferenceKernel);
    EXPECT_TRUE(k.declined.empty());
  }
  KernelRegistry no_ref;
  no_ref.add("Add", "cpu", test_registry().find("Add", "cpu")[0]);
  for (const char* op : {"Relu"})
    for (const KernelImpl& k : default_kernels().find(op, "cpu")) no_ref.add(op, "cpu", k);
  auto r = Session::create(m, SessionOptions{.kernels = &no_ref, .reference = true});
  ASSERT_TRUE(r.ok());
  auto out = (*r)->run(std::vector<Tensor>{zigzag({3, 4}, 0.5f), zigzag({3, 4}, -1.f)});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message().find("no reference kernel for op 'Add'"), std::string::npos) << out.error().message();
}

// Records, while it runs, whether the calling thread and the pool flush denormals.
class FloatModeProbe final : public Kernel {
 public:
  FloatModeProbe(bool* caller, bool* pool) : caller_(caller), pool_(pool) {}
  Status run(KernelContext& ctx) override {
    *caller_ = flushes_denormals();
    *pool_ = pool_flushes_denormals();
    std::memcpy(ctx.output(0).raw(), ctx.input(0).raw(), ctx.input(0).nbytes());
    return {};
  }

 private:
  bool* caller_;
  bool* pool_;
};

TEST(Session, KernelsRunWithDenormalsFlushedOnEveryPoolThread) {
  Model m;
  Graph& g = m.graph;
  // Enough data (a 1.2 MB intermediate) that the run uses the pool, not one thread.
  const int64_t n = 300000;
  ValueId x = g.add_value("x", DType::f32, Shape({Dim::known(n)}));
  ValueId mid = g.add_value("mid", DType::f32, Shape({Dim::known(n)}));
  ValueId y = g.add_value("y", DType::f32, Shape({Dim::known(n)}));
  g.inputs = {x};
  g.add_node(Node{.name = "probe", .op = "Relu", .inputs = {x}, .outputs = {mid}});
  g.add_node(Node{.name = "probe2", .op = "Relu", .inputs = {mid}, .outputs = {y}});
  g.outputs = {y};
  bool caller = false, pool = false;
  KernelRegistry reg;
  reg.add("Relu", "cpu",
          KernelImpl{std::string(kReferenceKernel), [](const KernelQuery&) { return std::optional<std::string>(); },
                     [&](const KernelQuery&) -> std::unique_ptr<Kernel> { return std::make_unique<FloatModeProbe>(&caller, &pool); }});
  ASSERT_FALSE(flushes_denormals());
  SessionOptions fast{.kernels = &reg};
  fast.target.threads = 3;
  auto s = Session::create(m, fast);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->run(std::vector<Tensor>{zigzag({n}, 1.f)}).ok());
  EXPECT_EQ(pool_threads(), 3);
  EXPECT_EQ((*s)->run_threads(), 3);
  EXPECT_TRUE(caller);
  EXPECT_TRUE(pool);
  EXPECT_FALSE(flushes_denormals()) << "a run leaves the caller's floating-point mode as it was";

  // The oracle keeps IEEE denormals on the calling thread.
  SessionOptions oracle{.kernels = &reg, .reference = true};
  oracle.target.threads = 2;
  auto r = Session::create(m, oracle);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*r)->run(std::vector<Tensor>{zigzag({n}, 1.f)}).ok());
  EXPECT_EQ(pool_threads(), 2);
  EXPECT_FALSE(caller);

  // Thread counts from 1 to kMaxThreads; past it the pool could not be made (a user error, not
  // a crash).
  for (int threads : {0, kMaxThreads + 1}) {
    SessionOptions wrong;
    wrong.target.threads = threads;
    auto bad = Session::create(m, wrong);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().kind, ErrorKind::user);
    EXPECT_EQ(bad.error().message(), "the thread count must be from 1 to 1024, not " + std::to_string(threads));
  }
}

TEST(Threads, AvailableCoresAreCounted) {
  EXPECT_GE(available_cores(), 1);
  // This machine's own files parse, whatever they say.
  std::ifstream cgroup("/proc/self/cgroup"), mounts("/proc/self/mountinfo");
  std::stringstream c, m;
  c << cgroup.rdbuf();
  m << mounts.rdbuf();
  const int limit = cgroup_cpu_limit(c.str(), m.str());
  EXPECT_GE(limit, 0);
  if (limit > 0) {
    EXPECT_LE(available_cores(), limit);
  }
}

// CPU quotas as containers set them, in a copy of the cgroup tree under a temporary directory:
// cgroup v2 with and without a namespace, nested limits (the smallest binds), v1's cpu
// controller mounted alone or with cpuacct at the container's own cgroup, and what sets no
// limit.
TEST(Threads, CgroupCpuLimitReadsTheQuota) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("kiln-cgroup-" + std::to_string(::getpid()));
  fs::remove_all(root);
  const auto put = [&](const std::string& file, const std::string& text) {
    fs::create_directories((root / file.substr(1)).parent_path());
    std::ofstream(root / file.substr(1)) << text;
  };
  const std::string v2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
  const std::string r = root.string();
  const auto limit = [&](const std::string& self, const std::string& mounts) { return cgroup_cpu_limit(self, mounts, r); };

  // v2, a cgroup namespace (the container's cgroup is the mount's top): 1.5 CPUs round up.
  put("/sys/fs/cgroup/cpu.max", "150000 100000\n");
  EXPECT_EQ(limit("0::/\n", v2), 2);
  put("/sys/fs/cgroup/cpu.max", "50000 100000\n");
  EXPECT_EQ(limit("0::/\n", v2), 1);
  put("/sys/fs/cgroup/cpu.max", "max 100000\n");
  EXPECT_EQ(limit("0::/\n", v2), 0);
  // Nested: a pod's limit above the container's unlimited cgroup, then a tighter own one.
  put("/sys/fs/cgroup/kubepods/pod1/cpu.max", "400000 100000\n");
  put("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n");
  EXPECT_EQ(limit("0::/kubepods/pod1/ctr\n", v2), 4);
  put("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "250000 100000\n");
  EXPECT_EQ(limit("0::/kubepods/pod1/ctr\n", v2), 3);
  // A v1 line for another hierarchy beside it changes nothing; no v2 line, no limit.
  EXPECT_EQ(limit("5:memory:/x\n0::/kubepods/pod1/ctr\n", v2), 3);
  EXPECT_EQ(limit("5:memory:/x\n", v2), 0);
  // What does not parse sets no limit.
  put("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "lots\n");
  put("/sys/fs/cgroup/kubepods/pod1/cpu.max", "100000\n");
  EXPECT_EQ(limit("0::/kubepods/pod1/ctr\n", v2), 0);

  // v1 without a namespace: the cpu,cpuacct mount shows the container's own cgroup at its top.
  const std::string v1 =
      "30 25 0:27 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
      "31 25 0:28 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n";
  const std::string self_v1 = "6:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
  put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n");
  put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit(self_v1, v1), 2);
  put("/sys/fs/cgroup/memory/cpu.cfs_quota_us", "100000\n");  // not the cpu controller's
  put("/sys/fs/cgroup/memory/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit(self_v1, v1), 2);
  put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(limit(self_v1, v1), 0);
  // v1 with the cpu controller alone, the process in a child of the mount's top.
  const std::string v1_cpu = "30 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
  put("/sys/fs/cgroup/cpu/batch/cpu.cfs_quota_us", "300000\n");
  put("/sys/fs/cgroup/cpu/batch/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit("3:cpu:/batch/job7\n", v1_cpu), 3);
  // Nothing mounted, nothing read.
  EXPECT_EQ(limit("0::/\n", ""), 0);
  EXPECT_EQ(limit("", v2 + v1), 0);
  fs::remove_all(root);
}

// Sizes below, at and above the parallel threshold, stretches that do not divide evenly among
// the threads, and unaligned ends: every byte arrives and nothing past the end is written.
TEST(Threads, ParallelCopyMovesEveryByte) {
  for (int threads : {1, 3}) {
    use_threads(threads);
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{4097}, size_t{1} << 18, (size_t{1} << 20) + 13, size_t{3} << 20}) {
      std::vector<unsigned char> src(bytes + 3), dst(bytes + 67, 0xAB);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
      parallel_copy(dst.data() + 1, src.data() + 3, bytes);
      EXPECT_EQ(dst[0], 0xAB) << bytes;
      EXPECT_EQ(std::memcmp(dst.data() + 1, src.data() + 3, bytes), 0) << bytes << " bytes on " << threads << " threads";
      for (size_t i = bytes + 1; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB) << "byte " << i << " of a " << bytes << "-byte copy";
    }
  }
  use_threads(available_cores());
}

// ShareQueues: every unit is taken exactly once, in chunks, whatever the threads do; a thread
// takes its own share first, front to back, and then what is left of the others' (here the
// threads that never come: one thread alone drains three shares, its own first); `more` says
// whether the chunk's share goes on after it.
TEST(Threads, ShareQueuesHandOutEveryUnitOnce) {
  struct Taken {
    int64_t begin, end;
    bool more;
  };
  for (int64_t count : {0, 1, 10, 1000})
    for (int64_t chunk : {1, 3}) {
      SCOPED_TRACE("count " + std::to_string(count) + " chunk " + std::to_string(chunk));
      ShareQueues queues(3, chunk);
      queues.fill(count);
      std::vector<Taken> alone;
      queues.drain(1, [&](int64_t b, int64_t e, bool more) { alone.push_back({b, e, more}); });
      // Part 1's share first, then part 2's, then part 0's: each in order, in chunks.
      std::vector<Taken> want;
      for (int part : {1, 2, 0}) {
        const auto [b, e] = even_share(count, 3, part);
        for (int64_t i = b; i < e; i += chunk) want.push_back({i, std::min(i + chunk, e), i + chunk < e});
      }
      ASSERT_EQ(alone.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(alone[i].begin, want[i].begin) << "chunk " << i;
        EXPECT_EQ(alone[i].end, want[i].end) << "chunk " << i;
        EXPECT_EQ(alone[i].more, want[i].more) << "chunk " << i;
      }
      // Three threads at once, and more threads than shares: each unit once.
      for (int threads : {3, 5}) {
        queues.fill(count);
        std::vector<std::atomic<int>> times(static_cast<size_t>(count));
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            queues.drain(t, [&](int64_t b, int64_t e, bool) {
              for (int64_t i = b; i < e; ++i) times[static_cast<size_t>(i)].fetch_add(1);
            });
          });
        for (std::thread& t : pool) t.join();
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(times[static_cast<size_t>(i)].load(), 1) << "unit " << i << " on " << threads;
      }
    }
}


// A compiled model records the ISA its kernels may use: a CPU without one of those features is
// refused, naming it, unless the oracle runs it.
TEST(Session, RefusesACpuWithoutTheCompiledFeatures) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, Shape({Dim::known(2)}));
  ValueId y = g.add_value("y", DType::f32, Shape({Dim::known(2)}));
  g.inputs = {x};
  g.add_node(Node{.name = "relu", .op = "Relu", .inputs = {x}, .outputs = {y}});
  g.outputs = {y};
  m.target = TargetRecord{"cpu", CpuFeatures::named("avx512-vnni")->names(), 1};
  SessionOptions baseline;
  baseline.target.cpu = *CpuFeatures::named("avx2");
  auto s = Session::create(m, baseline);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::user);
  EXPECT_EQ(s.error().message(),
            "the model was compiled for a CPU with avx512f, avx512bw, avx512vl, avx512-vnni, which this CPU lacks "
            "(compile it again with --target host, or run it with --reference)");
  baseline.reference = true;
  EXPECT_TRUE(Session::create(m, baseline).ok());
  SessionOptions vnni;
  vnni.target.cpu = *CpuFeatures::named("avx512-vnni");
  EXPECT_TRUE(Session::create(m, vnni).ok());
}

TEST(Target, NamedTargets) {
  EXPECT_EQ(CpuFeatures::named("avx2")->str(), "avx2 fma");
  EXPECT_EQ(CpuFeatures::named("avx512")->str(), "avx2 fma avx512f avx512bw avx512vl");
  EXPECT_EQ(CpuFeatures::named("avx512-vnni")->str(), "avx2 fma avx512f avx512bw avx512vl avx512-vnni");
  EXPECT_EQ(CpuFeatures::named("host")->str(), CpuFeatures::host().str());
  EXPECT_FALSE(CpuFeatures::named("sse2"));
  EXPECT_EQ(CpuFeatures{}.str(), "baseline");
  EXPECT_EQ(CpuFeatures::named("avx2")->missing({"avx2", "amx", "fma", "avx512f"}), (std::vector<std::string>{"amx", "avx512f"}));
}

}  // namespace
}  // namespace kiln
