// Op registry, schema checks and the inference driver.
#include "formats/op_schema.h"

#include <algorithm>
#include <utility>

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

OpSchema* OpRegistry::find_mutable(std::string_view domain, std::string_view name) {
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
    register_flop_models(r);  // last: it fills in the ops the families left without a model
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

std::string TypeSet::words(bool one) const {
  // Whole classes are named ("floating-point and signed integer types"), other types listed.
  static constexpr std::pair<TypeSet, std::string_view> kClasses[] = {
      {types::kNumeric, "numeric"}, {types::kFloat, "floating-point"}, {types::kInt, "integer"},
      {types::kSigned, "signed integer"}, {types::kUnsigned, "unsigned integer"}};
  const std::string_view sep = one ? " or " : " and ";
  uint32_t rest = bits_;
  std::string classes;
  for (const auto& [set, name] : kClasses)
    if ((rest & set.bits_) == set.bits_) {
      classes += (classes.empty() ? "" : std::string(sep)) + std::string(name);
      rest &= ~set.bits_;
    }
  std::vector<std::string> items;
  if (!classes.empty()) {
    const bool vowel = std::string_view("aeiou").find(classes[0]) != std::string_view::npos;
    items.push_back(one ? (vowel ? "an " : "a ") + classes + " type" : classes + " types");
  }
  for (unsigned t = 1; t < 32; ++t)
    if ((rest >> t) & 1) items.emplace_back(dtype_name(static_cast<DType>(t)));
  if (items.empty()) return "no type";
  std::string out = items[0];
  for (size_t i = 1; i < items.size(); ++i) out += (i + 1 == items.size() ? std::string(sep) : ", ") + items[i];
  return out;
}

namespace {

bool covers(const TypeConstraint& c, size_t slot) {
  return slot >= static_cast<size_t>(c.first) && (c.last == kVariadic || slot <= static_cast<size_t>(c.last));
}

// What the op's constraints call input `slot` ("indices"); empty for unnamed data inputs.
std::string_view input_name(const OpSchema& schema, size_t slot) {
  for (const TypeConstraint& c : schema.traits.types)
    if (!c.name.empty() && covers(c, slot)) return c.name;
  return {};
}

}  // namespace

Status check_input_types(const OpSchema& schema, const InferContext& ctx) {
  auto name_of = [&](size_t slot) {
    std::string_view n = input_name(schema, slot);
    return n.empty() ? "input " + std::to_string(slot) : std::string(n);
  };
  // The 4-bit types only where a constraint names them (no kernel of an op that takes "any
  // type" reads half bytes).
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i) || !is_int4(ctx.dtype(i))) continue;
    bool named = false;
    for (const TypeConstraint& c : schema.traits.types) {
      if (!covers(c, i)) continue;
      const TypeConstraint* own = &c;
      if (c.same_as >= 0)
        for (const TypeConstraint& o : schema.traits.types)
          if (o.same_as < 0 && covers(o, static_cast<size_t>(c.same_as))) own = &o;
      named = named || own->allowed.contains(ctx.dtype(i));
    }
    if (!named) return ctx.error(name_of(i) + " of type " + std::string(dtype_name(ctx.dtype(i))) + " is not supported by " + std::string(schema.name));
  }
  for (const TypeConstraint& c : schema.traits.types)
    for (size_t i = static_cast<size_t>(c.first); i < ctx.num_inputs() && covers(c, i); ++i) {
      if (!ctx.has_input(i)) continue;
      if (c.same_as < 0) {
        if (c.allowed.contains(ctx.dtype(i))) continue;
        const std::string t(dtype_name(ctx.dtype(i)));
        if (!c.name.empty()) return ctx.error(std::string(c.name) + " must be " + c.allowed.one_of() + ", got " + t);
        if (c.allowed.size() == 1) return ctx.error(std::string(schema.name) + " is " + c.allowed.one_of() + " only, got " + t);
        return ctx.error(std::string(schema.name) + " does not support " + t + " (it takes " + c.allowed.str() + ")");
      }
      const auto other = static_cast<size_t>(c.same_as);
      if (!ctx.has_input(other) || ctx.dtype(other) == ctx.dtype(i)) continue;
      const std::string t(dtype_name(ctx.dtype(i))), want(dtype_name(ctx.dtype(other)));
      if (input_name(schema, i).empty() && input_name(schema, other).empty())
        return ctx.error("input types differ: " + want + " and " + t);
      return ctx.error(name_of(i) + " type " + t + " differs from " + name_of(other) + " type " + want);
    }
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
  KILN_RETURN_IF_ERROR(check_input_types(*schema, ctx));
  KILN_RETURN_IF_ERROR(schema->infer(ctx));
  // The 4-bit types come out of QuantizeLinear alone (a Cast, ConstantOfShape or Constant to
  // them has no kernel that writes half bytes).
  if (schema->name != "QuantizeLinear")
    for (const InferOutput& o : ctx.outputs())
      if (is_int4(o.dtype))
        return ctx.error(std::string(schema->name) + " to " + std::string(dtype_name(o.dtype)) + " is not supported (only QuantizeLinear writes 4-bit values)");
  if (needs_data) *needs_data = ctx.needs_data();
  return std::move(ctx.outputs());
}

Status check_scalar_inputs(const InferContext& ctx, std::initializer_list<size_t> inputs) {
  for (size_t i : inputs) {
    if (!ctx.has_input(i)) continue;
    const Shape& s = ctx.shape(i);
    if (s.rank() > 1 || (s.rank() == 1 && s.dims[0].is_known() && s.dims[0].value != 1))
      return ctx.error("input " + std::to_string(i) + " has shape " + s.str() + "; the scales and zero points must be scalars");
  }
  return {};
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
