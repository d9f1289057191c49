// The autotune_kernels pass: max-autotune's search and --tuning-db's reuse (compile/autotune.h
// says how the search works and what it promises).
#include "compile/autotune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/text.h"
#include "profile/stats.h"
#include "runtime/compare.h"
#include "runtime/random_inputs.h"
#include "runtime/session.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

// Runs per candidate: at least kMinReps, up to kMaxReps while a candidate is within kCloseCall
// of its problem's best and not clearly slower (its fastest run over kClearlySlower times the
// best median).
constexpr size_t kMinReps = 3, kMaxReps = 9;
constexpr double kCloseCall = 0.05, kClearlySlower = 1.15;
// An implementation whose defaults are within this factor of the problem's best has its
// parameter axes searched; a slower one is pruned whole.
constexpr double kExploreWithin = 1.25;
// A candidate replaces the default only when its median is this fraction faster.
constexpr double kMinGain = 0.02;
// Runs of each configuration in the final interleaved comparison, and how much faster a
// problem's choice (the median of its nodes' paired ratios) and the whole tuned graph (the
// median of the runs' paired ratios) must be there to stay.
constexpr size_t kFinalRuns = 20;
constexpr double kConfirmGain = 0.01;
// The most runners-up a database record keeps.
constexpr size_t kRecordCandidates = 5;
// A candidate's output against the default kernel's (relative L2): float outputs, and integer
// ones (requantized int8: a rounding step apart here and there).
constexpr double kFloatTolerance = 1e-3, kIntegerTolerance = 5e-2;
// Float outputs in a graph lowered to bf16 or f16 (`--precision`): there each kernel rounds
// its operands or its sums, two candidates as differently as the default does from f32, and
// the differences of the problems upstream (trying their own candidates in the same round)
// reach a node's inputs. An fp16 MobileNetV2's f16 GEMMs read 1.2e-3 to 1.7e-3 from their
// defaults so, and every candidate of theirs was rejected at kFloatTolerance. This is the bound
// a lowered model keeps against fp32 as a whole (README, `--precision`); a kernel that computes
// something else is off by far more.
constexpr double kLoweredTolerance = 1e-2;

// Whether a graph computes in bf16 or f16 anywhere: a value or weight of either type.
bool lowered(const Graph& g) {
  return std::any_of(g.values.begin(), g.values.end(), [](const Value& v) { return v.dtype == DType::bf16 || v.dtype == DType::f16; });
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The median of a[i] / b[i].
double median_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (b[i] > 0) r.push_back(a[i] / b[i]);
  return r.empty() ? 1 : profile::median(r);
}

