// kiln profile's pieces: the significance test, the baseline reader, the comparison, the
// memory roofs and the ceilings cache.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "profile/ceilings.h"
#include "profile/compare.h"
#include "profile/node_check.h"
#include "profile/profiler.h"
#include "runtime/threads.h"
#include "tests/unit/compile_test_util.h"

namespace kiln::profile {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

TEST(MannWhitney, SeparatedSamples) {
  // n1 = n2 = 5, U = 0: z = (12.5 - 0.5) / sqrt(25/12 * 11), p = erfc(z / sqrt 2).
  EXPECT_NEAR(mann_whitney_p({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}), 0.0121858, 1e-6);
  EXPECT_NEAR(mann_whitney_p({6, 7, 8, 9, 10}, {1, 2, 3, 4, 5}), 0.0121858, 1e-6);  // two-sided
}

TEST(MannWhitney, SameSamplesAndDegenerateOnes) {
  EXPECT_NEAR(mann_whitney_p({1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}), 1.0, 1e-12);
  EXPECT_EQ(mann_whitney_p({3, 3, 3}, {3, 3, 3}), 1.0);  // all tied: no evidence either way
  EXPECT_EQ(mann_whitney_p({1}, {2, 3, 4}), 1.0);
  EXPECT_EQ(mann_whitney_p({}, {}), 1.0);
}

TEST(MannWhitney, TiesLowerTheVariance) {
  // With ties the p-value is smaller than without the tie correction would give.
  const double p = mann_whitney_p({1, 1, 1, 2, 2}, {2, 3, 3, 3, 3});
  EXPECT_GT(p, 0.0);
  EXPECT_LT(p, 0.02);
}

// A kiln.profile document with just what a comparison reads.
json doc(const std::vector<double>& runs_ms, const std::vector<std::pair<std::string, std::vector<double>>>& nodes,
         int threads = 2, const std::string& cpu = "cpu") {
  json d;
  d["schema"] = "kiln.profile";
  d["schema_version"] = 1;
  d["model"] = {{"file", "m.kiln"}};
  d["machine"] = {{"cpu", cpu}};
  d["run"] = {{"threads", threads}};
  d["iteration_ms"] = runs_ms;
  double total = 0;
  for (double x : runs_ms) total += x;
  json ns = json::array();
  for (const auto& [name, times] : nodes) {
    double sum = 0;
    for (double x : times) sum += x;
    ns.push_back({{"name", name}, {"kernel", "k"}, {"share", sum / 1e3 / total}, {"times_us", times}});
  }
  d["nodes"] = ns;
  return d;
}

std::vector<double> noisy(double center, int n, double jitter, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-jitter, jitter);
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(center * (1 + u(rng)));
  return v;
}

