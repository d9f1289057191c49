// ONNX converters of the elementwise family. Most ops map one to one onto the core op of the
// same name; older versions are normalised to the newest semantics: legacy attributes that
// never changed results (consumed_inputs) are dropped, Clip's min/max attributes become
// inputs, Cast's ONNX type code becomes a kiln type name, CastLike becomes Cast, and Dropout
// (inference) becomes Identity. Versions whose semantics kiln does not implement (the
// pre-7 "broadcast"/"axis" attributes) are registered only for the cases that match numpy.
#include <onnx/onnx_pb.h>

#include <limits>
#include <string>

#include "export/converter.h"
#include "export/onnx_tensor.h"

namespace kiln {

namespace {

// Opset 1/6 binary ops: "broadcast" = 0 requires equal shapes (numpy gives the same result);
// broadcast = 1 with the second input aligned at the end ("axis" absent or pointing there) is
// numpy broadcasting. Other alignments are refused rather than computed differently.
Status convert_legacy_binary(ConvertContext& ctx) {
  if (ctx.attr_int("broadcast", 0) != 0 && ctx.has_attr("axis")) {
    const Shape& a = ctx.graph().value(ctx.input(0)).shape;
    const Shape& b = ctx.graph().value(ctx.input(1)).shape;
    int64_t axis = ctx.attr_int("axis", 0);
    if (!a.rank_known || !b.rank_known) return ctx.error("legacy broadcast with 'axis' needs known input ranks");
    if (axis < 0) axis += a.rank();
    if (axis + b.rank() != a.rank())
      return ctx.error("legacy broadcast at axis " + std::to_string(axis) + " of a rank " + std::to_string(a.rank()) +
                       " input by a rank " + std::to_string(b.rank()) + " input is not supported");
  }
  auto n = ctx.emit_passthrough(ctx.op_type(), {"consumed_inputs", "broadcast", "axis"});
  return n.ok() ? Status() : Status(n.error());
}

// A one-element constant of `dtype` holding v.
Tensor scalar_of(DType dtype, double v) {
  Tensor t(dtype, {});
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) t.data<T>()[0] = T(static_cast<float>(v));
    else t.data<T>()[0] = static_cast<T>(v);
  });
  return t;
}

// Clip 1 and 6 carry min/max as float attributes (defaults: the float range).
Status convert_clip_attrs(ConvertContext& ctx) {
  DType dt = ctx.graph().value(ctx.input(0)).dtype;
  if (!is_float(dt)) return ctx.error("Clip before opset 11 takes floating-point input, got " + std::string(dtype_name(dt)));
  std::vector<ValueId> ins = {ctx.input(0)};
  double lo = ctx.attr_float("min", -std::numeric_limits<float>::max());
  double hi = ctx.attr_float("max", std::numeric_limits<float>::max());
  if (ctx.has_attr("min") || ctx.has_attr("max")) {
    ins.push_back(ctx.has_attr("min") ? ctx.constant(scalar_of(dt, lo), "min") : kNoValue);
    if (ctx.has_attr("max")) ins.push_back(ctx.constant(scalar_of(dt, hi), "max"));
  }
  ctx.emit("Clip", ins, {ctx.output(0)});
  return {};
}

Status emit_cast(ConvertContext& ctx, DType to) {
  Node& n = ctx.emit("Cast", {ctx.input(0)}, {ctx.output(0)});
  n.set_attr("to", std::string(dtype_name(to)));
  return {};
}

Status convert_cast(ConvertContext& ctx) {
  int64_t code = ctx.attr_int("to", 0);
  std::optional<DType> to = dtype_from_onnx(static_cast<int>(code));
  if (!to) return ctx.error("Cast to " + onnx_type_name(static_cast<int>(code)) + " is not supported");
  return emit_cast(ctx, *to);
}

Status convert_cast_like(ConvertContext& ctx) {
  DType to = ctx.graph().value(ctx.input(1)).dtype;
  if (to == DType::undefined) return ctx.error("the type of CastLike's target input is unknown");
  return emit_cast(ctx, to);
}

// Dropout at inference is the identity; its optional mask is all ones (bool from opset 10, the
// data's type before).
Status convert_dropout(ConvertContext& ctx) {
  if (ctx.op_version() >= 12 && ctx.has_input(2)) {
    const Tensor* training = ctx.constant_input(2);
    if (!training) return ctx.error("Dropout with a non-constant training_mode is not supported (inference only)");
    if (training->numel() != 1 || training->as_int64(0) != 0)
      return ctx.error("Dropout in training mode is not supported (inference only)");
  }
  ctx.emit("Identity", {ctx.input(0)}, {ctx.output(0)});
  if (ctx.output(1) != kNoValue) {
    DType mask_type = ctx.op_version() >= 10 ? DType::boolean : ctx.graph().value(ctx.input(0)).dtype;
    if (mask_type == DType::undefined) return ctx.error("the type of Dropout's input is unknown");
    ValueId shape = ctx.temp("shape");
    ctx.emit("Shape", {ctx.input(0)}, {shape});
    Tensor one = scalar_of(mask_type, 1.0).reshaped({1});
    Node& n = ctx.emit("ConstantOfShape", {shape}, {ctx.output(1)});
    n.set_attr("value", one);
  }
  return {};
}

// Every since-version of `op` from `from` on.
void add_from(ConverterRegistry& r, std::string_view op, int from, ConvertFn fn) {
  std::span<const int> versions = onnx_op_versions("", op);
  int last = versions.empty() ? from : versions.back();
  r.add(std::string(op), from, std::max(from, last), fn);
}

}  // namespace

void register_elementwise_converters(ConverterRegistry& r) {
  // Unary ops whose every version has today's semantics (v1's consumed_inputs is dropped).
  for (std::string_view op :
       {"Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Tan",
        "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Erf", "IsNaN", "IsInf", "Not",
        "BitwiseNot", "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
        "Softplus", "Softsign", "Mish", "Gelu", "ThresholdedRelu", "Shrink", "Swish", "Identity"})
    add_from(r, op, 1, convert_plain);
  // Numpy-broadcasting binary ops; their opset 1/6 forms go through the legacy converter.
  for (std::string_view op : {"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater"}) {
    r.add(std::string(op), 1, 6, convert_legacy_binary);
    add_from(r, op, 7, convert_plain);
  }
  for (std::string_view op : {"Mod", "LessOrEqual", "GreaterOrEqual", "BitShift", "BitwiseAnd", "BitwiseOr",
                              "BitwiseXor", "Where"})
    add_from(r, op, 1, convert_plain);
  // PRelu before 7 had a channel-wise slope rule of its own.
  add_from(r, "PRelu", 7, convert_plain);
  // Max/Min/Sum/Mean: opset 6 needs equal shapes, which numpy broadcasting also accepts.
  for (std::string_view op : {"Max", "Min", "Sum", "Mean"}) add_from(r, op, 1, convert_plain);
  r.add("Clip", 1, 6, convert_clip_attrs);
  add_from(r, "Clip", 11, convert_plain);
  add_from(r, "Cast", 6, convert_cast);
  add_from(r, "CastLike", 15, convert_cast_like);
  add_from(r, "Dropout", 7, convert_dropout);
}

}  // namespace kiln
