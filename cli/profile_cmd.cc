// `kiln profile M.kiln`: run a model on this machine and report where the time goes, per
// kernel call site, against the machine's measured ceilings.
#include <CLI/CLI.hpp>
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <iostream>

#include "cli/app.h"
#include "cli/inputs.h"
#include "compile/pipeline.h"
#include "formats/serialize.h"
#include "profile/ceilings.h"
#include "profile/compare.h"
#include "profile/node_check.h"
#include "profile/profiler.h"
#include "runtime/session.h"
#include "runtime/threads.h"

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;

struct ProfileArgs {
  std::string model;
  InputArgs in;
  int threads = 0;
  int warmup = 2;
  int iters = 0;
  std::string duration;
  bool json = false;
  bool csv = false;
  std::string trace;
  std::string html;
  int top = 15;
  bool reprobe = false;
  std::string compare;
  std::string max_regression = "5%";
  bool per_kernel = false;
  bool check = false;
  std::string check_dir = "kiln-check";
  double check_tolerance = 1e-4;
  bool bitwise = false;
};

// "5%" or "5" (percent) as a fraction; nullopt for anything else.
std::optional<double> parse_percent(const std::string& text) {
  auto n = number_and_unit(text);
  if (!n || (n->second != "" && n->second != "%") || !(n->first >= 0) || n->first > 1000) return std::nullopt;
  return n->first / 100;
}

// Columns of the terminal stdout writes to; 0 (no fitting) when it is not one.
int terminal_width() {
  if (!isatty(STDOUT_FILENO)) return 0;
  struct winsize ws {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* cols = std::getenv("COLUMNS")) return std::atoi(cols);
  return 100;
}

// The test hook of docs/architecture.md: KILN_PROFILE_DELAY=NODE:MICROSECONDS slows one node.
void read_delay_hook(profile::RunOptions& options) {
  const char* hook = std::getenv("KILN_PROFILE_DELAY");
  if (!hook) return;
  std::string spec = hook;
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos) return;
  options.delay_node = spec.substr(0, colon);
  options.delay_us = std::atof(spec.substr(colon + 1).c_str());
}

