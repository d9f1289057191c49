// max-autotune (compile/autotune.h): the search over a small MLP whose three hidden layers are
// one problem, the database it writes and a later compile's reuse of it without timing, the
// budget, the rule's preferences (`defers`) that a pinned kernel skips, and the GEMM kernel's
// partial parameters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "compile/autotune.h"
#include "compile/pipeline.h"
#include "formats/text.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/plan.h"
#include "tests/unit/kernel_test_util.h"
#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::GraphBuilder;

// Values in [-0.5, 0.5).
Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) { return testing::noise(std::move(shape), seed); }

// x[32, 64] -> three 64x64 linear layers with bias and ReLU (one problem) -> a 64x128 one.
Model mlp() {
  GraphBuilder b;
  ValueId h = b.input("x", {32, 64});
  for (int i = 0; i < 3; ++i) {
    const std::string n = std::to_string(i);
    ValueId w = b.constant("w" + n, random_tensor({64, 64}, 10 + i));
    ValueId bias = b.constant("b" + n, random_tensor({64}, 20 + i));
    ValueId y = b.op("mm" + n, "MatMul", {h, w});
    ValueId z = b.op("add" + n, "Add", {y, bias});
    h = b.op("relu" + n, "Relu", {z});
  }
  ValueId w = b.constant("w_out", random_tensor({64, 128}, 30));
  return b.done({b.op("out", "MatMul", {h, w})});
}

std::string temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kiln-autotune-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

struct Compiled {
  Model model;
  TuningReport report;
  Result<CompileReport> result = Error{};
};

Compiled compile(const Model& m, bool search, const std::string& db, double budget_s = 120) {
  Compiled c{m, {}, Error{}};
  CompileOptions options;
  options.target.threads = 1;
  options.tuning.search = search;
  options.tuning.db_path = db;
  options.tuning.budget_s = budget_s;
  options.tuning.report = &c.report;
  c.result = compile_model(c.model, options);
  return c;
}

const TunedProblem* find_problem(const TuningReport& r, size_t nodes) {
  for (const TunedProblem& p : r.problems)
    if (p.nodes.size() == nodes) return &p;
  return nullptr;
}

// `m`'s first output on `inputs` (a session on `threads` threads) against the reference kernels'
// on `original`, as relative L2; infinity, the test failed, where `m` does not run.
double error_against_reference(const Model& m, const Model& original, const std::vector<Tensor>& inputs, int threads = 1) {
  auto session = Session::create(m, SessionOptions{.target = Target{.threads = threads}});
  if (!session.ok()) {
    ADD_FAILURE() << session.error().message();
    return std::numeric_limits<double>::infinity();
  }
  auto got = (*session)->run(inputs);
  if (!got.ok()) {
    ADD_FAILURE() << got.error().message();
    return std::numeric_limits<double>::infinity();
  }
  return testing::relative_l2((*got)[0], testing::run_reference(original, inputs)[0]);
}

void expect_matches_reference(const Model& compiled, const Model& original) {
  EXPECT_LE(error_against_reference(compiled, original, {random_tensor({32, 64}, 99)}), 1e-5);
}