LatencyStats stats_of(const std::vector<double>& v) {
  if (v.empty()) return {};
  return {profile::median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

// One timed configuration of a problem.
struct Candidate {
  KernelChoice choice;  ///< its parameters as the prepared kernel reports them
  size_t impl = 0;      ///< index into Group::impls
  KernelParams asked;   ///< the parameters the search asked for (the axes applied so far)
  double us = 0;        ///< per node, median over runs
};

// One implementation's search within a problem.
struct ImplSearch {
  const KernelImpl* impl = nullptr;
  std::vector<TuningAxis> axes;
  size_t next_axis = 0;
  int best = -1;  ///< its fastest candidate (index into Group::measured), -1 before its defaults ran
};

struct Group {
  tuning::TuningProblem problem;
  std::vector<size_t> nodes;
  KernelChoice default_choice;
  std::vector<ImplSearch> impls;
  std::vector<Candidate> measured;  ///< [0]: the default
  std::deque<std::pair<size_t, KernelParams>> pending;  ///< (impl, parameters asked) not yet tried
  int best = 0;                     ///< index into measured
  bool search = false;              ///< timed by this compile
  bool done = false;
  std::optional<KernelChoice> from_db;
  double db_us = 0;
  std::vector<std::string> rejected;
  Tensor reference;  ///< the first node's output 0 on the default kernels
  // This round's candidate, and its per-run times.
  std::optional<Candidate> trying;
  std::vector<double> runs;
  KernelChoice final_choice;
  std::string note;
  bool cut_short = false;
};

KernelParams with(KernelParams base, const KernelParams& overrides) {
  for (const auto& kv : overrides) {
    auto it = std::find_if(base.begin(), base.end(), [&](const auto& p) { return p.first == kv.first; });
    if (it != base.end()) it->second = kv.second;
    else base.push_back(kv);
  }
  return base;
}

// Times the watched nodes of each run; on the reference run keeps their first output, and on a
// checking run compares it with the kept one.
class NodeTimer final : public ExecutionObserver {
 public:
  explicit NodeTimer(size_t nodes) : us(nodes, 0), watched(nodes, 0) {}
  void on_node_begin(const NodeEvent& e) override {
    if (watched[e.index]) start_ = Clock::now();
  }
  void on_node_end(const NodeEvent& e) override {
    if (!watched[e.index]) return;
    us[e.index] = std::chrono::duration<double, std::micro>(Clock::now() - start_).count();
    if (capture && capture->count(e.index) && !e.outputs.empty() && e.outputs[0]) (*capture)[e.index] = e.outputs[0]->clone();
  }
  std::vector<double> us;
  std::vector<char> watched;
  std::map<size_t, Tensor>* capture = nullptr;  ///< node -> output 0, for the nodes listed

 private:
  Clock::time_point start_;
};

class Search {
 public:
  Search(Model& model, PassContext& ctx)
      : model_(model), ctx_(ctx), options_(*ctx.tuning), registry_(default_kernels()),
        float_tolerance_(lowered(model.graph) ? kLoweredTolerance : kFloatTolerance) {}

  Result<PassResult> run();

 private:
  Result<KernelChoice> probe(const Group& g, const KernelImpl& impl, const KernelParams& params) const;
  Status form_groups();
  Status apply_database();
  Status search();
  bool next_candidate(Group& g);
  void refill(Group& g);
  Status round(bool reference);
  Status finish();
  void record(Group& g, const Candidate& c);
  Result<std::unique_ptr<Session>> session_for(Model& m) const;
  void install(Model& m, const Group& g, const KernelChoice& choice) const {
    for (size_t n : g.nodes) m.graph.nodes[n].kernel = choice;
  }
  double graph_estimate_s() const { return run_s_ > 0 ? run_s_ : 0.01; }
  void report_progress();
  Result<PassResult> dry_run(size_t searched);
  // A problem's row of the report: its nodes and default kernel, and the database's choice
  // when it had one.
  TunedProblem reported(const Group& g) const {
    TunedProblem p;
    p.problem = g.problem;
    for (size_t n : g.nodes) p.nodes.push_back(model_.graph.nodes[n].name);
    p.default_kernel = g.default_choice;
    if (g.from_db) {
      p.chosen = *g.from_db;
      p.chosen_us = g.db_us;
      p.source = TuningSource::database;
    }
    return p;
  }
  // The model the rounds run (the database's choices installed) and the inputs they run on.
  void start_trial() {
    trial_ = model_;
    for (const Group& g : groups_)
      if (g.from_db) install(trial_, g, *g.from_db);
    inputs_ = random_inputs(model_.graph, shapes_, 0x6b696c6e);
  }
  // The most one more round and the final comparison can take, from the last session's and the
  // last run's times.
  double round_bound_s() const { return std::max(round_s_, session_s_ + static_cast<double>(kMaxReps + 1) * graph_estimate_s()); }
  double final_bound_s() const { return 4 * session_s_ + static_cast<double>(4 * (2 * kFinalRuns + 1)) * graph_estimate_s(); }

  Model& model_;
  PassContext& ctx_;
  const TuningOptions& options_;
  const KernelRegistry& registry_;
  const double float_tolerance_;  ///< a float candidate's output against the default's
  std::vector<std::vector<int64_t>> shapes_;
  std::optional<ExecutionPlan> plan_;
  std::vector<Group> groups_;
  std::vector<Tensor> inputs_;
  Model trial_;  ///< the model the rounds run, candidates installed
  TuningReport report_;
  Clock::time_point start_;
  double run_s_ = 0;      ///< seconds per whole-graph run, last measured
  double session_s_ = 0;  ///< seconds to create (plan and prepare) the last round's session
  double round_s_ = 0;    ///< seconds the last round took
  tuning::TuningDb db_;
};

Result<KernelChoice> Search::probe(const Group& g, const KernelImpl& impl, const KernelParams& params) const {
  const size_t n = g.nodes.front();
  Node node = model_.graph.nodes[n];
  node.kernel = KernelChoice{impl.name, params};
  std::vector<InferInput> in;
  std::vector<InferOutput> out;
  node_query_operands(*plan_, n, in, out);
  const KernelQuery q{node, model_.graph, ctx_.target, in, out};
  if (auto why = impl.declines(q)) return user_error(node.where(), *why);
  std::unique_ptr<Kernel> kernel = impl.create(q);
  if (!kernel) return internal_error(node.where(), "kernel '" + impl.name + "' made no kernel");
  KernelNeeds needs;
  KILN_RETURN_IF_ERROR(kernel->prepare(q, needs));
  KernelParams full = kernel->params();
  return KernelChoice{impl.name, full.empty() ? params : full};
}

Status Search::form_groups() {
  const Graph& g = model_.graph;
  std::map<std::string, size_t> by_key;
  std::vector<InferInput> in;
  std::vector<InferOutput> out;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    if (node.kernel.empty() || node.kernel.name == kReferenceKernel) continue;
    node_query_operands(*plan_, n, in, out);
    // The implementations that can run it, and whether there is anything to choose.
    std::vector<ImplSearch> impls;
    size_t choices = 0;
    for (const KernelImpl& impl : registry_.find(node.qualified_op(), ctx_.target.device)) {
      if (impl.name == kReferenceKernel) continue;
      Node pinned = node;
      pinned.kernel = KernelChoice{impl.name, {}};
      const KernelQuery q{pinned, g, ctx_.target, in, out};
      if (impl.declines(q)) continue;
      ImplSearch s{&impl, impl.tuning_space ? impl.tuning_space(q) : std::vector<TuningAxis>{}};
      choices += 1;
      for (const TuningAxis& a : s.axes) choices += a.values.size();
      impls.push_back(std::move(s));
    }
    if (choices < 2) continue;
    tuning::TuningProblem problem = tuning_problem(*plan_, n, ctx_.target);
    const std::string key = problem.str() + " " + kernel_choice_text(node.kernel);
    auto [it, added] = by_key.emplace(key, groups_.size());
    if (added) {
      Group grp;
      grp.problem = std::move(problem);
      grp.default_choice = node.kernel;
      grp.impls = std::move(impls);
      groups_.push_back(std::move(grp));
    }
    groups_[it->second].nodes.push_back(n);
  }
  return {};
}

Status Search::apply_database() {
  report_.db_path = options_.db_path;
  if (options_.db_path.empty()) return {};
  KILN_ASSIGN_OR_RETURN(db_, tuning::load_tuning_db(options_.db_path, options_.search && !options_.require_db ? tuning::IfMissing::empty
                                                                                                                : tuning::IfMissing::error));
  const Group* first_miss = nullptr;
  std::string first_reason;
  size_t misses = 0;
  for (Group& g : groups_) {
    // Why the problem is not taken from the database, if it is not: searched again then, or,
    // with require_db, the compile's failure.
    std::string reason;
    if (const tuning::TuningRecord* rec = db_.lookup(g.problem)) {
      const KernelChoice& want = rec->winner.kernel;
      auto impl = std::find_if(g.impls.begin(), g.impls.end(), [&](const ImplSearch& s) { return s.impl->name == want.name; });
      if (impl == g.impls.end()) {
        reason = "its record's kernel " + want.name + " does not run here";
      } else if (Result<KernelChoice> choice = probe(g, *impl->impl, want.params); !choice.ok()) {
        reason = "its record's kernel " + kernel_choice_text(want) + " does not prepare here: " + choice.error().what;
      } else {
        g.from_db = *choice;
        g.db_us = rec->winner.time_us;
        ++report_.db_used;
        continue;
      }
    } else if (misses == 0) {
      reason = db_.miss_reason(g.problem);  // a scan of the records: for the first miss only
    }
    if (misses++ == 0) {
      first_miss = &g;
      first_reason = std::move(reason);
    }
  }
  report_.db_missed = misses;
  if (!first_miss) return {};
  const Node& node = model_.graph.nodes[first_miss->nodes.front()];
  const std::string why = first_reason + " (" + first_miss->problem.str() + ")";
  report_.db_first_miss = node.where() + ": " + why;
  if (options_.require_db) {
    std::string what = "not in the database for this machine: " + why;
    if (misses > 1) what += "; " + std::to_string(misses) + " of " + count_of(groups_.size(), "problem", "problems") + " missing";
    return Error{ErrorKind::check, options_.db_path, node.where(), what};
  }
  return {};
}

Result<std::unique_ptr<Session>> Search::session_for(Model& m) const {
  SessionOptions so;
  so.target = ctx_.target;
  return Session::create(m, so);
}

// Queues the next axis of the first implementation that has one left and whose defaults came
// within kExploreWithin of the problem's best, each value applied to that implementation's
// best parameters so far; marks the problem done when none is left.
void Search::refill(Group& g) {
  const double best = g.measured[static_cast<size_t>(g.best)].us;
  for (size_t i = 0; i < g.impls.size(); ++i) {
    ImplSearch& s = g.impls[i];
    if (s.best < 0 || s.next_axis >= s.axes.size()) continue;
    const Candidate& base = g.measured[static_cast<size_t>(s.best)];
    if (base.us > kExploreWithin * best) {
      s.next_axis = s.axes.size();  // pruned: its best is far behind
      continue;
    }
    for (const KernelParams& v : s.axes[s.next_axis].values) g.pending.emplace_back(i, with(base.asked, v));
    ++s.next_axis;
    return;
  }
  g.done = true;
}

// Takes the problem's next candidate that prepares and that is not one already timed (two
// parameter sets the kernel fits to the same thing are one candidate).
bool Search::next_candidate(Group& g) {
  g.trying.reset();
  while (!g.done) {
    if (g.pending.empty()) {
      refill(g);
      continue;
    }
    auto [impl, params] = g.pending.front();
    g.pending.pop_front();
    Result<KernelChoice> choice = probe(g, *g.impls[impl].impl, params);
    if (!choice.ok()) {
      g.rejected.push_back(kernel_choice_text(KernelChoice{g.impls[impl].impl->name, params}) + ": " + choice.error().what);
      continue;
    }
    const bool seen = std::any_of(g.measured.begin(), g.measured.end(), [&](const Candidate& c) { return c.choice == *choice; });
    if (seen) continue;
    g.trying = Candidate{*choice, impl, params, 0};
    return true;
  }
  return false;
}

// One round: a session over trial_ as installed, a warm-up run (the reference run captures the
// default kernels' outputs, later ones check the candidates' against them), then timed runs
// until every candidate is decided.
Status Search::round(bool reference) {
  const auto created = Clock::now();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, session_for(trial_));
  session_s_ = seconds(Clock::now() - created);
  NodeTimer timer(trial_.graph.nodes.size());
  std::map<size_t, Tensor> outputs;
  std::vector<Group*> active;
  for (Group& g : groups_) {
    if (!g.search || (!reference && !g.trying)) continue;
    active.push_back(&g);
    g.runs.clear();
    for (size_t n : g.nodes) timer.watched[n] = 1;
    outputs[g.nodes.front()] = Tensor();
  }
  session->set_observer(&timer);
  timer.capture = &outputs;
  KILN_RETURN_IF_ERROR(session->run(inputs_).status());
  ++report_.graph_runs;
  timer.capture = nullptr;
  std::vector<Group*> checked;
  for (Group* g : active) {
    Tensor& got = outputs[g->nodes.front()];
    if (reference) {
      g->reference = got;
      continue;
    }
    if (!g->reference.defined() || !got.defined()) {
      checked.push_back(g);
      continue;
    }
    const CompareResult cmp = compare_tensors(got, g->reference);
    const double tol = is_integer(g->reference.dtype()) ? kIntegerTolerance : float_tolerance_;
    if (cmp.kind == CompareResult::Kind::dtype_mismatch || cmp.kind == CompareResult::Kind::shape_mismatch ||
        !(cmp.rel_l2_error <= tol)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3g", cmp.rel_l2_error);
      g->rejected.push_back(kernel_choice_text(g->trying->choice) + ": output differs from the default kernel's (relative L2 " +
                            buf + ")");
      g->trying.reset();
      continue;
    }
    checked.push_back(g);
  }
  if (!reference) active = checked;
  if (active.empty()) return {};
  // Timed runs: each group's time per node is its nodes' total over their count.
  for (size_t rep = 0; rep < kMaxReps; ++rep) {
    const auto t0 = Clock::now();
    KILN_RETURN_IF_ERROR(session->run(inputs_).status());
    run_s_ = seconds(Clock::now() - t0);
    ++report_.graph_runs;
    for (Group* g : active) {
      double total = 0;
      for (size_t n : g->nodes) total += timer.us[n];
      g->runs.push_back(total / static_cast<double>(g->nodes.size()));
    }
    if (rep + 1 < kMinReps || reference) continue;  // the defaults, every comparison's base, run kMaxReps times
    const bool decided = std::all_of(active.begin(), active.end(), [](const Group* g) {
      const double best = g->measured[static_cast<size_t>(g->best)].us;
      const double med = profile::median(g->runs), fastest = *std::min_element(g->runs.begin(), g->runs.end());
      return fastest > kClearlySlower * best || std::abs(med - best) > kCloseCall * best;
    });
    if (decided) break;
  }
  return {};
}