int run_profile(const ProfileArgs& args, const std::string& cmdline) {
  const std::string verb = "profile";
  profile::RunOptions run_options;
  run_options.warmup = args.warmup;
  run_options.iterations = args.iters;
  if (!args.duration.empty()) {
    std::optional<double> s = parse_seconds(args.duration);
    if (!s) return report(verb, user_error("", "--duration '" + args.duration + "' is not a time such as 5s, 500ms or 2m"));
    run_options.duration_s = *s;
    run_options.min_iterations = 2;
  }
  read_delay_hook(run_options);
  for (const std::string* file : {&args.trace, &args.html})
    if (*file == "-") return report(verb, user_error("", "--trace and --html write files: stdout carries the report"));
  if (Status s = check_output_paths({&args.trace, &args.html}); !s.ok()) return report(verb, s);
  // The baseline is read (and found wanting) before anything runs.
  profile::CompareOptions compare_options;
  std::optional<profile::ProfileSamples> base;
  if (!args.compare.empty()) {
    std::optional<double> limit = parse_percent(args.max_regression);
    if (!limit) return report(verb, user_error("", "--max-regression '" + args.max_regression + "' is not a percentage such as 5%"));
    compare_options.max_regression = *limit;
    compare_options.per_kernel = args.per_kernel;
    auto bytes = read_input(args.compare);
    if (!bytes.ok()) return report(verb, bytes.error());
    auto samples = profile::read_profile_samples(*bytes, args.compare);
    if (!samples.ok()) return report(verb, samples.error());
    base = std::move(*samples);
  }

  auto model = load_model_arg(args.model);
  if (!model.ok()) return report(verb, model.error());
  const std::string display = args.model == "-" ? "<stdin>" : args.model;
  const int threads = thread_arg(verb, args.threads);
  // An exported or quantized model runs as the default compile would make it.
  const Stage stage = model->stage;
  if (stage != Stage::compiled) {
    CompileOptions options;
    options.target.threads = threads;
    options.command_line = cmdline;
    options.input_file = display;
    auto compiled = compile_model(*model, options);
    if (!compiled.ok()) return report(verb, with_file(compiled.status(), display));
  }
  const Graph& g = model->graph;
  if (!run_options.delay_node.empty() &&
      std::none_of(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.name == run_options.delay_node; }))
    return report(verb, user_error(display, "KILN_PROFILE_DELAY names node '" + run_options.delay_node + "', which the model lacks"));
  auto inputs = gather_inputs(g, args.in, display);
  if (!inputs.ok()) return report(verb, inputs.error());

  SessionOptions options;
  options.target.threads = threads;
  auto session = Session::create(*model, options);
  if (!session.ok()) return report(verb, with_file(session.status(), display));

  // A progress line on stderr when it is a terminal, at most five times a second.
  const bool tty = isatty(STDERR_FILENO);
  auto last = std::chrono::steady_clock::now();
  bool drew = false;
  if (tty)
    run_options.progress = [&](int done, double fraction) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last < std::chrono::milliseconds(200)) return;
      last = now;
      drew = true;
      std::fprintf(stderr, "\rkiln profile: %d runs, %3.0f%%", done, 100 * fraction);
      std::fflush(stderr);
    };
  auto measured = profile::measure(**session, *inputs, run_options);
  if (drew) std::fprintf(stderr, "\r\033[K");
  if (!measured.ok()) return report(verb, with_file(measured.status(), display));

  profile::CeilingsOptions ceilings_options;
  ceilings_options.reprobe = args.reprobe;
  profile::ReportContext context;
  context.model_file = display;
  context.stage = stage;
  context.compiled_in_memory = stage != Stage::compiled;
  context.command_line = cmdline;
  context.seed = args.in.seed;
  for (size_t i = 0; i < g.inputs.size(); ++i)
    context.inputs.push_back({g.value(g.inputs[i]).name, (*inputs)[i].dtype(), (*inputs)[i].shape()});
  context.threads_requested = threads;
  context.cpu = (*session)->target().cpu;
  context.ceilings = profile::machine_ceilings(context.cpu, measured->run_threads, ceilings_options);
  nlohmann::ordered_json doc = profile::build_report(g, *measured, context);
  // Cached ceilings that a node outran were probed while the machine was busy: a cache entry
  // stays until replaced, so measure them again now rather than let every later profile read
  // them low (a 2-thread f32 roof once cached at one core's rate).
  if (const auto [fastest, share] = profile::fastest_compute_node(doc); context.ceilings.source == "cache" && share > profile::kCeilingsOutrun) {
    ceilings_options.reprobe = true;
    context.ceilings = profile::machine_ceilings(context.cpu, measured->run_threads, ceilings_options);
    doc = profile::build_report(g, *measured, context);
    doc["notes"].push_back("node '" + fastest + "' ran at " + std::to_string(static_cast<int>(std::lround(100 * share))) +
                           "% of the cached compute ceiling, so the ceilings were measured again");
  }

  // The checks run after the timed runs, so that they never disturb the timings.
  std::vector<profile::NodeCheck> checks;
  profile::CheckOptions check_options;
  check_options.tolerance = args.check_tolerance;
  check_options.repro_dir = args.check_dir;
  check_options.model_file = display;
  // A model compiled here has nodes its file lacks (fused ones): the repro runs a saved copy.
  const std::string compiled_copy =
      (fs::path(args.check_dir) / (fs::path(display).stem().string() + ".compiled.kiln")).string();
  if (stage != Stage::compiled) check_options.model_file = compiled_copy;
  if (args.check) {
    auto r = profile::check_nodes(**session, *model, *inputs, check_options);
    if (!r.ok()) return report(verb, with_file(r.status(), display));
    checks = std::move(*r);
    doc["check"] = profile::to_json(checks, check_options);
    const bool mismatch = std::any_of(checks.begin(), checks.end(), [](const profile::NodeCheck& c) { return !c.pass; });
    if (mismatch && stage != Stage::compiled)
      if (Status s = save_model(*model, compiled_copy); !s.ok()) return report(verb, s);
  }
  std::optional<profile::BitwiseCheck> bitwise;
  if (args.bitwise) {
    auto r = profile::check_bitwise(**session, *inputs);
    if (!r.ok()) return report(verb, with_file(r.status(), display));
    bitwise = *r;
    doc["bitwise"] = profile::to_json(*bitwise);
  }

  std::optional<profile::Comparison> comparison;
  if (base) {
    auto now = profile::profile_samples(doc, display);
    if (!now.ok()) return report(verb, Error{ErrorKind::internal, display, "", "the profile cannot be compared: " + now.error().what});
    comparison = profile::compare_profiles(*base, *now, compare_options);
    doc["comparison"] = profile::to_json(*comparison, compare_options, args.compare);
  }

  if (!args.trace.empty()) {
    const std::string text = profile::render_trace(doc, *measured).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (Status s = write_output(args.trace, text); !s.ok()) return report(verb, s);
  }
  if (!args.html.empty())
    if (Status s = write_output(args.html, profile::render_html(doc)); !s.ok()) return report(verb, s);
  // Names come from files: bytes that are not UTF-8 become U+FFFD rather than invalid JSON.
  if (args.json) std::cout << doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else if (args.csv) std::cout << profile::render_csv(doc);
  else std::cout << profile::render_table(doc, terminal_width(), args.top);
  // The comparison's and checks' lines follow the table, or go to stderr when stdout is JSON or CSV.
  if (comparison) (args.json || args.csv ? std::cerr : std::cout) << "\n" << profile::render_comparison(*comparison, compare_options, args.compare);
  std::ostream& notes = args.json || args.csv ? std::cerr : std::cout;
  size_t mismatches = 0;
  if (args.check) {
    size_t checked = 0;
    const profile::NodeCheck* worst = nullptr;
    for (const profile::NodeCheck& c : checks) {
      if (!c.checked) continue;
      ++checked;
      if (!worst || c.rel_l2 > worst->rel_l2) worst = &c;
      mismatches += !c.pass;
    }
    notes << "\ncheck: " << checked << " of " << checks.size() << " nodes against their reference kernels";
    if (worst) notes << "; worst relative L2 error " << worst->rel_l2 << " at '" << escape_controls(worst->name) << "' (" << worst->kernel << ")";
    notes << "\n";
    for (const profile::NodeCheck& c : checks)
      if (c.checked && !c.pass)
        notes << "  MISMATCH '" << escape_controls(c.name) << "' (" << c.op << ", " << c.kernel << "): relative L2 " << c.rel_l2 << " > "
              << c.tolerance << "; " << escape_controls(c.detail) << "\n    repro: " << escape_controls(c.repro) << "\n";
  }
  if (bitwise) {
    notes << "\nbitwise: two runs ";
    if (bitwise->identical) {
      notes << "gave bit-identical outputs\n";
    } else {
      notes << "differ";
      if (!bitwise->first_node.empty()) notes << ", first at node '" << escape_controls(bitwise->first_node) << "' (" << bitwise->first_kernel << ")";
      for (const std::string& o : bitwise->outputs_differ) notes << "; output '" << escape_controls(o) << "' differs";
      notes << "\n";
    }
  }
  std::cout.flush();
  if (!std::cout) return report(verb, Error{ErrorKind::user, "<stdout>", "", "write failed"});
  if (mismatches)
    return report(verb, Error{ErrorKind::check, display, "", std::to_string(mismatches) + (mismatches == 1 ? " node differs" : " nodes differ") +
                                                                " from the reference kernels past the tolerance (repro commands above)"});
  if (bitwise && !bitwise->identical)
    return report(verb, Error{ErrorKind::check, display, "", "two runs on the same inputs gave different outputs" +
                                                                (bitwise->first_node.empty() ? std::string() : " (first at node '" + bitwise->first_node + "')")});
  if (comparison && comparison->failed) {
    const profile::Delta& e = comparison->end_to_end;
    std::string what = "end-to-end median regressed past " + args.max_regression;
    if (!e.regressed) {  // --per-kernel: name the worst kernel that failed it
      const profile::Delta* worst = nullptr;
      for (const profile::Delta& d : comparison->nodes)
        if (d.regressed && d.share >= compare_options.min_share && (!worst || d.change > worst->change)) worst = &d;
      what = "node '" + worst->what + "' (" + worst->kernel + ", " + std::to_string(static_cast<int>(100 * worst->share)) +
             "% of the run) regressed past " + args.max_regression;
    }
    return report(verb, Error{ErrorKind::check, display, "", what + " against " + args.compare});
  }
  return 0;
}

}  // namespace

