// `kiln quant IN.kiln -o OUT.kiln --quantizer x86|xnnpack --calib FILE.npz|DIR`: static
// post-training quantization as PT2E does it — annotate, prepare, calibrate on the user's files,
// convert to explicit QuantizeLinear / DequantizeLinear. Also dynamic (--dynamic) and
// weight-only (--weight-only int8|int4 [--group-size G]) quantization of the linear layers.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <optional>

#include "cli/app.h"
#include "cli/inputs.h"
#include "compile/graph_util.h"
#include "compile/pass.h"
#include "export/onnx_writer.h"
#include "formats/verify.h"
#include "formats/npy.h"
#include "formats/serialize.h"
#include "quant/config.h"
#include "quant/convert.h"
#include "quant/prepare.h"
#include "quant/quantizer.h"
#include "quant/report.h"
#include "runtime/session.h"
#include "runtime/threads.h"

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;

struct QuantArgs {
  std::string input;
  std::string output;
  std::string quantizer;
  std::vector<std::string> calib;
  int64_t calib_limit = 0;
  bool per_tensor = false;
  int threads = 0;
  bool verbose = false;
  bool report = false;
  std::vector<std::string> eval;
  bool json = false;
  std::string config;
  std::optional<double> min_sqnr;
  bool dynamic = false;
  std::string weight_only;  ///< "", "int8" or "int4"
  std::optional<int64_t> group_size;
  std::string exclude_out;
};

// Whether a folder is one sample set: an ONNX test_data_set (input_K.pb) or .npy files.
bool sample_folder(const fs::path& dir) {
  std::error_code ec;
  if (!numbered_pb_files(dir.string(), "input").empty()) return true;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".npy") return true;
  return false;
}

// What a --calib source names, each read on its own: .npz files, and sample-set folders (an
// ONNX test_data_set_N with input_K.pb, or <input name>.npy files). A folder of them is taken
// in name order.
Result<std::vector<std::string>> calibration_sets(const std::vector<std::string>& sources) {
  std::vector<std::string> sets;
  for (const std::string& src : sources) {
    std::error_code ec;
    if (!fs::is_directory(src, ec)) {
      if (fs::path(src).extension() != ".npz")
        return Error{ErrorKind::user, src, "", "is not an .npz of calibration inputs or a folder of them"};
      sets.push_back(src);
      continue;
    }
    if (sample_folder(src)) {
      sets.push_back(src);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(src, ec))
      if (entry.path().extension() == ".npz" || (entry.is_directory() && sample_folder(entry.path())))
        found.push_back(entry.path().string());
    if (found.empty())
      return Error{ErrorKind::user, src, "", "holds no calibration inputs (.npz files, .npy files named after the inputs, "
                                             "or test_data_set folders)"};
    std::sort(found.begin(), found.end());
    sets.insert(sets.end(), found.begin(), found.end());
  }
  return sets;
}

// One set's arrays by input name.
Result<NamedTensors> read_set(const Graph& g, const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return read_npz_file(path);
  std::vector<std::string> names;
  for (ValueId id : g.inputs) names.push_back(g.value(id).name);
  if (!numbered_pb_files(path, "input").empty()) return read_pb_set(path, "input", names);
  NamedTensors out;
  for (const std::string& name : names) {
    const std::string file = (fs::path(path) / (percent_encode_file_name(name) + ".npy")).string();
    if (!fs::exists(file, ec)) return Error{ErrorKind::user, path, "input '" + name + "'", "has no " + fs::path(file).filename().string()};
    KILN_ASSIGN_OR_RETURN(Tensor t, read_npy_file(file));
    out.emplace_back(name, std::move(t));
  }
  return out;
}

// Row `i` of dim 0 of `t`, dim 0 kept as 1.
Tensor row(const Tensor& t, int64_t i) {
  std::vector<int64_t> shape = t.shape();
  const size_t bytes = t.nbytes() / static_cast<size_t>(shape[0]);
  shape[0] = 1;
  Tensor out(t.dtype(), shape);
  std::memcpy(out.raw(), static_cast<const std::byte*>(t.raw()) + bytes * static_cast<size_t>(i), bytes);
  return out;
}

