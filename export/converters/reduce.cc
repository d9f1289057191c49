// ONNX converters of the reduce family. Older versions are normalised to the newest
// semantics: reduction axes given as an attribute become a constant i64 input; Softmax,
// LogSoftmax and Hardmax before opset 13 (which work on the input flattened to 2-D at `axis`)
// become the one-axis op when `axis` is the last dim, and Flatten → op → Reshape otherwise;
// TopK's k attribute becomes an input; GroupNormalization-18's per-group scale and bias are
// repeated per channel; MeanVarianceNormalization is decomposed exactly as its ONNX function
// body; BatchNormalization is accepted in inference mode only.
#include <onnx/onnx_pb.h>

#include <string>

#include "export/converter.h"

namespace kiln {

namespace {

Tensor i64_vector(const std::vector<int64_t>& v) {
  return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v);
}

Tensor scalar_like(DType dtype, double v) {
  Tensor t(dtype, {});
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) t.data<T>()[0] = T(static_cast<float>(v));
    else t.data<T>()[0] = static_cast<T>(v);
  });
  return t;
}

// Reductions whose axes are an attribute in this version: move them to input 1.
Status convert_reduce_attr_axes(ConvertContext& ctx) {
  std::vector<ValueId> ins = {ctx.input(0)};
  std::vector<int64_t> axes = ctx.attr_ints("axes");
  if (!axes.empty()) ins.push_back(ctx.constant(i64_vector(axes), "axes"));
  Node& n = ctx.emit(ctx.op_type(), ins, {ctx.output(0)});
  n.set_attr("keepdims", ctx.attr_int("keepdims", 1));
  return {};
}

// Softmax-like ops of opset 1 and 11: the input is seen as 2-D [prod(dims < axis),
// prod(dims >= axis)] and the op runs along the second dim.
Status convert_softmax_flatten(ConvertContext& ctx) {
  const Shape& s = ctx.graph().value(ctx.input(0)).shape;
  int64_t axis = ctx.attr_int("axis", 1);
  if (s.rank_known) {
    const int64_t r = s.rank();
    if (axis < -r || axis >= std::max<int64_t>(r, 1))
      return ctx.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
    if (axis < 0) axis += r;
    if (axis == r - 1) {
      Node& n = ctx.emit(ctx.op_type(), {ctx.input(0)}, {ctx.output(0)});
      n.set_attr("axis", int64_t{-1});
      return {};
    }
  }
  ValueId shape = ctx.temp("shape"), flat = ctx.temp("flat"), res = ctx.temp("result");
  ctx.emit("Shape", {ctx.input(0)}, {shape});
  ctx.emit("Flatten", {ctx.input(0)}, {flat}).set_attr("axis", axis);
  ctx.emit(ctx.op_type(), {flat}, {res}).set_attr("axis", int64_t{1});
  ctx.emit("Reshape", {res, shape}, {ctx.output(0)}).set_attr("allowzero", int64_t{1});
  return {};
}

Status convert_topk_attr(ConvertContext& ctx) {
  if (!ctx.has_attr("k")) return ctx.error("TopK is missing attribute 'k'");
  ValueId k = ctx.constant(i64_vector({ctx.attr_int("k", 0)}), "k");
  Node& n = ctx.emit("TopK", {ctx.input(0), k}, {ctx.output(0), ctx.output(1)});
  n.set_attr("axis", ctx.attr_int("axis", -1));
  return {};
}

Status convert_batch_norm(ConvertContext& ctx) {
  if (ctx.attr_int("training_mode", 0) != 0)
    return ctx.error("BatchNormalization in training mode is not supported (inference only)");
  if (ctx.attr_int("spatial", 1) == 0) return ctx.error("BatchNormalization with spatial=0 is not supported");
  for (size_t i = 1; i < ctx.num_outputs(); ++i)
    if (ctx.output(i) != kNoValue)
      return ctx.error("BatchNormalization's training outputs (running or saved statistics) are not supported");
  Node& n = ctx.emit("BatchNormalization", {ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3), ctx.input(4)},
                     {ctx.output(0)});
  n.set_attr("epsilon", ctx.attr_float("epsilon", 1e-5f));
  return {};
}

