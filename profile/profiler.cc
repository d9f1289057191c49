#include "profile/profiler.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

#include "formats/memory.h"
#include "formats/serialize.h"
#include "formats/summary.h"
#include "profile/stats.h"
#include "runtime/threads.h"

namespace kiln::profile {

namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double us_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Times every top-level node of the runs it observes. Two clock reads and two stores per node:
// the profile's own overhead is what docs/architecture.md measures.
class Recorder final : public ExecutionObserver {
 public:
  Recorder(Measurements& m, const RunOptions& options, size_t nodes, const Graph& g) : m_(m), graph_(g) {
    m_.node_us.assign(nodes, {});
    if (options.iterations > 0)  // no allocation on the timed path when the count is known
      for (auto& times : m_.node_us) times.reserve(static_cast<size_t>(options.iterations));
    m_.node_inputs.assign(nodes, {});
    m_.node_outputs.assign(nodes, {});
    delay_node_ = options.delay_node.empty() ? -1 : static_cast<int64_t>(find_node(g, options.delay_node));
    delay_us_ = options.delay_us;
  }

  void start_run(clock_type::time_point t, bool keep) {
    run_start_ = t;
    keep_ = keep;
    if (keep) {
      m_.start_us.emplace_back(m_.node_us.size(), -1.0f);
      m_.worker_events.emplace_back();
      take_worker_spans();  // nothing from before this run
    }
    record_worker_spans(keep);
  }
  void end_run() {
    first_ = false;
    record_worker_spans(false);
  }

  void on_node_begin(const NodeEvent&) override { begin_ = clock_type::now(); }
  void on_node_end(const NodeEvent& e) override {
    if (static_cast<int64_t>(e.index) == delay_node_) {
      // The test hook's slowed kernel: spin (a sleep's wake-up latency would swamp short delays).
      const auto until = clock_type::now() + std::chrono::duration<double, std::micro>(delay_us_);
      while (clock_type::now() < until) {
      }
    }
    const auto end = clock_type::now();
    m_.node_us[e.index].push_back(static_cast<float>(us_between(begin_, end)));
    if (keep_) {
      m_.start_us.back()[e.index] = static_cast<float>(us_between(run_start_, begin_));
      const int64_t base_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(run_start_.time_since_epoch()).count();
      for (const WorkerSpanRecord& w : take_worker_spans())
        m_.worker_events.back().push_back({e.index, w.thread, w.os_tid, static_cast<float>((w.begin_ns - base_ns) / 1e3),
                                           static_cast<float>((w.end_ns - w.begin_ns) / 1e3)});
    }
    if (first_) {
      m_.node_inputs[e.index] = infos(e.node.inputs, e.inputs);
      std::vector<ValueId> outs(e.node.outputs.begin(), e.node.outputs.end());
      std::vector<const Tensor*> out_ptrs(e.outputs.begin(), e.outputs.end());
      m_.node_outputs[e.index] = infos(outs, out_ptrs);
    }
  }

 private:
  static size_t find_node(const Graph& g, const std::string& name) {
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (g.nodes[i].name == name) return i;
    return static_cast<size_t>(-1);
  }
  std::vector<TensorInfo> infos(std::span<const ValueId> ids, std::span<const Tensor* const> tensors) const {
    std::vector<TensorInfo> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      TensorInfo t;
      if (ids[i] != kNoValue && i < tensors.size() && tensors[i] && tensors[i]->defined()) {
        t.name = graph_.value(ids[i]).name;
        t.dtype = tensors[i]->dtype();
        t.shape = tensors[i]->shape();
      }
      out.push_back(std::move(t));
    }
    return out;
  }

  Measurements& m_;
  const Graph& graph_;
  clock_type::time_point run_start_, begin_;
  bool keep_ = false, first_ = true;
  int64_t delay_node_ = -1;
  double delay_us_ = 0;
};

// Rounded to `digits` decimals: per-iteration times keep nanoseconds, not float noise.
double rounded(double x, int digits = 3) {
  const double scale = std::pow(10.0, digits);
  return std::round(x * scale) / scale;
}

json tensor_json(const TensorInfo& t) {
  if (t.name.empty() && t.dtype == DType::undefined) return nullptr;
  return json{{"name", t.name}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}};
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The compute ceiling a node's kernel works against.
}  // namespace

std::string kernel_precision(const std::string& kernel, const std::vector<DType>& input_dtypes) {
  if (kernel.find("bf16") != std::string::npos) return "bf16";
  if (kernel.find("f16") != std::string::npos) return "f16";  // kiln.gemm_f16_avx512: f16 products
  if (kernel.find("u8s8") != std::string::npos || kernel.find("int8") != std::string::npos) return "int8";
  for (DType t : input_dtypes) {
    if (t == DType::i8 || t == DType::u8) return "int8";
    if (t == DType::bf16) return "bf16";  // a bf16 weight (`compile --precision bf16`): bf16 products
  }
  return "f32";
}

