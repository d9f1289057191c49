// `kiln compile IN.kiln -o OUT.kiln`: run the pass pipeline (compile/) on a model.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <unistd.h>

#include "cli/app.h"
#include "compile/graph_util.h"
#include "compile/pipeline.h"
#include "compile/tuning_db.h"
#include "export/exporter.h"
#include "formats/serialize.h"
#include "formats/text.h"
#include "profile/ceilings.h"
#include "runtime/threads.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

struct CompileArgs {
  std::string input;
  std::string output;
  std::vector<std::string> input_shapes;
  int threads = 0;  ///< 0: the cores it may use (available_cores)
  std::string target = "host";
  std::vector<std::string> passes;
  std::vector<std::string> print_after;
  bool time_passes = false;
  bool list_passes = false;
  bool verbose = false;
  std::string mode = "default";
  std::string tuning_db;
  std::string tune_budget = "5m";
  bool require_db = false;
  bool dry_run = false;
  std::string tune_report;
  std::string precision = "fp32";
  bool lower_output_layers = false;
};

// max-autotune's progress on stderr when it is a terminal: problems done, the speed-up so far
// and the time left, redrawn after each round.
class TuneProgress {
 public:
  explicit TuneProgress(bool tty) : tty_(tty) {}
  ~TuneProgress() { clear(); }
  void operator()(const TuningProgress& p) {
    if (!tty_) return;
    constexpr int kWidth = 24;
    const int filled = p.problems ? static_cast<int>(kWidth * p.done / p.problems) : kWidth;
    char line[160];
    std::snprintf(line, sizeof line, "\rkiln compile: autotune [%s%s] %zu/%zu problems, best speed-up %.2fx, %.0f s, about %.0f s left\033[K",
                  std::string(static_cast<size_t>(filled), '#').c_str(), std::string(static_cast<size_t>(kWidth - filled), ' ').c_str(),
                  p.done, p.problems, p.speedup, p.elapsed_s, p.eta_s);
    std::fputs(line, stderr);
    std::fflush(stderr);
    shown_ = true;
  }
  void clear() {
    if (shown_) std::fputs("\r\033[K", stderr);
    shown_ = false;
  }

 private:
  bool tty_;
  bool shown_ = false;
};

void print_pass_table() {
  size_t width = 0;
  for (const PassInfo& p : all_passes()) width = std::max(width, p.name.size());
  for (const PassInfo& p : all_passes())
    std::cout << p.name << std::string(width - p.name.size() + 2, ' ') << p.summary << "\n";
}

std::string result_text(const PassRecord& rec) {
  if (rec.result.changed) return rec.result.summary;
  return rec.result.summary.empty() ? "no change" : rec.result.summary;
}

void print_times(const CompileReport& report) {
  size_t width = 5;
  for (const PassRecord& r : report.passes) width = std::max(width, r.name.size());
  char ms[32];
  double total = 0;
  std::cerr << "pass" << std::string(width - 4 + 2, ' ') << "   time ms  result\n";
  for (const PassRecord& r : report.passes) {
    std::snprintf(ms, sizeof ms, "%10.3f", r.ms);
    std::cerr << r.name << std::string(width - r.name.size() + 2, ' ') << ms << "  " << result_text(r) << "\n";
    total += r.ms;
  }
  std::snprintf(ms, sizeof ms, "%10.3f", total);
  std::cerr << "total" << std::string(width - 5 + 2, ' ') << ms << "\n";
}