// The flat index of the first NaN or Inf in a floating-point tensor, or -1.
int64_t first_non_finite(const Tensor& t) {
  if (t.dtype() == DType::f32) {
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(p[i])) return i;
    return -1;
  }
  const std::vector<double> d = t.to_double_vector();
  for (size_t i = 0; i < d.size(); ++i)
    if (!std::isfinite(d[i])) return static_cast<int64_t>(i);
  return -1;
}

// The samples of one calibration set, in graph.inputs order: a leading dim larger than the
// model's (1 or symbolic) is a batch of samples, each copied out only when it is asked for, so
// that a file costs its own size and one sample.
struct FileSamples {
  std::vector<Tensor> inputs;  ///< the arrays as read
  std::vector<bool> split;     ///< per input: a batch to split along dim 0
  int64_t count = 1;
  std::vector<Tensor> sample(int64_t i) const {
    std::vector<Tensor> s;
    for (size_t k = 0; k < inputs.size(); ++k) s.push_back(split[k] ? row(inputs[k], i) : inputs[k]);
    return s;
  }
};

Result<FileSamples> file_samples(const Graph& g, const std::string& file) {
  KILN_ASSIGN_OR_RETURN(NamedTensors arrays, read_set(g, file));
  std::map<std::string, Tensor> by_name(arrays.begin(), arrays.end());
  arrays.clear();
  FileSamples out;
  int64_t count = -1;
  for (ValueId id : g.inputs) {
    const Value& v = g.value(id);
    auto it = by_name.find(v.name);
    if (it == by_name.end()) return Error{ErrorKind::user, file, "input '" + v.name + "'", "has no array of this name"};
    const Tensor& t = it->second;
    const bool batch_dim = v.shape.rank_known && !v.shape.dims.empty() && (!v.shape.dims[0].is_known() || v.shape.dims[0].value == 1);
    const bool splits = batch_dim && t.rank() == v.shape.rank() && t.dim(0) > 1;
    const int64_t n = splits ? t.dim(0) : 1;
    if (count >= 0 && n != count && (n > 1 || count > 1))
      return Error{ErrorKind::user, file, "input '" + v.name + "'", "has " + std::to_string(n) + " samples, the others " + std::to_string(count)};
    count = std::max(count, n);
    // Calibration and evaluation data must be finite: observers skip NaN, but what one NaN or
    // Inf infects downstream left the sample CNN with scales of 1e36 and constant logits.
    if (is_float(t.dtype())) {
      const int64_t bad = first_non_finite(t);
      if (bad >= 0) {
        const int64_t per_sample = std::max<int64_t>(1, t.numel() / n);
        return Error{ErrorKind::user, file, "input '" + v.name + "'",
                     "sample " + std::to_string(bad / per_sample + 1) + " holds NaN or Inf; calibration and evaluation need finite values"};
      }
    }
    out.split.push_back(splits);
    out.inputs.push_back(t);
  }
  out.count = std::max<int64_t>(count, 1);
  return out;
}

// Calls fn on the samples of `files` in order, from sample `first` on, `count` of them at most
// (-1: all); one file's arrays are in memory at a time.
template <class F>
Status for_each_sample(const Graph& g, const std::vector<std::string>& files, int64_t first, int64_t count, F&& fn) {
  int64_t index = 0, done = 0;
  for (const std::string& file : files) {
    if (count >= 0 && done >= count) break;
    KILN_ASSIGN_OR_RETURN(FileSamples samples, file_samples(g, file));
    for (int64_t i = 0; i < samples.count; ++i) {
      if (count >= 0 && done >= count) break;
      if (index++ < first) continue;
      KILN_RETURN_IF_ERROR(with_file(fn(samples.sample(i)), file));
      ++done;
    }
  }
  return {};
}

Result<int64_t> count_samples(const Graph& g, const std::vector<std::string>& files) {
  int64_t n = 0;
  for (const std::string& file : files) {
    KILN_ASSIGN_OR_RETURN(FileSamples samples, file_samples(g, file));
    n += samples.count;
  }
  return n;
}

