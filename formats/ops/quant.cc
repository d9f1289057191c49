// Core ops of the quant family: QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked),
// DynamicQuantizeLinear, the integer compute ops of ONNX's QOperator format (QLinearMatMul,
// QLinearConv, MatMulInteger, ConvInteger), and QAdd, QMul and LookupTable, which `kiln compile` makes. Their semantics are the newest ONNX versions'; the
// shape rules here are shared by export (symbolic shapes) and the runtime (concrete shapes).
#include <algorithm>

#include "formats/checked.h"
#include "formats/op_schema.h"
#include "formats/ops/epilogue.h"
#include "formats/ops/flops.h"

namespace kiln {

namespace {

// Checks a scale or zero-point operand against x for per-tensor, per-axis or blocked
// quantization (ONNX's rules: rank 0 or one element = per tensor; 1-D = per axis; same rank as x
// with block_size > 0 = blocked).
Status check_quant_operand(const InferContext& ctx, size_t i, const Shape& x, std::string_view what) {
  const Shape& s = ctx.shape(i);
  if (!s.rank_known) return {};
  int64_t block = ctx.node().attr_int("block_size", 0);
  if (block < 0) return ctx.error("block_size " + std::to_string(block) + " is negative");
  bool single = s.rank() == 0 || (s.rank() == 1 && s.dims[0].is_known() && s.dims[0].value == 1 && block == 0);
  if (single) return {};
  if (!x.rank_known) return {};
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.node().attr_int("axis", 1), x.rank(), ctx));
  const Dim& xa = x.dims[static_cast<size_t>(axis)];
  if (block == 0) {
    if (s.rank() != 1)
      return ctx.error(std::string(what) + " has shape " + s.str() + "; per-axis quantization needs a 1-D tensor");
    if (s.dims[0].is_known() && xa.is_known() && s.dims[0].value != xa.value)
      return ctx.error(std::string(what) + " has " + std::to_string(s.dims[0].value) + " elements but axis " +
                       std::to_string(axis) + " of the input has size " + std::to_string(xa.value));
    return {};
  }
  if (s.rank() != x.rank())
    return ctx.error(std::string(what) + " has shape " + s.str() + "; blocked quantization needs rank " +
                     std::to_string(x.rank()));
  for (int64_t d = 0; d < x.rank(); ++d) {
    const Dim& sd = s.dims[static_cast<size_t>(d)];
    const Dim& xd = x.dims[static_cast<size_t>(d)];
    if (!sd.is_known() || !xd.is_known()) continue;
    int64_t want = d == axis ? xd.value / block + (xd.value % block != 0) : xd.value;
    if (sd.value != want)
      return ctx.error(std::string(what) + " has shape " + s.str() + " but input shape " + x.str() +
                       " with block_size " + std::to_string(block) + " needs " + std::to_string(want) +
                       " in dim " + std::to_string(d));
  }
  return {};
}

Status infer_quantize(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DType precision, dtype_attr(ctx, "precision", DType::undefined));
  if (precision != DType::undefined && !is_float(precision))
    return ctx.error("precision must be a float type, got " + std::string(dtype_name(precision)));
  DType out = DType::u8;
  if (ctx.has_input(2)) {
    out = ctx.dtype(2);
    KILN_RETURN_IF_ERROR(check_quant_operand(ctx, 2, ctx.shape(0), "zero point"));
  }
  KILN_RETURN_IF_ERROR(check_quant_operand(ctx, 1, ctx.shape(0), "scale"));
  ctx.set_output(0, out, ctx.shape(0));
  return {};
}

Status infer_dequantize(InferContext& ctx) {
  if (ctx.has_input(2)) {
    KILN_RETURN_IF_ERROR(check_quant_operand(ctx, 2, ctx.shape(0), "zero point"));
  }
  KILN_RETURN_IF_ERROR(check_quant_operand(ctx, 1, ctx.shape(0), "scale"));
  KILN_ASSIGN_OR_RETURN(DType out, dtype_attr(ctx, "output_dtype", ctx.dtype(1)));
  if (!is_float(out)) return ctx.error("output_dtype must be a float type, got " + std::string(dtype_name(out)));
  ctx.set_output(0, out, ctx.shape(0));
  return {};
}

Status infer_dynamic_quantize(InferContext& ctx) {
  ctx.set_output(0, DType::u8, ctx.shape(0));
  ctx.set_output(1, DType::f32, Shape(std::vector<Dim>{}));
  ctx.set_output(2, DType::u8, Shape(std::vector<Dim>{}));
  return {};
}

