// Graph-wide inference driver.
#include "formats/infer.h"

#include "formats/op_schema.h"

namespace kiln {

namespace {

// Combines an inferred shape with the shape a value already carries.
Result<Shape> merge_shape(const Shape& stored, const Shape& inferred, const Value& v) {
  if (!inferred.rank_known) return stored;
  if (!stored.rank_known) return inferred;
  if (stored.dims.size() != inferred.dims.size())
    return user_error("value '" + v.name + "'",
                      "declared shape " + stored.str() + " has rank " + std::to_string(stored.dims.size()) +
                          " but the graph computes " + inferred.str());
  Shape out = inferred;
  for (size_t i = 0; i < out.dims.size(); ++i) {
    const Dim& s = stored.dims[i];
    Dim& d = out.dims[i];
    if (d.is_known()) {
      if (s.is_known() && s.value != d.value)
        return user_error("value '" + v.name + "'",
                          "declared shape " + stored.str() + " but the graph computes " + inferred.str());
    } else if (s.is_known() || (s.is_symbolic() && !d.is_symbolic())) {
      d = s;
    }
  }
  return out;
}

}  // namespace

Status infer_node_into(Graph& graph, size_t index, std::vector<Tensor>& known, const InferOptions& options) {
  if (known.size() < graph.values.size()) known.resize(graph.values.size());
  const Node& node = graph.nodes[index];
  if (!node.domain.empty() && !core_ops().find(node.domain, node.op)) return {};
  bool needs_data = false;
  KILN_ASSIGN_OR_RETURN(std::vector<InferOutput> outs, infer_node(node, graph, &known, &needs_data));
  if (options.needs_data) {
    if (options.needs_data->size() < graph.nodes.size()) options.needs_data->resize(graph.nodes.size());
    (*options.needs_data)[index] = needs_data;
  }
  for (size_t i = 0; i < node.outputs.size() && i < outs.size(); ++i) {
    ValueId id = node.outputs[i];
    if (id == kNoValue) continue;
    Value& v = graph.value(id);
    InferOutput& o = outs[i];
    if (o.dtype != DType::undefined) {
      if (!options.overwrite && v.dtype != DType::undefined && v.dtype != o.dtype)
        return user_error("value '" + v.name + "'", "declared as " + std::string(dtype_name(v.dtype)) + " but " +
                                                        node.where() + " produces " + std::string(dtype_name(o.dtype)));
      v.dtype = o.dtype;
    }
    if (options.overwrite) {
      v.shape = o.shape;
    } else {
      KILN_ASSIGN_OR_RETURN(v.shape, merge_shape(v.shape, o.shape, v));
    }
    if (o.value.defined()) known[static_cast<size_t>(id)] = std::move(o.value);
  }
  return {};
}

Result<std::vector<Tensor>> infer_graph(Graph& graph, const InferOptions& options) {
  std::vector<Tensor> known(graph.values.size());
  for (size_t n = 0; n < graph.nodes.size(); ++n) KILN_RETURN_IF_ERROR(infer_node_into(graph, n, known, options));
  return known;
}

}  // namespace kiln
