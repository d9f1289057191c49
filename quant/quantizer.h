// Quantizers annotate, they never edit: a Quantizer walks a graph and says, per node, which of
// its input edges and which output get which spec, as PT2E's QuantizationAnnotation does
// (`../shared/reference/pt2-anchors.md` §1.2, §1.5, §1.6). prepare / convert read the
// annotations; the graph is untouched until convert.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "formats/ir.h"
#include "quant/spec.h"

namespace kiln::quant {

/// An edge of the graph: input `input` of node `node`, or (input == kOutput) the node's output 0;
/// output k (a Split's pieces) is input kOutput − k.
struct Edge {
  static constexpr int kOutput = -1;
  size_t node = 0;
  int input = kOutput;
  static Edge output(size_t node, size_t k) { return Edge{node, kOutput - static_cast<int>(k)}; }
  bool is_output() const { return input <= kOutput; }
  size_t output_index() const { return static_cast<size_t>(kOutput - input); }
  bool operator==(const Edge&) const = default;
  auto operator<=>(const Edge&) const = default;
};

/// The edge shares the observer (and so the scale and zero point) of another edge.
struct SharedSpec {
  Edge with;
};

/// Quantization parameters derived from other edges': an int32 bias, scale = the product of the
/// scales of `from` (input × weight), zero point 0.
struct DerivedSpec {
  std::vector<Edge> from;
  QuantSpec spec;  ///< dtype i32 and its range
};

/// Fixed parameters, whatever the data: a Sigmoid's output is 0..1 (u8 scale 1/256, zero point 0).
struct FixedSpec {
  QuantSpec spec;
  float scale = 1;
  int64_t zero_point = 0;
};

using EdgeSpec = std::variant<QuantSpec, SharedSpec, DerivedSpec, FixedSpec>;

/// What a quantizer says of one node.
struct NodeAnnotation {
  std::map<int, EdgeSpec> inputs;  ///< by input slot
  std::optional<EdgeSpec> output;  ///< of output 0
  std::map<size_t, EdgeSpec> later_outputs;  ///< of outputs 1.. by index (a Split's pieces)
  /// A producer's output spec and a consumer's equal input spec share one observer (PT2E's
  /// implicit sharing) unless this is false.
  bool allow_implicit_sharing = true;
  std::string quantizer;  ///< who annotated it ("x86", "xnnpack")
  std::string pattern;    ///< which of its patterns ("conv_relu", "linear", "shared: MaxPool")
  size_t anchor = 0;      ///< the first node of the pattern's instance (its nodes share it)
};

/// By node index. A node is annotated at most once: the first quantizer to annotate it wins.
using Annotations = std::map<size_t, NodeAnnotation>;

class Quantizer {
 public:
  virtual ~Quantizer() = default;
  virtual std::string name() const = 0;
  /// Adds its annotations to `out`, leaving nodes already in it alone.
  virtual Status annotate(const Graph& graph, Annotations& out) const = 0;
};

/// The activation, weight and bias specs a quantizer applies (PT2E's QuantizationConfig).
struct QuantConfig {
  QuantSpec activation;
  QuantSpec weight;          ///< ch_axis is set per node (the output-channel axis of its weight)
  std::optional<QuantSpec> bias;  ///< none: biases stay f32 (both built-in configs)
};

/// x86 (PT2E's X86InductorQuantizer default): activations u8 0..255 per-tensor affine with the
/// histogram observer, weights i8 −128..127 per-channel symmetric (per-channel min-max). Dynamic:
/// the activations' scale and zero point come from each run's data (the placeholder observer).
QuantConfig x86_config(bool dynamic = false);
/// xnnpack (ExecuTorch's XNNPACKQuantizer symmetric config): activations i8 −128..127 affine
/// (histogram), weights i8 −127..127 symmetric, per channel or per tensor.
QuantConfig xnnpack_config(bool per_channel);

/// Which nodes (by index) a quantizer may annotate; an empty filter allows every node.
using NodeFilter = std::function<bool(size_t)>;

/// The built-in quantizers by name ("x86", "xnnpack"); null for another name. With a filter, a
/// pattern takes only allowed nodes (a conv whose Relu is not allowed is a conv alone).
/// `dynamic` (x86 only, else null): linear layers alone, their input quantized at run time
/// (u8, as DynamicQuantizeLinear does), their output float.
std::unique_ptr<Quantizer> make_quantizer(const std::string& name, bool per_channel = true, NodeFilter filter = {},
                                          bool dynamic = false);

/// Weight-only quantization (`--weight-only`, the LLM-style path): the constant 2-D weights of
/// linear layers (MatMul, Gemm) stored quantized, read through a DequantizeLinear; activations
/// stay float and need no calibration. int8: i8 −128..127 symmetric (torchao's
/// int8_weight_only); int4: u4 0..15 affine (ONNX Runtime's MatMulNBits default, GPTQ / AWQ
/// style). Per output channel (group_size 0, min-max per channel) or per group of
/// `group_size` consecutive input features of each output channel (blocked along K).
QuantSpec weight_only_spec(int bits, int64_t group_size);
/// The weight-only quantizer (bits 8 or 4); null for other bits or a negative group size.
std::unique_ptr<Quantizer> make_weight_only_quantizer(int bits, int64_t group_size, NodeFilter filter = {});

/// Runs quantizers in order on one set of annotations: the first to annotate a node wins
/// (PT2E's ComposableQuantizer).
class ComposableQuantizer final : public Quantizer {
 public:
  explicit ComposableQuantizer(std::vector<std::unique_ptr<Quantizer>> parts) : parts_(std::move(parts)) {}
  std::string name() const override;
  Status annotate(const Graph& graph, Annotations& out) const override;

 private:
  std::vector<std::unique_ptr<Quantizer>> parts_;
};

}  // namespace kiln::quant
