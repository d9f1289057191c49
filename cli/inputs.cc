#include "cli/inputs.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>

#include "cli/app.h"
#include "export/onnx_tensor.h"
#include "formats/memory.h"
#include "runtime/random_inputs.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<NamedTensors> read_one_input(const std::string& spec) {
  size_t eq = spec.find('=');
  std::string name = eq == std::string::npos ? "" : spec.substr(0, eq);
  std::string file = eq == std::string::npos ? spec : spec.substr(eq + 1);
  if (ends_with(file, ".pb")) {
    KILN_ASSIGN_OR_RETURN(auto named, read_onnx_tensor_file(file));
    return NamedTensors{{name.empty() ? named.first : name, std::move(named.second)}};
  }
  KILN_ASSIGN_OR_RETURN(NamedTensors t, read_tensors_file(file));
  if (!name.empty()) {
    if (t.size() != 1) return Error{ErrorKind::user, file, "", "holds " + std::to_string(t.size()) + " arrays; NAME=FILE needs a .npy"};
    t[0].first = name;
  }
  return t;
}

}  // namespace

void add_input_options(CLI::App* cmd, InputArgs& args) {
  cmd->add_option("--input", args.inputs, "NAME=FILE.npy or NAME=FILE.pb (repeatable); FILE alone names itself");
  cmd->add_option("--inputs", args.inputs_file, "an .npz of inputs, or an ONNX test_data_set folder");
  cmd->add_option("--seed", args.seed, "seed for inputs not given (random within valid ranges)")->capture_default_str();
  cmd->add_option("--input-shape", args.input_shapes,
                  "NAME=SHAPE of a random input, e.g. ids=1x128 (repeatable); other symbolic dims are 1");
}

std::vector<std::string> numbered_pb_files(const std::string& dir, const std::string& prefix) {
  std::map<int, std::string> found;
  std::regex re(prefix + "_([0-9]+)\\.pb");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, re)) found[std::stoi(m[1])] = entry.path().string();
  }
  std::vector<std::string> out;
  for (auto& [k, p] : found) out.push_back(p);
  return out;
}

Result<NamedTensors> read_pb_set(const std::string& dir, const std::string& prefix, const std::vector<std::string>& names) {
  NamedTensors out;
  std::vector<std::string> files = numbered_pb_files(dir, prefix);
  for (size_t k = 0; k < files.size(); ++k) {
    KILN_ASSIGN_OR_RETURN(auto named, read_onnx_tensor_file(files[k]));
    std::string name = named.first;
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      if (k >= names.size()) return Error{ErrorKind::user, files[k], "", "the model has only " + std::to_string(names.size()) + " " + prefix + "s"};
      name = names[k];
    }
    out.emplace_back(name, std::move(named.second));
  }
  return out;
}

Result<std::vector<Tensor>> gather_inputs(const Graph& g, const InputArgs& args, const std::string& model_file) {
  std::vector<std::string> input_names;
  for (ValueId id : g.inputs) input_names.push_back(g.value(id).name);
  auto is_input = [&](const std::string& name) { return std::find(input_names.begin(), input_names.end(), name) != input_names.end(); };

  NamedTensors given;
  if (!args.inputs_file.empty()) {
    std::error_code ec;
    KILN_ASSIGN_OR_RETURN(given, fs::is_directory(args.inputs_file, ec) ? read_pb_set(args.inputs_file, "input", input_names)
                                                                        : read_tensors_file(args.inputs_file));
  }
  for (const std::string& spec : args.inputs) {
    KILN_ASSIGN_OR_RETURN(NamedTensors one, read_one_input(spec));
    for (auto& nt : one) given.push_back(std::move(nt));
  }
  std::map<std::string, Tensor> feed;
  for (auto& [name, t] : given) {
    if (!is_input(name)) return Error{ErrorKind::user, model_file, "input '" + name + "'", "the model has no input of this name"};
    feed[name] = t;
  }
  // --input-shape NAME=1x128: the shape of a random input.
  std::map<std::string, std::vector<int64_t>> shaped;
  for (const std::string& spec : args.input_shapes) {
    KILN_ASSIGN_OR_RETURN(auto flag, parse_input_shape_flag(spec, "ids=1x128"));
    const std::string& name = flag.first;
    if (!flag.second.is_concrete())
      return user_error("", "--input-shape '" + spec + "': a random input needs numbers for every dim");
    if (!is_input(name))
      return Error{ErrorKind::user, model_file, "input '" + name + "'", "the model has no input of this name (--input-shape)"};
    if (feed.count(name))
      return Error{ErrorKind::user, model_file, "input '" + name + "'", "is given as data; --input-shape shapes random inputs only"};
    shaped[name] = flag.second.concrete();
  }
  std::map<std::string, int64_t> bound;
  for (ValueId id : g.inputs) {
    const Value& v = g.value(id);
    const std::vector<int64_t>* shape = nullptr;
    if (auto it = feed.find(v.name); it != feed.end()) shape = &it->second.shape();
    else if (auto s = shaped.find(v.name); s != shaped.end()) shape = &s->second;
    if (!shape || !v.shape.rank_known || shape->size() != v.shape.dims.size()) continue;
    for (size_t d = 0; d < v.shape.dims.size(); ++d)
      if (v.shape.dims[d].is_symbolic()) bound.emplace(v.shape.dims[d].symbol, (*shape)[d]);
  }
  for (ValueId id : g.inputs) {
    const Value& v = g.value(id);
    if (feed.count(v.name)) continue;
    std::vector<int64_t> shape;
    if (auto s = shaped.find(v.name); s != shaped.end()) {
      shape = s->second;
    } else {
      for (const Dim& d : v.shape.dims) {
        if (d.is_known()) shape.push_back(d.value);
        else if (d.is_symbolic() && bound.count(d.symbol)) shape.push_back(bound[d.symbol]);
        else shape.push_back(1);
      }
    }
    try {
      feed[v.name] = random_input(g, id, shape, input_seed(args.seed, v.name));
    } catch (const MemoryLimitExceeded& e) {
      return Error{ErrorKind::user, model_file, "input '" + v.name + "'", std::string("a random input of this shape ") + e.what()};
    }
  }
  std::vector<Tensor> ordered;
  for (const std::string& name : input_names) ordered.push_back(feed[name]);
  return ordered;
}

}  // namespace kiln::cli
