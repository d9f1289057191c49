// Model summary for `kiln inspect`.
#include "formats/summary.h"

#include <cstdio>
#include <limits>
#include <sstream>

#include "formats/checked.h"
#include "formats/op_schema.h"
#include "formats/ops/flops.h"

namespace kiln {

int64_t node_flops(const Node& node, const Graph& graph) {
  const OpSchema* schema = core_ops().find(node.domain, node.op);
  return schema && schema->traits.flops ? schema->traits.flops(node, graph) : 0;
}

ModelSummary summarize(const Model& model) {
  ModelSummary s;
  const Graph& g = model.graph;
  for (const Node& n : g.nodes) {
    ++s.op_counts[n.qualified_op()];
    ++s.nodes;
    s.flops = flops::saturate(CheckedInt(s.flops) + node_flops(n, g));
  }
  for (const Value& v : g.values)
    if (v.is_constant()) {
      s.parameters += v.constant.numel();
      s.parameter_bytes += static_cast<int64_t>(v.constant.nbytes());
    }
  return s;
}

std::string json_escape(std::string_view in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

namespace {

std::string q(std::string_view s) { return "\"" + json_escape(s) + "\""; }

std::string dims_json(const Shape& s) {
  if (!s.rank_known) return "null";
  std::string out = "[";
  for (size_t i = 0; i < s.dims.size(); ++i) {
    if (i) out += ", ";
    const Dim& d = s.dims[i];
    out += d.is_known() ? std::to_string(d.value) : d.is_symbolic() ? q(d.symbol) : "null";
  }
  return out + "]";
}

std::string io_json(const Graph& g, const std::vector<ValueId>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    const Value& v = g.value(ids[i]);
    out += std::string(i ? ", " : "") + "{\"name\": " + q(v.name) + ", \"dtype\": " + q(dtype_name(v.dtype)) +
           ", \"shape\": " + dims_json(v.shape) + "}";
  }
  return out + "]";
}

}  // namespace

std::string summary_json(const Model& model, const ModelSummary& s) {
  std::ostringstream o;
  o << "{\n  \"schema\": \"kiln.inspect\",\n  \"schema_version\": 1,\n";
  o << "  \"stage\": " << q(stage_name(model.stage)) << ",\n";
  o << "  \"nodes\": " << s.nodes << ",\n  \"parameters\": " << s.parameters
    << ",\n  \"parameter_bytes\": " << s.parameter_bytes << ",\n  \"flops\": " << s.flops << ",\n";
  o << "  \"inputs\": " << io_json(model.graph, model.graph.inputs) << ",\n";
  o << "  \"outputs\": " << io_json(model.graph, model.graph.outputs) << ",\n";
  o << "  \"ops\": {";
  bool first = true;
  for (const auto& [op, n] : s.op_counts) {
    o << (first ? "" : ", ") << q(op) << ": " << n;
    first = false;
  }
  o << "},\n  \"metadata\": {";
  first = true;
  for (const auto& [k, v] : model.metadata) {
    o << (first ? "" : ", ") << q(k) << ": " << q(v);
    first = false;
  }
  o << "},\n  \"provenance\": [";
  for (size_t i = 0; i < model.provenance.size(); ++i) {
    const Provenance& p = model.provenance[i];
    o << (i ? ", " : "") << "{\"tool\": " << q(p.tool) << ", \"version\": " << q(p.version)
      << ", \"command\": " << q(p.command) << ", \"input_file\": " << q(p.input_file)
      << ", \"input_sha256\": " << q(p.input_sha256) << "}";
  }
  o << "]\n}\n";
  return o.str();
}

}  // namespace kiln