void Search::record(Group& g, const Candidate& c) {
  g.measured.push_back(c);
  const int index = static_cast<int>(g.measured.size() - 1);
  ImplSearch& s = g.impls[c.impl];
  if (s.best < 0 || c.us < g.measured[static_cast<size_t>(s.best)].us) s.best = index;
  if (c.us < g.measured[static_cast<size_t>(g.best)].us) g.best = index;
}

void Search::report_progress() {
  if (!options_.progress) return;
  TuningProgress p;
  double before = 0, after = 0;
  size_t left = 0;
  for (const Group& g : groups_) {
    if (!g.search) continue;
    ++p.problems;
    p.done += g.done;
    const double n = static_cast<double>(g.nodes.size());
    before += g.measured[0].us * n;
    after += g.measured[static_cast<size_t>(g.best)].us * n;
    size_t mine = g.pending.size();
    for (const ImplSearch& s : g.impls)
      for (size_t a = s.next_axis; a < s.axes.size(); ++a) mine += s.axes[a].values.size();
    if (!g.done) left = std::max(left, mine);
  }
  p.elapsed_s = seconds(Clock::now() - start_);
  p.speedup = after > 0 ? before / after : 1;
  const double per_round = report_.rounds ? p.elapsed_s / static_cast<double>(report_.rounds) : 0;
  p.eta_s = per_round * static_cast<double>(left);
  options_.progress(p);
}