// numpy.matmul's shape rule (1-D operands promoted and the promoted dim dropped again).
Result<Shape> matmul_shape(const InferContext& ctx, const Shape& a, const Shape& b) {
  if (!a.rank_known || !b.rank_known) return Shape::unknown_rank();
  if (a.rank() == 0 || b.rank() == 0) return ctx.error("matmul operands must have rank >= 1");
  std::vector<Dim> ad = a.dims, bd = b.dims;
  bool a1 = ad.size() == 1, b1 = bd.size() == 1;
  if (a1) ad.insert(ad.begin(), Dim::known(1));
  if (b1) bd.push_back(Dim::known(1));
  const Dim& ka = ad.back();
  const Dim& kb = bd[bd.size() - 2];
  if (ka.is_known() && kb.is_known() && ka.value != kb.value)
    return ctx.error("inner dimensions differ: " + a.str() + " and " + b.str());
  Shape ab(std::vector<Dim>(ad.begin(), ad.end() - 2));
  Shape bb(std::vector<Dim>(bd.begin(), bd.end() - 2));
  KILN_ASSIGN_OR_RETURN(Shape out, broadcast_shapes(ab, bb, ctx));
  if (!a1) out.dims.push_back(ad[ad.size() - 2]);
  if (!b1) out.dims.push_back(bd.back());
  return out;
}

Status infer_matmul_integer(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape s, matmul_shape(ctx, ctx.shape(0), ctx.shape(1)));
  ctx.set_output(0, DType::i32, std::move(s));
  return {};
}

Status infer_qlinear_matmul(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape s, matmul_shape(ctx, ctx.shape(0), ctx.shape(3)));
  ctx.set_output(0, ctx.dtype(7), std::move(s));
  return {};
}

// Output shape of an N-d convolution (ONNX Conv rules, auto_pad included).
Result<Shape> conv_shape(const InferContext& ctx, const Shape& x, const Shape& w) {
  const Node& n = ctx.node();
  if (!x.rank_known) return Shape::unknown_rank();
  if (x.rank() < 3) return ctx.error("input has shape " + x.str() + "; convolution needs rank >= 3");
  const size_t ns = static_cast<size_t>(x.rank() - 2);
  if (w.rank_known && w.rank() != x.rank())
    return ctx.error("weight shape " + w.str() + " does not match input rank " + std::to_string(x.rank()));
  int64_t group = n.attr_int("group", 1);
  if (group < 1) return ctx.error("group " + std::to_string(group) + " must be positive");
  std::vector<int64_t> kernel = n.attr_ints("kernel_shape");
  if (kernel.empty() && w.rank_known)
    for (size_t i = 0; i < ns; ++i) kernel.push_back(w.dims[2 + i].value);
  std::vector<int64_t> strides = n.attr_ints("strides", std::vector<int64_t>(ns, 1));
  std::vector<int64_t> dil = n.attr_ints("dilations", std::vector<int64_t>(ns, 1));
  std::vector<int64_t> pads = n.attr_ints("pads", std::vector<int64_t>(2 * ns, 0));
  std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  if (strides.size() != ns || dil.size() != ns || pads.size() != 2 * ns || (!kernel.empty() && kernel.size() != ns))
    return ctx.error("strides, dilations, pads or kernel_shape do not match " + std::to_string(ns) + " spatial dims");
  for (size_t i = 0; i < ns; ++i) {
    if (strides[i] < 1 || dil[i] < 1) return ctx.error("strides and dilations must be positive");
    if (pads[i] < 0 || pads[i + ns] < 0) return ctx.error("pads must not be negative");
  }
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER")
    return ctx.error("unknown auto_pad '" + auto_pad + "'");
  if (x.dims[1].is_known() && w.rank_known && w.dims[1].is_known()) {
    CheckedInt expect = CheckedInt(w.dims[1].value) * group;
    if (!expect.ok() || x.dims[1].value != expect.value())
      return ctx.error("input has " + std::to_string(x.dims[1].value) + " channels but the weight expects " +
                       std::to_string(w.dims[1].value) + " x group " + std::to_string(group));
  }
  std::vector<Dim> out{x.dims[0], w.rank_known ? w.dims[0] : Dim::unknown()};
  if (out[1].is_known() && out[1].value % group != 0)
    return ctx.error("output channels " + std::to_string(out[1].value) + " are not divisible by group " + std::to_string(group));
  for (size_t i = 0; i < ns; ++i) {
    const Dim& in = x.dims[2 + i];
    if (!in.is_known() || i >= kernel.size() || kernel[i] < 0) { out.push_back(Dim::unknown()); continue; }
    CheckedInt o;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      o = (CheckedInt(in.value) + strides[i] - 1) / strides[i];
    } else {
      CheckedInt padded = CheckedInt(in.value) + (auto_pad == "VALID" ? CheckedInt(0) : CheckedInt(pads[i]) + pads[i + ns]);
      CheckedInt span = CheckedInt(dil[i]) * (CheckedInt(kernel[i]) - 1) + 1;
      if (!padded.ok() || !span.ok())
        return ctx.error("the padded input size or kernel extent of spatial dim " + std::to_string(i) + " overflows int64");
      if (padded.value() < span.value())
        return ctx.error("kernel extent " + std::to_string(span.value()) + " exceeds padded input size " +
                         std::to_string(padded.value()));
      o = (padded - span) / strides[i] + 1;
    }
    if (!o.ok()) return ctx.error("the output size of spatial dim " + std::to_string(i) + " overflows int64");
    out.push_back(Dim::known(o.value()));
  }
  return Shape(std::move(out));
}

