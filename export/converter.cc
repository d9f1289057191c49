// ConvertContext, the converter registry and the ONNX op-version table.
#include "export/converter.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <map>

#include "export/onnx_tensor.h"

namespace kiln {

ConvertContext::ConvertContext(const onnx::NodeProto& node, std::string name, int op_version, Graph& graph,
                               std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                               SubgraphConverter subgraphs, void* exporter)
    : node_(node), op_version_(op_version), graph_(graph), inputs_(std::move(inputs)),
      outputs_(std::move(outputs)), name_(std::move(name)), subgraphs_(subgraphs), exporter_(exporter) {}

const std::string& ConvertContext::op_type() const { return node_.op_type(); }

const Tensor* ConvertContext::constant_input(size_t i) const {
  if (!has_input(i)) return nullptr;
  const Value& v = graph_.value(inputs_[i]);
  return v.is_constant() ? &v.constant : nullptr;
}

const onnx::AttributeProto* ConvertContext::attr(std::string_view name) const {
  for (const auto& a : node_.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

bool ConvertContext::has_attr(std::string_view name) const { return attr(name) != nullptr; }

int64_t ConvertContext::attr_int(std::string_view name, int64_t def) const {
  const auto* a = attr(name);
  return a && a->has_i() ? a->i() : def;
}

double ConvertContext::attr_float(std::string_view name, double def) const {
  const auto* a = attr(name);
  return a && a->has_f() ? a->f() : def;
}

std::string ConvertContext::attr_string(std::string_view name, std::string def) const {
  const auto* a = attr(name);
  return a && a->has_s() ? a->s() : def;
}

std::vector<int64_t> ConvertContext::attr_ints(std::string_view name, std::vector<int64_t> def) const {
  const auto* a = attr(name);
  if (!a) return def;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::vector<double> ConvertContext::attr_floats(std::string_view name, std::vector<double> def) const {
  const auto* a = attr(name);
  if (!a) return def;
  return std::vector<double>(a->floats().begin(), a->floats().end());
}

Result<Tensor> ConvertContext::attr_tensor(std::string_view name) const {
  const auto* a = attr(name);
  if (!a || !a->has_t()) return error("attribute '" + std::string(name) + "' is missing or not a tensor");
  auto t = tensor_from_onnx(a->t(), "");
  if (!t.ok()) return error("attribute '" + std::string(name) + "': " + t.error().what);
  return t;
}

Result<AttrValue> ConvertContext::convert_attr(const onnx::AttributeProto& a) const {
  using AP = onnx::AttributeProto;
  switch (a.type()) {
    case AP::INT: return AttrValue(int64_t{a.i()});
    case AP::FLOAT: return AttrValue(static_cast<double>(a.f()));
    case AP::STRING: return AttrValue(a.s());
    case AP::INTS: return AttrValue(std::vector<int64_t>(a.ints().begin(), a.ints().end()));
    case AP::FLOATS: {
      std::vector<double> v(a.floats().begin(), a.floats().end());
      return AttrValue(std::move(v));
    }
    case AP::STRINGS: return AttrValue(std::vector<std::string>(a.strings().begin(), a.strings().end()));
    case AP::TENSOR: {
      auto t = tensor_from_onnx(a.t(), "");
      if (!t.ok()) return error("attribute '" + a.name() + "': " + t.error().what);
      return AttrValue(std::move(t).value());
    }
    case AP::GRAPH: {
      if (!subgraphs_) return error("attribute '" + a.name() + "': subgraphs are not supported here");
      KILN_ASSIGN_OR_RETURN(std::shared_ptr<Graph> g, subgraphs_(a.g(), exporter_));
      return AttrValue(std::move(g));
    }
    default:
      return error("attribute '" + a.name() + "' has type " + AP::AttributeType_Name(a.type()) +
                   ", which kiln does not support");
  }
}

Node& ConvertContext::emit(std::string op, std::vector<ValueId> inputs, std::vector<ValueId> outputs) {
  Node n;
  n.name = emitted_ == 0 ? name_ : name_ + "/" + std::to_string(emitted_);
  ++emitted_;
  n.op = std::move(op);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.sources = {name_};
  graph_.nodes.push_back(std::move(n));
  return graph_.nodes.back();
}

Result<Node*> ConvertContext::emit_passthrough(std::string op, std::initializer_list<std::string_view> skip) {
  std::vector<Attribute> attrs;
  for (const auto& a : node_.attribute()) {
    if (std::find(skip.begin(), skip.end(), a.name()) != skip.end()) continue;
    KILN_ASSIGN_OR_RETURN(AttrValue v, convert_attr(a));
    attrs.push_back({a.name(), std::move(v)});
  }
  Node& n = emit(std::move(op), inputs_, outputs_);
  for (auto& a : attrs) n.set_attr(std::move(a.name), std::move(a.value));
  return &n;
}

ValueId ConvertContext::constant(Tensor t, std::string_view hint) {
  return graph_.add_constant(graph_.unique_value_name(name_ + "/" + std::string(hint)), std::move(t));
}

ValueId ConvertContext::temp(std::string_view hint) {
  return graph_.add_value(graph_.unique_value_name(name_ + "/" + std::string(hint)), DType::undefined);
}

Error ConvertContext::error(std::string what) const { return user_error("node '" + name_ + "'", std::move(what)); }

void ConverterRegistry::add(std::string domain, std::string op, int min_version, int max_version, ConvertFn fn) {
  entries_.push_back({std::move(domain), std::move(op), min_version, max_version, fn});
}

const ConverterEntry* ConverterRegistry::find(std::string_view domain, std::string_view op, int version) const {
  for (const ConverterEntry& e : entries_)
    if (e.domain == domain && e.op == op && version >= e.min_version && version <= e.max_version) return &e;
  return nullptr;
}

void ConverterRegistry::sort() {
  std::stable_sort(entries_.begin(), entries_.end(), [](const ConverterEntry& a, const ConverterEntry& b) {
    return std::tie(a.domain, a.op, a.min_version) < std::tie(b.domain, b.op, b.min_version);
  });
}

const ConverterRegistry& onnx_converters() {
  static const ConverterRegistry registry = [] {
    ConverterRegistry r;
    register_elementwise_converters(r);
    register_reduce_converters(r);
    register_shape_converters(r);
    register_nn_converters(r);
    register_quant_converters(r);
    register_misc_converters(r);
    register_control_converters(r);
    register_attention_converters(r);
    register_loss_converters(r);
    r.sort();
    return r;
  }();
  return registry;
}

namespace {

struct VersionArity {
  int since, min_in, max_in, required_in, min_out, max_out;
};

struct OpVersions {
  std::string_view domain, op;
  std::vector<VersionArity> arity;
  std::vector<int> versions;  // the since-versions of `arity`, for callers that want only those
};

const std::vector<OpVersions>& op_version_table() {
  static const std::vector<OpVersions> table = [] {
    std::vector<OpVersions> t = {
#define KILN_ONNX_OP(domain, op, ...) {domain, op, {__VA_ARGS__}, {}},
#include "export/onnx_op_versions.inc"
#undef KILN_ONNX_OP
    };
    for (OpVersions& e : t)
      for (const VersionArity& a : e.arity) e.versions.push_back(a.since);
    return t;
  }();
  return table;
}

const OpVersions* find_op(std::string_view domain, std::string_view op) {
  if (domain == "ai.onnx") domain = "";
  for (const OpVersions& e : op_version_table())
    if (e.domain == domain && e.op == op) return &e;
  return nullptr;
}

// "2 inputs", "1 output".
std::string count_of(int n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

// "1", "1 to 3", "at least 2".
std::string range_of(int lo, int hi) {
  if (hi < 0) return "at least " + std::to_string(lo);
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
}

}  // namespace

std::span<const int> onnx_op_versions(std::string_view domain, std::string_view op) {
  const OpVersions* e = find_op(domain, op);
  return e ? std::span<const int>(e->versions) : std::span<const int>();
}

std::optional<OnnxArity> onnx_op_arity(std::string_view domain, std::string_view op, int version) {
  const OpVersions* e = find_op(domain, op);
  if (!e) return std::nullopt;
  for (const VersionArity& a : e->arity)
    if (a.since == version) return OnnxArity{a.min_in, a.max_in, a.required_in, a.min_out, a.max_out};
  return std::nullopt;
}

Status check_onnx_arity(const onnx::NodeProto& node, const OnnxArity& arity, int version, const std::string& where) {
  std::string op = node.op_type() + "-" + std::to_string(version);
  int ins = node.input_size(), outs = node.output_size();
  if (ins < arity.min_inputs || (arity.max_inputs >= 0 && ins > arity.max_inputs))
    return user_error(where, "has " + count_of(ins, "input") + " but " + op + " takes " +
                                 range_of(arity.min_inputs, arity.max_inputs));
  for (int i = 0; i < arity.required_inputs && i < ins; ++i)
    if (node.input(i).empty()) return user_error(where, "input " + std::to_string(i) + " of " + op + " is required but omitted");
  if (outs < arity.min_outputs || (arity.max_outputs >= 0 && outs > arity.max_outputs))
    return user_error(where, "has " + count_of(outs, "output") + " but " + op + " gives " +
                                 range_of(arity.min_outputs, arity.max_outputs));
  return {};
}

int resolve_op_version(std::string_view domain, std::string_view op, int opset) {
  int best = 0;
  for (int v : onnx_op_versions(domain, op))
    if (v <= opset) best = std::max(best, v);
  return best;
}

Status convert_passthrough(ConvertContext& ctx) {
  auto n = ctx.emit_passthrough(ctx.op_type());
  return n.ok() ? Status() : Status(n.error());
}

Status convert_plain(ConvertContext& ctx) {
  auto n = ctx.emit_passthrough(ctx.op_type(), {"consumed_inputs"});
  return n.ok() ? Status() : Status(n.error());
}

}  // namespace kiln
