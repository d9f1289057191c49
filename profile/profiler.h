// `kiln profile`'s engine: runs a session with an observer that times every top-level node,
// then turns the times, the shapes the nodes saw and the op table's FLOP and byte models into
// one document (schema "kiln.profile", docs/profile.schema.json). Every report — the table, CSV,
// trace, HTML, a comparison — is a view of that document or of the measurements behind it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "formats/huge_pages.h"
#include "formats/ir.h"
#include "profile/ceilings.h"
#include "runtime/session.h"

namespace kiln::profile {

struct RunOptions {
  int warmup = 2;            ///< untimed runs first (the first also builds the plan)
  int iterations = 0;        ///< exactly this many timed runs when > 0; else by duration_s
  double duration_s = 2.0;   ///< without `iterations`: run until this much time has passed...
  int min_iterations = 20;   ///< ...and at least this many (a comparison needs samples)
  int max_iterations = 100'000;
  /// Called after each timed run with the runs done and the fraction of the run done (0..1).
  std::function<void(int done, double fraction)> progress;
  /// Test hook: sleep this long inside the node of this name on every timed run (a
  /// deliberately slowed kernel, to test --compare). Empty: none.
  std::string delay_node;
  double delay_us = 0;
};

/// One pool thread's stretch of work inside a node of a kept run (runtime/threads.h).
struct WorkerEvent {
  size_t node;
  int thread;      ///< index in the pool; 0 is the thread that runs the nodes
  int64_t os_tid;
  float start_us;  ///< after the run's start
  float dur_us;
};

/// A value as a node saw it on the timed runs.
struct TensorInfo {
  std::string name;
  DType dtype = DType::undefined;
  std::vector<int64_t> shape;
};

/// What a profiling run measured.
struct Measurements {
  std::vector<double> iteration_ms;  ///< wall-clock time of each timed run()
  /// Per node (graph.nodes order), its time on each timed run, in microseconds.
  std::vector<std::vector<float>> node_us;
  /// The first kept_iterations runs' timelines: per run, per node, its start after the run's start (µs).
  std::vector<std::vector<float>> start_us;
  std::vector<double> iteration_start_us;  ///< each kept run's start after the first timed run's start
  /// Per kept run, the pool threads' work inside kiln's own parallel kernels (library kernels,
  /// oneDNN's, run on the same threads but record nothing).
  std::vector<std::vector<WorkerEvent>> worker_events;
  /// The inputs and outputs of each node (absent ones have no name), from the first timed run.
  std::vector<std::vector<TensorInfo>> node_inputs, node_outputs;
  std::vector<NodeKernel> kernels;  ///< each node's kernel in the timed runs' plan
  MemoryPlanStats memory;
  int run_threads = 1;
  int warmup = 0;
  std::vector<Tensor> outputs;  ///< the last run's
  int64_t thread_id = 0;        ///< the OS thread that ran the nodes
  int64_t peak_rss_bytes = 0;   ///< the process's peak resident set after the runs
  /// After the runs, where /proc/self/smaps tells: the mapped model file's pages, and those of
  /// the buffers that asked for 2 MiB pages (HugePages: weights packed or moved there, arenas,
  /// workspace).
  std::optional<PageUse> model_file_pages, huge_page_buffers;
};

/// The compute ceiling a kernel works against: "bf16", "f16" or "int8" when its name (and
/// parameters) say it computes so ("bf16", "f16", "u8s8", "int8") or an input is i8 / u8 (int8)
/// or bf16 (a bf16 weight); else "f32" (an f16 weight that a kernel widens included).
std::string kernel_precision(const std::string& kernel, const std::vector<DType>& input_dtypes);

/// How many timed runs keep their timeline (trace events, the HTML timeline).
inline constexpr size_t kKeptIterations = 50;

/// Runs `session` on `inputs` as `options` say and times every top-level node. The session's
/// observer is attached for the timed runs and detached after.
Result<Measurements> measure(Session& session, const std::vector<Tensor>& inputs, const RunOptions& options);

/// What the document says about where the profile ran, beyond the measurements.
struct ReportContext {
  std::string model_file;
  Stage stage = Stage::compiled;
  bool compiled_in_memory = false;
  std::string command_line;
  uint64_t seed = 0;
  std::vector<TensorInfo> inputs;
  int threads_requested = 1;
  CpuFeatures cpu;
  Ceilings ceilings;
};

/// The "kiln.profile" document (docs/profile.schema.json) of a measured run of `graph`.
nlohmann::ordered_json build_report(const Graph& graph, const Measurements& m, const ReportContext& context);

/// The node of a "kiln.profile" document that ran at the highest share of its compute roof, and
/// that share (0 and "" when no node is compute-bound). Winograd's nodes are left out: they do
/// fewer multiplications than the convolution's count, so their rate may pass the roof. No
/// kernel outruns the machine: a share above kCeilingsOutrun means the ceilings were measured
/// low (on a busy machine).
std::pair<std::string, double> fastest_compute_node(const nlohmann::ordered_json& doc);
constexpr double kCeilingsOutrun = 1.05;

/// The default output: a header (model, machine and ceilings, latency, memory, kernel time
/// against wall time), the `top` most expensive nodes and the per-op-type summary, fitted to
/// `width` columns.
std::string render_table(const nlohmann::ordered_json& doc, int width, int top);

/// One row per node (kernel call site), RFC 4180, with a header row.
std::string render_csv(const nlohmann::ordered_json& doc);

/// Chrome's trace event format (Perfetto and chrome://tracing load it): per kept run a complete
/// event for the run and one per node, on the thread that ran it, with the node's op, kernel,
/// sources, shapes, FLOPs and bytes as args.
nlohmann::ordered_json render_trace(const nlohmann::ordered_json& doc, const Measurements& m);

/// One self-contained HTML page (inline CSS and JavaScript, nothing fetched) that embeds `doc` and
/// draws it: the summary, a roofline of the nodes under the machine's roofs, one run's timeline
/// and the node, op-type and kernel tables (profile/html.cc).
std::string render_html(const nlohmann::ordered_json& doc);

}  // namespace kiln::profile
