// `kiln inspect M.kiln`: what a model is (summary, --json, or the full --text form).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <set>
#include <iostream>

#include "cli/app.h"
#include "formats/serialize.h"
#include "formats/summary.h"
#include "formats/text.h"

namespace kiln::cli {

namespace {

struct InspectArgs {
  std::string model;
  bool json = false;
  bool text = false;
};

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (v >= 1000 && p < 5) { v /= 1000; ++p; }
  char buf[64];
  std::snprintf(buf, sizeof buf, p ? "%.2f %s%s" : "%.0f %s%s", v, prefixes[p], unit);
  return buf;
}

// How a quantized operand is stored: "u8 per tensor", "i8 per channel (64)".
std::string quantized_as(const Graph& g, const Node& dq) {
  const Value& scale = g.value(dq.inputs[1]);
  std::string s = std::string(dtype_name(g.value(dq.inputs[0]).dtype));
  if (dq.has_attr("block_size") && dq.attr_int("block_size", 0) > 0) return s + " in blocks of " + std::to_string(dq.attr_int("block_size", 0));
  if (scale.shape.rank() == 1 && scale.shape.dims[0].is_known() && scale.shape.dims[0].value > 1)
    return s + " per channel (" + std::to_string(scale.shape.dims[0].value) + ")";
  return s + (scale.is_constant() ? " per tensor" : " per tensor, at run time");
}

// One quantized layer: a node that reads a dequantized operand (or is one of compile's int8 or
// weight-only ops), with how its inputs and weights are stored and how its output leaves it.
struct QuantizedLayer {
  std::string name, op;
  std::string stored;  ///< "in u8 per tensor, weight i8 per channel (64)"
  std::string out;     ///< "u8", or "f32"
};

// The quantizer settings kiln quant recorded (its --config form), or null.
nlohmann::json quant_config(const Model& model) {
  for (const auto& [key, value] : model.metadata)
    if (key == "kiln.quant_config") {
      nlohmann::json j = nlohmann::json::parse(value, nullptr, false);
      return j.is_discarded() ? nlohmann::json(value) : j;
    }
  return nullptr;
}

std::vector<QuantizedLayer> quantized_layers(const Model& model) {
  const Graph& g = model.graph;
  const std::vector<int32_t> producers = g.producers();
  const std::vector<std::vector<Use>> uses = g.uses();
  auto producer = [&](ValueId v) -> const Node* {
    const int32_t p = v >= 0 ? producers[static_cast<size_t>(v)] : -1;
    return p >= 0 ? &g.nodes[static_cast<size_t>(p)] : nullptr;
  };
  std::vector<QuantizedLayer> layers;
  for (const Node& n : g.nodes) {
    if (n.op == "QuantizeLinear" || n.op == "DequantizeLinear" || n.op == "DynamicQuantizeLinear" || n.op == "Transpose") continue;
    const bool int8_in = !n.inputs.empty() && n.inputs[0] >= 0 &&
                         (g.value(n.inputs[0]).dtype == DType::u8 || g.value(n.inputs[0]).dtype == DType::i8);
    const bool int8_op = n.op == "QFusedConv" || n.op == "QFusedMatMul" || n.op == "QAdd" || int8_in;
    std::string line;
    if (n.op == "WoqFusedMatMul") {  // compile's weight-only layer: f32 in, the weight's codes
      line = "in f32, weight " + std::string(dtype_name(g.value(n.inputs[1]).dtype));
      if (n.attr_int("block_size", 0) > 0) line += " in blocks of " + std::to_string(n.attr_int("block_size", 0));
    } else if (int8_op) {
      line = "in " + std::string(dtype_name(g.value(n.inputs[0]).dtype));
      if (n.op == "QFusedConv" || n.op == "QFusedMatMul") line += ", weight " + std::string(dtype_name(g.value(n.inputs[3]).dtype));
    } else {
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const Node* p = producer(n.inputs[i]);
        if (!p || p->op != "DequantizeLinear") continue;
        const bool weight = g.value(p->inputs[0]).is_constant();
        line += std::string(line.empty() ? "" : ", ") + (weight ? "weight " : "in ") + quantized_as(g, *p);
      }
      if (line.empty()) continue;
    }
    // The output as the next layer reads it: quantized by a QuantizeLinear after it, or after
    // the activation / residual add its pattern ends with.
    std::string out = "f32";
    if (!n.outputs.empty() && n.outputs[0] >= 0) {
      ValueId y = n.outputs[0];
      if (g.value(y).dtype != DType::f32) out = std::string(dtype_name(g.value(y).dtype));
      for (int hop = 0; hop < 3 && out == "f32"; ++hop) {
        const std::vector<Use>& us = uses[static_cast<size_t>(y)];
        for (const Use& u : us)
          if (u.slot != Use::kCaptured && g.nodes[u.node].op == "QuantizeLinear")
            out = std::string(dtype_name(g.value(g.nodes[u.node].outputs[0]).dtype));
        const bool passes = us.size() == 1 && us[0].slot != Use::kCaptured &&
                            std::set<std::string, std::less<>>{"Relu", "Clip", "Add", "LeakyRelu", "HardSwish", "Tanh", "Gelu"}.count(g.nodes[us[0].node].op);
        if (!passes || g.nodes[us[0].node].outputs.empty()) break;
        y = g.nodes[us[0].node].outputs[0];
      }
    }
    layers.push_back({n.name, n.op, line, out});
  }
  return layers;
}

