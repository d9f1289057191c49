// `kiln run M.kiln`: execute a model on given or random inputs, write and/or check outputs.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/app.h"
#include "cli/inputs.h"
#include "export/exporter.h"
#include "formats/memory.h"
#include "formats/npy.h"
#include "formats/serialize.h"
#include "profile/node_check.h"
#include "runtime/compare.h"
#include "runtime/session.h"
#include "runtime/threads.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

struct RunArgs {
  std::string model;
  InputArgs in;
  std::string output_dir;
  std::string check_against;
  double atol = 1e-5;
  double rtol = 1e-3;
  int warmup = 1;  // the first run of a shape signature also plans it
  int iters = 0;
  bool json = false;
  int threads = 0;  ///< 0: the cores it may use (available_cores)
  bool reference = false;
  bool verbose = false;
  std::string node;
};

/// Latency of the timed runs, in milliseconds.
struct Latency {
  double min, median, p90, mean;
};

Latency summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  double sum = 0;
  for (double x : ms) sum += x;
  // p90 by nearest rank: the smallest time at least 90% of the runs did not exceed.
  const size_t rank90 = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(n)));
  return {ms.front(), n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2, ms[std::max<size_t>(rank90, 1) - 1],
          sum / static_cast<double>(n)};
}

int run(const RunArgs& args) {
  const std::string verb = "run";
  using clock = std::chrono::steady_clock;
  const auto load_start = clock::now();
  auto model = load_model_arg(args.model);
  const double load_ms = std::chrono::duration<double, std::milli>(clock::now() - load_start).count();
  if (!model.ok()) return report(verb, model.error());
  if (!args.node.empty()) {  // --node: that node alone, its other inputs now the graph's
    auto index = profile::find_node(*model, args.node, args.model);
    if (!index.ok()) return report(verb, index.error());
    auto alone = profile::single_node_model(*model, *index);
    if (!alone.ok()) return report(verb, with_file(alone.status(), args.model));
    *model = std::move(*alone);
  }
  const Graph& g = model->graph;
  std::vector<std::string> input_names, output_names;
  for (ValueId id : g.inputs) input_names.push_back(g.value(id).name);
  for (ValueId id : g.outputs) output_names.push_back(g.value(id).name);

  auto gathered = gather_inputs(g, args.in, args.model);
  if (!gathered.ok()) return report(verb, gathered.error());
  const std::vector<Tensor>& ordered = *gathered;

  SessionOptions options;
  options.target.threads = thread_arg(verb, args.threads);
  options.reference = args.reference;
  const auto session_start = clock::now();
  auto session = Session::create(*model, options);
  if (!session.ok()) return report(verb, with_file(session.status(), args.model));
  const double session_ms = std::chrono::duration<double, std::milli>(clock::now() - session_start).count();
  // With --iters: the warm-up runs, then the timed ones; otherwise one run. The outputs
  // written or checked are the last run's.
  const int warmup = args.iters > 0 ? args.warmup : 0;
  std::vector<double> times_ms;
  double first_ms = 0;
  Result<std::vector<Tensor>> outputs = Error{};
  for (int i = 0; i < warmup + std::max(args.iters, 1); ++i) {
    auto t0 = clock::now();
    outputs = (*session)->run(ordered);
    auto t1 = clock::now();
    if (!outputs.ok()) return report(verb, with_file(outputs.status(), args.model));
    const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    if (i == 0) first_ms = ms;
    if (i >= warmup) times_ms.push_back(ms);
  }
  if (args.verbose) {
    const Target& target = (*session)->target();
    std::cerr << "target: " << target.device << " (" << target.cpu.str() << "), " << target.threads << (target.threads == 1 ? " thread" : " threads")
              << (args.reference ? ", reference kernels" : "") << "\n";
    if ((*session)->run_threads() != target.threads)
      std::cerr << "runs on " << (*session)->run_threads() << " thread: the graph is too little work to share\n";
    const MemoryPlanStats& m = (*session)->memory_stats();
    std::cerr << "memory plan: " << m.arena_bytes << " bytes planned for " << m.planned_values
              << " intermediate values (" << m.unshared_bytes << " without reuse), " << m.workspace_bytes
              << " bytes of kernel workspace, " << m.dynamic_values
              << " allocated separately; " << m.reinferred_nodes << " of " << g.nodes.size()
              << " nodes infer their output shapes on each run\n";
    if (const size_t forms = (*session)->packed_weight_forms(); forms > 0)
      std::cerr << "packed weights: " << (*session)->packed_weight_bytes() << " bytes in " << forms
                << (forms == 1 ? " form" : " forms") << " made while planning, shared by the plans of every input shape\n";
    if (const size_t eligible = (*session)->huge_page_eligible_bytes(); eligible > 0) {
      const size_t moved = (*session)->huge_page_weight_bytes();
      std::cerr << "huge pages: " << moved << " of " << eligible << " bytes of low-precision weights moved onto them"
                << (moved < eligible ? " (the rest are read where mapped: the machine gave the pages slowly, or the memory budget had no room)" : "")
                << "\n";
    }
    // Where the runs left the pages (after them: a mapped weight is resident once read).
    const ModelPageUse pages = model_page_use();
    std::string on_huge;
    for (const auto& [what, use] :
         {std::pair{"model file ", pages.model_files}, std::pair{"buffers that asked for them ", pages.huge_page_buffers}})
      if (use)
        on_huge += (on_huge.empty() ? "" : ", ") + (what + std::to_string(use->huge_page_bytes)) + " of " +
                   std::to_string(use->resident_bytes) + " resident bytes";
    if (!on_huge.empty()) std::cerr << "on 2 MiB pages: " << on_huge << "\n";
    std::span<const NodeKernel> kernels = (*session)->kernels();
    for (size_t i = 0; i < kernels.size(); ++i) {
      std::cerr << "node '" << escape_controls(g.nodes[i].name) << "' (" << escape_controls(g.nodes[i].qualified_op()) << "): " << kernels[i].name;
      if (!kernels[i].label.empty()) std::cerr << " (" << kernels[i].label << ")";
      for (const auto& [impl, why] : kernels[i].declined) std::cerr << "; " << impl << " declined: " << why;
      std::cerr << "\n";
    }
  }
  if (args.iters > 0) {
    Latency lat = summarize(times_ms);
    if (args.json) {
      nlohmann::ordered_json j;
      j["schema"] = "kiln.run";
      j["schema_version"] = 1;
      j["model"] = args.model;
      j["latency_ms"] = {{"min", lat.min}, {"median", lat.median}, {"p90", lat.p90}, {"mean", lat.mean}};
      j["iters"] = args.iters;
      j["warmup"] = args.warmup;
      j["threads"] = (*session)->target().threads;
      j["reference"] = args.reference;
      nlohmann::ordered_json shapes = nlohmann::ordered_json::object();
      for (size_t i = 0; i < input_names.size(); ++i) shapes[input_names[i]] = ordered[i].shape();
      j["input_shapes"] = shapes;
      j["arena_bytes"] = (*session)->memory_stats().arena_bytes;
      j["startup_ms"] = {{"load", load_ms}, {"session", session_ms}, {"first_run", first_ms}};
      j["peak_rss_bytes"] = peak_rss_bytes();
      std::cout << j.dump(2) << "\n";
    } else {
      char line[160];
      std::snprintf(line, sizeof line, "%8s %10s %10s %10s %10s\n%8d %10.4g %10.4g %10.4g %10.4g\n", "runs", "min ms",
                    "median ms", "p90 ms", "mean ms", args.iters, lat.min, lat.median, lat.p90, lat.mean);
      const int threads = (*session)->target().threads;
      std::cerr << "kiln run: " << args.iters << " timed runs after " << args.warmup << " warm-up, " << threads
                << (threads == 1 ? " thread" : " threads") << (args.reference ? ", reference kernels" : "") << "\n"
                << line;
      std::snprintf(line, sizeof line, "start: load %.1f ms, session %.1f ms, first run %.4g ms; peak RSS %.1f MB\n",
                    load_ms, session_ms, first_ms, static_cast<double>(peak_rss_bytes()) / 1e6);
      std::cerr << line;
    }
  }

  if (!args.output_dir.empty()) {
    std::error_code ec;
    fs::create_directories(args.output_dir, ec);
    if (ec) return report(verb, Error{ErrorKind::user, args.output_dir, "", "cannot create folder: " + ec.message()});
    for (size_t i = 0; i < outputs->size(); ++i) {
      std::string path = (fs::path(args.output_dir) / (percent_encode_file_name(output_names[i]) + ".npy")).string();
      Status st = write_npy_file(path, (*outputs)[i]);
      if (!st.ok()) return report(verb, st);
    }
  }
  if (args.check_against.empty()) {
    if (args.output_dir.empty() && args.iters == 0)
      for (size_t i = 0; i < outputs->size(); ++i)
        std::cout << escape_controls(output_names[i]) << ": " << dtype_name((*outputs)[i].dtype()) << " "
                  << shape_str((*outputs)[i].shape()) << "\n";
    return 0;
  }

  // Expected outputs: <name>.npy files, or an ONNX test_data_set's output_K.pb files.
  NamedTensors expected;
  if (!numbered_pb_files(args.check_against, "output").empty()) {
    auto r = read_pb_set(args.check_against, "output", output_names);
    if (!r.ok()) return report(verb, r.error());
    expected = std::move(*r);
  } else {
    for (const std::string& name : output_names) {
      std::string path = (fs::path(args.check_against) / (percent_encode_file_name(name) + ".npy")).string();
      auto t = read_npy_file(path);
      if (!t.ok()) return report(verb, t.error());
      expected.emplace_back(name, std::move(*t));
    }
  }
  CompareOptions copt;
  copt.atol = args.atol;
  copt.rtol = args.rtol;
  bool all_pass = true;
  for (size_t i = 0; i < outputs->size(); ++i) {
    auto it = std::find_if(expected.begin(), expected.end(), [&](const auto& e) { return e.first == output_names[i]; });
    if (it == expected.end()) continue;  // a test set may leave optional outputs out
    CompareResult r = compare_tensors((*outputs)[i], it->second, copt);
    std::cout << "output '" << escape_controls(output_names[i]) << "': " << (r.pass ? "ok" : "FAILED") << ": " << r.summary << "\n";
    all_pass = all_pass && r.pass;
  }
  if (!all_pass) {
    std::ostringstream what;
    what << "outputs differ from " << args.check_against << " (atol " << args.atol << ", rtol " << args.rtol << ")";
    return report(verb, Error{ErrorKind::check, args.model, "", what.str()});
  }
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Run a .kiln model");
  cmd->add_option("model", args->model, "model .kiln file (- for stdin)")->required();
  add_input_options(cmd, args->in);
  cmd->add_option("--output-dir", args->output_dir, "write DIR/<output name>.npy");
  cmd->add_option("--check-against", args->check_against,
                  "compare with DIR/<output name>.npy (or a test_data_set's output_K.pb); exit 3 on mismatch");
  cmd->add_option("--atol", args->atol, "absolute tolerance for --check-against")->capture_default_str();
  cmd->add_option("--rtol", args->rtol, "relative tolerance for --check-against")->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed runs before the timed ones (the first run of a shape also builds its plan)")->check(whole_number(0))->capture_default_str();
  CLI::Option* iters = cmd->add_option("--iters", args->iters, "time this many runs and print min/median/p90/mean latency on stderr")
                           ->check(whole_number(1));
  cmd->add_flag("--json", args->json, "with --iters: print the latency as JSON on stdout")->needs(iters);
  cmd->add_option("--threads", args->threads, "threads for the kernels (default: the physical cores it may use, within its CPU quota)")
      ->check(thread_count());
  cmd->add_flag("--reference", args->reference,
                "run every node on its reference kernel, with IEEE denormals: the oracle other kernels are checked against");
  cmd->add_option("--node", args->node,
                  "run this node alone: its non-constant inputs are the inputs (kiln profile --check saves them as NODE.npz)");
  add_max_memory_option(cmd);
  cmd->add_flag("-v,--verbose", args->verbose, "print the target CPU's features, the memory plan and each node's kernel");
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}

}  // namespace kiln::cli
