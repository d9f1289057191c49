// ONNX converters of the quant family. QuantizeLinear's output_dtype becomes an explicit zero
// point (the core op takes its output type from the zero point, as `kiln quant` will write it);
// ONNX dtype enums in attributes (DequantizeLinear's output_dtype, QuantizeLinear's precision)
// become kiln dtype names. Everything else maps one to one.
#include <onnx/onnx_pb.h>

#include "export/converter.h"
#include "export/onnx_tensor.h"

namespace kiln {

namespace {

// An ONNX dtype enum attribute as a kiln DType; nullopt when absent or 0.
Result<std::optional<DType>> dtype_enum_attr(const ConvertContext& ctx, std::string_view name) {
  int64_t v = ctx.attr_int(name, 0);
  if (v == 0) return std::optional<DType>();
  auto t = value_dtype_from_onnx(static_cast<int>(v));
  if (!t) return ctx.error("attribute '" + std::string(name) + "' is " + onnx_type_name(static_cast<int>(v)) +
                           ", which kiln does not support");
  return std::optional<DType>(*t);
}

Status convert_quantize(ConvertContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::optional<DType> out, dtype_enum_attr(ctx, "output_dtype"));
  KILN_ASSIGN_OR_RETURN(std::optional<DType> precision, dtype_enum_attr(ctx, "precision"));
  std::vector<ValueId> ins{ctx.input(0), ctx.input(1)};
  if (ctx.has_input(2)) {
    ins.push_back(ctx.input(2));
  } else if (out && *out != DType::u8) {
    // A scalar zero of the requested type selects the output type.
    ins.push_back(ctx.constant(Tensor(*out, {}), "zero_point"));
  }
  Node& n = ctx.emit("QuantizeLinear", ins, {ctx.output(0)});
  if (ctx.has_attr("axis")) n.set_attr("axis", ctx.attr_int("axis", 1));
  if (ctx.attr_int("block_size", 0) != 0) n.set_attr("block_size", ctx.attr_int("block_size", 0));
  if (precision) n.set_attr("precision", std::string(dtype_name(*precision)));
  return {};
}

Status convert_dequantize(ConvertContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::optional<DType> out, dtype_enum_attr(ctx, "output_dtype"));
  std::vector<ValueId> ins{ctx.input(0), ctx.input(1)};
  if (ctx.has_input(2)) ins.push_back(ctx.input(2));
  Node& n = ctx.emit("DequantizeLinear", ins, {ctx.output(0)});
  if (ctx.has_attr("axis")) n.set_attr("axis", ctx.attr_int("axis", 1));
  if (ctx.attr_int("block_size", 0) != 0) n.set_attr("block_size", ctx.attr_int("block_size", 0));
  if (out) n.set_attr("output_dtype", std::string(dtype_name(*out)));
  return {};
}

}  // namespace

void register_quant_converters(ConverterRegistry& r) {
  r.add("QuantizeLinear", 10, 25, convert_quantize);
  r.add("DequantizeLinear", 10, 25, convert_dequantize);
  r.add("DynamicQuantizeLinear", 11, 11, convert_passthrough);
  r.add("MatMulInteger", 10, 10, convert_passthrough);
  r.add("QLinearMatMul", 10, 21, convert_passthrough);
  r.add("ConvInteger", 10, 10, convert_passthrough);
  r.add("QLinearConv", 10, 10, convert_passthrough);
}

}  // namespace kiln
