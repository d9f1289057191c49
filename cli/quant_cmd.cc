// `kiln quant IN.kiln -o OUT.kiln --quantizer x86|xnnpack --calib FILE.npz|DIR`: static
// post-training quantization as PT2E does it — annotate, prepare, calibrate on the user's files,
// convert to explicit QuantizeLinear / DequantizeLinear.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>

#include "cli/app.h"
#include "cli/inputs.h"
#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/verify.h"
#include "formats/npy.h"
#include "formats/serialize.h"
#include "formats/sha256.h"
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

// The samples of one calibration set, in graph.inputs order: a leading dim larger than the
// model's (1 or symbolic) is a batch of samples, split one by one.
Result<std::vector<std::vector<Tensor>>> file_samples(const Graph& g, const std::string& file) {
  KILN_ASSIGN_OR_RETURN(NamedTensors arrays, read_set(g, file));
  std::map<std::string, Tensor> by_name(arrays.begin(), arrays.end());
  std::vector<Tensor> inputs;
  int64_t count = -1;
  std::vector<bool> split;
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
    split.push_back(splits);
    inputs.push_back(t);
  }
  std::vector<std::vector<Tensor>> samples;
  for (int64_t i = 0; i < std::max<int64_t>(count, 1); ++i) {
    std::vector<Tensor> s;
    for (size_t k = 0; k < inputs.size(); ++k) s.push_back(split[k] ? row(inputs[k], i) : inputs[k]);
    samples.push_back(std::move(s));
  }
  return samples;
}

// Calls fn on the samples of `files` in order, from sample `first` on, `count` of them at most
// (-1: all); one file's arrays are in memory at a time.
template <class F>
Status for_each_sample(const Graph& g, const std::vector<std::string>& files, int64_t first, int64_t count, F&& fn) {
  int64_t index = 0, done = 0;
  for (const std::string& file : files) {
    if (count >= 0 && done >= count) break;
    KILN_ASSIGN_OR_RETURN(auto samples, file_samples(g, file));
    for (const auto& sample : samples) {
      if (count >= 0 && done >= count) break;
      if (index++ < first) continue;
      KILN_RETURN_IF_ERROR(with_file(fn(sample), file));
      ++done;
    }
  }
  return {};
}

Result<int64_t> count_samples(const Graph& g, const std::vector<std::string>& files) {
  int64_t n = 0;
  for (const std::string& file : files) {
    KILN_ASSIGN_OR_RETURN(auto samples, file_samples(g, file));
    n += static_cast<int64_t>(samples.size());
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
  for (const auto& [name, s] : r.outputs()) std::cout << "  output '" << name << "': " << db_text(s.db()) << "\n";
  std::cout << "  per layer, as the next layer reads it, worst first:\n";
  std::cout << "  SQNR dB  node (pattern)\n";
  for (const quant::LayerSqnr& l : r.layers()) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%7s", db_text(l.sqnr.db()).c_str());
    std::cout << "  " << buf << "  " << l.node << (l.pattern.empty() ? "" : " (" + l.pattern + ")") << "\n";
  }
}