// The quantizer settings and the quantized layers, as text.
void print_quantized_layers(const Model& model) {
  const nlohmann::json config = quant_config(model);
  if (!config.is_null()) std::cout << "quantizer config: " << escape_controls(config.is_string() ? config.get<std::string>() : config.dump()) << "\n";
  const std::vector<QuantizedLayer> layers = quantized_layers(model);
  if (layers.empty()) return;
  std::cout << "quantized layers: " << layers.size() << "\n";
  for (const QuantizedLayer& l : layers) std::cout << "  " << escape_controls(l.name) << " (" << l.op << "): " << l.stored << "; out " << l.out << "\n";
}

int inspect(const InspectArgs& args) {
  const std::string verb = "inspect";
  auto model = load_model_arg(args.model);
  if (!model.ok()) return report(verb, model.error());
  if (args.text) {
    std::cout << model_to_text(*model);
    return 0;
  }
  ModelSummary s = summarize(*model);
  if (args.json) {  // the summary, and (quantized models) the quantizer settings and layers
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(summary_json(*model, s));
    if (const nlohmann::json config = quant_config(*model); !config.is_null()) j["quant_config"] = nlohmann::ordered_json::parse(config.dump());
    if (const std::vector<QuantizedLayer> layers = quantized_layers(*model); !layers.empty()) {
      j["quantized_layers"] = nlohmann::ordered_json::array();
      for (const QuantizedLayer& l : layers)
        j["quantized_layers"].push_back({{"name", l.name}, {"op", l.op}, {"stored", l.stored}, {"out", l.out}});
    }
    std::cout << j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
  }
  const Graph& g = model->graph;
  std::cout << "stage: " << stage_name(model->stage) << "\n";
  for (const Provenance& p : model->provenance)
    std::cout << "provenance: " << escape_controls(p.tool) << " " << escape_controls(p.version) << " from " << escape_controls(p.input_file)
              << " (sha256 " << escape_controls(p.input_sha256.substr(0, 16)) << "…): " << escape_controls(p.command) << "\n";
  if (const TargetRecord* t = model->target ? &*model->target : nullptr) {
    std::string isa;
    for (const std::string& f : t->isa) isa += (isa.empty() ? "" : " ") + f;
    std::cout << "target: " << escape_controls(t->device) << " (" << escape_controls(isa.empty() ? "baseline" : isa) << "), " << t->threads
              << (t->threads == 1 ? " thread" : " threads") << "\n";
  }
  if (const MemoryPlanRecord* mp = model->memory_plan ? &*model->memory_plan : nullptr)
    std::cout << "memory plan: arena " << human(static_cast<double>(mp->arena_bytes), "B") << " for " << mp->values.size()
              << " values, workspace " << human(static_cast<double>(mp->workspace_bytes), "B") << "\n";
  for (ValueId id : g.inputs)
    std::cout << "input  " << escape_controls(g.value(id).name) << ": " << dtype_name(g.value(id).dtype) << " " << g.value(id).shape.str() << "\n";
  for (ValueId id : g.outputs)
    std::cout << "output " << escape_controls(g.value(id).name) << ": " << dtype_name(g.value(id).dtype) << " " << g.value(id).shape.str() << "\n";
  std::cout << "nodes: " << s.nodes << "\nparameters: " << s.parameters << " (" << human(static_cast<double>(s.parameter_bytes), "B")
            << ")\nflops: " << s.flops << " (" << human(static_cast<double>(s.flops), "FLOP") << ", batch 1 where symbolic)\n"
            << "bytes: " << s.bytes << " (" << human(static_cast<double>(s.bytes), "B")
            << " read and written by the kernels, batch 1 where symbolic)\nops:\n";
  for (const auto& [op, n] : s.op_counts) std::cout << "  " << escape_controls(op) << " " << n << "\n";
  print_quantized_layers(*model);
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Summarise a .kiln model");
  cmd->add_option("model", args->model, "model .kiln file (- for stdin)")->required();
  add_max_memory_option(cmd);
  auto* json = cmd->add_flag("--json", args->json, "machine-readable summary");
  cmd->add_flag("--text", args->text, "the whole graph as diffable text")->excludes(json);
  cmd->callback([args, &exit_code] { exit_code = inspect(*args); });
}

}  // namespace kiln::cli
