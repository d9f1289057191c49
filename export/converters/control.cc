// ONNX converters of the control family. If, Loop and Scan (opset 9+) map one to one: the
// exporter converts their body attributes into kiln subgraphs (with the bodies' nodes already
// inferred), and outer-scope values stay references by name. ONNX lets a Loop / Scan body leave
// its inputs untyped (function expansions do), so the converter fills those types in from the
// node's inputs before converting the body. Scan-8 (batched, with sequence_lens) has other
// semantics and is not registered; sequence-typed bodies are refused by the exporter because
// kiln has tensors only.
#include <onnx/onnx_pb.h>

#include "export/converter.h"

namespace kiln {

namespace {

int onnx_elem_type(DType t) {
  using TP = onnx::TensorProto;
  switch (t) {
    case DType::f32: return TP::FLOAT;
    case DType::f16: return TP::FLOAT16;
    case DType::bf16: return TP::BFLOAT16;
    case DType::f64: return TP::DOUBLE;
    case DType::i8: return TP::INT8;
    case DType::u8: return TP::UINT8;
    case DType::i16: return TP::INT16;
    case DType::u16: return TP::UINT16;
    case DType::i32: return TP::INT32;
    case DType::u32: return TP::UINT32;
    case DType::i64: return TP::INT64;
    case DType::u64: return TP::UINT64;
    case DType::boolean: return TP::BOOL;
    default: return TP::UNDEFINED;
  }
}

// Converts the node with its graph attributes, after giving untyped body inputs the element
// types `types` (same order as the body's inputs; undefined entries are left alone).
Status convert_with_body_types(ConvertContext& ctx, const std::vector<DType>& types, bool scalars_first2) {
  std::vector<Attribute> attrs;
  for (const auto& a : ctx.onnx_node().attribute()) {
    onnx::AttributeProto copy = a;
    if (copy.type() == onnx::AttributeProto::GRAPH && copy.name() == "body") {
      auto* inputs = copy.mutable_g()->mutable_input();
      for (int i = 0; i < inputs->size() && static_cast<size_t>(i) < types.size(); ++i) {
        onnx::ValueInfoProto* vi = inputs->Mutable(i);
        if (vi->has_type() && vi->type().has_tensor_type() && vi->type().tensor_type().elem_type() != 0) continue;
        if (vi->has_type() && !vi->type().has_tensor_type() && vi->type().value_case() != onnx::TypeProto::VALUE_NOT_SET)
          continue;  // a sequence or optional: the exporter reports it
        if (types[static_cast<size_t>(i)] == DType::undefined) continue;
        auto* tt = vi->mutable_type()->mutable_tensor_type();
        tt->set_elem_type(onnx_elem_type(types[static_cast<size_t>(i)]));
        if (scalars_first2 && i < 2) tt->mutable_shape();  // iteration number and condition are scalars
      }
    }
    KILN_ASSIGN_OR_RETURN(AttrValue v, ctx.convert_attr(copy));
    attrs.push_back({copy.name(), std::move(v)});
  }
  std::vector<ValueId> ins, outs;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) ins.push_back(ctx.input(i));
  for (size_t i = 0; i < ctx.num_outputs(); ++i) outs.push_back(ctx.output(i));
  Node& n = ctx.emit(ctx.op_type(), ins, outs);
  for (auto& a : attrs) n.set_attr(std::move(a.name), std::move(a.value));
  return {};
}

DType input_dtype(ConvertContext& ctx, size_t i) {
  return ctx.has_input(i) ? ctx.graph().value(ctx.input(i)).dtype : DType::undefined;
}

Status convert_loop(ConvertContext& ctx) {
  std::vector<DType> types{DType::i64, DType::boolean};
  for (size_t i = 2; i < ctx.num_inputs(); ++i) types.push_back(input_dtype(ctx, i));
  return convert_with_body_types(ctx, types, true);
}

Status convert_scan(ConvertContext& ctx) {
  std::vector<DType> types;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) types.push_back(input_dtype(ctx, i));
  return convert_with_body_types(ctx, types, false);
}

}  // namespace

void register_control_converters(ConverterRegistry& r) {
  r.add("If", 1, 25, convert_passthrough);
  r.add("Loop", 1, 25, convert_loop);
  r.add("Scan", 9, 25, convert_scan);
}

}  // namespace kiln