std::string db_text(double db) {
  if (std::isinf(db)) return db > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", db);
  return buf;
}

nlohmann::json db_json(double db) { return std::isinf(db) ? nlohmann::json(nullptr) : nlohmann::json(db); }

// --report on stdout: each layer worst first, then the graph outputs; or the same as JSON.
void print_report(const quant::AccuracyReport& r, const std::string& source, bool json) {
  if (json) {
    nlohmann::json doc = {{"format", "kiln.quant_report"}, {"version", 1}, {"samples", r.samples()}, {"eval", source}};
    doc["outputs"] = nlohmann::json::array();
    for (const auto& [name, s] : r.outputs()) doc["outputs"].push_back({{"name", name}, {"sqnr_db", db_json(s.db())}});
    doc["layers"] = nlohmann::json::array();
    for (const quant::LayerSqnr& l : r.layers())
      doc["layers"].push_back({{"node", l.node}, {"value", l.value}, {"pattern", l.pattern}, {"sqnr_db", db_json(l.sqnr.db())}});
    std::cout << doc.dump(2) << "\n";
    return;
  }
  std::cout << "SQNR of the quantized model against the float one on " << r.samples() << (r.samples() == 1 ? " sample" : " samples")
            << " (" << source << "), in dB\n";
  for (const auto& [name, s] : r.outputs()) std::cout << "  output '" << escape_controls(name) << "': " << db_text(s.db()) << "\n";
  std::cout << "  per layer, as the next layer reads it, worst first:\n";
  std::cout << "  SQNR dB  node (pattern)\n";
  for (const quant::LayerSqnr& l : r.layers()) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%7s", db_text(l.sqnr.db()).c_str());
    std::cout << "  " << buf << "  " << escape_controls(l.node) << (l.pattern.empty() ? "" : " (" + l.pattern + ")") << "\n";
  }
}

// A progress line on stderr when it is a terminal: samples done (of how many, when known), the
// rate, and the time left; nothing in a pipe.
class Progress {
 public:
  Progress(bool tty, std::string what, int64_t total) : tty_(tty), what_(std::move(what)), total_(total) {}
  ~Progress() {
    if (tty_ && shown_) std::fprintf(stderr, "\r\033[K");
  }
  void tick(int64_t done) {
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (shown_ && done != total_ && now - last_ < std::chrono::milliseconds(100)) return;  // ten lines a second at most
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double rate = s > 0 ? static_cast<double>(done) / s : 0;
    std::string line = "\rkiln quant: " + what_ + " " + std::to_string(done);
    if (total_ > 0) line += "/" + std::to_string(total_);
    char tail[64];
    std::snprintf(tail, sizeof tail, " samples, %.1f/s", rate);
    line += tail;
    if (total_ > done && rate > 0) {
      std::snprintf(tail, sizeof tail, ", %.0f s left", static_cast<double>(total_ - done) / rate);
      line += tail;
    }
    std::fprintf(stderr, "%s\033[K", line.c_str());
    shown_ = true;
  }

 private:
  bool tty_;
  std::string what_;
  int64_t total_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_;
};

// One quantization of the float model under a config: annotate, calibrate, convert, and (for
// --report / --min-sqnr) its accuracy on the evaluation samples.
struct Attempt {
  Model model;  ///< the quantized model
  quant::Annotations annotations;
  std::string quantizer_name;
  size_t kept_float = 0, observers = 0;
  int64_t calibrated = 0;
  quant::ConvertStats stats;
  std::unique_ptr<Model> simulated;  ///< the report's quantized model, weights dequantized once
  std::unique_ptr<quant::AccuracyReport> accuracy;
};

// What every attempt shares: the float model (BatchNorm folded), its session, the data.
struct QuantJob {
  const QuantArgs& args;
  Model float_model;
  Target target;
  std::unique_ptr<Session> session;  ///< on float_model: calibration and the report's float runs
  std::vector<std::string> files, eval_files;
  int64_t calib_count = -1, eval_from = -1, eval_count = -1;
  std::string label;  ///< what the progress line says of the quantization (--min-sqnr's search)
  quant::MaybeSetting command_line;
  bool tty = false;