TEST(Autotune, SearchesEachProblemOnceRecordsItAndReusesTheRecordWithoutTiming) {
  const std::string dir = temp_dir("search"), db = dir + "/tuning.jsonl";
  const Model original = mlp();
  Compiled cold = compile(original, true, db);
  ASSERT_TRUE(cold.result.ok()) << cold.result.error().message();
  const TuningReport& r = cold.report;
  EXPECT_TRUE(r.searched);
  EXPECT_GT(r.rounds, 0u);
  EXPECT_FALSE(r.budget_exhausted);
  // The three hidden layers are one problem; the output layer another.
  ASSERT_EQ(r.problems.size(), 2u) << tuning_report_text(r);
  const TunedProblem* hidden = find_problem(r, 3);
  ASSERT_NE(hidden, nullptr) << tuning_report_text(r);
  EXPECT_EQ(hidden->problem.op, "FusedMatMul");
  EXPECT_EQ(hidden->problem.threads, 1);
  EXPECT_GT(hidden->timed, 2u) << "the implementations and the GEMM template's axes";
  EXPECT_GT(hidden->default_us, 0);
  EXPECT_GT(hidden->chosen_us, 0);
  for (const TunedProblem& p : r.problems) {
    EXPECT_NE(p.source, TuningSource::cut_short);
    if (p.source == TuningSource::measured) EXPECT_LT(p.chosen_us, p.default_us) << "a replacement measured faster";
    else EXPECT_EQ(p.chosen, p.default_kernel);
    EXPECT_TRUE(p.rejected.empty()) << p.rejected.front();
  }
  // Every node of a problem runs the chosen kernel; the model computes what it did.
  for (const Node& n : cold.model.graph.nodes) {
    if (n.name.rfind("mm", 0) == 0) {
      EXPECT_EQ(n.kernel.name, hidden->chosen.name) << n.name;
    }
  }
  expect_matches_reference(cold.model, original);
  const bool changed = !(r.problems[0].chosen == r.problems[0].default_kernel) || !(r.problems[1].chosen == r.problems[1].default_kernel);
  if (changed) {
    EXPECT_EQ(r.final_runs, 20u) << "a changed kernel was confirmed end to end";
    EXPECT_LT(r.paired_ratio, 0.99) << "and the tuned graph was faster there";
    EXPECT_GE(r.graph_runs, r.rounds + 2 * (2 * r.final_runs + 1)) << "each timed run of the comparison after an untimed one";
  }
  if (r.reverted) {
    EXPECT_FALSE(changed) << "a tuned graph not faster end to end keeps every default";
  }

  // The database holds one record per problem, for this machine.
  auto loaded = tuning::load_tuning_db(db);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  EXPECT_EQ(loaded->size(), 2u);
  EXPECT_EQ(r.db_written, 2u);
  for (const tuning::TuningRecord* rec : loaded->records()) EXPECT_EQ(rec->machine, tuning::MachineFingerprint::host());

  // Warm: nothing timed, the same choices.
  Compiled warm = compile(original, true, db);
  ASSERT_TRUE(warm.result.ok()) << warm.result.error().message();
  EXPECT_FALSE(warm.report.searched);
  EXPECT_EQ(warm.report.graph_runs, 0u);
  EXPECT_EQ(warm.report.db_used, 2u);
  EXPECT_EQ(warm.report.db_written, 0u);
  for (size_t i = 0; i < cold.model.graph.nodes.size(); ++i)
    EXPECT_EQ(warm.model.graph.nodes[i].kernel, cold.model.graph.nodes[i].kernel) << cold.model.graph.nodes[i].name;

  // A default compile reads the database it is given, and only then.
  Compiled reuse = compile(original, false, db);
  ASSERT_TRUE(reuse.result.ok()) << reuse.result.error().message();
  EXPECT_EQ(reuse.report.db_used, 2u);
  for (size_t i = 0; i < cold.model.graph.nodes.size(); ++i)
    EXPECT_EQ(reuse.model.graph.nodes[i].kernel, cold.model.graph.nodes[i].kernel);
  Compiled plain = compile(original, false, "");
  ASSERT_TRUE(plain.result.ok());
  EXPECT_TRUE(plain.report.problems.empty());
  fs::remove_all(dir);
}