int run_compile(const CompileArgs& args, const std::string& cmdline) {
  const std::string verb = "compile";
  if (args.list_passes) {
    print_pass_table();
    return 0;
  }
  if (args.input.empty()) return report(verb, user_error("", "no input model given (kiln compile IN.kiln -o OUT.kiln)"));
  if (args.dry_run && args.mode != "max-autotune") return report(verb, user_error("", "--dry-run needs --mode max-autotune"));
  if (args.output.empty() && !args.dry_run) return report(verb, user_error("", "no output given (-o OUT.kiln, or -o - for stdout)"));
  if (Status s = check_output_paths({&args.output, &args.tune_report}); !s.ok()) return report(verb, s);
  CompileOptions options;
  options.passes = args.passes;
  options.print_after.insert(args.print_after.begin(), args.print_after.end());
  options.command_line = cmdline;
  // A search times kernels here at the count given; a default compile only records it for the
  // machine the model will run on.
  options.target.threads = thread_arg(verb, args.threads, args.mode == "max-autotune" && !args.dry_run && !args.require_db);
  std::optional<CpuFeatures> cpu = CpuFeatures::named(args.target);
  if (!cpu)
    return report(verb, user_error("", "--target '" + args.target + "' is not one of host, avx2, avx512, avx512-vnni, avx512-bf16, avx512-fp16, amx"));
  options.target.cpu = *cpu;
  if (args.precision != "fp32" && args.precision != "bf16" && args.precision != "fp16")
    return report(verb, user_error("", "--precision '" + args.precision + "' is not one of fp32, bf16, fp16"));
  options.precision = args.precision == "bf16" ? DType::bf16 : args.precision == "fp16" ? DType::f16 : DType::f32;
  if (args.lower_output_layers && options.precision == DType::f32)
    return report(verb, user_error("", "--lower-output-layers needs --precision bf16 or fp16"));
  options.lower_output_layers = args.lower_output_layers;
  // The search: max-autotune times what the database lacks; a default compile reads a database
  // only when one is named.
  if (args.mode != "default" && args.mode != "max-autotune")
    return report(verb, user_error("", "--mode '" + args.mode + "' is not one of default, max-autotune"));
  options.tuning.search = args.mode == "max-autotune";
  const std::optional<double> budget = parse_seconds(args.tune_budget);
  if (!budget) return report(verb, user_error("", "--tune-budget '" + args.tune_budget + "' is not a time such as 90s or 5m"));
  options.tuning.budget_s = *budget;
  // --require-db replays a database (the one named, else max-autotune's): nothing is timed, and
  // a problem it lacks fails the compile.
  options.tuning.require_db = args.require_db;
  options.tuning.dry_run = args.dry_run;
  options.tuning.db_path = !args.tuning_db.empty()                               ? args.tuning_db
                           : options.tuning.search || options.tuning.require_db ? tuning::default_tuning_db_path()
                                                                                : "";
  if (options.tuning.require_db && options.tuning.db_path.empty())
    return report(verb, user_error("", "--require-db needs --tuning-db (neither XDG_CACHE_HOME nor HOME is set)"));
  if (!args.tune_report.empty() && !options.tuning.search && options.tuning.db_path.empty())
    return report(verb, user_error("", "--tune-report needs --mode max-autotune or --tuning-db"));
  TuningReport tuning_report;
  options.tuning.report = &tuning_report;
  TuneProgress progress(options.tuning.search && isatty(STDERR_FILENO));
  if (options.tuning.search) options.tuning.progress = [&](const TuningProgress& p) { progress(p); };
  // Unknown pass names are reported before the model is read.
  if (Status s = check_pass_names(options); !s.ok()) return report(verb, s);
  for (const std::string& spec : args.input_shapes) {
    auto flag = parse_input_shape_flag(spec, "input=1x3x224x224");
    if (!flag.ok()) return report(verb, flag.error());
    options.input_shapes[flag->first] = flag->second;
  }

  // The file is mapped once: hashed for the provenance where it lies, then decoded (the constants
  // view the mapping; stdin's bytes are read and copied).
  const std::string display = args.input == "-" ? "<stdin>" : args.input;
  Result<Model> model = Error{};
  {
    auto loaded = load_model_arg_hashed(args.input);
    if (!loaded.ok()) return report(verb, loaded.error());
    options.input_sha256 = std::move(loaded->sha256);
    options.input_file = args.input == "-" ? display : fs::path(args.input).filename().string();
    model = std::move(loaded->model);
  }

  const std::set<std::string>& print_after = options.print_after;
  const bool print_all = print_after.count("all") > 0;
  options.after_pass = [&](const PassRecord& rec) {
    if (print_all || print_after.count(rec.name)) {
      if (rec.has_text) std::cerr << "# after " << rec.name << "\n" << rec.text_after;
      else std::cerr << "# after " << rec.name << ": no change\n";
    }
    if (args.verbose) {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.3f", rec.ms);
      std::cerr << "kiln compile: " << rec.name << ": " << result_text(rec) << " (" << ms << " ms)\n";
    }
  };
  if (args.verbose) {
    const Target& t = options.target;
    std::cerr << "kiln compile: target " << t.device << " (" << t.cpu.str() << "), " << t.threads
              << (t.threads == 1 ? " thread" : " threads") << "\n";
  }
  auto compiled = compile_model(*model, options);
  progress.clear();
  if (!compiled.ok()) return report(verb, with_file(compiled.status(), display));
  if (options.tuning.search && tuning_report.problems.empty()) {
    // Nothing to tune: say why (a symbolic input shape) rather than print an empty table.
    const auto tune = std::find_if(compiled->passes.begin(), compiled->passes.end(), [](const PassRecord& p) { return p.name == "autotune_kernels"; });
    if (tune != compiled->passes.end() && !tune->result.summary.empty())
      std::cerr << "kiln compile: warning: max-autotune tuned nothing: " << tune->result.summary << "\n";
  } else if (options.tuning.search || (args.verbose && !tuning_report.problems.empty())) {
    std::cerr << tuning_report_text(tuning_report);
  } else if (const std::string db = tuning_database_text(tuning_report); !db.empty()) {  // a database replayed: what it gave
    std::cerr << "kiln compile: " << db;
  }
  if (args.time_passes) print_times(*compiled);
  // A symbolic input leaves the kernels unchosen: each session chooses them on each new input
  // shape's first run, and packs the weights the model could not store packed for every shape
  // (prepack_weights). -v says so in select_kernels' line, and max-autotune in its warning above.
  if (std::vector<std::vector<int64_t>> shapes; !args.verbose && !options.tuning.search)
    if (std::optional<std::string> symbolic = concrete_input_shapes(model->graph, shapes))
      std::cerr << "kiln compile: note: " << *symbolic
                << ": kernels are chosen on each new input shape's first run (--input-shape chooses them here)\n";
  if (options.precision == DType::bf16 && !options.target.cpu.amx && args.target == "host") {
    // Whether bf16 will be faster here without AMX: the compute peaks probed now (this machine
    // only; tens of milliseconds), not the cached ceilings, which a busy moment can have skewed.
    const std::map<std::string, double> peaks = profile::probe_compute_peaks(options.target.cpu, options.target.threads);
    if (std::optional<std::string> w = precision_speed_warning(options.precision, options.target.cpu, peaks))
      std::cerr << "kiln compile: warning: " << *w << "\n";
  }
  if (args.verbose)  // each node's kernel, with its parameters
    for (const Node& n : model->graph.nodes)
      if (!n.kernel.empty())
        std::cerr << "kiln compile: node '" << escape_controls(n.name) << "' (" << escape_controls(n.qualified_op()) << "): " << kernel_choice_text(n.kernel) << "\n";

  if (!args.tune_report.empty())
    if (Status s = write_output(args.tune_report, tuning_report_json(tuning_report)); !s.ok()) return report(verb, s);
  if (args.dry_run) return 0;  // the table said what a search would do; no model is written
  return report(verb, write_model_output(*model, args.output));
}

}  // namespace