  Result<Attempt> run(const quant::QuantizerConfig& config, bool evaluate) {
    const Graph& g = float_model.graph;
    Attempt a;
    const std::unique_ptr<quant::Quantizer> quantizer = quant::configured_quantizer(g, config, command_line, &a.kept_float);
    a.quantizer_name = quantizer->name().empty() ? "no quantizer" : quantizer->name();
    KILN_RETURN_IF_ERROR(quantizer->annotate(g, a.annotations));
    KILN_ASSIGN_OR_RETURN(quant::Prepared prepared, quant::prepare(g, a.annotations));
    a.observers = prepared.groups.size();
    quant::Calibrator calibrator(g, prepared);
    session->set_observer(&calibrator);
    Status calibrated;
    if (!prepared.watch.empty() && files.empty())  // a config's static setting under --dynamic / --weight-only
      return user_error("", "static quantization needs calibration inputs (--calib FILE.npz or DIR)");
    if (!prepared.watch.empty()) {  // weights alone (weight-only, dynamic) were observed by prepare
      Progress progress(tty, "calibrating" + label, calib_count);
      calibrated = for_each_sample(g, files, 0, calib_count, [&](const std::vector<Tensor>& sample) -> Status {
        KILN_RETURN_IF_ERROR(calibrator.observe_inputs(sample));
        KILN_RETURN_IF_ERROR(session->run(sample).status());
        KILN_RETURN_IF_ERROR(calibrator.status());
        progress.tick(++a.calibrated);
        return {};
      });
    }
    session->set_observer(nullptr);
    KILN_RETURN_IF_ERROR(calibrated);
    a.model = float_model;  // shares the constants
    KILN_ASSIGN_OR_RETURN(a.stats, quant::convert(a.model, prepared));
    // The float weights now stored quantized, and what BatchNorm folding left, are read no more.
    PassContext pass_context{target, {}};
    KILN_RETURN_IF_ERROR(eliminate_dead(a.model, pass_context).status());
    if (Status s = verify_model(a.model); !s.ok()) return internal_error("", "the quantized model does not verify: " + s.error().what);
    if (!evaluate) return a;
    // The quantized model with its weights dequantized once (as compile folds them), so that its
    // convolutions and matrix products run on the fast float kernels: the same values.
    a.simulated = std::make_unique<Model>(a.model);
    KILN_RETURN_IF_ERROR(fold_constant_dequantize(a.simulated->graph).status());
    SessionOptions options;
    options.target = target;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Session> quantized, Session::create(*a.simulated, options));
    std::map<std::string, std::vector<std::string>> instance;  // anchor name -> its nodes
    for (const auto& [n, ann] : a.annotations) instance[g.nodes[ann.anchor].name].push_back(g.nodes[n].name);
    std::map<std::string, quant::PatternOf> patterns;
    for (const auto& [n, ann] : a.annotations) patterns[g.nodes[n].name] = {ann.pattern, instance[g.nodes[ann.anchor].name]};
    a.accuracy = std::make_unique<quant::AccuracyReport>(g, a.simulated->graph, patterns);
    Progress progress(tty, "evaluating" + label, eval_files.empty() ? eval_count : -1);
    auto add = [&](const std::vector<Tensor>& sample) -> Status {
      KILN_RETURN_IF_ERROR(a.accuracy->add_sample(*session, *quantized, sample));
      progress.tick(a.accuracy->samples());
      return {};
    };
    KILN_RETURN_IF_ERROR(eval_files.empty() ? for_each_sample(g, files, eval_from, -1, add) : for_each_sample(g, eval_files, 0, -1, add));
    return a;
  }
};