TEST(Autotune, AnExhaustedBudgetKeepsTheDefaultsAndRecordsNothing) {
  const std::string dir = temp_dir("budget"), db = dir + "/tuning.jsonl";
  Compiled c = compile(mlp(), true, db, 1e-6);
  ASSERT_TRUE(c.result.ok()) << c.result.error().message();
  EXPECT_TRUE(c.report.budget_exhausted);
  ASSERT_FALSE(c.report.problems.empty());
  for (const TunedProblem& p : c.report.problems) {
    EXPECT_EQ(p.source, TuningSource::cut_short);
    EXPECT_EQ(p.chosen, p.default_kernel) << "only the defaults were timed";
  }
  EXPECT_EQ(c.report.db_written, 0u);
  EXPECT_NE(tuning_report_text(c.report).find("cut short"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Autotune, ACorruptDatabaseIsAUserErrorNamingTheLine) {
  const std::string dir = temp_dir("corrupt"), db = dir + "/tuning.jsonl";
  std::ofstream(db) << "{\"format_version\": 1}\n";
  Compiled c = compile(mlp(), true, db);
  ASSERT_FALSE(c.result.ok());
  EXPECT_EQ(c.result.error().kind, ErrorKind::user);
  EXPECT_NE(c.result.error().message().find("line 1"), std::string::npos) << c.result.error().message();
  // A default compile given a database that does not exist is refused too.
  Compiled missing = compile(mlp(), false, dir + "/none.jsonl");
  ASSERT_FALSE(missing.result.ok());
  EXPECT_EQ(missing.result.error().kind, ErrorKind::user);
  fs::remove_all(dir);
}

TEST(Autotune, TheReportIsJsonWithEveryProblem) {
  const std::string dir = temp_dir("json"), db = dir + "/tuning.jsonl";
  Compiled c = compile(mlp(), true, db);
  ASSERT_TRUE(c.result.ok()) << c.result.error().message();
  const nlohmann::json j = nlohmann::json::parse(tuning_report_json(c.report));
  EXPECT_TRUE(j["searched"].get<bool>());
  ASSERT_EQ(j["problems"].size(), 2u);
  for (const auto& p : j["problems"]) {
    EXPECT_TRUE(p.contains("default_us"));
    EXPECT_TRUE(p.contains("chosen_us"));
    EXPECT_TRUE(p["chosen"].contains("name"));
  }
  EXPECT_EQ(j["database"]["added"].get<int>(), 2);
  fs::remove_all(dir);
}

TEST(Autotune, ProblemsKeyOnShapesAttributesConstantsAndThreads) {
  Model m = mlp();
  CompileOptions options;
  options.target.threads = 1;
  ASSERT_TRUE(compile_model(m, options).ok());
  std::vector<std::vector<int64_t>> shapes = {{32, 64}};
  Target t1{.threads = 1}, t2{.threads = 2};
  auto plan = build_plan(m.graph, shapes, PlanOptions{t1, default_kernels()});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  std::vector<tuning::TuningProblem> mm;
  for (size_t n = 0; n < m.graph.nodes.size(); ++n)
    if (m.graph.nodes[n].op == "FusedMatMul" || m.graph.nodes[n].op == "MatMul") mm.push_back(tuning_problem(*plan, n, t1));
  ASSERT_EQ(mm.size(), 4u);
  EXPECT_EQ(mm[0], mm[1]);
  EXPECT_EQ(mm[1], mm[2]);
  EXPECT_NE(mm[2], mm[3]);
  EXPECT_EQ(mm[0].inputs[1].shape, (std::vector<int64_t>{64, 64}));
  EXPECT_NE(mm[0].layout.find("const=1,2"), std::string::npos) << mm[0].layout;
  EXPECT_NE(mm[0].epilogue.find("activation=\"Relu\""), std::string::npos) << mm[0].epilogue;
  size_t first = 0;
  while (m.graph.nodes[first].op != "FusedMatMul") ++first;
  EXPECT_EQ(tuning_problem(*plan, first, t2).threads, 2);
}

// XNNPACK declines products above a million multiply-adds; up to that it runs them when pinned
// (max-autotune's candidates), while the default rule leaves those above 32,768 to kiln's GEMM.
TEST(Autotune, APinnedKernelSkipsTheRulesPreferences) {
  GraphBuilder b;
  ValueId x = b.input("x", {64, 64});
  ValueId w = b.constant("w", random_tensor({64, 64}, 5));
  Model m = b.done({b.op("y", "MatMul", {x, w})});
  const KernelRegistry& reg = default_kernels();
  Target target{.threads = 1};
  std::vector<std::vector<int64_t>> shapes = {{64, 64}};
  auto plan = build_plan(m.graph, shapes, PlanOptions{target, reg});
  ASSERT_TRUE(plan.ok());
  EXPECT_NE(plan->kernels[0].name, "xnnpack.fully_connected");
  bool deferred = false;
  for (const auto& [name, why] : plan->kernels[0].declined) deferred |= name == "xnnpack.fully_connected";
  EXPECT_TRUE(deferred) << "the rule leaves 262,144 multiply-adds to others";
  m.graph.nodes[0].kernel = KernelChoice{"xnnpack.fully_connected", {}};
  auto pinned = build_plan(m.graph, shapes, PlanOptions{target, reg});
  ASSERT_TRUE(pinned.ok()) << pinned.error().message();
  EXPECT_EQ(pinned->kernels[0].name, "xnnpack.fully_connected");
}

// A GEMM record with some parameters takes the rest from the defaults for its tile, and rounds
// its blocks to whole tiles.
TEST(Autotune, GemmKernelTakesPartialParameters) {
  GraphBuilder b;
  ValueId x = b.input("x", {100, 200});
  ValueId w = b.constant("w", random_tensor({200, 300}, 6));
  Model m = b.done({b.op("y", "MatMul", {x, w})});
  Target target{.threads = 1};
  std::vector<std::vector<int64_t>> shapes = {{100, 200}};
  const std::string gemm = CpuFeatures::host().avx512f ? "kiln.gemm_f32_avx512" : "kiln.gemm_f32_avx2";
  if (!CpuFeatures::host().avx2) GTEST_SKIP() << "no AVX2";
  const int64_t mr = CpuFeatures::host().avx512f ? 14 : 3, nr = CpuFeatures::host().avx512f ? 32 : 32;
  m.graph.nodes[0].kernel = KernelChoice{gemm, {{"mr", mr}, {"nr", nr}, {"mc", int64_t{50}}}};
  auto plan = build_plan(m.graph, shapes, PlanOptions{target, default_kernels()});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  ASSERT_EQ(plan->kernels[0].name, gemm);
  KernelChoice full{gemm, plan->kernels[0].kernel->params()};
  EXPECT_EQ(*full.param<int64_t>("mr"), mr);
  EXPECT_EQ(*full.param<int64_t>("nr"), nr);
  EXPECT_EQ(*full.param<int64_t>("mc") % mr, 0) << "rounded to whole tiles";
  EXPECT_GE(*full.param<int64_t>("mc"), 50);
  EXPECT_GT(*full.param<int64_t>("kc"), 0);
  EXPECT_LE(error_against_reference(m, m, {random_tensor({100, 200}, 7)}), 1e-5);
}

// `--precision fp16`: the f16 GEMM's blocking is searched (Kc, Mc) like the f32 template's
// parameters, and its candidates, and the f32 kernels', are held to what a lowered graph's
// kernels can differ by (the default's f16 rounding), not to the f32 graph's 1e-3: none is
// rejected for its output, and the model stays within a lowered model's bound of the reference.
TEST(Autotune, SearchesTheF16GemmsBlockingInAnFp16Graph) {
  if (auto why = cpu::gemm::lowp_lacks(CpuFeatures::host(), cpu::gemm::Lowp::f16)) GTEST_SKIP() << *why;
  GraphBuilder b;
  ValueId h = b.input("x", {96, 640});
  int64_t k = 640;
  for (int i = 0; i < 2; ++i) {
    const std::string n = std::to_string(i);
    ValueId w = b.constant("w" + n, random_tensor({k, 384}, 40 + i));
    ValueId y = b.op("mm" + n, "MatMul", {h, w});
    h = b.op("relu" + n, "Relu", {b.op("add" + n, "Add", {y, b.constant("b" + n, random_tensor({384}, 50 + i))})});
    k = 384;
  }
  const Model original = b.done({b.op("out", "MatMul", {h, b.constant("w_out", random_tensor({384, 32}, 60))})});
  Compiled c{original, {}, Error{}};
  CompileOptions options;
  options.target.threads = 1;
  options.precision = DType::f16;
  options.tuning.search = true;
  options.tuning.report = &c.report;
  c.result = compile_model(c.model, options);
  ASSERT_TRUE(c.result.ok()) << c.result.error().message();
  size_t f16 = 0;
  for (const TunedProblem& p : c.report.problems) {
    EXPECT_TRUE(p.rejected.empty()) << tuning_report_text(c.report) << p.rejected.front();
    if (p.default_kernel.name != "kiln.gemm_f16_avx512") continue;
    ++f16;
    EXPECT_NE(p.default_kernel.param<int64_t>("mc"), nullptr) << "the defaults resolved and recorded";
    EXPECT_NE(p.default_kernel.param<std::string>("split"), nullptr);
    EXPECT_GE(p.timed, 4u) << tuning_report_text(c.report) << "the implementations, then Kc and Mc";
  }
  EXPECT_EQ(f16, 2u) << tuning_report_text(c.report);
  EXPECT_LE(error_against_reference(c.model, original, {random_tensor({96, 640}, 99)}), 1e-2);
}

// kiln's Winograd convolution on two threads: the default records how the threads share it
// (its own tiles each, where U is under half of L2), and the search has that split as an axis
// beside the tile; on one thread neither (the split has no meaning there).
TEST(Autotune, WinogradSplitIsAnAxisOnSeveralThreads) {
  GraphBuilder b;
  ValueId x = b.input("x", {1, 64, 56, 56});
  const Model original = b.done({b.op("conv", "Conv", {x, b.constant("w", random_tensor({64, 64, 3, 3}, 70))},
                                      {testing::attr("pads", std::vector<int64_t>{1, 1, 1, 1})})});
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    Model m = original;
    CompileOptions options;
    options.target.threads = threads;
    ASSERT_TRUE(compile_model(m, options).ok());
    const std::vector<std::vector<int64_t>> shapes = {{1, 64, 56, 56}};
    auto plan = build_plan(m.graph, shapes, PlanOptions{options.target, default_kernels()});
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    size_t n = 0;
    while (n < m.graph.nodes.size() && m.graph.nodes[n].op != "FusedConv") ++n;
    ASSERT_LT(n, m.graph.nodes.size());
    const KernelChoice recorded{plan->kernels[n].name, plan->kernels[n].kernel->params()};
    ASSERT_EQ(recorded.name.rfind("kiln.winograd_f32_", 0), 0u) << recorded.name;
    const std::string* split = recorded.param<std::string>("split");
    std::vector<InferInput> in;
    std::vector<InferOutput> out;
    node_query_operands(*plan, n, in, out);
    const KernelQuery q{m.graph.nodes[n], m.graph, options.target, in, out};
    std::vector<std::string> axes;
    for (const KernelImpl& impl : default_kernels().find("FusedConv", "cpu"))
      if (impl.name == recorded.name)
        for (const TuningAxis& axis : impl.tuning_space(q)) axes.push_back(axis.name + "x" + std::to_string(axis.values.size()));
    if (threads == 1) {
      EXPECT_EQ(split, nullptr);
      EXPECT_EQ(axes, std::vector<std::string>{"tilex2"});
    } else {
      ASSERT_NE(split, nullptr);
      const bool u_fits = 36 * 64 * 64 * 4 < cpu::gemm::CacheSizes::host().l2 / 2;  // 4x4 tiles' U under half of L2
      EXPECT_EQ(*split, u_fits ? "tiles" : "points");
      EXPECT_EQ(axes, (std::vector<std::string>{"tilex2", "splitx2"}));
    }
  }
}

// The f16 GEMM's recorded blocking: what a record leaves out stays to the defaults, Mc is
// rounded to whole tiles, Kc to even chunks of whole blocks, and a value no blocking has is the
// model's error, naming the node.
TEST(Autotune, F16GemmTakesPartialParametersAndRefusesInvalidOnes) {
  if (auto why = cpu::gemm::lowp_lacks(CpuFeatures::host(), cpu::gemm::Lowp::f16)) GTEST_SKIP() << *why;
  GraphBuilder b;
  ValueId x = b.input("x", {100, 1000});
  Tensor w = random_tensor({1000, 150}, 8);
  Model m = b.done({b.op("y", "FusedMatMul", {x, b.constant("w", testing::to_f16(w))})});
  Target target{.threads = 2};
  const std::vector<std::vector<int64_t>> shapes = {{100, 1000}};
  auto plan_with = [&](KernelParams params) {
    m.graph.nodes[0].kernel = KernelChoice{"kiln.gemm_f16_avx512", std::move(params)};
    return build_plan(m.graph, shapes, PlanOptions{target, default_kernels()});
  };
  auto plan = plan_with({{"mc", int64_t{50}}, {"kc", int64_t{300}}, {"split", std::string("panels")}});
  ASSERT_TRUE(plan.ok()) << plan.error().message();
  KernelChoice full{"kiln.gemm_f16_avx512", plan->kernels[0].kernel->params()};
  EXPECT_EQ(*full.param<int64_t>("mc"), 54) << "whole tiles of 6 rows";
  EXPECT_EQ(*full.param<int64_t>("kc"), 384) << "three chunks of at most 384 steps, whole blocks of 128";
  EXPECT_EQ(*full.param<std::string>("split"), "panels");
  auto defaults = plan_with({{"mc", int64_t{50}}});
  ASSERT_TRUE(defaults.ok()) << defaults.error().message();
  KernelChoice rest{"kiln.gemm_f16_avx512", defaults->kernels[0].kernel->params()};
  EXPECT_EQ(*rest.param<int64_t>("kc"), 1000) << "K in one chunk of up to kF16Kc steps";
  EXPECT_EQ(*rest.param<std::string>("split"), "rows") << "N is not twice M: the threads on A's rows";
  EXPECT_LE(error_against_reference(m, m, {random_tensor({100, 1000}, 9)}, target.threads), 3e-3);
  for (const KernelParams& bad : {KernelParams{{"mc", int64_t{0}}}, KernelParams{{"kc", int64_t{-128}}},
                                  KernelParams{{"split", std::string("diagonal")}}}) {
    auto refused = plan_with(bad);
    ASSERT_FALSE(refused.ok()) << kernel_choice_text(m.graph.nodes[0].kernel);
    EXPECT_NE(refused.error().message().find("'y'"), std::string::npos) << refused.error().message();
  }
}

}  // namespace
}  // namespace kiln
