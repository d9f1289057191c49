// ONNX converters of the shape family. Most ops map one to one onto the core op of the same
// name (the newest ONNX semantics); older versions are normalised here: attributes that later
// became inputs (Reshape-1 shape, Squeeze/Unsqueeze axes, Split split, Slice-1 starts/ends/axes,
// Pad-1/2 pads and value) become constant inputs, Scatter becomes ScatterElements, and Constant
// becomes a constant value without any node.
#include <onnx/onnx_pb.h>

#include <algorithm>

#include "export/converter.h"
#include "export/onnx_tensor.h"

namespace kiln {

namespace {

// The highest since-version listed for these ops (onnx 1.22); newer versions only add dtypes.
constexpr int kLatest = 25;

ValueId ints_constant(ConvertContext& ctx, const std::vector<int64_t>& v, std::string_view hint) {
  return ctx.constant(Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v), hint);
}

// Emits `op` over the node's inputs plus extra constant inputs, copying every attribute except
// those in `skip`.
Status emit_with_inputs(ConvertContext& ctx, std::string op, std::vector<ValueId> inputs,
                        std::initializer_list<std::string_view> skip) {
  std::vector<Attribute> attrs;
  for (const auto& a : ctx.onnx_node().attribute()) {
    if (std::find(skip.begin(), skip.end(), a.name()) != skip.end()) continue;
    KILN_ASSIGN_OR_RETURN(AttrValue v, ctx.convert_attr(a));
    attrs.push_back({a.name(), std::move(v)});
  }
  std::vector<ValueId> outs;
  for (size_t i = 0; i < ctx.num_outputs(); ++i) outs.push_back(ctx.output(i));
  Node& n = ctx.emit(std::move(op), std::move(inputs), std::move(outs));
  for (auto& a : attrs) n.set_attr(std::move(a.name), std::move(a.value));
  return {};
}

std::vector<ValueId> node_inputs(ConvertContext& ctx) {
  std::vector<ValueId> in;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) in.push_back(ctx.input(i));
  while (!in.empty() && in.back() == kNoValue) in.pop_back();
  return in;
}

Status convert_constant(ConvertContext& ctx) {
  for (const char* unsupported : {"sparse_value", "value_string", "value_strings"})
    if (ctx.has_attr(unsupported))
      return ctx.error(std::string("Constant with a ") + unsupported + " attribute is not supported");
  Tensor t;
  if (ctx.has_attr("value")) {
    KILN_ASSIGN_OR_RETURN(t, ctx.attr_tensor("value"));
  } else if (ctx.has_attr("value_float")) {
    t = Tensor::from<float>({}, {static_cast<float>(ctx.attr_float("value_float", 0))});
  } else if (ctx.has_attr("value_floats")) {
    std::vector<double> v = ctx.attr_floats("value_floats");
    t = Tensor::from<float>({static_cast<int64_t>(v.size())}, std::vector<float>(v.begin(), v.end()));
  } else if (ctx.has_attr("value_int")) {
    t = Tensor::from<int64_t>({}, {ctx.attr_int("value_int", 0)});
  } else if (ctx.has_attr("value_ints")) {
    std::vector<int64_t> v = ctx.attr_ints("value_ints");
    t = Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v);
  } else {
    return ctx.error("Constant has no value attribute");
  }
  if (ctx.output(0) == kNoValue) return {};
  Value& v = ctx.graph().value(ctx.output(0));
  if (v.dtype != DType::undefined && v.dtype != t.dtype())
    return ctx.error("output '" + v.name + "' is declared " + std::string(dtype_name(v.dtype)) + " but the constant is " +
                     std::string(dtype_name(t.dtype())));
  v.dtype = t.dtype();
  v.shape = Shape::of(t.shape());
  v.constant = std::move(t);
  return {};
}

// Reshape-1: the shape is an attribute.
Status convert_reshape_v1(ConvertContext& ctx) {
  if (!ctx.has_attr("shape")) return ctx.error("Reshape-1 without a shape attribute is not supported");
  return emit_with_inputs(ctx, "Reshape", {ctx.input(0), ints_constant(ctx, ctx.attr_ints("shape"), "shape")},
                          {"shape", "consumed_inputs"});
}

// Squeeze-1/11 and Unsqueeze-1/11: axes is an attribute.
Status convert_axes_attr(ConvertContext& ctx) {
  std::vector<ValueId> in = {ctx.input(0)};
  if (ctx.has_attr("axes")) in.push_back(ints_constant(ctx, ctx.attr_ints("axes"), "axes"));
  else if (ctx.op_type() == "Unsqueeze") return ctx.error("Unsqueeze needs axes");
  return emit_with_inputs(ctx, ctx.op_type(), std::move(in), {"axes"});
}

// Split-1/2/11: split is an attribute (Split-1 also allowed it as a second input).
Status convert_split_attr(ConvertContext& ctx) {
  std::vector<ValueId> in = {ctx.input(0)};
  if (ctx.has_input(1)) in.push_back(ctx.input(1));
  else if (ctx.has_attr("split")) in.push_back(ints_constant(ctx, ctx.attr_ints("split"), "split"));
  return emit_with_inputs(ctx, "Split", std::move(in), {"split"});
}

// Slice-1: starts, ends and axes are attributes.
Status convert_slice_v1(ConvertContext& ctx) {
  std::vector<ValueId> in = {ctx.input(0), ints_constant(ctx, ctx.attr_ints("starts"), "starts"),
                             ints_constant(ctx, ctx.attr_ints("ends"), "ends")};
  if (ctx.has_attr("axes")) in.push_back(ints_constant(ctx, ctx.attr_ints("axes"), "axes"));
  return emit_with_inputs(ctx, "Slice", std::move(in), {"starts", "ends", "axes"});
}