void add_compile_command(CLI::App& app, int& exit_code, const std::string& cmdline) {
  auto args = std::make_shared<CompileArgs>();
  CLI::App* cmd = app.add_subcommand("compile", "Optimize a .kiln model with the pass pipeline");
  cmd->add_option("input", args->input, ".kiln model (- for stdin)");
  cmd->add_option("-o,--output", args->output, "output .kiln file (- for stdout)");
  cmd->add_option("--input-shape", args->input_shapes,
                  "NAME=SHAPE with a number for every dim, e.g. input=1x3x224x224 (repeatable); binds the input's symbolic dims everywhere");
  cmd->add_option("--threads", args->threads, "threads the compiled model is meant to run with (default: the physical cores it may use, within its CPU quota)")
      ->check(thread_count());
  cmd->add_option("--target", args->target,
                  "the CPU to compile for: host (this one), avx2, avx512, avx512-vnni, avx512-bf16, avx512-fp16 or amx; the model then refuses CPUs without the features its kernels use")
      ->type_name("CPU")
      ->default_str("host");
  cmd->add_option("--passes", args->passes, "run only these passes, in this order (comma-separated; see --list-passes)")
      ->delimiter(',');
  cmd->add_option("--print-after", args->print_after, "print the model's text form on stderr after this pass, or after every pass with 'all' (repeatable)")
      ->type_name("PASS|all")
      ->delimiter(',');
  cmd->add_flag("--time-passes", args->time_passes, "print each pass's time and what it changed on stderr");
  cmd->add_flag("--list-passes", args->list_passes, "print the passes in pipeline order with a line on each, then exit");
  cmd->add_option("--mode", args->mode,
                  "default (kernels by rule) or max-autotune (time each GEMM/conv problem's candidate kernels in the graph and keep the fastest)")
      ->type_name("MODE")
      ->default_str("default");
  cmd->add_option("--tuning-db", args->tuning_db,
                  "the tuning database max-autotune reads and adds to (default: $XDG_CACHE_HOME/kiln/tuning.jsonl); a default compile reads it only when named")
      ->type_name("FILE");
  cmd->add_option("--tune-budget", args->tune_budget,
                  "max-autotune's time limit, e.g. 90s or 5m; problems still searching then keep the best found so far")
      ->type_name("TIME")
      ->default_str("5m");
  cmd->add_flag("--require-db", args->require_db,
                "take every GEMM/conv problem's kernel from the tuning database (--tuning-db, else max-autotune's) and time nothing; a problem it lacks for this machine fails the compile (exit 3, nothing written): a CI rebuild of a tuned model");
  cmd->add_flag("--dry-run", args->dry_run,
                "with --mode max-autotune: list the problems the search would time and their candidates, and bound its time from one timed round of the default kernels; no search, no model written (-o optional)");
  cmd->add_option("--tune-report", args->tune_report, "write the tuning report (each problem's kernels and times, end-to-end latency) as JSON")
      ->type_name("FILE");
  cmd->add_option("--precision", args->precision,
                  "fp32, bf16 or fp16: convolutions and matrix products by constant weights in that precision with f32 sums, weights stored converted (needs avx512-bf16 / avx512-fp16 on the target)")
      ->type_name("PRECISION")
      ->default_str("fp32");
  cmd->add_flag("--lower-output-layers", args->lower_output_layers,
                "with --precision: lower the layers that write graph outputs too (a classifier's logits, an LM head), their outputs still f32");
  add_max_memory_option(cmd);
  cmd->add_flag("-v,--verbose", args->verbose, "print the target, what each pass changed and each node's kernel");
  cmd->callback([args, &exit_code, cmdline] { exit_code = run_compile(*args, cmdline); });
}

}  // namespace kiln::cli