// GroupNormalization-18: scale and bias have one value per group; the core op (opset 21)
// takes one per channel, so each is repeated C / G times.
Status convert_group_norm_18(ConvertContext& ctx) {
  const int64_t groups = ctx.attr_int("num_groups", 0);
  const Shape& xs = ctx.graph().value(ctx.input(0)).shape;
  if (groups <= 0) return ctx.error("num_groups must be positive, got " + std::to_string(groups));
  if (!xs.rank_known || xs.rank() < 2 || !xs.dims[1].is_known())
    return ctx.error("GroupNormalization-18 needs the channel count of X at export, got shape " + xs.str());
  const int64_t channels = xs.dims[1].value;
  if (channels % groups != 0)
    return ctx.error(std::to_string(channels) + " channels do not divide into " + std::to_string(groups) + " groups");
  std::vector<ValueId> ins = {ctx.input(0)};
  for (size_t i = 1; i <= 2; ++i) {
    ValueId g2 = ctx.temp("grouped"), wide = ctx.temp("per_group"), per_channel = ctx.temp("per_channel");
    ctx.emit("Reshape", {ctx.input(i), ctx.constant(i64_vector({groups, 1}), "group_shape")}, {g2});
    ctx.emit("Expand", {g2, ctx.constant(i64_vector({groups, channels / groups}), "expand_shape")}, {wide});
    ctx.emit("Reshape", {wide, ctx.constant(i64_vector({channels}), "channel_shape")}, {per_channel});
    ins.push_back(per_channel);
  }
  Node& n = ctx.emit("GroupNormalization", ins, {ctx.output(0)});
  n.set_attr("num_groups", groups);
  n.set_attr("epsilon", ctx.attr_float("epsilon", 1e-5f));
  return {};
}

// MeanVarianceNormalization, as its ONNX function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9).
Status convert_mvn(ConvertContext& ctx) {
  DType dt = ctx.graph().value(ctx.input(0)).dtype;
  if (!is_float(dt)) return ctx.error("MeanVarianceNormalization takes floating-point input, got " + std::string(dtype_name(dt)));
  ValueId x = ctx.input(0);
  ValueId axes = ctx.constant(i64_vector(ctx.attr_ints("axes", {0, 2, 3})), "axes");
  ValueId mean = ctx.temp("mean"), mean_sq = ctx.temp("mean_squared"), sq = ctx.temp("squared"),
          sq_mean = ctx.temp("squared_mean"), var = ctx.temp("variance"), stddev = ctx.temp("stddev"),
          centered = ctx.temp("centered"), denom = ctx.temp("denominator");
  ctx.emit("ReduceMean", {x, axes}, {mean});
  ctx.emit("Mul", {mean, mean}, {mean_sq});
  ctx.emit("Mul", {x, x}, {sq});
  ctx.emit("ReduceMean", {sq, axes}, {sq_mean});
  ctx.emit("Sub", {sq_mean, mean_sq}, {var});
  ctx.emit("Sqrt", {var}, {stddev});
  ctx.emit("Sub", {x, mean}, {centered});
  ctx.emit("Add", {stddev, ctx.constant(scalar_like(dt, 1e-9), "epsilon")}, {denom});
  ctx.emit("Div", {centered, denom}, {ctx.output(0)});
  return {};
}

void add_range(ConverterRegistry& r, std::string_view op, int from, int to, ConvertFn fn) {
  r.add(std::string(op), from, to, fn);
}

int last_version(std::string_view op) {
  std::span<const int> v = onnx_op_versions("", op);
  return v.empty() ? 1 : v.back();
}

}  // namespace

void register_reduce_converters(ConverterRegistry& r) {
  // ReduceSum took axes as an input from 13, the others from 18.
  add_range(r, "ReduceSum", 1, 12, convert_reduce_attr_axes);
  add_range(r, "ReduceSum", 13, last_version("ReduceSum"), convert_plain);
  for (std::string_view op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}) {
    add_range(r, op, 1, 17, convert_reduce_attr_axes);
    add_range(r, op, 18, last_version(op), convert_plain);
  }
  for (std::string_view op : {"ArgMax", "ArgMin", "CumSum", "CumProd", "LayerNormalization", "LpNormalization",
                              "InstanceNormalization", "RMSNormalization"})
    add_range(r, op, 1, last_version(op), convert_plain);
  for (std::string_view op : {"Softmax", "LogSoftmax", "Hardmax"}) {
    add_range(r, op, 1, 12, convert_softmax_flatten);
    add_range(r, op, 13, last_version(op), convert_plain);
  }
  add_range(r, "TopK", 1, 9, convert_topk_attr);
  add_range(r, "TopK", 10, last_version("TopK"), convert_plain);
  add_range(r, "BatchNormalization", 1, last_version("BatchNormalization"), convert_batch_norm);
  add_range(r, "GroupNormalization", 18, 20, convert_group_norm_18);
  add_range(r, "GroupNormalization", 21, last_version("GroupNormalization"), convert_plain);
  add_range(r, "MeanVarianceNormalization", 1, last_version("MeanVarianceNormalization"), convert_mvn);
}

}  // namespace kiln