Status Search::search() {
  start_ = Clock::now();
  report_.searched = true;
  report_.budget_s = options_.budget_s;
  // Round 0: the default kernels (database choices installed), their outputs the reference.
  KILN_RETURN_IF_ERROR(round(true));
  for (Group& g : groups_) {
    if (!g.search) continue;
    Candidate def{g.default_choice, 0, {}, profile::median(g.runs)};
    for (size_t i = 0; i < g.impls.size(); ++i)
      if (g.impls[i].impl->name == g.default_choice.name) def.impl = i;
    g.measured.push_back(def);
    g.impls[def.impl].best = 0;
    for (size_t i = 0; i < g.impls.size(); ++i)
      if (i != def.impl) g.pending.emplace_back(i, KernelParams{});
  }
  for (;;) {
    // The budget: a round and the final comparison must still fit.
    const double elapsed = seconds(Clock::now() - start_);
    const double round_s = round_bound_s(), final_s = final_bound_s();
    bool any = false;
    for (Group& g : groups_) {
      if (!g.search) continue;
      if (!g.done) any |= next_candidate(g);
      install(trial_, g, g.trying ? g.trying->choice : g.measured[static_cast<size_t>(g.best)].choice);
    }
    if (!any) break;
    if (elapsed + round_s + final_s > options_.budget_s) {
      report_.budget_exhausted = true;
      for (Group& g : groups_)
        if (g.search && !g.done) {
          g.cut_short = true;
          g.trying.reset();
        }
      break;
    }
    const auto began = Clock::now();
    Status s = round(false);
    round_s_ = seconds(Clock::now() - began);
    ++report_.rounds;
    if (!s.ok()) {  // a candidate failed in the graph: drop this round's candidates
      for (Group& g : groups_)
        if (g.trying) g.rejected.push_back(kernel_choice_text(g.trying->choice) + ": " + s.error().what);
      for (Group& g : groups_) g.trying.reset();
      continue;
    }
    for (Group& g : groups_)
      if (g.trying) {
        Candidate c = *g.trying;
        c.us = profile::median(g.runs);
        record(g, c);
        g.trying.reset();
      }
    report_progress();
  }
  return {};
}