TEST(ProfileSamples, ReadsAProfileAndRefusesOthers) {
  auto ok = read_profile_samples(doc({1, 2}, {{"a", {10, 11}}}).dump(), "base.json");
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(ok->iteration_ms.size(), 2u);
  ASSERT_EQ(ok->nodes.size(), 1u);
  EXPECT_EQ(ok->nodes[0].times_us[1], 11);

  auto fails = [](const std::string& text, const std::string& what) {
    auto r = read_profile_samples(text, "base.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().kind, ErrorKind::user);
    EXPECT_NE(r.error().message().find("base.json"), std::string::npos);
    EXPECT_NE(r.error().message().find(what), std::string::npos) << r.error().message();
  };
  fails("not json", "not valid JSON");
  fails("[1, 2]", "not a kiln profile");
  fails(R"({"schema": "kiln.inspect"})", "not a kiln profile");
  json d = doc({1}, {});
  d["schema_version"] = 2;
  fails(d.dump(), "schema_version 2");
  d = doc({1, -3}, {});
  fails(d.dump(), "not a time");
  d = doc({}, {});
  fails(d.dump(), "no runs");
  d = doc({1}, {{"a", {1}}});
  d["nodes"][0]["times_us"] = "fast";
  fails(d.dump(), "node 'a'");
  d = doc({1}, {});
  d.erase("machine");
  fails(d.dump(), "\"machine\"");
  d = doc({1}, {});
  d["run"]["threads"] = "two";
  fails(d.dump(), "threads");
}

TEST(CompareProfiles, SameDistributionIsNoRegression) {
  auto base = profile_samples(doc(noisy(10, 40, 0.02, 1), {{"a", noisy(500, 40, 0.02, 2)}}), "b");
  auto now = profile_samples(doc(noisy(10, 40, 0.02, 3), {{"a", noisy(500, 40, 0.02, 4)}}), "n");
  ASSERT_TRUE(base.ok() && now.ok());
  CompareOptions o;
  o.per_kernel = true;
  Comparison c = compare_profiles(*base, *now, o);
  EXPECT_FALSE(c.failed);
  EXPECT_FALSE(c.end_to_end.regressed);
  ASSERT_EQ(c.nodes.size(), 1u);
  EXPECT_FALSE(c.nodes[0].regressed);
  EXPECT_TRUE(c.notes.empty());
}

TEST(CompareProfiles, ASignificantRisePastTheLimitRegresses) {
  auto base = profile_samples(doc(noisy(10, 30, 0.02, 1), {{"a", noisy(500, 30, 0.02, 2)}, {"b", noisy(9, 30, 0.02, 5)}}), "b");
  // The run 10% slower, node b 50% slower but under 1% of the run.
  auto now = profile_samples(doc(noisy(11, 30, 0.02, 3), {{"a", noisy(500, 30, 0.02, 4)}, {"b", noisy(13.5, 30, 0.02, 6)}}), "n");
  ASSERT_TRUE(base.ok() && now.ok());
  CompareOptions o;
  Comparison c = compare_profiles(*base, *now, o);
  EXPECT_TRUE(c.end_to_end.regressed);
  EXPECT_TRUE(c.failed);
  EXPECT_NEAR(c.end_to_end.change, 0.1, 0.03);
  EXPECT_TRUE(c.nodes[1].regressed);
  // A 10% rise under a 15% limit is no regression, however significant.
  o.max_regression = 0.15;
  c = compare_profiles(*base, *now, o);
  EXPECT_FALSE(c.failed);
  EXPECT_TRUE(c.end_to_end.significant);
  // --per-kernel: a kernel under 1% of the run does not fail the check...
  o.per_kernel = true;
  c = compare_profiles(*base, *now, o);
  EXPECT_FALSE(c.failed);
  // ...one above it does.
  o.min_share = 0.0001;
  c = compare_profiles(*base, *now, o);
  EXPECT_TRUE(c.failed);
}

TEST(CompareProfiles, NotesSpreadMachineAndUnmatchedNodes) {
  auto base = profile_samples(doc(noisy(10, 30, 0.3, 1), {{"a", {1, 2}}, {"gone", {1, 1}}}, 1, "cpu A"), "b");
  auto now = profile_samples(doc(noisy(10, 30, 0.3, 2), {{"a", {1, 2}}, {"new", {1, 1}}}, 2, "cpu B"), "n");
  ASSERT_TRUE(base.ok() && now.ok());
  Comparison c = compare_profiles(*base, *now, CompareOptions{});
  ASSERT_EQ(c.only_base.size(), 1u);
  EXPECT_EQ(c.only_base[0], "gone [k]");
  ASSERT_EQ(c.only_now.size(), 1u);
  EXPECT_EQ(c.only_now[0], "new [k]");
  std::string notes;
  for (const auto& n : c.notes) notes += n + "\n";
  EXPECT_NE(notes.find("another CPU (cpu A)"), std::string::npos) << notes;
  EXPECT_NE(notes.find("1 threads, this profile on 2"), std::string::npos) << notes;
  EXPECT_NE(notes.find("larger than the 5.0% limit"), std::string::npos) << notes;
  const json j = to_json(c, CompareOptions{}, "base.json");
  EXPECT_EQ(j["base"], "base.json");
  EXPECT_EQ(j["only_base"].size(), 1u);
}

// Node names need not be unique in a graph: the k-th node of a name and kernel pairs with the
// k-th, so a profile compared with itself changes nothing (a fuzzer's finding: two nodes named
// alike, one slow and one fast, compared the slow one with the fast one).
TEST(CompareProfiles, NodesOfOneNamePairInOrder) {
  auto base = profile_samples(doc(noisy(10, 30, 0.02, 1), {{"x", noisy(500, 30, 0.02, 2)}, {"x", noisy(5, 30, 0.02, 3)}, {"y", {1, 2}}}), "b");
  ASSERT_TRUE(base.ok());
  CompareOptions o;
  o.per_kernel = true;
  o.min_share = 0;
  Comparison c = compare_profiles(*base, *base, o);
  EXPECT_FALSE(c.failed);
  ASSERT_EQ(c.nodes.size(), 3u);
  for (const Delta& d : c.nodes) EXPECT_FALSE(d.significant) << d.what;
  EXPECT_TRUE(c.only_base.empty() && c.only_now.empty());
  // One more of the name in the new profile: the third is new, the first two pair as before.
  auto now = profile_samples(doc(noisy(10, 30, 0.02, 1), {{"x", noisy(500, 30, 0.02, 2)}, {"x", noisy(5, 30, 0.02, 3)}, {"x", {7, 8}}}), "n");
  ASSERT_TRUE(now.ok());
  c = compare_profiles(*base, *now, o);
  EXPECT_EQ(c.nodes.size(), 2u);
  for (const Delta& d : c.nodes) EXPECT_FALSE(d.significant) << d.what;
  ASSERT_EQ(c.only_now.size(), 1u);
  EXPECT_EQ(c.only_now[0], "x [k]");
  ASSERT_EQ(c.only_base.size(), 1u);
  EXPECT_EQ(c.only_base[0], "y [k]");
}

TEST(CompareProfiles, NotesOtherInputsAndAnotherGraph) {
  auto with_input = [](json d, const std::string& name, std::vector<int64_t> shape) {
    d["run"]["inputs"] = json::array({{{"name", name}, {"dtype", "f32"}, {"shape", shape}}});
    return d;
  };
  const auto runs = noisy(10, 20, 0.01, 1);
  auto base = profile_samples(with_input(doc(runs, {{"a", {1, 2}}, {"b", {1, 2}}, {"c", {1, 2}}}), "x", {1, 3}), "b");
  auto now = profile_samples(with_input(doc(runs, {{"a", {1, 2}}, {"d", {1, 2}}, {"e", {1, 2}}}), "x", {8, 3}), "n");
  ASSERT_TRUE(base.ok() && now.ok()) << (base.ok() ? now.error().message() : base.error().message());
  EXPECT_EQ(base->inputs, std::vector<std::string>{"x: f32[1x3]"});
  Comparison c = compare_profiles(*base, *now, CompareOptions{});
  std::string notes;
  for (const auto& n : c.notes) notes += n + "\n";
  EXPECT_NE(notes.find("other inputs (x: f32[1x3]; now x: f32[8x3])"), std::string::npos) << notes;
  EXPECT_NE(notes.find("only 1 of the baseline's 3 call sites"), std::string::npos) << notes;
  // The same inputs and graph: neither note.
  c = compare_profiles(*base, *base, CompareOptions{});
  EXPECT_TRUE(c.notes.empty());

  json bad = with_input(doc({1}, {}), "x", {1});
  bad["run"]["inputs"][0]["shape"] = json::array({"n"});
  auto r = profile_samples(bad, "b.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("input 'x': \"shape\": expected integers"), std::string::npos) << r.error().message();
  bad["run"]["inputs"] = 3;
  EXPECT_FALSE(profile_samples(bad, "b.json").ok());
}

