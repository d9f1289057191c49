// kiln → ONNX (onnx_writer.h). kiln's core ops before compile are ONNX's, with ONNX's newest
// semantics, so a node is written as the op of its name; what export turned from ONNX's enums
// into dtype names (Cast's `to`, QuantizeLinear's `precision`, ...) goes back to enums.
#include "export/onnx_writer.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "export/onnx_tensor.h"

namespace kiln {

namespace {

// The opset written: ONNX Runtime's QDQ format and every op kiln converts up to it; a node whose
// op came later raises it to that op's version.
constexpr int kBaseOpset = 21;

// Attributes that export stores as dtype names and ONNX as TensorProto.DataType enums.
const std::set<std::string, std::less<>> kDtypeAttrs = {"to", "dtype", "output_dtype", "precision", "softmax_precision"};

int onnx_type(DType t) {
  using TP = onnx::TensorProto;
  switch (t) {
    case DType::f32: return TP::FLOAT;
    case DType::u8: return TP::UINT8;
    case DType::i8: return TP::INT8;
    case DType::u16: return TP::UINT16;
    case DType::i16: return TP::INT16;
    case DType::i32: return TP::INT32;
    case DType::i64: return TP::INT64;
    case DType::boolean: return TP::BOOL;
    case DType::f16: return TP::FLOAT16;
    case DType::f64: return TP::DOUBLE;
    case DType::u32: return TP::UINT32;
    case DType::u64: return TP::UINT64;
    case DType::bf16: return TP::BFLOAT16;
    case DType::u4: return kOnnxUint4;
    case DType::i4: return kOnnxInt4;
    default: return TP::UNDEFINED;
  }
}

void set_value_info(onnx::ValueInfoProto& info, const Value& v) {
  info.set_name(v.name);
  auto* tensor = info.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(onnx_type(v.dtype));
  if (!v.shape.rank_known) return;
  auto* shape = tensor->mutable_shape();
  for (const Dim& d : v.shape.dims) {
    auto* dim = shape->add_dim();
    if (d.is_known()) dim->set_dim_value(d.value);
    else if (d.is_symbolic()) dim->set_dim_param(d.symbol);
  }
}

void set_tensor(onnx::TensorProto& t, const std::string& name, const Tensor& value) {
  t.set_name(name);
  t.set_data_type(onnx_type(value.dtype()));
  for (int64_t d : value.shape()) t.add_dims(d);
  t.set_raw_data(std::string(static_cast<const char*>(value.raw()), value.nbytes()));
}

Status set_attribute(onnx::AttributeProto& a, const Attribute& attr, const Node& node) {
  using AP = onnx::AttributeProto;
  a.set_name(attr.name);
  return std::visit(
      [&](const auto& v) -> Status {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          a.set_type(AP::INT);
          a.set_i(v);
        } else if constexpr (std::is_same_v<T, double>) {
          a.set_type(AP::FLOAT);
          a.set_f(static_cast<float>(v));
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (kDtypeAttrs.count(attr.name)) {
            const std::optional<DType> t = dtype_from_name(v);
            if (!t || onnx_type(*t) == onnx::TensorProto::UNDEFINED)
              return user_error(node.where(), "attribute '" + attr.name + "': dtype '" + v + "' has no ONNX type");
            a.set_type(AP::INT);
            a.set_i(onnx_type(*t));
          } else {
            a.set_type(AP::STRING);
            a.set_s(v);
          }
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          a.set_type(AP::INTS);
          for (int64_t x : v) a.add_ints(x);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          a.set_type(AP::FLOATS);
          for (double x : v) a.add_floats(static_cast<float>(x));
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          a.set_type(AP::STRINGS);
          for (const std::string& x : v) a.add_strings(x);
        } else if constexpr (std::is_same_v<T, Tensor>) {
          a.set_type(AP::TENSOR);
          set_tensor(*a.mutable_t(), "", v);
        } else {
          return user_error(node.where(), "has a subgraph ('" + attr.name + "'): control flow is not written as ONNX yet");
        }
        return {};
      },
      attr.value);
}

}  // namespace

Result<std::string> write_onnx(const Model& model) {
  const Graph& g = model.graph;
  onnx::ModelProto m;
  m.set_ir_version(10);
  m.set_producer_name("kiln");
  m.set_producer_version(std::string(kiln_version()));
  onnx::GraphProto& graph = *m.mutable_graph();
  graph.set_name("kiln");
  int opset = kBaseOpset;
  for (const Node& n : g.nodes) {
    if (!n.domain.empty()) return user_error(n.where(), "op " + n.qualified_op() + " is kiln's own, not ONNX's");
    const onnx::OpSchema* latest = onnx::OpSchemaRegistry::Schema(n.op, "");
    if (!latest) return user_error(n.where(), "op " + n.op + " (made by kiln compile) has no ONNX equivalent; write the quantized model before compiling");
    const onnx::OpSchema* at_base = onnx::OpSchemaRegistry::Schema(n.op, kBaseOpset, "");
    if (!at_base) opset = std::max(opset, latest->SinceVersion());
  }
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(opset);

  for (ValueId id : g.inputs) set_value_info(*graph.add_input(), g.value(id));
  for (ValueId id : g.outputs) set_value_info(*graph.add_output(), g.value(id));
  std::set<ValueId> written;
  for (size_t i = 0; i < g.values.size(); ++i) {
    const Value& v = g.values[i];
    if (!v.is_constant()) continue;
    if (v.constant.is_packed()) return user_error(v.name, "is stored packed for a compiled model's kernel; write the model before compiling");
    set_tensor(*graph.add_initializer(), v.name, v.constant);
  }
  for (const Node& n : g.nodes) {
    onnx::NodeProto& p = *graph.add_node();
    p.set_name(n.name);
    p.set_op_type(n.op);
    for (ValueId in : n.inputs) p.add_input(in == kNoValue ? "" : g.value(in).name);
    for (ValueId out : n.outputs) p.add_output(out == kNoValue ? "" : g.value(out).name);
    for (const Attribute& a : n.attrs) KILN_RETURN_IF_ERROR(set_attribute(*p.add_attribute(), a, n));
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes)) return internal_error("", "the ONNX model does not serialize (over 2 GB?)");
  return bytes;
}

}  // namespace kiln
