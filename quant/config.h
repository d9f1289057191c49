// `kiln quant --config quant.json`: which quantizer settings apply to which nodes, as PT2E's
// set_global / set_module_type_qconfig / set_module_name_qconfig do, with the same precedence:
// a node's name, then its op type, then the global setting. A null setting keeps the nodes
// float. A pattern (conv + relu) is quantized only when all of its nodes resolve to the same
// setting (PT2E skips a pattern any of whose nodes is filtered out).
//
//   {
//     "global": {"quantizer": "x86"},
//     "op_types": {"Gemm": null, "MatMul": {"quantizer": "x86", "dynamic": true}},
//     "nodes": {"/fc/Gemm": null, "/layer1/conv1/Conv": {"quantizer": "x86"}}
//   }
//
// A weight-only setting names no quantizer: {"weight_only": "int4", "group_size": 128}.
//
// Every key is optional; without "global" the command line's --quantizer is the global
// setting. Unknown keys are errors (a typo must not silently quantize what should stay float).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ir.h"
#include "formats/status.h"
#include "quant/quantizer.h"

namespace kiln::quant {

/// One quantizer setting: a built-in quantizer and its options, or weight-only quantization.
struct QuantizerSetting {
  std::string quantizer;  ///< "x86" or "xnnpack"; empty for weight-only
  bool per_tensor = false;
  bool dynamic = false;  ///< x86: linear layers with their input quantized at run time
  int weight_only_bits = 0;  ///< 8 or 4: weight-only quantization of the linear layers (no quantizer)
  int64_t group_size = 0;    ///< weight-only: K values per scale, 0 per output channel
  bool operator==(const QuantizerSetting&) const = default;
  auto operator<=>(const QuantizerSetting&) const = default;
};

/// --group-size's default: 128 for int4 (ONNX Runtime's and torchao's), 0 (per output channel)
/// for int8 (torchao's int8_weight_only).
int64_t default_group_size(int bits);

/// nullopt: the nodes stay float.
using MaybeSetting = std::optional<QuantizerSetting>;

struct QuantizerConfig {
  std::optional<MaybeSetting> global;  ///< unset: the command line's
  std::map<std::string, MaybeSetting> op_types;
  std::map<std::string, MaybeSetting> nodes;

  /// The setting of `node`: its name's, else its op type's, else the global one (or `fallback`).
  MaybeSetting setting_for(const Node& node, const MaybeSetting& fallback) const;
};

/// Parses a config file's text; a user error names `file` and the key at fault.
Result<QuantizerConfig> parse_quantizer_config(std::string_view text, const std::string& file);

/// The config as the JSON parse_quantizer_config reads, with `fallback` as its global setting
/// when it has none (so that the file stands alone).
std::string quantizer_config_json(const QuantizerConfig& config, const MaybeSetting& fallback);

/// The quantizer that applies `config` to `graph` (fallback: the command line's setting): one
/// built-in quantizer per distinct setting, each annotating only the nodes resolving to it.
/// Also returns, through `float_nodes`, how many nodes the config keeps float.
std::unique_ptr<Quantizer> configured_quantizer(const Graph& graph, const QuantizerConfig& config, const MaybeSetting& fallback,
                                                size_t* float_nodes = nullptr);

}  // namespace kiln::quant