TEST(CompareProfiles, RenderedNamesCannotDriveTheTerminal) {
  auto base = profile_samples(doc(noisy(10, 30, 0.01, 1), {{"a\x1b[2J", noisy(500, 30, 0.01, 2)}}), "b");
  auto now = profile_samples(doc(noisy(10, 30, 0.01, 3), {{"a\x1b[2J", noisy(900, 30, 0.01, 4)}, {"n\r", {1, 1}}}), "n");
  ASSERT_TRUE(base.ok() && now.ok());
  const Comparison c = compare_profiles(*base, *now, CompareOptions{});
  const std::string text = render_comparison(c, CompareOptions{}, "base\x07.json");
  EXPECT_NE(text.find("a\\x1b[2J [k]"), std::string::npos) << text;
  EXPECT_NE(text.find("only now: n\\x0d"), std::string::npos) << text;
  EXPECT_NE(text.find("base\\x07.json"), std::string::npos) << text;
  for (char ch : text) EXPECT_TRUE(ch == '\n' || static_cast<unsigned char>(ch) >= 0x20) << static_cast<int>(ch);
}

TEST(Ceilings, MemoryRoofIsTheSmallestLevelThatHolds) {
  Ceilings c;
  c.memory = {{"L1", 32 << 10, 200}, {"L2", 1 << 20, 100}, {"DRAM", 0, 20}};
  EXPECT_EQ(memory_roof(c, 1000).name, "L1");
  EXPECT_EQ(memory_roof(c, 32 << 10).name, "L1");
  EXPECT_EQ(memory_roof(c, (32 << 10) + 1).name, "L2");
  EXPECT_EQ(memory_roof(c, 1 << 30).name, "DRAM");
  EXPECT_EQ(memory_roof(Ceilings{}, 1).gbps, 0);
}

