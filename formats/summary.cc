// Model summary for `kiln inspect`.
#include "formats/summary.h"

#include <nlohmann/json.hpp>

#include "formats/checked.h"
#include "formats/op_schema.h"
#include "formats/ops/bytes.h"
#include "formats/ops/flops.h"

namespace kiln {

int64_t node_flops(const Node& node, const Graph& graph) {
  const OpSchema* schema = core_ops().find(node.domain, node.op);
  return schema && schema->traits.flops ? schema->traits.flops(node, graph) : 0;
}

int64_t node_bytes(const Node& node, const Graph& graph) {
  const OpSchema* schema = core_ops().find(node.domain, node.op);
  return schema && schema->traits.bytes ? schema->traits.bytes(node, graph) : bytes::moved(node, graph);
}

ModelSummary summarize(const Model& model) {
  ModelSummary s;
  const Graph& g = model.graph;
  for (const Node& n : g.nodes) {
    ++s.op_counts[n.qualified_op()];
    ++s.nodes;
    s.flops = flops::saturate(CheckedInt(s.flops) + node_flops(n, g));
    s.bytes = flops::saturate(CheckedInt(s.bytes) + node_bytes(n, g));
  }
  for (const Value& v : g.values)
    if (v.is_constant()) {
      s.parameters += v.constant.numel();
      s.parameter_bytes += static_cast<int64_t>(v.constant.nbytes());
    }
  return s;
}

namespace {

// A shape as JSON: known dims as numbers, symbolic ones as their names, unknown ones null;
// null for an unknown rank.
nlohmann::ordered_json dims_json(const Shape& s) {
  if (!s.rank_known) return nullptr;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Dim& d : s.dims) {
    if (d.is_known()) out.push_back(d.value);
    else if (d.is_symbolic()) out.push_back(d.symbol);
    else out.push_back(nullptr);
  }
  return out;
}

nlohmann::ordered_json io_json(const Graph& g, const std::vector<ValueId>& ids) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (ValueId id : ids) {
    const Value& v = g.value(id);
    out.push_back({{"name", v.name}, {"dtype", dtype_name(v.dtype)}, {"shape", dims_json(v.shape)}});
  }
  return out;
}

}  // namespace

std::string summary_json(const Model& model, const ModelSummary& s) {
  nlohmann::ordered_json j;
  j["schema"] = "kiln.inspect";
  j["schema_version"] = 1;
  j["stage"] = stage_name(model.stage);
  j["nodes"] = s.nodes;
  j["parameters"] = s.parameters;
  j["parameter_bytes"] = s.parameter_bytes;
  j["flops"] = s.flops;
  j["bytes"] = s.bytes;
  j["inputs"] = io_json(model.graph, model.graph.inputs);
  j["outputs"] = io_json(model.graph, model.graph.outputs);
  j["ops"] = nlohmann::ordered_json::object();
  for (const auto& [op, n] : s.op_counts) j["ops"][op] = n;
  j["metadata"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : model.metadata) j["metadata"][k] = v;
  j["provenance"] = nlohmann::ordered_json::array();
  for (const Provenance& p : model.provenance)
    j["provenance"].push_back({{"tool", p.tool},
                               {"version", p.version},
                               {"command", p.command},
                               {"input_file", p.input_file},
                               {"input_sha256", p.input_sha256}});
  if (model.target)
    j["target"] = {{"device", model.target->device}, {"isa", model.target->isa}, {"threads", model.target->threads}};
  if (model.memory_plan)
    j["memory_plan"] = {{"arena_bytes", model.memory_plan->arena_bytes},
                        {"workspace_bytes", model.memory_plan->workspace_bytes},
                        {"values", model.memory_plan->values.size()}};
  std::map<std::string, int64_t> kernels;
  for (const Node& n : model.graph.nodes)
    if (!n.kernel.empty()) ++kernels[n.kernel.name];
  if (!kernels.empty()) j["kernels"] = kernels;
  // Names come from files: bytes that are not UTF-8 become U+FFFD rather than invalid JSON.
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace kiln