// Pad-1/2: pads (Pad-1: paddings) and the constant value are attributes.
Status convert_pad_attr(ConvertContext& ctx) {
  const char* pads_name = ctx.op_version() == 1 ? "paddings" : "pads";
  if (!ctx.has_attr(pads_name)) return ctx.error(std::string("Pad needs the ") + pads_name + " attribute");
  std::vector<ValueId> in = {ctx.input(0), ints_constant(ctx, ctx.attr_ints(pads_name), "pads")};
  DType dt = ctx.graph().value(ctx.input(0)).dtype;
  double value = ctx.attr_float("value", 0.0);
  if (value != 0.0) {
    if (dt == DType::undefined) return ctx.error("the type of the padded input is not known");
    Tensor t(dt, {});
    visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      t.data<T>()[0] = static_cast<T>(static_cast<float>(value));
    });
    in.push_back(ctx.constant(std::move(t), "value"));
  }
  return emit_with_inputs(ctx, "Pad", std::move(in), {pads_name, "value"});
}

// Concat-1: axis defaults to 1.
Status convert_concat_v1(ConvertContext& ctx) {
  auto n = ctx.emit_passthrough("Concat");
  if (!n.ok()) return n.error();
  if (!(*n)->has_attr("axis")) (*n)->set_attr("axis", int64_t{1});
  return {};
}

// Scatter-9/11 is ScatterElements without reduction.
Status convert_scatter(ConvertContext& ctx) {
  auto n = ctx.emit_passthrough("ScatterElements");
  return n.ok() ? Status() : Status(n.error());
}

// EyeLike: the dtype attribute is an ONNX TensorProto type; the core op takes a kiln dtype name.
Status convert_eye_like(ConvertContext& ctx) {
  std::vector<ValueId> in = {ctx.input(0)};
  KILN_RETURN_IF_ERROR(emit_with_inputs(ctx, "EyeLike", std::move(in), {"dtype"}));
  if (ctx.has_attr("dtype")) {
    int onnx_type = static_cast<int>(ctx.attr_int("dtype", 0));
    auto t = dtype_from_onnx(onnx_type);
    if (!t) return ctx.error("EyeLike dtype " + onnx_type_name(onnx_type) + " is not supported");
    ctx.graph().nodes.back().set_attr("dtype", std::string(dtype_name(*t)));
  }
  return {};
}

// Range-27 adds stash_type (the precision f16/bf16 ranges are computed in): the core Range
// always computes them in at least f32, which is what stash_type float (the default) or double ask.
Status convert_range(ConvertContext& ctx) {
  int64_t stash = ctx.attr_int("stash_type", 1);
  if (stash != 1 && stash != 11) return ctx.error("Range stash_type " + std::to_string(stash) + " is not supported");
  return emit_with_inputs(ctx, "Range", node_inputs(ctx), {"stash_type"});
}

// Ops whose inputs and attributes are the core op's, dropping trailing omitted inputs.
Status convert_same(ConvertContext& ctx) { return emit_with_inputs(ctx, ctx.op_type(), node_inputs(ctx), {}); }

}  // namespace

void register_shape_converters(ConverterRegistry& r) {
  r.add("Constant", 1, kLatest, convert_constant);
  r.add("Reshape", 1, 4, convert_reshape_v1);
  r.add("Reshape", 5, kLatest, convert_same);
  r.add("Flatten", 1, kLatest, convert_same);
  r.add("Squeeze", 1, 12, convert_axes_attr);
  r.add("Squeeze", 13, kLatest, convert_same);
  r.add("Unsqueeze", 1, 12, convert_axes_attr);
  r.add("Unsqueeze", 13, kLatest, convert_same);
  r.add("Transpose", 1, kLatest, convert_same);
  r.add("Concat", 1, 3, convert_concat_v1);
  r.add("Concat", 4, kLatest, convert_same);
  r.add("Split", 1, 12, convert_split_attr);
  r.add("Split", 13, kLatest, convert_same);
  r.add("Slice", 1, 9, convert_slice_v1);
  r.add("Slice", 10, kLatest, convert_same);
  r.add("Gather", 1, kLatest, convert_same);
  r.add("GatherElements", 11, kLatest, convert_same);
  r.add("GatherND", 11, kLatest, convert_same);
  r.add("ScatterElements", 11, kLatest, convert_same);
  r.add("ScatterND", 11, kLatest, convert_same);
  r.add("Scatter", 9, 11, convert_scatter);
  r.add("Pad", 1, 10, convert_pad_attr);
  r.add("Pad", 11, kLatest, convert_same);
  r.add("Tile", 6, kLatest, convert_same);
  r.add("Expand", 8, kLatest, convert_same);
  r.add("Shape", 1, kLatest, convert_same);
  r.add("Size", 1, kLatest, convert_same);
  r.add("ConstantOfShape", 9, kLatest, convert_same);
  r.add("Range", 11, 27, convert_range);
  r.add("OneHot", 9, kLatest, convert_same);
  r.add("DepthToSpace", 1, kLatest, convert_same);
  r.add("SpaceToDepth", 1, kLatest, convert_same);
  r.add("Trilu", 14, kLatest, convert_same);
  r.add("EyeLike", 9, kLatest, convert_eye_like);
  r.add("Compress", 9, kLatest, convert_same);
  r.add("NonZero", 9, kLatest, convert_same);
  r.add("Unique", 11, kLatest, convert_same);
  r.add("ReverseSequence", 10, kLatest, convert_same);
  r.add("CenterCropPad", 18, kLatest, convert_same);
}

}  // namespace kiln