TEST(Ceilings, ProbedOnceThenCachedAndACorruptCacheIsReplaced) {
  const fs::path dir = fs::temp_directory_path() / ("kiln-ceilings-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  CeilingsOptions o;
  o.cache_dir = dir.string();
  const CpuFeatures& cpu = CpuFeatures::host();
  use_threads(3);
  const Ceilings first = machine_ceilings(cpu, 1, o);
  EXPECT_EQ(first.source, "probed");
  EXPECT_EQ(pool_threads(), 3) << "a one-thread probe left the caller's pool at one thread";
  use_threads(1);
  EXPECT_GT(first.compute_gflops.at("f32"), 0);
  ASSERT_FALSE(first.memory.empty());
  EXPECT_EQ(first.memory.back().name, "DRAM");
  EXPECT_GT(first.memory_gbps, 0);
  for (size_t i = 0; i + 1 < first.memory.size(); ++i) EXPECT_LT(first.memory[i].capacity, first.memory[i + 1].capacity == 0 ? INT64_MAX : first.memory[i + 1].capacity);
  EXPECT_EQ(cpu.avx512_vnni || cpu.amx, first.compute_gflops.count("int8") == 1);
  EXPECT_EQ(cpu.avx512_fp16, first.compute_gflops.count("f16") == 1);
  // The cache's behaviour, with a probe that counts its calls and answers the first one's
  // ceilings (a real one takes seconds where the L3 is large).
  int probes = 0;
  o.probe = [&](const CpuFeatures&, int) {
    ++probes;
    Ceilings c = first;
    c.cache_file.clear();
    return c;
  };
  const Ceilings again = machine_ceilings(cpu, 1, o);
  EXPECT_EQ(again.source, "cache");
  EXPECT_EQ(again.compute_gflops, first.compute_gflops);
  EXPECT_EQ(again.memory.size(), first.memory.size());
  EXPECT_EQ(again.cache_file, (dir / "ceilings.json").string());
  o.reprobe = true;
  EXPECT_EQ(machine_ceilings(cpu, 1, o).source, "probed");
  o.reprobe = false;
  std::ofstream(dir / "ceilings.json") << "{ corrupt";
  EXPECT_EQ(machine_ceilings(cpu, 1, o).source, "probed");
  EXPECT_EQ(machine_ceilings(cpu, 1, o).source, "cache");
  // A folder that cannot be made: probed, not cached, no error.
  o.cache_dir = "/proc/kiln-no-such-dir";
  const Ceilings uncached = machine_ceilings(cpu, 1, o);
  EXPECT_EQ(uncached.source, "probed");
  EXPECT_TRUE(uncached.cache_file.empty());
  EXPECT_EQ(probes, 3);
  fs::remove_all(dir);
  // Each peak is the best of a few timings; a busy moment on a shared machine can still slow one
  // probe, so the ratios get up to three probes. AMX: a tile product is 16x16x32 bf16
  // multiply-adds, many times an FMA's 16. AVX512-FP16: 32 f16 multiply-adds an FMA, twice f32's.
  auto holds = [&](const Ceilings& c) {
    const auto& g = c.compute_gflops;
    return (!cpu.amx || (g.at("bf16") > 2 * g.at("f32") && g.at("int8") > 1.5 * g.at("bf16"))) &&  // 64 int8 for 32 bf16
           (!cpu.avx512_fp16 || g.at("f16") > 1.5 * g.at("f32"));
  };
  Ceilings c = first;
  for (int tries = 1; tries < 3 && !holds(c); ++tries) c = probe_ceilings(cpu, 1);
  if (cpu.amx) {
    EXPECT_GT(c.compute_gflops.at("bf16"), 2 * c.compute_gflops.at("f32"));
    EXPECT_GT(c.compute_gflops.at("int8"), 1.5 * c.compute_gflops.at("bf16"));
  }
  if (cpu.avx512_fp16) {
    EXPECT_GT(c.compute_gflops.at("f16"), 1.5 * c.compute_gflops.at("f32"));
  }
}

// The compute peaks alone (compile's bf16 warning): the precisions this CPU has, each measured,
// the caller's pool left as it was.
TEST(Ceilings, ComputePeaksAloneLeaveThePool) {
  const CpuFeatures& cpu = CpuFeatures::host();
  use_threads(3);
  const std::map<std::string, double> peaks = probe_compute_peaks(cpu, 1);
  EXPECT_EQ(pool_threads(), 3);
  use_threads(1);
  EXPECT_GT(peaks.at("f32"), 0);
  EXPECT_EQ(cpu.avx512_bf16 || cpu.amx, peaks.count("bf16") == 1);
  EXPECT_EQ(cpu.avx512_vnni || cpu.amx, peaks.count("int8") == 1);
  EXPECT_EQ(cpu.avx512_fp16, peaks.count("f16") == 1);
  for (const auto& [name, gflops] : peaks) EXPECT_GT(gflops, 0) << name;
}

// One precision's peak alone (a benchmark's probe beside its kernels): each precision the CPU
// has, measured; 0 for one it lacks or a name no probe has; the caller's pool left as it was.
TEST(Ceilings, OnePrecisionsPeakAlone) {
  const CpuFeatures& cpu = CpuFeatures::host();
  use_threads(3);
  const double f32 = probe_compute_peak(cpu, "f32", 1, 1);
  EXPECT_EQ(pool_threads(), 3);
  use_threads(1);
  EXPECT_GT(f32, 0);
  EXPECT_EQ(cpu.avx512_fp16, probe_compute_peak(cpu, "f16", 1, 1) > 0);
  EXPECT_EQ(cpu.avx512_bf16 || cpu.amx, probe_compute_peak(cpu, "bf16", 1, 1) > 0);
  EXPECT_EQ(cpu.avx512_vnni || cpu.amx, probe_compute_peak(cpu, "int8", 1, 1) > 0);
  EXPECT_EQ(probe_compute_peak(cpu, "f64", 1, 1), 0);
}

// A batch-symbolic MatMul + Relu, measured: FLOPs and bytes count the shapes that ran.
TEST(Profiler, MeasuresAndReportsWhatRan) {
  testing::GraphBuilder b;
  ValueId x = b.input("x", Shape({Dim::sym("batch"), Dim::known(64)}));
  ValueId w = b.constant("w", testing::make<float>({64, 32}, std::vector<float>(64 * 32, 0.01f)));
  ValueId y = b.op("mm", "MatMul", {x, w});
  ValueId z = b.op("relu", "Relu", {y});
  Model m = b.done({z});
  auto session = Session::create(m);
  ASSERT_TRUE(session.ok()) << session.error().message();
  RunOptions ro;
  ro.warmup = 1;
  ro.iterations = 7;
  int progress_calls = 0;
  ro.progress = [&](int, double) { ++progress_calls; };
  Tensor input = testing::make<float>({8, 64}, std::vector<float>(8 * 64, 1.0f));
  auto measured = measure(**session, {input}, ro);
  ASSERT_TRUE(measured.ok()) << measured.error().message();
  EXPECT_EQ(measured->iteration_ms.size(), 7u);
  EXPECT_EQ(progress_calls, 7);
  ASSERT_EQ(measured->node_us.size(), 2u);
  EXPECT_EQ(measured->node_us[0].size(), 7u);
  EXPECT_EQ(measured->start_us.size(), 7u);  // all kept: fewer than kKeptIterations
  EXPECT_EQ(measured->outputs.size(), 1u);

  ReportContext ctx;
  ctx.model_file = "m.kiln";
  ctx.stage = Stage::exported;
  ctx.compiled_in_memory = true;
  ctx.inputs = {{"x", DType::f32, {8, 64}}};
  ctx.ceilings.compute_gflops["f32"] = 1e6;  // a roof no node reaches
  ctx.ceilings.memory = {{"L1", 1 << 20, 1e6}, {"DRAM", 0, 1e6}};
  ctx.ceilings.memory_gbps = 1e6;
  ctx.ceilings.threads = 1;
  ctx.ceilings.source = "probed";
  json doc = build_report(m.graph, *measured, ctx);
  ASSERT_EQ(doc["nodes"].size(), 2u);
  const json& mm = doc["nodes"][0];
  EXPECT_EQ(mm["name"], "mm");
  EXPECT_EQ(mm["flops"], 2 * 8 * 64 * 32);  // batch 8 as it ran, not 1
  EXPECT_EQ(mm["bytes_written"], 8 * 32 * 4);
  EXPECT_EQ(mm["bytes_read"], (8 * 64 + 64 * 32) * 4);
  EXPECT_EQ(mm["inputs"][0]["shape"], json::array({8, 64}));
  EXPECT_EQ(mm["times_us"].size(), 7u);
  EXPECT_EQ(doc["nodes"][1]["flops"], 8 * 32);  // Relu: one per element
  EXPECT_EQ(doc["run"]["iterations"], 7);
  EXPECT_EQ(doc["by_op"].size(), 2u);
  EXPECT_TRUE(doc["notes"].empty());
  EXPECT_LE(doc["kernel_time"]["sum_ms_p50"].get<double>(), doc["kernel_time"]["wall_ms_p50"].get<double>());
  EXPECT_EQ(doc["timeline"]["events"].size(), 2u);

  // Ceilings far below what a node reached: the report says they were measured low.
  ctx.ceilings.compute_gflops["f32"] = 1e-6;
  ctx.ceilings.memory = {{"DRAM", 0, 1e6}};  // so that the nodes sit under the compute roof
  doc = build_report(m.graph, *measured, ctx);
  ASSERT_EQ(doc["notes"].size(), 1u);
  EXPECT_NE(doc["notes"][0].get<std::string>().find("--reprobe"), std::string::npos);
  EXPECT_EQ(doc["nodes"][0]["bound"], "compute");
  EXPECT_NE(render_table(doc, 80, 5).find("note: node 'mm' ran at"), std::string::npos);
  const std::string csv = render_csv(doc);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  // A Winograd kernel does fewer multiplications than its op counts: passing the roof is no sign.
  for (NodeKernel& k : measured->kernels) k.label = "winograd";
  ctx.ceilings.compute_gflops["f32"] = 1e-6;
  doc = build_report(m.graph, *measured, ctx);
  EXPECT_TRUE(doc["notes"].empty()) << doc["notes"].dump();
}

// A Reshape between two intermediates runs nothing (a view of its input's memory): it reads
// and writes no bytes and does no FLOPs in the report, not 2 KiB in no time.
TEST(Profiler, ViewsMoveNothing) {
  testing::GraphBuilder b;
  ValueId x = b.input("x", Shape::of(std::vector<int64_t>{8, 64}));
  ValueId a = b.op("relu", "Relu", {x});
  ValueId v = b.op("view", "Reshape", {a, b.constant("shape", Tensor::from<int64_t>({2}, {64, 8}))});
  Model m = b.done({b.op("neg", "Neg", {v})});
  auto session = Session::create(m);
  ASSERT_TRUE(session.ok()) << session.error().message();
  RunOptions ro;
  ro.warmup = 1;
  ro.iterations = 3;
  auto measured = measure(**session, {Tensor(DType::f32, {8, 64})}, ro);
  ASSERT_TRUE(measured.ok()) << measured.error().message();
  ASSERT_EQ(measured->kernels.size(), 3u);
  EXPECT_TRUE(measured->kernels[1].nothing_to_run);
  EXPECT_FALSE(measured->kernels[2].nothing_to_run);
  ReportContext ctx;
  ctx.model_file = "m.kiln";
  ctx.stage = Stage::exported;
  ctx.inputs = {{"x", DType::f32, {8, 64}}};
  ctx.ceilings.compute_gflops["f32"] = 1e6;
  ctx.ceilings.memory = {{"DRAM", 0, 1e6}};
  ctx.ceilings.memory_gbps = 1e6;
  ctx.ceilings.threads = 1;
  ctx.ceilings.source = "probed";
  json doc = build_report(m.graph, *measured, ctx);
  const json& view = doc["nodes"][1];
  EXPECT_EQ(view["name"], "view");
  EXPECT_EQ(view["bytes_read"], 0);
  EXPECT_EQ(view["bytes_written"], 0);
  EXPECT_EQ(view["flops"], 0);
  EXPECT_EQ(view["gbps"], 0);
  EXPECT_EQ(doc["nodes"][2]["bytes_written"], 8 * 64 * 4);
}

// A QAdd kernel for --check to judge: with unit scales and zero points 0 its codes are a + b,
// which the reference computes exactly; its first code is `off` steps higher.
class QAddOffBy final : public Kernel {
 public:
  explicit QAddOffBy(int off) : off_(off) {}
  Status run(KernelContext& ctx) override {
    const int8_t *a = ctx.input(0).data<int8_t>(), *b = ctx.input(3).data<int8_t>();
    int8_t* y = ctx.output(0).data<int8_t>();
    for (int64_t i = 0; i < ctx.output(0).numel(); ++i) y[i] = static_cast<int8_t>(a[i] + b[i] + (i == 0 ? off_ : 0));
    return {};
  }

 private:
  int off_;
};

TEST(NodeCheck, RequantizingInt8OpsMayLandOneStepOff) {
  // The int8 ops lower_int8 makes multiply by 1/scale where their reference divides, so
  // `kiln profile --check` lets their codes land one step from the reference's, not two.
  testing::GraphBuilder b;
  auto zero = [&](const std::string& name) {
    Tensor t(DType::i8, {});
    t.data<int8_t>()[0] = 0;
    return b.constant(name, t);
  };
  const ValueId x = b.input("x", {4, 32}, DType::i8), y = b.input("y", {4, 32}, DType::i8);
  const ValueId sum = b.op("add", "QAdd", {x, b.scalar("xs", 1.f), zero("xz"), y, b.scalar("ys", 1.f), zero("yz"), b.scalar("s", 1.f), zero("z")});
  Model m = b.done({sum});
  m.graph.nodes[0].kernel = KernelChoice{"test.qadd", {}};  // pinned, as a compiled model's (the reference comes first otherwise)
  Tensor xv(DType::i8, {4, 32}), yv(DType::i8, {4, 32});  // sums within ±80: none saturates
  for (int64_t i = 0; i < 128; ++i) xv.data<int8_t>()[i] = static_cast<int8_t>(i * 7 % 101 - 50), yv.data<int8_t>()[i] = static_cast<int8_t>(i * 13 % 61 - 30);
  for (int off : {0, 1, 2}) {
    SCOPED_TRACE("off by " + std::to_string(off));
    KernelRegistry kernels = default_kernels().without({"kiln.qadd_avx512", "kiln.qadd_avx2"});
    kernels.add("QAdd", "cpu", KernelImpl{.name = "test.qadd", .declines = [](const KernelQuery&) { return std::optional<std::string>(); }, .create = [off](const KernelQuery&) { return std::make_unique<QAddOffBy>(off); }});
    SessionOptions options;
    options.kernels = &kernels;
    auto session = Session::create(m, options);
    ASSERT_TRUE(session.ok()) << session.error().message();
    const fs::path repro = fs::temp_directory_path() / ("kiln-check-" + std::to_string(::getpid()));
    auto checks = check_nodes(**session, m, {xv, yv}, CheckOptions{.repro_dir = repro.string()});
    fs::remove_all(repro);
    ASSERT_TRUE(checks.ok()) << checks.error().message();
    ASSERT_EQ(checks->size(), 1u);
    const NodeCheck& c = (*checks)[0];
    EXPECT_EQ(c.kernel, "test.qadd");
    EXPECT_TRUE(c.checked);
    EXPECT_EQ(c.pass, off < 2) << c.detail;
    EXPECT_EQ(c.max_abs, off);
    if (off == 2) {
      EXPECT_NE(c.detail.find("1 of 128 codes differ, by up to 2 steps (one allowed)"), std::string::npos) << c.detail;
    }
  }
}

}  // namespace
}  // namespace kiln::profile