// --min-sqnr: the layers ranked by the noise each adds (one evaluation of the fully quantized
// model), then the fewest of the top ones kept float that bring the end-to-end SQNR to the
// target, found by bisection (a handful of quantizations, not one per layer).
Result<Attempt> meet_min_sqnr(QuantJob& job, const quant::QuantizerConfig& config, Attempt all, double target,
                              std::vector<std::string>& kept, std::vector<std::string>& excluded, int& attempts) {
  attempts = 1;
  if (all.accuracy->end_to_end_db() >= target) return all;
  std::vector<quant::LayerSqnr> ranking = all.accuracy->ranking_by_own_error();
  // Then the pattern instances whose output is not quantized (a linear layer writing a graph
  // output): no SQNR of their own, but keeping every instance float is the float model.
  const Graph& g = job.float_model.graph;
  std::set<std::string> covered;
  for (const quant::LayerSqnr& l : ranking) covered.insert(l.nodes.begin(), l.nodes.end());
  std::map<size_t, std::vector<std::string>> instances;
  for (const auto& [n, ann] : all.annotations) instances[ann.anchor].push_back(g.nodes[n].name);
  for (const auto& [anchor, nodes] : instances)
    if (!covered.count(g.nodes[anchor].name)) {
      quant::LayerSqnr l;
      l.node = g.nodes[anchor].name;
      l.nodes = nodes;
      ranking.push_back(std::move(l));
    }
  auto excluding = [&](size_t k) {
    quant::QuantizerConfig c = config;
    for (size_t i = 0; i < k && i < ranking.size(); ++i)
      for (const std::string& n : ranking[i].nodes.empty() ? std::vector<std::string>{ranking[i].node} : ranking[i].nodes)
        c.nodes[n] = quant::MaybeSetting{};
    return c;
  };
  size_t lo = 1, hi = ranking.size();
  std::optional<Attempt> best;
  size_t best_k = ranking.size();
  while (lo <= hi) {
    const size_t mid = lo + (hi - lo) / 2;
    job.label = " (" + std::to_string(mid) + " layers float)";
    KILN_ASSIGN_OR_RETURN(Attempt a, job.run(excluding(mid), true));
    ++attempts;
    if (a.accuracy->end_to_end_db() >= target) {
      best = std::move(a);
      best_k = mid;
      if (mid == 1) break;
      hi = mid - 1;
    } else {
      lo = mid + 1;
    }
  }
  if (!best) {  // every layer float: the float model itself
    KILN_ASSIGN_OR_RETURN(Attempt a, job.run(excluding(ranking.size()), true));
    ++attempts;
    best = std::move(a);
  }
  for (size_t i = 0; i < best_k && i < ranking.size(); ++i) {
    kept.push_back(ranking[i].node);
    for (const std::string& n : ranking[i].nodes.empty() ? std::vector<std::string>{ranking[i].node} : ranking[i].nodes) excluded.push_back(n);
  }
  return std::move(*best);
}

