// `kiln compile --mode max-autotune`: the measured kernel search of the autotune_kernels pass,
// and `--tuning-db`'s reuse of what an earlier search found.
//
// The search times candidates inside the compiled graph, never in isolation: every round runs
// the whole graph with one candidate installed on every node of each problem still searching
// (the other nodes on their best so far), so that each kernel meets the cache state its
// neighbours leave, and times each node. Nodes of one problem (op, shapes, dtypes, attributes,
// epilogue, threads: a transformer's repeated layers) share their candidates and their
// timings, so a model with twelve identical layers costs one layer's search. Per problem the
// candidates are every implementation that runs the node (kiln's GEMM templates, oneDNN,
// XNNPACK) with its defaults, then, for those within reach of the best, its parameter axes one
// after the other (KernelImpl::tuning_space: tile, Kc, packing, Mc, Nc, thread grid; oneDNN's
// convolution algorithm), each from the best values so far. A round stops early once every
// candidate in it is clearly slower or clearly apart from its problem's best. A candidate
// whose output differs from the default kernel's is dropped.
//
// Never slower than the default: a candidate replaces the default only when its median beats
// the default's by kMinGain, and then again in a final comparison of the default and the tuned
// graph in pairs of runs (each timed run after an untimed one of the same graph, so that each
// meets its own weights in the caches), node by node (the median of its paired ratios at most 1 −
// kConfirmGain); unless the tuned graph is then kConfirmGain faster end to end too (the median
// of the pairs' ratios), every default is kept: per-node times of small kernels do not always
// add up (a kernel can leave the next one a worse cache state), and the end-to-end pairs are
// the judge. Problems found in the database are not timed; those the search timed to the end are
// added to it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compile/tuning_db.h"
#include "formats/ir.h"
#include "runtime/plan.h"
#include "runtime/target.h"

namespace kiln {

/// Where a problem's kernel came from.
enum class TuningSource {
  measured,      ///< the search timed it to the end and the chosen kernel was faster
  kept_default,  ///< timed, and nothing was faster than the default
  cut_short,     ///< the budget ran out before its search ended: the best found so far
  database,      ///< a database record, not timed
  planned,       ///< a dry run: the search would time it
};

/// One problem of a tuned model.
struct TunedProblem {
  tuning::TuningProblem problem;
  std::vector<std::string> nodes;  ///< the nodes that are this problem
  KernelChoice default_kernel;     ///< what the default compile chooses
  KernelChoice chosen;             ///< what the model now runs
  double default_us = 0;           ///< per node, median of the search's runs (0 when not timed)
  double chosen_us = 0;            ///< per node, the chosen kernel's median (the record's time from a database)
  KernelChoice best;               ///< the fastest candidate the search timed (the chosen one, unless it was not kept)
  double best_us = 0;
  std::optional<double> runner_up_margin;  ///< how much slower the runner-up was, as a fraction
  size_t timed = 0;                        ///< candidates timed
  size_t candidates = 0;                   ///< a dry run: the most candidates the search would time (the default's included)
  std::vector<std::string> rejected;       ///< candidates dropped, each "kernel{...}: why"
  TuningSource source = TuningSource::measured;
  std::string note;  ///< why the default was kept, when it was
};

/// Latency of one run of the whole graph, in milliseconds, over the final comparison's runs.
struct LatencyStats {
  double median = 0, min = 0, max = 0;
};

/// What a max-autotune compile (or a --tuning-db reuse) did.
struct TuningReport {
  bool searched = false;  ///< false: only database records were applied
  /// --dry-run: the problems listed, the default graph timed once (round 0), nothing searched;
  /// max_rounds and estimate_s bound what the search would take.
  bool dry_run = false;
  size_t max_rounds = 0;
  double estimate_s = 0;
  std::vector<TunedProblem> problems;
  size_t rounds = 0;      ///< search rounds (one candidate per problem each)
  size_t graph_runs = 0;  ///< whole-graph runs, warm-ups and the final comparison included
  double search_s = 0;    ///< wall time of the search and the final comparison
  double budget_s = 0;
  bool budget_exhausted = false;
  size_t final_runs = 0;  ///< runs per configuration in the final comparison (0: none)
  LatencyStats default_ms, tuned_ms;
  double paired_ratio = 1;  ///< the median of tuned/default over the comparison's pairs of runs
  bool reverted = false;    ///< the tuned graph was not 1% faster end to end: every default kept
  std::string db_path;
  size_t db_used = 0, db_written = 0;
  size_t db_missed = 0;      ///< problems the database had no usable record of
  std::string db_first_miss;  ///< the first of them: "node 'x': why (problem)"
};

/// Progress after each search round (the CLI's progress bar).
struct TuningProgress {
  size_t problems = 0, done = 0;
  double elapsed_s = 0, eta_s = 0;
  double speedup = 1;  ///< the searched problems' default time over their best time so far
};

/// `kiln compile --mode`, `--tuning-db`, `--tune-budget`.
struct TuningOptions {
  bool search = false;  ///< --mode max-autotune: time what the database lacks
  std::string db_path;  ///< the database to read (and, when searching, to add to); empty: none
  /// --require-db: every problem from the database, nothing timed; a problem it lacks for this
  /// machine fails the pass (ErrorKind::check, naming the node, the problem and why).
  bool require_db = false;
  /// --dry-run: list what the search would time, and bound how long it would take, without it.
  bool dry_run = false;
  double budget_s = 300;
  std::function<void(const TuningProgress&)> progress;  ///< after each round; may be empty
  TuningReport* report = nullptr;                      ///< filled in when not null
};

/// The problem node `n` of a planned graph is, for `target`'s threads: its op, its inputs'
/// shapes and dtypes, its attributes and which inputs are constants (`layout`), its activation
/// attributes (`epilogue`). A target other than this machine's CPU is part of the layout.
tuning::TuningProblem tuning_problem(const ExecutionPlan& plan, size_t n, const Target& target);

/// The report as a table for stderr: one row per problem (its first node, op, the default's and
/// the best candidate's time, how it was chosen, the kernel), then the search and the
/// end-to-end comparison.
std::string tuning_report_text(const TuningReport& report);
/// The report's last line: the database, how many problems it had, and the records a search
/// added to it, or, when nothing was searched, why the first problem it lacked was not found.
std::string tuning_database_text(const TuningReport& report);
/// The report as JSON (`--tune-report`).
std::string tuning_report_json(const TuningReport& report);

}  // namespace kiln