Status infer_conv_integer(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape s, conv_shape(ctx, ctx.shape(0), ctx.shape(1)));
  ctx.set_output(0, DType::i32, std::move(s));
  return {};
}

Status infer_qlinear_conv(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Shape s, conv_shape(ctx, ctx.shape(0), ctx.shape(3)));
  ctx.set_output(0, ctx.dtype(7), std::move(s));
  return {};
}

// QAdd: y = Q(activation(DQ(a) + DQ(b))), every scale and zero point a scalar; numpy
// broadcasting of a and b; y takes y_zero_point's type.
Status infer_qadd(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalar_inputs(ctx, {1, 2, 4, 5, 6, 7}));
  KILN_RETURN_IF_ERROR(read_activation(ctx.node(), "activation").status());
  KILN_ASSIGN_OR_RETURN(Shape y, broadcast_shapes(ctx.shape(0), ctx.shape(3), ctx));
  ctx.set_output(0, ctx.dtype(7), std::move(y));
  return {};
}

// QMul: y = Q(DQ(a) · b), b f32 (a gate: EfficientNet's squeeze-excite scales), a's and y's
// scales and zero points scalars; numpy broadcasting of a and b; y takes y_zero_point's type.
Status infer_qmul(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_scalar_inputs(ctx, {1, 2, 4, 5}));
  KILN_ASSIGN_OR_RETURN(Shape y, broadcast_shapes(ctx.shape(0), ctx.shape(3), ctx));
  ctx.set_output(0, ctx.dtype(5), std::move(y));
  return {};
}

// LookupTable: y[i] = table[x[i]] (u8 codes index it as they are, s8 ones plus 128); table
// holds 256 f32 values; y has x's shape.
Status infer_lookup_table(InferContext& ctx) {
  const Shape& t = ctx.shape(1);
  if (t.rank_known && (t.rank() != 1 || (t.dims[0].is_known() && t.dims[0].value != 256)))
    return ctx.error("table has shape " + t.str() + "; it must hold 256 values, one per code");
  ctx.set_output(0, DType::f32, ctx.shape(0));
  return {};
}

std::vector<AttrSpec> conv_attrs() {
  return {{"auto_pad", AttrType::string, false, "NOTSET, VALID, SAME_UPPER or SAME_LOWER"},
          {"dilations", AttrType::ints, false, "per spatial dim, default 1"},
          {"group", AttrType::int64, false, "channel groups, default 1"},
          {"kernel_shape", AttrType::ints, false, "default: the weight's spatial dims"},
          {"pads", AttrType::ints, false, "begin pads then end pads, default 0"},
          {"strides", AttrType::ints, false, "per spatial dim, default 1"}};
}

}  // namespace