// The winners, confirmed node by node in an interleaved comparison of the default and the tuned
// graph; the end-to-end latency of both; every default kept unless the tuned graph is faster.
Status Search::finish() {
  for (Group& g : groups_) {
    if (!g.search) continue;
    const Candidate& def = g.measured[0];
    const Candidate& best = g.measured[static_cast<size_t>(g.best)];
    g.final_choice = g.best != 0 && best.us < (1 - kMinGain) * def.us ? best.choice : def.choice;
    if (g.best != 0 && g.final_choice == def.choice) g.note = "the best candidate was less than 2% faster";
  }
  Model base = model_, tuned = model_;
  for (Group& g : groups_) {
    install(base, g, g.default_choice);
    install(tuned, g, g.from_db ? *g.from_db : g.search ? g.final_choice : g.default_choice);
  }
  bool reverted = false;  // a choice went back to the default node by node
  auto compare = [&](bool per_node) -> Status {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Session> a, session_for(base));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Session> b, session_for(tuned));
    NodeTimer ta(model_.graph.nodes.size()), tb(model_.graph.nodes.size());
    for (Group& g : groups_)
      for (size_t n : g.nodes) ta.watched[n] = tb.watched[n] = per_node && g.search;
    a->set_observer(&ta);
    b->set_observer(&tb);
    std::vector<double> ams, bms;
    std::map<const Group*, std::pair<std::vector<double>, std::vector<double>>> by_group;
    // Pairs of runs, in alternating order (so that neither configuration always runs second):
    // a pair's ratio cancels what the machine did in between, which run-to-run noise on a
    // shared machine would otherwise swamp. Each timed run follows an untimed one of the same
    // graph, so that it meets its own weights and arena in the caches, as a model run in a
    // loop does: right after the other graph's run it reads them from further out (at one
    // thread, a tuned MobileNetV2 read 0.915 of the default's time that way and ran no faster
    // than it in `kiln run`). The first pair warms up.
    for (size_t r = 0; r <= kFinalRuns; ++r) {
      for (int k = 0; k < 2; ++k) {
        const int which = (r % 2) ^ k;  // 0: default, 1: tuned
        Session& s = which ? *b : *a;
        if (r > 0) {
          KILN_RETURN_IF_ERROR(s.run(inputs_).status());
          ++report_.graph_runs;
        }
        const auto t0 = Clock::now();
        KILN_RETURN_IF_ERROR(s.run(inputs_).status());
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        ++report_.graph_runs;
        if (r == 0) continue;
        (which ? bms : ams).push_back(ms);
        if (!per_node) continue;
        NodeTimer& t = which ? tb : ta;
        for (const Group& g : groups_) {
          if (!g.search) continue;
          double total = 0;
          for (size_t n : g.nodes) total += t.us[n];
          (which ? by_group[&g].second : by_group[&g].first).push_back(total);
        }
      }
    }
    report_.final_runs = kFinalRuns;
    report_.default_ms = stats_of(ams);
    report_.tuned_ms = stats_of(bms);
    report_.paired_ratio = median_ratio(bms, ams);
    if (!per_node) return {};
    for (Group& g : groups_) {
      if (!g.search || g.final_choice == g.default_choice) continue;
      const auto& [def, tun] = by_group[&g];
      if (median_ratio(tun, def) <= 1 - kConfirmGain) continue;
      g.final_choice = g.default_choice;
      g.note = "not faster than the default in the final comparison";
      install(tuned, g, g.default_choice);
      reverted = true;
    }
    return {};
  };
  bool changed = std::any_of(groups_.begin(), groups_.end(), [](const Group& g) { return g.search && g.final_choice != g.default_choice; });
  if (changed) {
    KILN_RETURN_IF_ERROR(compare(true));
    if (reverted) KILN_RETURN_IF_ERROR(compare(false));  // the end-to-end latency without them
    if (report_.paired_ratio > 1 - kConfirmGain) {  // not faster end to end: every default kept
      report_.reverted = true;
      for (Group& g : groups_)
        if (g.search && g.final_choice != g.default_choice) {
          g.final_choice = g.default_choice;
          g.note = "the tuned graph was not faster end to end";
        }
    }
  }
  report_.search_s = seconds(Clock::now() - start_);
  return {};
}