void add_profile_command(CLI::App& app, int& exit_code, const std::string& cmdline) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand("profile", "Run a model on this machine and report each kernel's time against the machine's ceilings");
  cmd->add_option("model", args->model, "model .kiln file (- for stdin); an uncompiled one is compiled in memory first")->required();
  add_input_options(cmd, args->in);
  cmd->add_option("--threads", args->threads, "threads for the kernels (default: the physical cores it may use, within its CPU quota)")
      ->check(thread_count());
  cmd->add_option("--warmup", args->warmup, "untimed runs first (the first also builds the plan)")
      ->check(whole_number(0))->capture_default_str();
  CLI::Option* iters = cmd->add_option("--iters", args->iters, "time exactly this many runs")->check(whole_number(1));
  cmd->add_option("--duration", args->duration, "time runs for this long, e.g. 5s or 500ms (default: 2s and at least 20 runs)")
      ->excludes(iters);
  CLI::Option* json = cmd->add_flag("--json", args->json, "print the profile as JSON (schema kiln.profile, docs/profile.schema.json)");
  cmd->add_flag("--csv", args->csv, "print one CSV row per kernel call site")->excludes(json);
  cmd->add_option("--trace", args->trace, "write a Chrome trace (Perfetto, chrome://tracing) of the first runs to this file");
  cmd->add_option("--html", args->html, "write an HTML report (roofline, one run's timeline, the tables; self-contained) to this file");
  cmd->add_option("--top", args->top, "nodes in the table")->check(whole_number(1))->capture_default_str();
  cmd->add_flag("--reprobe", args->reprobe, "measure the machine's ceilings again instead of reading them from the cache");
  CLI::Option* compare = cmd->add_option("--compare", args->compare,
                  "compare with an earlier profile (--json output): what got slower or faster; exit 3 when the end-to-end median regressed");
  cmd->add_option("--max-regression", args->max_regression,
                  "with --compare: a median rise past this, significant (Mann-Whitney p < 0.01), is a regression")
      ->needs(compare)->capture_default_str();
  cmd->add_flag("--per-kernel", args->per_kernel, "with --compare: a kernel above 1% of the run that regressed also fails the check")
      ->needs(compare);
  CLI::Option* check = cmd->add_flag("--check", args->check,
                "run every node's kernel against its reference kernel on the same inputs; exit 3 on a mismatch, with a repro command");
  cmd->add_option("--check-dir", args->check_dir, "with --check: where a mismatching node's inputs are saved (DIR/NODE.npz)")
      ->needs(check)->capture_default_str();
  cmd->add_option("--check-tolerance", args->check_tolerance,
                  "with --check: the relative L2 error an f32 kernel may have (bf16 and int8 kernels: 1e-2)")
      ->needs(check)->check(positive_number())->capture_default_str();
  cmd->add_flag("--bitwise", args->bitwise, "run twice more and require bit-identical outputs (determinism); exit 3 if not");
  add_max_memory_option(cmd);
  cmd->callback([args, &exit_code, cmdline] { exit_code = run_profile(*args, cmdline); });
}

}  // namespace kiln::cli