Result<Measurements> measure(Session& session, const std::vector<Tensor>& inputs, const RunOptions& options) {
  Measurements m;
  const Graph& g = session.graph();
  m.warmup = options.warmup;
  for (int i = 0; i < options.warmup; ++i) {  // the first run of a new shape also builds its plan
    auto r = session.run(inputs);
    if (!r.ok()) return r.error();
  }
  Recorder recorder(m, options, g.nodes.size(), g);
  session.set_observer(&recorder);
  const auto t_begin = clock_type::now();
  const bool by_count = options.iterations > 0;
  Status failed;
  for (int i = 0;; ++i) {
    if (by_count ? i >= options.iterations
                 : (i >= options.max_iterations ||
                    (i >= options.min_iterations && us_between(t_begin, clock_type::now()) >= options.duration_s * 1e6)))
      break;
    const bool keep = static_cast<size_t>(i) < kKeptIterations;
    const auto t0 = clock_type::now();
    recorder.start_run(t0, keep);
    auto r = session.run(inputs);
    const auto t1 = clock_type::now();
    recorder.end_run();
    if (!r.ok()) {
      failed = r.status();
      break;
    }
    m.iteration_ms.push_back(us_between(t0, t1) / 1e3);
    if (keep) m.iteration_start_us.push_back(us_between(t_begin, t0));
    m.outputs = std::move(*r);
    if (options.progress) {
      const double fraction = by_count ? static_cast<double>(i + 1) / options.iterations
                                       : std::min(1.0, us_between(t_begin, t1) / (options.duration_s * 1e6));
      options.progress(i + 1, fraction);
    }
  }
  session.set_observer(nullptr);
  if (!failed.ok()) return failed.error();
  auto kernels = session.kernels();
  m.kernels.assign(kernels.begin(), kernels.end());
  m.memory = session.memory_stats();
  m.run_threads = session.run_threads();
  m.thread_id = static_cast<int64_t>(syscall(SYS_gettid));
  m.peak_rss_bytes = peak_rss_bytes();
  const ModelPageUse pages = model_page_use();
  m.model_file_pages = pages.model_files;
  m.huge_page_buffers = pages.huge_page_buffers;
  return m;
}

std::pair<std::string, double> fastest_compute_node(const json& doc) {
  std::pair<std::string, double> best{"", 0};
  for (const json& n : doc.at("nodes")) {
    if (n.at("bound") != "compute" || n.at("kernel_params").get<std::string>().find("winograd") != std::string::npos) continue;
    const double share = n.at("peak_share").get<double>();
    if (share > best.second) best = {n.at("name").get<std::string>(), share};
  }
  return best;
}