int run_quant(const QuantArgs& args, const std::string& cmdline) {
  const std::string verb = "quant";
  if (args.output.empty()) return report(verb, user_error("", "no output given (-o OUT.kiln)"));
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
  if (args.quantizer.empty() && !config.global)
    return report(verb, user_error("", "no quantizer given (--quantizer x86|xnnpack, or \"global\" in --config)"));
  quant::MaybeSetting command_line;
  if (!args.quantizer.empty()) command_line = quant::QuantizerSetting{args.quantizer, args.per_tensor};
  if (args.calib.empty()) return report(verb, user_error("", "static quantization needs calibration inputs (--calib FILE.npz or DIR)"));
  auto files = calibration_sets(args.calib);
  if (!files.ok()) return report(verb, files.error());
  if ((!args.eval.empty() || args.json) && !args.report) return report(verb, user_error("", "--eval and --json go with --report"));
  if (args.report && args.output == "-") return report(verb, user_error("", "--report prints on stdout: write the model to a file (-o)"));
  std::vector<std::string> eval_files;
  if (!args.eval.empty()) {
    auto e = calibration_sets(args.eval);
    if (!e.ok()) return report(verb, e.error());
    eval_files = std::move(*e);
  }

  const std::string display = args.input == "-" ? "<stdin>" : args.input;
  // The file's bytes are read once: hashed for the provenance, then decoded (the constants view
  // a copy of them, so the bytes are freed before calibration runs).
  std::string input_sha256;
  Result<Model> model = Error{};
  {
    auto bytes = read_input(args.input);
    if (!bytes.ok()) return report(verb, bytes.error());
    std::span<const uint8_t> raw(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
    input_sha256 = sha256_hex(raw);
    model = load_model_from_bytes(raw, display, {}, args.input == "-" ? "" : fs::path(args.input).parent_path().string());
  }
  if (!model.ok()) return report(verb, model.error());
  if (model->stage != Stage::exported)
    return report(verb, user_error(display, "is " + std::string(stage_name(model->stage)) +
                                                "; quantize the exported model (before kiln compile)"));
  // As prepare_pt2e does first: BatchNorm folded into the convolution before it, so that the
  // quantized weights are the folded ones and Conv + Relu is one pattern.
  Target target;
  target.threads = args.threads > 0 ? args.threads : physical_cores();
  PassContext pass_context{target, {}};
  if (auto r = fold_batchnorm(*model, pass_context); !r.ok()) return report(verb, with_file(r.status(), display));
  const Graph& g = model->graph;

  size_t kept_float = 0;
  const std::unique_ptr<quant::Quantizer> quantizer = quant::configured_quantizer(g, config, command_line, &kept_float);
  quant::Annotations annotations;
  if (Status s = quantizer->annotate(g, annotations); !s.ok()) return report(verb, with_file(s, display));
  auto prepared = quant::prepare(g, annotations);
  if (!prepared.ok()) return report(verb, with_file(prepared.status(), display));

  SessionOptions options;
  options.target = target;
  auto session = Session::create(*model, options);
  if (!session.ok()) return report(verb, with_file(session.status(), display));
  quant::Calibrator calibrator(g, *prepared);
  (*session)->set_observer(&calibrator);
  // Without --eval, --report holds the last quarter of the calibration samples apart.
  int64_t eval_from = -1;
  if (args.report && eval_files.empty()) {
    auto total = count_samples(g, *files);
    if (!total.ok()) return report(verb, total.error());
    if (*total < 2) return report(verb, user_error("", "--report needs --eval or at least 2 calibration samples (the last quarter evaluates)"));
    eval_from = *total - *total / 4;
  }
  int64_t seen = 0;
  const bool tty = isatty(STDERR_FILENO);
  int64_t calib_count = args.calib_limit > 0 ? args.calib_limit : -1;
  if (eval_from >= 0) calib_count = calib_count < 0 ? eval_from : std::min(calib_count, eval_from);
  Status calibrated = for_each_sample(g, *files, 0, calib_count, [&](const std::vector<Tensor>& sample) -> Status {
    KILN_RETURN_IF_ERROR(calibrator.observe_inputs(sample));
    KILN_RETURN_IF_ERROR((*session)->run(sample).status());
    KILN_RETURN_IF_ERROR(calibrator.status());
    ++seen;
    if (tty) std::fprintf(stderr, "\rkiln quant: calibrating, %lld samples", static_cast<long long>(seen));
    return {};
  });
  if (!calibrated.ok()) return report(verb, calibrated.error());
  if (tty) std::fprintf(stderr, "\r\033[K");
  (*session)->set_observer(nullptr);
  session->reset();

  const size_t float_nodes = g.nodes.size();  // before convert adds the Q/DQ
  const Model float_model = *model;  // for --report (it shares the constants)
  std::map<std::string, std::string> pattern_of;
  for (const auto& [n, a] : annotations) pattern_of[g.nodes[n].name] = a.pattern;
  std::vector<std::string> annotated_names;
  for (const auto& [n, a] : annotations)
    annotated_names.push_back("node '" + g.nodes[n].name + "': " + a.pattern + (args.config.empty() ? "" : " (" + a.quantizer + ")"));
  auto stats = quant::convert(*model, *prepared);
  if (!stats.ok()) return report(verb, with_file(stats.status(), display));
  // The float weights now stored quantized, and what BatchNorm folding left, are read no more.
  if (auto r = eliminate_dead(*model, pass_context); !r.ok()) return report(verb, with_file(r.status(), display));
  if (Status s = verify_model(*model); !s.ok())
    return report(verb, Error{ErrorKind::internal, display, "", "the quantized model does not verify: " + s.error().what});
  Provenance p;
  p.tool = "kiln quant";
  p.version = std::string(kiln_version());
  p.command = cmdline;
  p.input_file = args.input == "-" ? display : fs::path(args.input).filename().string();
  p.input_sha256 = input_sha256;
  model->provenance.push_back(std::move(p));

  std::map<std::string, int> patterns;
  for (const auto& [n, a] : annotations) ++patterns[a.pattern];
  const std::string quantizer_name = quantizer->name().empty() ? "no quantizer" : quantizer->name();
  std::cerr << "kiln quant: " << quantizer_name << ": " << annotations.size() << " of " << float_nodes << " nodes annotated";
  if (!args.config.empty()) std::cerr << " (" << kept_float << " kept float by --config)";
  // Nodes per pattern: a conv + relu pattern is two nodes.
  for (const auto& [pattern, count] : patterns) std::cerr << (pattern == patterns.begin()->first ? " (nodes per pattern: " : ", ") << pattern << " " << count;
  std::cerr << (patterns.empty() ? "" : ")") << "; " << prepared->groups.size() << " observers, calibrated on " << seen
            << (seen == 1 ? " sample" : " samples") << "; " << stats->quantize_nodes << " QuantizeLinear, " << stats->dequantize_nodes
            << " DequantizeLinear, " << stats->quantized_weights << " weights stored quantized\n";
  if (args.verbose)
    for (const std::string& line : annotated_names) std::cerr << "kiln quant: " << line << "\n";

  if (args.report) {
    SessionOptions eval_options;
    eval_options.target = target;
    auto float_session = Session::create(float_model, eval_options);
    if (!float_session.ok()) return report(verb, with_file(float_session.status(), display));
    // The quantized model with its weights dequantized once (as compile folds them), so that its
    // convolutions and matrix products run on the fast float kernels: the same values.
    Model simulated = *model;
    if (auto folded = fold_constant_dequantize(simulated.graph); !folded.ok()) return report(verb, with_file(folded.status(), display));
    auto quantized_session = Session::create(simulated, eval_options);
    if (!quantized_session.ok()) return report(verb, with_file(quantized_session.status(), display));
    quant::AccuracyReport accuracy(float_model.graph, simulated.graph, pattern_of);
    auto add = [&](const std::vector<Tensor>& sample) { return accuracy.add_sample(**float_session, **quantized_session, sample); };
    Status evaluated = eval_files.empty() ? for_each_sample(g, *files, eval_from, -1, add) : for_each_sample(g, eval_files, 0, -1, add);
    if (!evaluated.ok()) return report(verb, evaluated.error());
    std::string source = "--eval";
    if (eval_files.empty()) source = "the last " + std::to_string(accuracy.samples()) + " of the --calib samples, held out of calibration";
    print_report(accuracy, source, args.json);
  }

  return report(verb, write_model_output(*model, args.output));
}

}  // namespace

