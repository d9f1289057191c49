// lower_precision (`kiln compile --precision bf16|fp16`): autocast for inference. Each f32
// convolution and matrix product by a constant weight becomes a FusedConv / FusedMatMul whose
// weight is stored converted (bf16 or f16, rounded to nearest even: half the bytes):
//
//   Conv | FusedConv (W constant f32)          -> FusedConv (W bf16 | f16)
//   MatMul | FusedMatMul (B constant 2-D f32)  -> FusedMatMul (B bf16 | f16)
//
// A bf16 weight makes its kernels round the activations to bf16 too and sum the products in f32
// (AVX512-BF16's vdpbf16ps; the op schemas say so); an f16 one is widened to f32 as it is packed.
// Everything else stays f32: the activations between nodes, the bias and the epilogue, Softmax,
// the normalizations and reductions, attention (its products are of activations, not weights),
// and the final layers: a node that writes a graph output keeps its f32 weight, so that the
// model's outputs (a classifier's logits, an LM head's) are computed in f32. torch.autocast
// would lower those linear layers too; GPT-2's LM head, 70 % of its run and bound by reading
// its 154 MB weight, is why its fp16 compile is no faster than fp32.
//
// The target must have the ISA the precision is for (avx512-bf16, avx512-fp16); `--target` names
// another machine to compile for.
#include <map>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/memory.h"
#include "runtime/ref/nn_util.h"

namespace kiln {

namespace {

Tensor converted(const Tensor& w, DType to) {
  const Tensor plain = w.is_packed() ? unpack(w) : w;
  Tensor out(to, plain.shape());
  nn::store_from_f32(plain, out);
  return out;
}

// Whether the node is a product of f32 activations by a constant f32 weight that lowers.
bool lowers(const Graph& g, const Node& n) {
  const bool conv = n.op == "Conv" || n.op == "FusedConv", matmul = n.op == "MatMul" || n.op == "FusedMatMul";
  if (!n.domain.empty() || (!conv && !matmul) || !n.has_input(0) || !n.has_input(1)) return false;
  const Value& x = g.value(n.inputs[0]);
  const Value& w = g.value(n.inputs[1]);
  if (x.dtype != DType::f32 || !w.is_constant() || w.dtype != DType::f32) return false;
  return conv || w.constant.rank() == 2;
}

}  // namespace

Result<PassResult> lower_precision(Model& model, PassContext& ctx) {
  const DType to = ctx.precision;
  if (to == DType::f32) return PassResult{};
  const CpuFeatures& cpu = ctx.target.cpu;
  if (to == DType::bf16 && !cpu.avx512_bf16)
    return user_error("", "--precision bf16: the target CPU lacks avx512-bf16 (--target names a CPU to compile for)");
  if (to == DType::f16 && !cpu.avx512_fp16)
    return user_error("", "--precision fp16: the target CPU lacks avx512-fp16 (--target names a CPU to compile for)");
  if (to != DType::bf16 && to != DType::f16)
    return internal_error("", "lower_precision: " + std::string(dtype_name(to)) + " is not a precision");
  Graph& g = model.graph;
  std::vector<char> is_output(g.values.size(), 0);
  for (ValueId v : g.outputs) is_output[static_cast<size_t>(v)] = 1;
  std::map<ValueId, ValueId> lowered_weight;  // f32 constant -> its converted copy
  size_t lowered = 0;
  size_t bytes_before = 0, bytes_after = 0;
  std::vector<std::string> kept;
  for (Node& n : g.nodes) {
    if (!lowers(g, n)) continue;
    if (is_output[static_cast<size_t>(n.outputs[0])]) {
      kept.push_back("'" + n.name + "'");
      continue;
    }
    const ValueId w = n.inputs[1];
    auto [it, fresh] = lowered_weight.try_emplace(w, kNoValue);
    if (fresh) {
      const Tensor c = converted(g.value(w).constant, to);
      bytes_before += g.value(w).constant.nbytes();
      bytes_after += c.nbytes();
      it->second = g.add_constant(g.value(w).name + "." + std::string(dtype_name(to)), c);
    }
    n.inputs[1] = it->second;
    if (n.op == "MatMul") n.op = "FusedMatMul";
    if (n.op == "Conv") n.op = "FusedConv";
    n.kernel = {};
    ++lowered;
  }
  if (lowered == 0) return PassResult{};
  drop_unused_values(g);
  std::string summary = "lowered " + count_of(lowered, "convolution or matrix product", "convolutions and matrix products") + " to " +
                        std::string(dtype_name(to)) + " (their weights " + format_bytes(bytes_before) + " -> " + format_bytes(bytes_after) + ")";
  if (!kept.empty()) {
    summary += "; kept f32 as it writes a graph output:";
    for (const std::string& k : kept) summary += " " + k;
  }
  return PassResult{true, summary};
}

}  // namespace kiln
