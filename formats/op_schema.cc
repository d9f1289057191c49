// Op registry, schema checks and the inference driver.
#include "formats/op_schema.h"

#include <algorithm>

namespace kiln {

InferContext::InferContext(const Node& node, std::vector<InferInput> inputs)
    : node_(node), inputs_(std::move(inputs)), outputs_(node.outputs.size()) {}

void InferContext::set_output(size_t i, DType dtype, Shape shape) {
  if (i >= outputs_.size()) return;  // optional output not requested
  outputs_[i].dtype = dtype;
  outputs_[i].shape = std::move(shape);
}

void InferContext::set_output_value(size_t i, Tensor value) {
  if (i >= outputs_.size()) return;
  outputs_[i].dtype = value.dtype();
  outputs_[i].shape = Shape::of(value.shape());
  outputs_[i].value = std::move(value);
}

bool InferContext::all_inputs_known() const {
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (has_input(i) && (!inputs_[i].value || !inputs_[i].shape.is_concrete())) return false;
  return true;
}

Error InferContext::error(std::string what) const { return user_error(node_.where(), std::move(what)); }

OpSchema& OpRegistry::add(std::string domain, OpSchema schema) {
  std::string name(schema.name);
  return ops_.insert_or_assign({std::move(domain), std::move(name)}, std::move(schema)).first->second;
}

const OpSchema* OpRegistry::find(std::string_view domain, std::string_view name) const {
  auto it = ops_.find(std::pair<std::string, std::string>(domain, name));
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<std::pair<std::string, const OpSchema*>> OpRegistry::all() const {
  std::vector<std::pair<std::string, const OpSchema*>> out;
  for (const auto& [key, schema] : ops_) out.emplace_back(key.first, &schema);
  return out;
}

const OpRegistry& core_ops() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    register_elementwise_ops(r);
    register_reduce_ops(r);
    register_shape_ops(r);
    register_nn_ops(r);
    register_quant_ops(r);
    register_misc_ops(r);
    register_control_ops(r);
    register_attention_ops(r);
    register_loss_ops(r);
    return r;
  }();
  return registry;
}

Status check_node_schema(const Node& node, const OpSchema& schema) {
  auto count = [](int n) { return std::to_string(n); };
  int nin = static_cast<int>(node.num_inputs());
  if (nin < schema.min_inputs || (schema.max_inputs != kVariadic && nin > schema.max_inputs)) {
    std::string range = schema.max_inputs == kVariadic ? "at least " + count(schema.min_inputs)
                        : schema.min_inputs == schema.max_inputs
                            ? count(schema.min_inputs)
                            : count(schema.min_inputs) + " to " + count(schema.max_inputs);
    return user_error(node.where(), std::string(schema.name) + " takes " + range + " inputs, got " + count(nin));
  }
  for (int i = 0; i < schema.min_inputs; ++i)
    if (!node.has_input(static_cast<size_t>(i)))
      return user_error(node.where(), "required input " + count(i) + " of " + std::string(schema.name) + " is missing");
  int nout = static_cast<int>(node.outputs.size());
  if (nout < schema.min_outputs || (schema.max_outputs != kVariadic && nout > schema.max_outputs))
    return user_error(node.where(), std::string(schema.name) + " has " + count(nout) + " outputs, expected " +
                                        count(schema.min_outputs) +
                                        (schema.max_outputs == schema.min_outputs ? "" : " to " + count(schema.max_outputs)));
  for (const Attribute& a : node.attrs) {
    auto spec = std::find_if(schema.attrs.begin(), schema.attrs.end(),
                             [&](const AttrSpec& s) { return s.name == a.name; });
    if (spec == schema.attrs.end())
      return user_error(node.where(), "unknown attribute '" + a.name + "' for " + std::string(schema.name));
    AttrType t = attr_type(a.value);
    bool ok = t == spec->type || (spec->type == AttrType::float64 && t == AttrType::int64);
    if (!ok)
      return user_error(node.where(), "attribute '" + a.name + "' is " + std::string(attr_type_name(t)) +
                                          ", expected " + std::string(attr_type_name(spec->type)));
  }
  for (const AttrSpec& s : schema.attrs)
    if (s.required && !node.has_attr(s.name))
      return user_error(node.where(), "required attribute '" + std::string(s.name) + "' is missing");
  return {};
}

Result<std::vector<InferOutput>> infer_node(const Node& node, const Graph& graph,
                                            const std::vector<Tensor>* known_values, bool* needs_data) {
  const OpSchema* schema = core_ops().find(node.domain, node.op);
  if (!schema) return user_error(node.where(), "unknown op '" + node.qualified_op() + "'");
  KILN_RETURN_IF_ERROR(check_node_schema(node, *schema));
  std::vector<InferInput> inputs(node.inputs.size());
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    ValueId id = node.inputs[i];
    if (id == kNoValue) continue;
    const Value& v = graph.value(id);
    inputs[i].dtype = v.dtype;
    inputs[i].shape = v.shape;
    if (v.is_constant()) inputs[i].value = &v.constant;
    else if (known_values && static_cast<size_t>(id) < known_values->size() &&
             (*known_values)[static_cast<size_t>(id)].defined())
      inputs[i].value = &(*known_values)[static_cast<size_t>(id)];
  }
  InferContext ctx(node, std::move(inputs));
  KILN_RETURN_IF_ERROR(schema->infer(ctx));
  if (needs_data) *needs_data = ctx.needs_data();
  return std::move(ctx.outputs());
}

Result<Shape> broadcast_shapes(const Shape& a, const Shape& b, const InferContext& ctx) {
  if (!a.rank_known || !b.rank_known) return Shape::unknown_rank();
  size_t rank = std::max(a.dims.size(), b.dims.size());
  std::vector<Dim> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const Dim one = Dim::known(1);
    const Dim& da = i < rank - a.dims.size() ? one : a.dims[i - (rank - a.dims.size())];
    const Dim& db = i < rank - b.dims.size() ? one : b.dims[i - (rank - b.dims.size())];
    if (da == db) out[i] = da;
    else if (da.is_known() && da.value == 1) out[i] = db;
    else if (db.is_known() && db.value == 1) out[i] = da;
    else if (da.is_known() && db.is_known())
      return ctx.error("cannot broadcast shapes " + a.str() + " and " + b.str());
    else if (da.is_known()) out[i] = da;  // the symbolic side must be 1 or equal
    else if (db.is_known()) out[i] = db;
    else out[i] = Dim::unknown();
  }
  return Shape(std::move(out));
}

Result<int64_t> normalize_axis(int64_t axis, int64_t rank, const InferContext& ctx, std::string_view what) {
  if (axis < -rank || axis >= rank)
    return ctx.error(std::string(what) + " " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

Result<DType> dtype_attr(const InferContext& ctx, std::string_view name, DType def) {
  if (!ctx.node().has_attr(name)) return def;
  std::string s = ctx.node().attr_string(name, "");
  auto t = dtype_from_name(s);
  if (!t) return ctx.error("attribute '" + std::string(name) + "' names unknown dtype '" + s + "'");
  return *t;
}

}  // namespace kiln