// What the search would time, each problem's candidates counted as the search would reach them
// at most (every implementation's defaults, and every value of each of its axes), and a bound
// on its time from round 0 (the default kernels timed, as the search begins): the most
// candidates of one problem as rounds, each at its most runs, then the final comparison.
Result<PassResult> Search::dry_run(size_t searched) {
  report_.dry_run = true;
  size_t most = 0;
  for (const Group& g : groups_) {
    TunedProblem p = reported(g);
    if (!g.from_db) {
      p.chosen = g.default_choice;
      for (const ImplSearch& impl : g.impls) {
        p.candidates += 1;
        for (const TuningAxis& a : impl.axes) p.candidates += a.values.size();
      }
      p.source = TuningSource::planned;
      most = std::max(most, p.candidates);
    }
    report_.problems.push_back(std::move(p));
  }
  if (searched > 0) {
    start_trial();
    start_ = Clock::now();
    KILN_RETURN_IF_ERROR(round(true));
    report_.max_rounds = most - 1;  // the defaults were round 0
    report_.estimate_s = seconds(Clock::now() - start_) + static_cast<double>(report_.max_rounds) * round_bound_s() + final_bound_s();
    report_.budget_s = options_.budget_s;
  }
  plan_.reset();
  trial_ = Model{};
  if (options_.report) *options_.report = report_;
  return PassResult{false, "dry run: " + count_of(searched, "problem", "problems") + " to time"};
}

Result<PassResult> Search::run() {
  Graph& graph = model_.graph;
  if (auto symbolic = concrete_input_shapes(graph, shapes_)) {
    if (options_.require_db) return user_error("", *symbolic + ": give --input-shape to look its kernels up in the database");
    return PassResult{false, *symbolic + ": give --input-shape to tune kernels"};
  }
  if (std::none_of(graph.nodes.begin(), graph.nodes.end(), [](const Node& n) { return !n.kernel.empty(); }))
    return PassResult{false, "no kernels chosen yet (select_kernels runs first)"};
  {
    // The queries need the shapes and constants, not the prepared kernels.
    KILN_ASSIGN_OR_RETURN(ExecutionPlan plan, build_plan(graph, shapes_, PlanOptions{ctx_.target, registry_, false, false}));
    plan_ = std::move(plan);
  }
  KILN_RETURN_IF_ERROR(form_groups());
  KILN_RETURN_IF_ERROR(apply_database());
  size_t searched = 0;
  for (Group& g : groups_) {
    g.search = options_.search && !options_.require_db && !g.from_db;
    searched += g.search;
  }
  if (options_.dry_run) return dry_run(searched);
  if (searched > 0) {
    start_trial();
    KILN_RETURN_IF_ERROR(search());
    KILN_RETURN_IF_ERROR(finish());
  }
  plan_.reset();
  trial_ = Model{};

  // The choices go into the model, the records into the database.
  std::vector<tuning::TuningRecord> records;
  size_t faster = 0, cut = 0, kept = 0;
  for (Group& g : groups_) {
    if (!g.from_db && !g.search) continue;  // not asked to search, and not in the database: the rule's choice stays
    TunedProblem p = reported(g);
    if (g.search) {
      p.chosen = g.final_choice;
      p.default_us = g.measured[0].us;
      auto chosen = std::find_if(g.measured.begin(), g.measured.end(), [&](const Candidate& c) { return c.choice == g.final_choice; });
      p.chosen_us = chosen->us;
      p.best = g.measured[static_cast<size_t>(g.best)].choice;
      p.best_us = g.measured[static_cast<size_t>(g.best)].us;
      p.timed = g.measured.size();
      p.rejected = g.rejected;
      p.note = g.note;
      std::vector<const Candidate*> others;
      for (const Candidate& c : g.measured)
        if (!(c.choice == g.final_choice)) others.push_back(&c);
      std::sort(others.begin(), others.end(), [](const Candidate* a, const Candidate* b) { return a->us < b->us; });
      if (!others.empty() && p.chosen_us > 0) p.runner_up_margin = others.front()->us / p.chosen_us - 1;
      p.source = g.cut_short ? TuningSource::cut_short : g.final_choice == g.default_choice ? TuningSource::kept_default : TuningSource::measured;
      faster += p.source == TuningSource::measured;
      cut += g.cut_short;
      kept += p.source == TuningSource::kept_default;
      if (!g.cut_short) {
        tuning::TuningRecord rec;
        rec.problem = g.problem;
        rec.machine = tuning::MachineFingerprint::host();
        rec.versions = tuning::TuningVersions::current();
        rec.winner = tuning::TimedKernel{g.final_choice, p.chosen_us};
        for (size_t i = 0; i < others.size() && i < kRecordCandidates; ++i)
          rec.candidates.push_back(tuning::TimedKernel{others[i]->choice, others[i]->us});
        records.push_back(std::move(rec));
      }
    }
    for (size_t n : g.nodes) graph.nodes[n].kernel = p.chosen;
    report_.problems.push_back(std::move(p));
  }
  if (!options_.db_path.empty() && !records.empty()) {
    KILN_RETURN_IF_ERROR(tuning::add_tuning_records(options_.db_path, records));
    report_.db_written = records.size();
  }
  // The target and memory plan again, for the kernels now chosen.
  if (!report_.problems.empty()) KILN_RETURN_IF_ERROR(select_kernels(model_, ctx_).status());

  std::string summary;
  if (searched > 0) {
    summary = "timed " + count_of(searched, "problem", "problems") + ": " + std::to_string(faster) + " faster, " +
              std::to_string(kept) + " kept the default" + (cut ? ", " + std::to_string(cut) + " cut short by the budget" : "");
  } else if (options_.search) {
    summary = groups_.empty() ? "no kernel to choose between" : "nothing to time";
  }
  if (report_.db_used) summary += std::string(summary.empty() ? "" : "; ") + count_of(report_.db_used, "problem", "problems") + " from the database";
  if (summary.empty()) summary = options_.db_path.empty() ? "no kernel to choose between" : "no problem in the database";
  if (options_.report) *options_.report = report_;
  const bool changed = std::any_of(report_.problems.begin(), report_.problems.end(),
                                   [](const TunedProblem& p) { return !(p.chosen == p.default_kernel); });
  return PassResult{changed, summary};
}

