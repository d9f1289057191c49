// fuse_linear_bias: Y = MatMul(A, B) + bias, with A 2-D, B a constant [K, N] and bias a
// constant row ([N] or [1, N]), becomes Y = Gemm(A, B, bias): one node, and the form the
// dense kernels take with their bias epilogue. The MatMul's output must be read by the Add
// alone (and be no graph output). f32 only: that is what the dense kernels to come take first,
// and Gemm's alpha/beta arithmetic is then exact to the Add's rounding.
// Left for later: A of rank > 2 (torch's Linear on [batch, seq, hidden]) needs a Reshape to
// 2-D around the Gemm, or a MatMul with a bias epilogue.
#include "compile/graph_util.h"
#include "compile/pass.h"

namespace kiln {

namespace {

bool is_f32_constant(const Graph& g, ValueId v) {
  return v >= 0 && g.value(v).is_constant() && g.value(v).dtype == DType::f32;
}

// The bias is a row that Gemm's C broadcasts exactly as Add did: [N] or [1, N].
bool is_row(const Tensor& t, int64_t n) {
  return (t.rank() == 1 && t.dim(0) == n) || (t.rank() == 2 && t.dim(0) == 1 && t.dim(1) == n);
}

}  // namespace

Result<PassResult> fuse_linear_bias(Model& model, PassContext&) {
  Graph& g = model.graph;
  std::vector<int32_t> producer = g.producers();
  std::vector<size_t> readers = reader_counts(g);
  std::vector<char> drop(g.nodes.size(), 0);
  size_t fused = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& add = g.nodes[i];
    if (add.op != "Add" || !add.domain.empty() || add.num_inputs() != 2 || add.outputs.size() != 1) continue;
    for (size_t side = 0; side < 2; ++side) {
      const ValueId y = add.inputs[side], bias = add.inputs[1 - side];
      if (y < 0 || bias < 0) break;
      const int32_t p = producer[static_cast<size_t>(y)];
      if (p < 0 || drop[static_cast<size_t>(p)] || readers[static_cast<size_t>(y)] != 1) continue;
      const Node& mm = g.nodes[static_cast<size_t>(p)];
      if (mm.op != "MatMul" || !mm.domain.empty() || mm.num_inputs() != 2) continue;
      const ValueId a = mm.inputs[0], b = mm.inputs[1];
      if (g.value(a).dtype != DType::f32 || g.value(a).shape.rank() != 2 || !is_f32_constant(g, b) ||
          !is_f32_constant(g, bias) || g.value(b).constant.rank() != 2 ||
          !is_row(g.value(bias).constant, g.value(b).constant.dim(1)))
        continue;
      // The Add becomes the Gemm, in its place: its output keeps its name and readers.
      std::vector<std::string> sources = mm.sources;
      for (const std::string& s : add.sources) sources.push_back(s);
      add.name = mm.name;  // the node is the matrix product now; sources name both
      add.op = "Gemm";
      add.inputs = {a, b, bias};
      add.attrs.clear();
      add.kernel = {};
      add.sources = std::move(sources);
      drop[static_cast<size_t>(p)] = 1;
      ++fused;
      break;
    }
  }
  if (fused == 0) return PassResult{};
  erase_nodes(g, drop);
  drop_unused_values(g);
  return PassResult{true, "fused " + count_of(fused, "MatMul + Add into Gemm", "MatMul + Add pairs into Gemm")};
}

}  // namespace kiln