void add_quant_command(CLI::App& app, int& exit_code, const std::string& cmdline) {
  auto args = std::make_shared<QuantArgs>();
  CLI::App* cmd = app.add_subcommand("quant", "Quantize an exported model (PT2E-style: annotate, calibrate, convert to Q/DQ)");
  cmd->add_option("input", args->input, "exported .kiln model (- for stdin)")->required();
  cmd->add_option("-o,--output", args->output, "quantized .kiln model (- for stdout)");
  cmd->add_option("--quantizer", args->quantizer,
                  "x86 (u8 activations, i8 per-channel weights) or xnnpack (i8 / i8 symmetric); required unless --config "
                  "has a global setting");
  cmd->add_option("--config", args->config,
                  "JSON: quantizer settings per node name, op type and global (null: stays float); see the README");
  cmd->add_option("--calib", args->calib,
                  "calibration inputs: an .npz of arrays named after the inputs, a folder of <input>.npy files or an ONNX "
                  "test_data_set (input_K.pb), or a folder of any of these (repeatable); a leading batch dim is split into samples");
  cmd->add_option("--calib-limit", args->calib_limit, "use at most this many samples")->check(CLI::PositiveNumber);
  cmd->add_flag("--per-tensor", args->per_tensor, "xnnpack: one weight scale per tensor instead of per output channel");
  cmd->add_option("--threads", args->threads, "threads for the calibration runs (default: the machine's physical cores)")
      ->check(CLI::PositiveNumber);
  add_max_memory_option(cmd);
  cmd->add_flag("--report", args->report,
                "print each quantized layer's SQNR against the float model (worst first) and each output's, on --eval "
                "inputs or the last quarter of the --calib ones (then held out of calibration)");
  cmd->add_option("--eval", args->eval, "evaluation inputs for --report, in --calib's forms (repeatable)");
  cmd->add_flag("--json", args->json, "with --report: the report as JSON on stdout");
  cmd->add_flag("-v,--verbose", args->verbose, "print each annotated node's pattern");
  cmd->callback([args, &exit_code, cmdline] { exit_code = run_quant(*args, cmdline); });
}

}  // namespace kiln::cli