// Attributes as one canonical text: sorted by name, `name=value` joined by spaces.
std::string attributes_text(const Node& node, bool epilogue) {
  std::vector<std::string> parts;
  for (const Attribute& a : node.attrs) {
    const bool act = a.name.rfind("activation", 0) == 0 || a.name.rfind("post_activation", 0) == 0;
    if (act != epilogue) continue;
    parts.push_back(a.name + "=" + attribute_text(a.value));
  }
  std::sort(parts.begin(), parts.end());
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : " ") + p;
  return s;
}

const char* source_name(TuningSource s) {
  switch (s) {
    case TuningSource::measured: return "tuned";
    case TuningSource::kept_default: return "default";
    case TuningSource::cut_short: return "cut short";
    case TuningSource::database: return "database";
    case TuningSource::planned: return "to time";
  }
  return "";
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

tuning::TuningProblem tuning_problem(const ExecutionPlan& plan, size_t n, const Target& target) {
  const Node& node = plan.bound.nodes[n];
  tuning::TuningProblem p;
  p.op = node.qualified_op();
  std::string constants;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (node.inputs[i] == kNoValue) {
      p.inputs.push_back({{}, "none"});
      continue;
    }
    const Value& v = plan.bound.value(node.inputs[i]);
    p.inputs.push_back({v.shape.is_concrete() ? v.shape.concrete() : std::vector<int64_t>{}, std::string(dtype_name(v.dtype))});
    if (v.is_constant()) constants += (constants.empty() ? "" : ",") + std::to_string(i);
  }
  p.layout = attributes_text(node, false);
  if (!constants.empty()) p.layout += std::string(p.layout.empty() ? "" : " ") + "const=" + constants;
  if (target.cpu.names() != CpuFeatures::host().names()) p.layout += std::string(p.layout.empty() ? "" : " ") + "target=" + target.cpu.str();
  p.epilogue = attributes_text(node, true);
  p.threads = target.threads;
  return p;
}

std::string tuning_report_text(const TuningReport& r) {
  std::vector<std::vector<std::string>> rows = {{"node", "op", "default us", "best us", "speed-up", "how", "kernel"}};
  if (r.dry_run) rows = {{"node", "op", "candidates", "how", "kernel now"}};
  for (const TunedProblem& p : r.problems) {
    std::string node = p.nodes.empty() ? "" : escape_controls(p.nodes.front());
    if (p.nodes.size() > 1) node += " (+" + std::to_string(p.nodes.size() - 1) + ")";
    if (r.dry_run) {
      rows.push_back({node, p.problem.op, p.candidates ? std::to_string(p.candidates) : "-", source_name(p.source), kernel_choice_text(p.chosen)});
      continue;
    }
    const bool timed = p.default_us > 0 && p.best_us > 0;
    rows.push_back({node, p.problem.op, timed ? fixed(p.default_us, 1) : "-", timed ? fixed(p.best_us, 1) : p.chosen_us > 0 ? fixed(p.chosen_us, 1) : "-",
                    timed ? fixed(p.default_us / p.best_us, 2) + "x" : "-", source_name(p.source),
                    kernel_choice_text(p.chosen) + (p.note.empty() ? "" : " (" + p.note + ")")});
  }
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& cells : rows)
    for (size_t i = 0; i < cells.size(); ++i) widths[i] = std::max(widths[i], cells[i].size());
  std::string s;
  for (const auto& cells : rows) {
    std::string line;
    for (size_t i = 0; i < cells.size(); ++i) {
      std::string c = cells[i];
      if (i + 1 < cells.size()) c += std::string(widths[i] - c.size(), ' ');
      line += (i ? "  " : "") + c;
    }
    s += line + "\n";
  }
  if (r.searched) {
    s += "search: " + std::to_string(r.rounds) + " rounds, " + std::to_string(r.graph_runs) + " graph runs, " + fixed(r.search_s, 1) +
         " s of a " + fixed(r.budget_s, 0) + " s budget" +
         (r.budget_exhausted ? " (exhausted: the problems marked 'cut short' keep the best found so far)" : "") + "\n";
    if (r.final_runs)
      s += "end to end, median (min-max) of " + std::to_string(r.final_runs) + " interleaved runs: default " + fixed(r.default_ms.median, 3) +
           " ms (" + fixed(r.default_ms.min, 3) + "-" + fixed(r.default_ms.max, 3) + "), tuned " + fixed(r.tuned_ms.median, 3) + " ms (" +
           fixed(r.tuned_ms.min, 3) + "-" + fixed(r.tuned_ms.max, 3) + "); tuned/default of each pair, median " + fixed(r.paired_ratio, 3) +
           (r.reverted ? ": not 1% faster, so every default is kept" : "") + "\n";
    else
      s += "end to end: no kernel changed, nothing to compare\n";
  }
  if (r.dry_run) {
    const size_t planned = static_cast<size_t>(
        std::count_if(r.problems.begin(), r.problems.end(), [](const TunedProblem& p) { return p.source == TuningSource::planned; }));
    s += "dry run: " + count_of(planned, "problem", "problems") + " to time";
    if (planned > 0) {
      s += ", in at most " + count_of(r.max_rounds, "round", "rounds") + " after the defaults' and the final comparison: at most about " +
           fixed(r.estimate_s, 0) + " s here, ";
      if (r.estimate_s <= r.budget_s)
        s += "within the " + fixed(r.budget_s, 0) + " s budget";
      else
        s += "past the " + fixed(r.budget_s, 0) + " s budget (--tune-budget " + fixed(std::ceil(r.estimate_s / 10) * 10, 0) +
             "s should leave no problem cut short)";
    }
    s += "\n";
  }
  return s + tuning_database_text(r);
}