json build_report(const Graph& graph, const Measurements& m, const ReportContext& ctx) {
  // The graph with every value a node saw at its concrete shape: the op table's FLOP and byte
  // models then count what ran, not the symbolic dims.
  Graph shaped = graph;
  auto set_shapes = [&](const std::vector<ValueId>& ids, const std::vector<TensorInfo>& infos) {
    for (size_t i = 0; i < ids.size() && i < infos.size(); ++i)
      if (ids[i] != kNoValue && !infos[i].name.empty()) {
        Value& v = shaped.value(ids[i]);
        v.shape = Shape::of(infos[i].shape);
        v.dtype = infos[i].dtype;
      }
  };
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    set_shapes(graph.nodes[n].inputs, m.node_inputs[n]);
    set_shapes(graph.nodes[n].outputs, m.node_outputs[n]);
  }

  const size_t iters = m.iteration_ms.size();
  std::vector<double> sorted = m.iteration_ms;
  std::sort(sorted.begin(), sorted.end());
  double wall_total = 0;
  for (double x : m.iteration_ms) wall_total += x;
  const double mean = iters ? wall_total / static_cast<double>(iters) : 0;
  double var = 0;
  for (double x : m.iteration_ms) var += (x - mean) * (x - mean);
  const double stdev = iters > 1 ? std::sqrt(var / static_cast<double>(iters - 1)) : 0;

  const auto& ceilings = ctx.ceilings;
  const double f32_peak = ceilings.compute_gflops.count("f32") ? ceilings.compute_gflops.at("f32") : 0;

  json doc;
  doc["schema"] = "kiln.profile";
  doc["schema_version"] = 1;
  doc["kiln_version"] = std::string(kiln_version());
  doc["command_line"] = ctx.command_line;
  doc["created"] = utc_now();
  doc["model"] = {{"file", ctx.model_file},
                  {"stage", std::string(stage_name(ctx.stage))},
                  {"compiled_in_memory", ctx.compiled_in_memory},
                  {"nodes", graph.nodes.size()}};
  doc["machine"] = {{"cpu", cpu_model_name()}, {"features", ctx.cpu.names()}, {"threads", ceilings.threads},
                    {"ceilings", to_json(ceilings)}};
  json inputs = json::array();
  for (const TensorInfo& t : ctx.inputs) inputs.push_back(tensor_json(t));
  doc["run"] = {{"warmup", m.warmup}, {"iterations", iters}, {"threads", m.run_threads}, {"threads_requested", ctx.threads_requested}, {"seed", ctx.seed}, {"inputs", inputs}};
  doc["latency_ms"] = {{"min", sorted.empty() ? 0 : sorted.front()},
                       {"p50", median(m.iteration_ms)},
                       {"p90", percentile(sorted, 0.90)},
                       {"p99", percentile(sorted, 0.99)},
                       {"max", sorted.empty() ? 0 : sorted.back()},
                       {"mean", mean},
                       {"stdev", stdev}};
  json per_iter = json::array();
  for (double x : m.iteration_ms) per_iter.push_back(rounded(x, 6));
  doc["iteration_ms"] = per_iter;
  doc["throughput_per_s"] = wall_total > 0 ? 1e3 * static_cast<double>(iters) / wall_total : 0;
  doc["memory"] = {{"peak_rss_bytes", m.peak_rss_bytes},
                   {"arena_bytes", m.memory.arena_bytes},
                   {"workspace_bytes", m.memory.workspace_bytes}};
  if (m.model_file_pages) {
    doc["memory"]["model_file_resident_bytes"] = m.model_file_pages->resident_bytes;
    doc["memory"]["model_file_huge_page_bytes"] = m.model_file_pages->huge_page_bytes;
  }
  if (m.huge_page_buffers) {
    doc["memory"]["huge_page_buffers_resident_bytes"] = m.huge_page_buffers->resident_bytes;
    doc["memory"]["huge_page_buffers_huge_page_bytes"] = m.huge_page_buffers->huge_page_bytes;
  }

  // The executor's own time: per run, its wall time less the sum of its nodes' times.
  std::vector<double> sums(iters, 0.0), gaps(iters, 0.0);
  for (const auto& times : m.node_us)
    for (size_t i = 0; i < times.size() && i < iters; ++i) sums[i] += times[i] / 1e3;
  for (size_t i = 0; i < iters; ++i) gaps[i] = m.iteration_ms[i] - sums[i];
  const double wall_p50 = median(m.iteration_ms);
  doc["kernel_time"] = {{"sum_ms_p50", median(sums)},
                        {"wall_ms_p50", wall_p50},
                        {"overhead_ms_p50", median(gaps)},
                        {"overhead_share", wall_p50 > 0 ? median(gaps) / wall_p50 : 0}};

  struct Group {
    int64_t nodes = 0, flops = 0, bytes = 0;
    double total_ms = 0;
    double median_sum_us = 0;  // the members' median times added: the group's time per run
  };
  std::map<std::string, Group> by_op, by_kernel;
  json nodes = json::array();
  json notes = json::array();
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    const NodeKernel empty;
    const NodeKernel& k = n < m.kernels.size() ? m.kernels[n] : empty;
    const std::vector<float>& t = m.node_us[n];
    std::vector<double> times(t.begin(), t.end());
    std::vector<double> st = times;
    std::sort(st.begin(), st.end());
    double total_us = 0;
    for (double x : times) total_us += x;
    const double med_us = median(times);
    // A view or an in-place Concat moves nothing (NodeKernel::nothing_to_run).
    const int64_t flops = k.nothing_to_run ? 0 : node_flops(node, shaped);
    const int64_t bytes = k.nothing_to_run ? 0 : node_bytes(node, shaped);
    int64_t written = 0;
    for (const TensorInfo& o : m.node_outputs[n])
      if (!o.name.empty()) written += static_cast<int64_t>(storage_bytes(o.dtype, shape_numel(o.shape)).value_or(0));
    written = std::min(written, bytes);
    const double gflops = med_us > 0 ? static_cast<double>(flops) / (med_us * 1e3) : 0;
    const double gbps = med_us > 0 ? static_cast<double>(bytes) / (med_us * 1e3) : 0;
    const double intensity = bytes > 0 ? static_cast<double>(flops) / static_cast<double>(bytes) : 0;
    std::vector<DType> dtypes;
    for (const TensorInfo& t : m.node_inputs[n]) dtypes.push_back(t.dtype);
    std::string precision = kernel_precision(k.name + " " + k.label, dtypes);
    if (!ceilings.compute_gflops.count(precision)) precision = "f32";
    const double compute_peak = ceilings.compute_gflops.count(precision) ? ceilings.compute_gflops.at(precision) : f32_peak;
    // Under the roofline: compute-bound where the intensity passes the ridge point (peak over
    // bandwidth), memory-bound below it and for nodes that do no arithmetic.
    const MemoryLevel& roof = memory_roof(ceilings, bytes);
    const bool compute_bound = flops > 0 && roof.gbps > 0 && intensity * roof.gbps >= compute_peak;
    const double peak_share = compute_bound ? (compute_peak > 0 ? gflops / compute_peak : 0) : (roof.gbps > 0 ? gbps / roof.gbps : 0);
    json ins = json::array(), outs = json::array(), sources = json::array(), per_call = json::array();
    for (const TensorInfo& x : m.node_inputs[n]) ins.push_back(tensor_json(x));
    for (const TensorInfo& x : m.node_outputs[n]) outs.push_back(tensor_json(x));
    for (const std::string& s : node.sources) sources.push_back(s);
    for (double x : times) per_call.push_back(rounded(x));
    nodes.push_back({{"index", n},
                     {"name", node.name},
                     {"op", node.qualified_op()},
                     {"kernel", k.name},
                     {"kernel_params", k.label},
                     {"sources", sources},
                     {"inputs", ins},
                     {"outputs", outs},
                     {"calls", times.size()},
                     {"total_ms", rounded(total_us / 1e3, 6)},
                     {"median_us", rounded(med_us)},
                     {"p90_us", rounded(percentile(st, 0.90))},
                     {"share", wall_total > 0 ? rounded(total_us / 1e3 / wall_total, 6) : 0},
                     {"flops", flops},
                     {"bytes_read", bytes - written},
                     {"bytes_written", written},
                     {"gflops", rounded(gflops)},
                     {"gbps", rounded(gbps)},
                     {"intensity", rounded(intensity, 4)},
                     {"bound", compute_bound ? "compute" : "memory"},
                     {"memory_level", roof.name},
                     {"precision", precision},
                     {"peak_share", rounded(peak_share, 4)},
                     {"times_us", per_call}});
    for (auto* group : {&by_op[node.qualified_op()], &by_kernel[k.name]}) {
      group->nodes += 1;
      group->flops += flops;
      group->bytes += bytes;
      group->total_ms += total_us / 1e3;
      group->median_sum_us += med_us;
    }
  }
  doc["nodes"] = nodes;
  if (const auto [fastest, fastest_share] = fastest_compute_node(doc); fastest_share > kCeilingsOutrun)
    notes.push_back("node '" + fastest + "' ran at " + std::to_string(static_cast<int>(std::lround(100 * fastest_share))) +
                    "% of the " + (ceilings.source == "cache" ? "cached " : "") +
                    "compute ceiling: the ceilings were measured low (a busy machine?); measure them again with --reprobe");
  doc["notes"] = notes;
  auto groups_json = [&](const std::map<std::string, Group>& groups) {
    std::vector<std::pair<std::string, Group>> rows(groups.begin(), groups.end());
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.total_ms > b.second.total_ms; });
    json out = json::array();
    for (const auto& [key, gr] : rows)
      out.push_back({{"key", key},
                     {"nodes", gr.nodes},
                     {"total_ms", rounded(gr.total_ms, 6)},
                     {"share", wall_total > 0 ? rounded(gr.total_ms / wall_total, 6) : 0},
                     {"flops", gr.flops},
                     {"bytes", gr.bytes},
                     {"gflops", gr.median_sum_us > 0 ? rounded(static_cast<double>(gr.flops) / (gr.median_sum_us * 1e3)) : 0},
                     {"gbps", gr.median_sum_us > 0 ? rounded(static_cast<double>(gr.bytes) / (gr.median_sum_us * 1e3)) : 0}});
    return out;
  };
  doc["by_op"] = groups_json(by_op);
  doc["by_kernel"] = groups_json(by_kernel);

  // One run's timeline, for the HTML report: the kept run whose latency is the median's.
  json timeline = json::object();
  if (!m.start_us.empty()) {
    size_t pick = 0;
    double best = -1;
    for (size_t i = 0; i < m.start_us.size(); ++i) {
      const double d = std::abs(m.iteration_ms[i] - wall_p50);
      if (best < 0 || d < best) best = d, pick = i;
    }
    json events = json::array();
    for (size_t n = 0; n < graph.nodes.size(); ++n)
      if (m.start_us[pick][n] >= 0 && pick < m.node_us[n].size())
        events.push_back({{"node", n}, {"start_us", rounded(m.start_us[pick][n])}, {"dur_us", rounded(m.node_us[n][pick])}});
    timeline = {{"iteration", pick}, {"wall_us", rounded(m.iteration_ms[pick] * 1e3)}, {"events", events}};
  }
  doc["timeline"] = timeline;
  return doc;
}

}  // namespace kiln::profile
