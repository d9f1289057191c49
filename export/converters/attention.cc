// ONNX converters of the attention family: Attention (23, 24) and RotaryEmbedding (23) map onto
// the core ops of the same name; the loss converters live in export/converters/loss.cc.
// Attention-23 is Attention-24 without the nonpad_kv_seqlen input, so both pass through; the
// only rewrite is softmax_precision, an ONNX TensorProto type code that becomes a kiln type name.
#include <string>

#include "export/converter.h"
#include "export/onnx_tensor.h"

namespace kiln {

namespace {

Status convert_attention(ConvertContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Node * n, ctx.emit_passthrough("Attention", {"softmax_precision"}));
  if (ctx.has_attr("softmax_precision")) {
    const int64_t code = ctx.attr_int("softmax_precision", 0);
    std::optional<DType> t = dtype_from_onnx(static_cast<int>(code));
    if (!t || !is_float(*t))
      return ctx.error("softmax_precision " + std::to_string(code) + " is not a float type (FLOAT, FLOAT16, BFLOAT16, DOUBLE)");
    n->set_attr("softmax_precision", std::string(dtype_name(*t)));
  }
  return {};
}

}  // namespace

void register_attention_converters(ConverterRegistry& r) {
  r.add("Attention", 23, 24, convert_attention);
  r.add("RotaryEmbedding", 23, 23, convert_passthrough);
}

}  // namespace kiln