void register_quant_ops(OpRegistry& r) {
  using namespace types;
  const TypeSet storage = DType::u8 | DType::i8 | DType::u16 | DType::i16 | DType::u4 | DType::i4;
  const TypeSet int8 = DType::u8 | DType::i8;
  r.add("", OpSchema{"QuantizeLinear", "y = saturate(round_half_even(x / scale) + zero_point)", 2, 3, 1, 1,
                     {{"axis", AttrType::int64, false, "channel axis of per-axis / blocked parameters, default 1"},
                      {"block_size", AttrType::int64, false, "block length along axis; 0 = not blocked"},
                      {"precision", AttrType::string, false, "float dtype of the division; default the scale's"}},
                     infer_quantize})
      .traits.types = {input(0, kFloat, "input"), input(1, kFloat, "scale"), input(2, storage, "zero point")};
  r.add("", OpSchema{"DequantizeLinear", "y = (x - zero_point) * scale", 2, 3, 1, 1,
                     {{"axis", AttrType::int64, false, "channel axis of per-axis / blocked parameters, default 1"},
                      {"block_size", AttrType::int64, false, "block length along axis; 0 = not blocked"},
                      {"output_dtype", AttrType::string, false, "float dtype of y; default the scale's"}},
                     infer_dequantize})
      .traits.types = {input(0, storage | DType::i32, "input"), input(1, kFloat, "scale"), same_as(2, 0, "zero point")};
  r.add("", OpSchema{"DynamicQuantizeLinear", "u8 quantization with scale and zero point from the data's range",
                     1, 1, 3, 3, {}, infer_dynamic_quantize}).traits.types = {input(0, DType::f32)};
  r.add("", OpSchema{"MatMulInteger", "i32 matmul of (a - a_zero_point) and (b - b_zero_point)", 2, 4, 1, 1, {},
                     infer_matmul_integer})
      .traits = {.types = {input(0, int8, "A"), input(1, int8, "B"), same_as(2, 0, "a_zero_point"), same_as(3, 1, "b_zero_point")},
                 .flops = flops::matmul<0>,
                 .prepack_inputs = {1}};
  r.add("", OpSchema{"QLinearMatMul", "quantized matmul: requantized i32 product of dequantized operands", 8, 8,
                     1, 1, {}, infer_qlinear_matmul})
      .traits = {.types = {input(0, int8, "a"), input(1, kFloat, "a_scale"), same_as(2, 0, "a_zero_point"),
                           input(3, int8, "b"), input(4, kFloat, "b_scale"), same_as(5, 3, "b_zero_point"),
                           input(6, kFloat, "y_scale"), input(7, int8, "y_zero_point")},
                 .flops = flops::matmul<0>,
                 .prepack_inputs = {3}};
  r.add("", OpSchema{"ConvInteger", "i32 convolution of (x - x_zero_point) and (w - w_zero_point)", 2, 4, 1, 1,
                     conv_attrs(), infer_conv_integer})
      .traits = {.types = {input(0, int8, "x"), input(1, int8, "w"), same_as(2, 0, "x_zero_point"), same_as(3, 1, "w_zero_point")},
                 .flops = flops::conv<1>,
                 .prepack_inputs = {1}};
  r.add("", OpSchema{"QLinearConv", "quantized convolution with i32 bias, requantized to y's scale", 8, 9, 1, 1,
                     conv_attrs(), infer_qlinear_conv})
      .traits = {.types = {input(0, int8, "x"), input(1, kFloat, "x_scale"), same_as(2, 0, "x_zero_point"),
                           input(3, int8, "w"), input(4, kFloat, "w_scale"), same_as(5, 3, "w_zero_point"),
                           input(6, kFloat, "y_scale"), input(7, int8, "y_zero_point"), input(8, DType::i32, "bias")},
                 .flops = flops::conv<3>,
                 .prepack_inputs = {3}};
  r.add("", OpSchema{"QAdd", "elementwise add of dequantized u8/s8 a and b, activation, quantized (made by compile)", 8, 8, 1, 1,
                     {{"activation", AttrType::string, false, "applied to the sum (none)"},
                      {"activation_params", AttrType::floats, false, "its alpha / min and beta / max"}},
                     infer_qadd})
      .traits.types = {input(0, int8, "a"), input(1, DType::f32, "a_scale"), same_as(2, 0, "a_zero_point"),
                       input(3, int8, "b"), same_as(4, 1, "b_scale"), same_as(5, 3, "b_zero_point"),
                       same_as(6, 1, "y_scale"), input(7, int8, "y_zero_point")};
  r.add("", OpSchema{"LookupTable", "f32 value of each u8/s8 code from a table of 256 (made by compile: f(DQ(x)))", 2, 2, 1, 1, {},
                     infer_lookup_table})
      .traits.types = {input(0, int8, "x"), input(1, DType::f32, "table")};
  r.add("", OpSchema{"QMul", "dequantized u8/s8 a times f32 b, quantized (made by compile)", 6, 6, 1, 1, {}, infer_qmul})
      .traits.types = {input(0, int8, "a"), input(1, DType::f32, "a_scale"), same_as(2, 0, "a_zero_point"), same_as(3, 1, "b"),
                       same_as(4, 1, "y_scale"), input(5, int8, "y_zero_point")};
}

}  // namespace kiln