int run_quant(const QuantArgs& args, const std::string& cmdline) {
  const std::string verb = "quant";
  if (args.output.empty()) return report(verb, user_error("", "no output given (-o OUT.kiln)"));
  if (Status s = check_output_paths({&args.output, &args.exclude_out}); !s.ok()) return report(verb, s);
  if (!args.quantizer.empty() && args.quantizer != "x86" && args.quantizer != "xnnpack")
    return report(verb, user_error("", "--quantizer '" + args.quantizer + "' is not one of x86, xnnpack"));
  if (args.per_tensor && args.quantizer != "xnnpack")
    return report(verb, user_error("", "--per-tensor is for the xnnpack quantizer (x86 weights are per channel)"));
  quant::QuantizerConfig config;
  if (!args.config.empty()) {
    auto text = read_input(args.config);
    if (!text.ok()) return report(verb, text.error());
    auto parsed = quant::parse_quantizer_config(*text, args.config);
    if (!parsed.ok()) return report(verb, parsed.error());
    config = std::move(*parsed);
  }
  if (!args.weight_only.empty() && args.weight_only != "int8" && args.weight_only != "int4")
    return report(verb, user_error("", "--weight-only '" + args.weight_only + "' is not one of int8, int4"));
  if (!args.weight_only.empty() && (!args.quantizer.empty() || args.dynamic || args.per_tensor))
    return report(verb, user_error("", "--weight-only quantizes the weights alone: it takes no --quantizer, --dynamic or --per-tensor"));
  if (args.group_size && args.weight_only.empty()) return report(verb, user_error("", "--group-size goes with --weight-only"));
  if (args.quantizer.empty() && args.weight_only.empty() && !config.global)
    return report(verb, user_error("", "no quantizer given (--quantizer x86|xnnpack, --weight-only int8|int4, or \"global\" in --config)"));
  if (args.dynamic && args.quantizer != "x86")
    return report(verb, user_error("", "--dynamic is for --quantizer x86 (u8 activations quantized at run time)"));
  // (With --config, whether any setting needs calibration is known once it has annotated.)
  if (args.calib.empty() && !args.dynamic && args.weight_only.empty() && args.config.empty())
    return report(verb, user_error("", "static quantization needs calibration inputs (--calib FILE.npz or DIR)"));
  auto files = calibration_sets(args.calib);
  if (!files.ok()) return report(verb, files.error());
  const bool evaluate = args.report || args.min_sqnr;
  if (!args.eval.empty() && !evaluate) return report(verb, user_error("", "--eval goes with --report or --min-sqnr"));
  if (args.json && !args.report) return report(verb, user_error("", "--json goes with --report"));
  if (!args.exclude_out.empty() && !args.min_sqnr) return report(verb, user_error("", "--exclude-out goes with --min-sqnr"));
  if (args.report && args.output == "-") return report(verb, user_error("", "--report prints on stdout: write the model to a file (-o)"));
  std::vector<std::string> eval_files;
  if (!args.eval.empty()) {
    auto e = calibration_sets(args.eval);
    if (!e.ok()) return report(verb, e.error());
    eval_files = std::move(*e);
  }

  const std::string display = args.input == "-" ? "<stdin>" : args.input;
  // The file is mapped once: hashed for the provenance where it lies, then decoded (the constants
  // view the mapping; stdin's bytes are read and copied).
  std::string input_sha256;
  Result<Model> model = Error{};
  {
    auto loaded = load_model_arg_hashed(args.input);
    if (!loaded.ok()) return report(verb, loaded.error());
    input_sha256 = std::move(loaded->sha256);
    model = std::move(loaded->model);
  }
  if (model->stage != Stage::exported)
    return report(verb, user_error(display, "is " + std::string(stage_name(model->stage)) +
                                                "; quantize the exported model (before kiln compile)"));
  QuantJob job{args, std::move(*model)};
  job.files = std::move(*files);
  job.eval_files = std::move(eval_files);
  job.tty = isatty(STDERR_FILENO);
  if (!args.quantizer.empty()) job.command_line = quant::QuantizerSetting{args.quantizer, args.per_tensor, args.dynamic};
  if (!args.weight_only.empty()) {
    quant::QuantizerSetting w;
    w.weight_only_bits = args.weight_only == "int8" ? 8 : 4;
    w.group_size = args.group_size.value_or(quant::default_group_size(w.weight_only_bits));
    job.command_line = w;
  }
  // As prepare_pt2e does first: BatchNorm folded into the convolution before it, so that the
  // quantized weights are the folded ones and Conv + Relu is one pattern.
  job.target.threads = thread_arg(verb, args.threads);
  PassContext pass_context{job.target, {}};
  if (auto r = fold_batchnorm(job.float_model, pass_context); !r.ok()) return report(verb, with_file(r.status(), display));
  // And weights computed from constants (a tied LM head's Transpose) folded, so that the
  // quantizers see them as the constant weights they are.
  if (auto r = fold_computed_weights(job.float_model.graph); !r.ok()) return report(verb, with_file(r.status(), display));
  const Graph& g = job.float_model.graph;
  SessionOptions options;
  options.target = job.target;
  auto session = Session::create(job.float_model, options);
  if (!session.ok()) return report(verb, with_file(session.status(), display));
  job.session = std::move(*session);
  // Without --eval, the evaluation takes the last quarter of the calibration samples.
  if (evaluate && job.eval_files.empty() && job.files.empty())
    return report(verb, user_error("", std::string(args.report ? "--report" : "--min-sqnr") + " needs evaluation inputs (--eval, or --calib)"));
  if (evaluate && job.eval_files.empty()) {
    auto total = count_samples(g, job.files);
    if (!total.ok()) return report(verb, total.error());
    if (*total < 2)
      return report(verb, user_error("", std::string(args.report ? "--report" : "--min-sqnr") +
                                             " needs --eval or at least 2 calibration samples (the last quarter evaluates)"));
    job.eval_from = *total - *total / 4;
    job.eval_count = *total - job.eval_from;
  }
  job.calib_count = args.calib_limit > 0 ? args.calib_limit : -1;
  if (job.eval_from >= 0) job.calib_count = job.calib_count < 0 ? job.eval_from : std::min(job.calib_count, job.eval_from);

  auto first = job.run(config, evaluate);
  if (!first.ok()) return report(verb, with_file(first.status(), display));
  const double all_quantized_db = evaluate ? first->accuracy->end_to_end_db() : 0;
  std::vector<std::string> kept, excluded;
  int attempts = 1;
  Result<Attempt> chosen = std::move(first);
  if (args.min_sqnr) {
    chosen = meet_min_sqnr(job, config, std::move(*chosen), *args.min_sqnr, kept, excluded, attempts);
    if (!chosen.ok()) return report(verb, with_file(chosen.status(), display));
  }
  Attempt& a = *chosen;
  // The settings that made it, for `kiln inspect` (and to reuse as a --config).
  quant::QuantizerConfig used = config;
  for (const std::string& n : excluded) used.nodes[n] = quant::MaybeSetting{};
  auto& md = a.model.metadata;
  md.erase(std::remove_if(md.begin(), md.end(), [](const auto& kv) { return kv.first == "kiln.quant_config"; }), md.end());
  md.emplace_back("kiln.quant_config", quant::quantizer_config_json(used, job.command_line));
  std::sort(md.begin(), md.end());
  Provenance p;
  p.tool = "kiln quant";
  p.version = std::string(kiln_version());
  p.command = cmdline;
  p.input_file = args.input == "-" ? display : fs::path(args.input).filename().string();
  p.input_sha256 = input_sha256;
  a.model.provenance.push_back(std::move(p));

  std::map<std::string, int> patterns;
  for (const auto& [n, ann] : a.annotations) ++patterns[ann.pattern];
  std::cerr << "kiln quant: " << a.quantizer_name << ": " << a.annotations.size() << " of " << g.nodes.size() << " nodes annotated";
  if (!args.config.empty() || !kept.empty())
    std::cerr << " (" << a.kept_float << " kept float by "
              << (kept.empty() ? "--config" : args.config.empty() ? "--min-sqnr" : "--config and --min-sqnr") << ")";
  // Nodes per pattern: a conv + relu pattern is two nodes.
  for (const auto& [pattern, count] : patterns) std::cerr << (pattern == patterns.begin()->first ? " (nodes per pattern: " : ", ") << pattern << " " << count;
  std::cerr << (patterns.empty() ? "" : ")") << "; " << count_of(a.observers, "observer", "observers") << ", calibrated on "
            << count_of(a.calibrated, "sample", "samples") << "; " << a.stats.quantize_nodes << " QuantizeLinear, " << a.stats.dequantize_nodes
            << " DequantizeLinear, " << count_of(a.stats.quantized_weights, "weight", "weights") << " stored quantized";
  if (a.stats.dynamic_quantize_nodes) std::cerr << ", " << a.stats.dynamic_quantize_nodes << " DynamicQuantizeLinear";
  std::cerr << "\n";
  if (args.verbose)
    for (const auto& [n, ann] : a.annotations)
      std::cerr << "kiln quant: node '" << escape_controls(g.nodes[n].name) << "': " << ann.pattern << (args.config.empty() ? "" : " (" + ann.quantizer + ")") << "\n";
  if (args.min_sqnr) {
    std::cerr << "kiln quant: --min-sqnr " << db_text(*args.min_sqnr) << ": end-to-end SQNR " << db_text(a.accuracy->end_to_end_db())
              << " dB with " << kept.size() << (kept.size() == 1 ? " layer" : " layers") << " kept float (" << db_text(all_quantized_db)
              << " dB with all quantized; " << attempts << (attempts == 1 ? " quantization" : " quantizations") << ")";
    for (size_t i = 0; i < kept.size(); ++i) std::cerr << (i ? ", " : ": ") << escape_controls(kept[i]);
    std::cerr << "\n";
    if (!args.exclude_out.empty())  // the choice as a --config file that reproduces it
      if (Status s = write_output(args.exclude_out, quant::quantizer_config_json(used, job.command_line)); !s.ok()) return report(verb, s);
  }
  if (args.report) {
    std::string source = "--eval";
    if (job.eval_files.empty())
      source = "the last " + std::to_string(a.accuracy->samples()) + " of the --calib samples, held out of calibration";
    print_report(*a.accuracy, source, args.json);
  }
  // The output's extension picks the format: .onnx is standard ONNX in QDQ form.
  if (fs::path(args.output).extension() == ".onnx") {
    auto bytes = write_onnx(a.model);
    if (!bytes.ok()) return report(verb, with_file(bytes.status(), args.output));
    return report(verb, write_output(args.output, *bytes));
  }
  return report(verb, write_model_output(a.model, args.output));
}

}  // namespace

