// ONNX → kiln converters: one function per ONNX op family, registered by (domain, op, range of
// op versions). A converter reads one ONNX node and emits kiln core nodes through its
// ConvertContext; the exporter then infers types and shapes for the whole graph.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ir.h"

namespace onnx {
class NodeProto;
class AttributeProto;
class GraphProto;
}  // namespace onnx

namespace kiln {

class ConvertContext;
using ConvertFn = Status (*)(ConvertContext&);

/// Converts an ONNX subgraph (If/Loop/Scan bodies) into a kiln Graph; supplied by the exporter.
using SubgraphConverter = Result<std::shared_ptr<Graph>> (*)(const onnx::GraphProto&, void* exporter);

class ConvertContext {
 public:
  /// `name` is the node's kiln name: the ONNX name, or a generated one when that is empty or taken.
  ConvertContext(const onnx::NodeProto& node, std::string name, int op_version, Graph& graph,
                 std::vector<ValueId> inputs, std::vector<ValueId> outputs, SubgraphConverter subgraphs,
                 void* exporter);

  const onnx::NodeProto& onnx_node() const { return node_; }
  /// ONNX node name, or "<op>_<index>" when the model leaves it empty.
  const std::string& name() const { return name_; }
  const std::string& op_type() const;
  /// The since-version of the op definition this node uses (e.g. 13 for Softmax in opset 15).
  int op_version() const { return op_version_; }
  Graph& graph() { return graph_; }

  // Inputs and outputs: kiln value ids (kNoValue for omitted optional inputs / outputs).
  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i] != kNoValue; }
  ValueId input(size_t i) const { return has_input(i) ? inputs_[i] : kNoValue; }
  size_t num_outputs() const { return outputs_.size(); }
  ValueId output(size_t i) const { return i < outputs_.size() ? outputs_[i] : kNoValue; }
  /// The input's data when it is a constant (initializer or Constant node), else nullptr.
  const Tensor* constant_input(size_t i) const;

  // ONNX attributes.
  bool has_attr(std::string_view name) const;
  const onnx::AttributeProto* attr(std::string_view name) const;
  int64_t attr_int(std::string_view name, int64_t def) const;
  double attr_float(std::string_view name, double def) const;
  std::string attr_string(std::string_view name, std::string def) const;
  std::vector<int64_t> attr_ints(std::string_view name, std::vector<int64_t> def = {}) const;
  std::vector<double> attr_floats(std::string_view name, std::vector<double> def = {}) const;
  /// A tensor attribute converted to a Tensor (user error on bad data).
  Result<Tensor> attr_tensor(std::string_view name) const;
  /// Converts one ONNX attribute to a kiln attribute value (graphs through the exporter).
  Result<AttrValue> convert_attr(const onnx::AttributeProto& a) const;

  /// Adds a core node named after the ONNX node (suffixed when one ONNX node emits several),
  /// with this ONNX node as its source. Returns a reference valid until the next emit.
  Node& emit(std::string op, std::vector<ValueId> inputs, std::vector<ValueId> outputs);
  /// Emits a node of the same op name with every ONNX attribute copied (except `skip`), after
  /// converting them; the common case for ops whose core form matches the ONNX one.
  Result<Node*> emit_passthrough(std::string op, std::initializer_list<std::string_view> skip = {});
  /// A new constant value.
  ValueId constant(Tensor t, std::string_view hint = "const");
  /// A new intermediate value (type and shape filled in by inference).
  ValueId temp(std::string_view hint = "tmp");

  /// A user error about this node.
  Error error(std::string what) const;

 private:
  const onnx::NodeProto& node_;
  int op_version_;
  Graph& graph_;
  std::vector<ValueId> inputs_, outputs_;
  std::string name_;
  int emitted_ = 0;
  SubgraphConverter subgraphs_;
  void* exporter_;
};

/// One registered converter.
struct ConverterEntry {
  std::string domain;   ///< "" for the default ONNX domain, "ai.onnx.ml", …
  std::string op;
  int min_version;      ///< the since-versions this converter handles, inclusive
  int max_version;
  ConvertFn fn;
};

class ConverterRegistry {
 public:
  void add(std::string domain, std::string op, int min_version, int max_version, ConvertFn fn);
  /// Shorthand for the default domain.
  void add(std::string op, int min_version, int max_version, ConvertFn fn) {
    add("", std::move(op), min_version, max_version, fn);
  }
  const ConverterEntry* find(std::string_view domain, std::string_view op, int version) const;
  const std::vector<ConverterEntry>& entries() const { return entries_; }
  /// Orders entries by (domain, op, first version), for listings.
  void sort();

 private:
  std::vector<ConverterEntry> entries_;
};

/// Every converter kiln has, built on first use.
const ConverterRegistry& onnx_converters();

/// The since-versions of an ONNX op (from the table generated from onnx 1.22), empty if unknown.
std::span<const int> onnx_op_versions(std::string_view domain, std::string_view op);

/// How many inputs and outputs one version of an ONNX op allows (onnx 1.22's schemas).
struct OnnxArity {
  int min_inputs = 0, max_inputs = -1;  ///< -1: no upper limit (variadic)
  int required_inputs = 0;              ///< leading inputs that may not be omitted ("")
  int min_outputs = 0, max_outputs = -1;
};
/// The arity of `op` at since-version `version`; nullopt if the table does not know it.
std::optional<OnnxArity> onnx_op_arity(std::string_view domain, std::string_view op, int version);
/// A user error when the node's input or output counts do not fit the arity, so that no
/// converter ever indexes an input that is not there.
Status check_onnx_arity(const onnx::NodeProto& node, const OnnxArity& arity, int version, const std::string& where);
/// The since-version an op has in a model importing `opset` of its domain (0 if none).
int resolve_op_version(std::string_view domain, std::string_view op, int opset);

/// A converter that emits the core op of the same name with all attributes copied.
Status convert_passthrough(ConvertContext& ctx);
/// convert_passthrough without `consumed_inputs`: the newest semantics, with the attribute that
/// only ever was a memory hint (opsets 1-6) dropped.
Status convert_plain(ConvertContext& ctx);

// Per-family registration (export/converters/*.cc).
void register_elementwise_converters(ConverterRegistry& r);
void register_reduce_converters(ConverterRegistry& r);
void register_shape_converters(ConverterRegistry& r);
void register_nn_converters(ConverterRegistry& r);
void register_quant_converters(ConverterRegistry& r);
void register_misc_converters(ConverterRegistry& r);
void register_control_converters(ConverterRegistry& r);
void register_attention_converters(ConverterRegistry& r);
void register_loss_converters(ConverterRegistry& r);

}  // namespace kiln
