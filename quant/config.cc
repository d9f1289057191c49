#include "quant/config.h"

#include <nlohmann/json.hpp>

#include <set>

namespace kiln::quant {

namespace {

using nlohmann::json;

Error bad(const std::string& file, const std::string& where, const std::string& what) {
  return Error{ErrorKind::user, file, where, what};
}

Result<MaybeSetting> parse_setting(const json& j, const std::string& file, const std::string& where) {
  if (j.is_null()) return MaybeSetting{};
  if (!j.is_object()) return bad(file, where, "must be null (stay float) or an object like {\"quantizer\": \"x86\"}");
  QuantizerSetting s;
  for (const auto& [key, value] : j.items()) {
    if (key == "quantizer") {
      if (!value.is_string()) return bad(file, where + ".quantizer", "must be a string");
      s.quantizer = value.get<std::string>();
      if (s.quantizer != "x86" && s.quantizer != "xnnpack")
        return bad(file, where + ".quantizer", "'" + s.quantizer + "' is not one of x86, xnnpack");
    } else if (key == "per_tensor") {
      if (!value.is_boolean()) return bad(file, where + ".per_tensor", "must be true or false");
      s.per_tensor = value.get<bool>();
    } else if (key == "dynamic") {
      if (!value.is_boolean()) return bad(file, where + ".dynamic", "must be true or false");
      s.dynamic = value.get<bool>();
    } else if (key == "weight_only") {
      const std::string bits = value.is_string() ? value.get<std::string>() : "";
      if (bits != "int8" && bits != "int4") return bad(file, where + ".weight_only", "must be \"int8\" or \"int4\"");
      s.weight_only_bits = bits == "int8" ? 8 : 4;
    } else if (key == "group_size") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0)
        return bad(file, where + ".group_size", "must be a whole number, 0 for one scale per output channel");
      s.group_size = value.get<int64_t>();
    } else {
      return bad(file, where + "." + key, "unknown key (known: quantizer, per_tensor, dynamic, weight_only, group_size)");
    }
  }
  if (s.weight_only_bits) {
    if (!s.quantizer.empty() || s.per_tensor || s.dynamic)
      return bad(file, where, "a weight_only setting takes only group_size (no quantizer, per_tensor or dynamic)");
    if (!j.contains("group_size")) s.group_size = default_group_size(s.weight_only_bits);
    return MaybeSetting{s};
  }
  if (j.contains("group_size")) return bad(file, where + ".group_size", "goes with weight_only");
  if (s.quantizer.empty()) return bad(file, where, "names no quantizer");
  if (s.per_tensor && s.quantizer != "xnnpack") return bad(file, where + ".per_tensor", "is for the xnnpack quantizer (x86 weights are per channel)");
  if (s.dynamic && s.quantizer != "x86") return bad(file, where + ".dynamic", "is for the x86 quantizer (u8 activations quantized at run time)");
  return MaybeSetting{s};
}

Status parse_map(const json& j, const std::string& file, const std::string& key, std::map<std::string, MaybeSetting>& out) {
  if (!j.is_object()) return bad(file, key, "must be an object of name: setting");
  for (const auto& [name, value] : j.items()) {
    KILN_ASSIGN_OR_RETURN(MaybeSetting s, parse_setting(value, file, key + "." + name));
    out[name] = s;
  }
  return {};
}

}  // namespace

int64_t default_group_size(int bits) { return bits == 4 ? 128 : 0; }

MaybeSetting QuantizerConfig::setting_for(const Node& node, const MaybeSetting& fallback) const {
  if (auto it = nodes.find(node.name); it != nodes.end()) return it->second;
  if (auto it = op_types.find(node.op); it != op_types.end()) return it->second;
  return global ? *global : fallback;
}

Result<QuantizerConfig> parse_quantizer_config(std::string_view text, const std::string& file) {
  const json doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded()) return bad(file, "", "is not valid JSON");
  if (!doc.is_object()) return bad(file, "", "must be a JSON object with \"global\", \"op_types\" or \"nodes\"");
  QuantizerConfig c;
  for (const auto& [key, value] : doc.items()) {
    if (key == "global") {
      KILN_ASSIGN_OR_RETURN(MaybeSetting s, parse_setting(value, file, "global"));
      c.global = s;
    } else if (key == "op_types") {
      KILN_RETURN_IF_ERROR(parse_map(value, file, "op_types", c.op_types));
    } else if (key == "nodes") {
      KILN_RETURN_IF_ERROR(parse_map(value, file, "nodes", c.nodes));
    } else {
      return bad(file, key, "unknown key (known: global, op_types, nodes)");
    }
  }
  return c;
}

std::unique_ptr<Quantizer> configured_quantizer(const Graph& graph, const QuantizerConfig& config, const MaybeSetting& fallback,
                                                size_t* float_nodes) {
  std::vector<MaybeSetting> of(graph.nodes.size());
  std::set<QuantizerSetting> distinct;
  size_t kept_float = 0;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    of[n] = config.setting_for(graph.nodes[n], fallback);
    if (of[n]) distinct.insert(*of[n]);
    else ++kept_float;
  }
  if (float_nodes) *float_nodes = kept_float;
  std::vector<std::unique_ptr<Quantizer>> parts;
  for (const QuantizerSetting& s : distinct) {
    NodeFilter filter = [of, s](size_t n) { return n < of.size() && of[n] && *of[n] == s; };
    parts.push_back(s.weight_only_bits ? make_weight_only_quantizer(s.weight_only_bits, s.group_size, std::move(filter))
                                       : make_quantizer(s.quantizer, !s.per_tensor, std::move(filter), s.dynamic));
  }
  return std::make_unique<ComposableQuantizer>(std::move(parts));
}

std::string quantizer_config_json(const QuantizerConfig& config, const MaybeSetting& fallback) {
  auto setting = [](const MaybeSetting& s) -> json {
    if (!s) return nullptr;
    if (s->weight_only_bits) return json{{"weight_only", "int" + std::to_string(s->weight_only_bits)}, {"group_size", s->group_size}};
    json j = {{"quantizer", s->quantizer}};
    if (s->per_tensor) j["per_tensor"] = true;
    if (s->dynamic) j["dynamic"] = true;
    return j;
  };
  json doc = json::object();
  doc["global"] = setting(config.global ? *config.global : fallback);
  if (!config.op_types.empty()) {
    doc["op_types"] = json::object();
    for (const auto& [op, s] : config.op_types) doc["op_types"][op] = setting(s);
  }
  if (!config.nodes.empty()) {
    doc["nodes"] = json::object();
    for (const auto& [name, s] : config.nodes) doc["nodes"][name] = setting(s);
  }
  return doc.dump(2) + "\n";
}

}  // namespace kiln::quant
