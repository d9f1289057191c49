// ONNX converters of the misc family. Most ops map one to one; ONNX dtype enums in attributes
// (the windows' and MelWeightMatrix's output_datatype) become kiln dtype names, and DFT-17's
// axis attribute becomes DFT-20's axis input. Random ops (Bernoulli, RandomUniform, …) are not
// converted: their outputs cannot be reproduced, so kiln leaves them unsupported.
#include <onnx/onnx_pb.h>

#include "export/converter.h"
#include "export/onnx_tensor.h"

namespace kiln {

namespace {

// Copies the node and rewrites the ONNX dtype enum attribute `name` as a kiln dtype name.
Status convert_with_dtype_attr(ConvertContext& ctx, std::string_view name) {
  int64_t v = ctx.attr_int(name, 0);
  std::optional<DType> t;
  if (ctx.has_attr(name)) {
    t = dtype_from_onnx(static_cast<int>(v));
    if (!t) return ctx.error("attribute '" + std::string(name) + "' is " + onnx_type_name(static_cast<int>(v)) +
                             ", which kiln does not support");
  }
  KILN_ASSIGN_OR_RETURN(Node * n, ctx.emit_passthrough(ctx.op_type(), {name}));
  if (t) n->set_attr(std::string(name), std::string(dtype_name(*t)));
  return {};
}

Status convert_output_datatype(ConvertContext& ctx) { return convert_with_dtype_attr(ctx, "output_datatype"); }

Status convert_dft17(ConvertContext& ctx) {
  ValueId axis = ctx.constant(Tensor::from<int64_t>({}, {ctx.attr_int("axis", 1)}), "axis");
  Node& n = ctx.emit("DFT", {ctx.input(0), ctx.input(1), axis}, {ctx.output(0)});
  if (ctx.attr_int("inverse", 0)) n.set_attr("inverse", int64_t{1});
  if (ctx.attr_int("onesided", 0)) n.set_attr("onesided", int64_t{1});
  return {};
}

}  // namespace

void register_misc_converters(ConverterRegistry& r) {
  r.add("RNN", 7, 22, convert_passthrough);
  r.add("GRU", 7, 22, convert_passthrough);
  r.add("LSTM", 7, 22, convert_passthrough);
  r.add("NonMaxSuppression", 10, 11, convert_passthrough);
  r.add("HannWindow", 17, 17, convert_output_datatype);
  r.add("HammingWindow", 17, 17, convert_output_datatype);
  r.add("BlackmanWindow", 17, 17, convert_output_datatype);
  r.add("MelWeightMatrix", 17, 17, convert_output_datatype);
  r.add("DFT", 17, 17, convert_dft17);
  r.add("DFT", 20, 20, convert_passthrough);
  r.add("STFT", 17, 17, convert_passthrough);
  r.add("Det", 11, 22, convert_passthrough);
}

}  // namespace kiln