std::string tuning_database_text(const TuningReport& r) {
  if (r.db_path.empty()) return "";
  std::string s = "database " + r.db_path + ": " + std::to_string(r.db_used) + " of " + count_of(r.db_used + r.db_missed, "problem", "problems") + " found";
  if (r.searched) s += ", " + std::to_string(r.db_written) + " added";
  else if (r.db_missed && !r.dry_run) s += "; the first missing, " + r.db_first_miss + ", keeps the default kernel";
  return s + "\n";
}

std::string tuning_report_json(const TuningReport& r) {
  using nlohmann::json;
  auto choice = [](const KernelChoice& c) {
    json params = json::object();
    for (const auto& kv : c.params) {
      const std::string& key = kv.first;
      std::visit([&](const auto& x) { params[key] = x; }, kv.second);
    }
    return json{{"name", c.name}, {"params", params}};
  };
  json problems = json::array();
  for (const TunedProblem& p : r.problems) {
    json j{{"problem", p.problem.str()},     {"op", p.problem.op},       {"nodes", p.nodes},
           {"default_kernel", choice(p.default_kernel)}, {"chosen", choice(p.chosen)},
           {"source", source_name(p.source)}, {"timed", p.timed},         {"rejected", p.rejected}};
    if (p.candidates) j["candidates"] = p.candidates;
    if (p.default_us > 0) j["default_us"] = p.default_us;
    if (p.chosen_us > 0) j["chosen_us"] = p.chosen_us;
    if (p.default_us > 0 && p.chosen_us > 0) j["speedup"] = p.default_us / p.chosen_us;
    if (p.runner_up_margin) j["runner_up_margin"] = *p.runner_up_margin;
    if (p.best_us > 0) {
      j["best"] = choice(p.best);
      j["best_us"] = p.best_us;
    }
    if (!p.note.empty()) j["note"] = p.note;
    problems.push_back(std::move(j));
  }
  auto lat = [](const LatencyStats& l) { return json{{"median", l.median}, {"min", l.min}, {"max", l.max}}; };
  json out{{"searched", r.searched},
           {"problems", problems},
           {"rounds", r.rounds},
           {"graph_runs", r.graph_runs},
           {"search_s", r.search_s},
           {"budget_s", r.budget_s},
           {"budget_exhausted", r.budget_exhausted},
           {"database", {{"path", r.db_path}, {"used", r.db_used}, {"added", r.db_written}, {"missed", r.db_missed}}}};
  if (!r.db_first_miss.empty()) out["database"]["first_missed"] = r.db_first_miss;
  if (r.dry_run) out["dry_run"] = {{"max_rounds", r.max_rounds}, {"estimate_s", r.estimate_s}};
  if (r.final_runs)
    out["end_to_end"] = {{"runs", r.final_runs},
                         {"default_ms", lat(r.default_ms)},
                         {"tuned_ms", lat(r.tuned_ms)},
                         {"paired_ratio", r.paired_ratio},
                         {"reverted", r.reverted}};
  return out.dump(2) + "\n";
}

Result<PassResult> autotune_kernels(Model& model, PassContext& ctx) {
  if (!ctx.tuning || (!ctx.tuning->search && ctx.tuning->db_path.empty()))
    return PassResult{false, "not asked for (--mode max-autotune, or --tuning-db)"};
  return Search(model, ctx).run();
}

}  // namespace kiln