void add_quant_command(CLI::App& app, int& exit_code, const std::string& cmdline) {
  auto args = std::make_shared<QuantArgs>();
  CLI::App* cmd = app.add_subcommand("quant", "Quantize an exported model (PT2E-style: annotate, calibrate, convert to Q/DQ)");
  cmd->add_option("input", args->input, "exported .kiln model (- for stdin)")->required();
  cmd->add_option("-o,--output", args->output, "quantized .kiln model (- for stdout), or .onnx: standard ONNX in QDQ form");
  cmd->add_option("--quantizer", args->quantizer,
                  "x86 (u8 activations, i8 per-channel weights) or xnnpack (i8 / i8 symmetric); required unless --config "
                  "has a global setting");
  cmd->add_option("--config", args->config,
                  "JSON: quantizer settings per node name, op type and global (null: stays float); see the README");
  cmd->add_option("--calib", args->calib,
                  "calibration inputs: an .npz of arrays named after the inputs, a folder of <input>.npy files or an ONNX "
                  "test_data_set (input_K.pb), or a folder of any of these (repeatable); a leading batch dim is split into samples");
  cmd->add_option("--calib-limit", args->calib_limit, "use at most this many samples")->check(whole_number(1));
  cmd->add_flag("--dynamic", args->dynamic,
                "x86: dynamic quantization of the linear layers (inputs quantized at run time from their range, weights "
                "per channel; no calibration needed)");
  cmd->add_option("--weight-only", args->weight_only,
                  "int8 | int4: store the linear layers' weights quantized (int8 symmetric, int4 u4 affine), activations "
                  "float; no calibration needed");
  cmd->add_option("--group-size", args->group_size,
                  "with --weight-only: input features per weight scale; 0: one scale per output channel (int8's "
                  "default; int4's is 128)")
      ->check(whole_number(0));
  cmd->add_flag("--per-tensor", args->per_tensor, "xnnpack: one weight scale per tensor instead of per output channel");
  cmd->add_option("--threads", args->threads, "threads for the calibration runs (default: the physical cores it may use, within its CPU quota)")
      ->check(thread_count());
  add_max_memory_option(cmd);
  cmd->add_flag("--report", args->report,
                "print each quantized layer's SQNR against the float model (worst first) and each output's, on --eval "
                "inputs or the last quarter of the --calib ones (then held out of calibration)");
  cmd->add_option("--eval", args->eval, "evaluation inputs for --report, in --calib's forms (repeatable)");
  cmd->add_flag("--json", args->json, "with --report: the report as JSON on stdout");
  cmd->add_option("--min-sqnr", args->min_sqnr,
                  "keep the fewest layers float (the ones adding the most noise first) that bring the end-to-end SQNR on "
                  "the evaluation inputs to this many dB");
  cmd->add_option("--exclude-out", args->exclude_out, "with --min-sqnr: write the layers kept float as a --config file");
  cmd->add_flag("-v,--verbose", args->verbose, "print each annotated node's pattern");
  cmd->callback([args, &exit_code, cmdline] { exit_code = run_quant(*args, cmdline); });
}

}  // namespace kiln::cli
