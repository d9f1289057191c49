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
// On a target with AMX, bf16 activations also stay bf16 from one convolution to the next: where
// a bf16-weight channels-last FusedConv's output is read only by such convolutions (as X or as
// the residual Z) and channels-last max pools, it is stored in bf16, and so are their X, Z and
// Y. oneDNN's AMX convolutions read and write them as they are, where f32 activations cost each
// convolution a reorder of X to bf16 (15 % of ResNet-50's bf16 run at two threads) and twice
// the bytes written. A Cast node converts where such a chain meets f32 nodes (before
// ResNet-50's first convolution, before its average pool). The reference computes the same: X
// and Z widened, Y rounded to bf16 as it is stored (a max commutes with the rounding).
//
// The target must have the ISA the precision is for (avx512-bf16, avx512-fp16); `--target` names
// another machine to compile for.
#include <algorithm>
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

bool is_max_pool(const Node& n) { return n.op == "MaxPool" && n.domain.empty(); }

// A channels-last FusedConv by a constant bf16 weight, all of whose activations are f32 now, or
// a channels-last MaxPool (without indices) of f32: one that may keep its activations in bf16.
bool bf16_chain_node(const Graph& g, const Node& n) {
  if (!n.domain.empty() || n.attr_int("channels_last", 0) != 1 || !n.captures.empty()) return false;
  if (is_max_pool(n)) return n.num_inputs() == 1 && n.outputs.size() == 1 && g.value(n.inputs[0]).dtype == DType::f32;
  if (n.op != "FusedConv") return false;
  const Value& w = g.value(n.inputs[1]);
  if (!w.is_constant() || w.dtype != DType::bf16 || g.value(n.inputs[0]).dtype != DType::f32) return false;
  if (n.has_input(3) && g.value(n.inputs[3]).dtype != DType::f32) return false;
  return n.outputs.size() == 1 && g.value(n.outputs[0]).dtype == DType::f32;
}

struct Bf16Chains {
  size_t convs = 0, pools = 0, casts = 0;  ///< the nodes that read and write bf16, the Casts added
};

// Keeps activations bf16 between the bf16 convolutions (the file's comment).
Bf16Chains keep_bf16_activations(Graph& g) {
  Bf16Chains made;
  const size_t count = g.nodes.size();
  std::vector<char> chain(count, 0);
  for (size_t i = 0; i < count; ++i) chain[i] = bf16_chain_node(g, g.nodes[i]);
  const std::vector<std::vector<Use>> uses = g.uses();
  const std::vector<int32_t> producer = g.producers();
  std::vector<char> is_output(g.values.size(), 0);
  for (ValueId v : g.outputs) is_output[static_cast<size_t>(v)] = 1;
  auto chain_use = [&](const Use& u) { return u.slot != Use::kCaptured && chain[u.node] && (u.slot == 0 || u.slot == 3); };
  // The convolutions whose output only chain nodes read; then, as long as one is added, the
  // chain nodes that read the output of one (their X would be bf16 anyway: their Y is made bf16
  // too, and a Cast gives its f32 readers f32). A max pool joins only so: after a convolution.
  std::vector<char> bf16(count, 0);
  for (size_t i = 0; i < count; ++i) {
    if (!chain[i] || is_max_pool(g.nodes[i])) continue;
    const ValueId y = g.nodes[i].outputs[0];
    const std::vector<Use>& u = uses[static_cast<size_t>(y)];
    bf16[i] = !is_output[static_cast<size_t>(y)] && !u.empty() && std::all_of(u.begin(), u.end(), chain_use);
  }
  auto from_bf16 = [&](ValueId v) {
    const int32_t p = v == kNoValue ? -1 : producer[static_cast<size_t>(v)];
    return p >= 0 && bf16[static_cast<size_t>(p)];
  };
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = 0; i < count; ++i) {
      const Node& n = g.nodes[i];
      if (chain[i] && !bf16[i] && (from_bf16(n.inputs[0]) || (n.has_input(3) && from_bf16(n.inputs[3])))) bf16[i] = grew = true;
    }
  }
  for (size_t i = 0; i < count; ++i)
    if (bf16[i]) ++(is_max_pool(g.nodes[i]) ? made.pools : made.convs);
  if (made.convs == 0) return made;

  auto cast_node = [&](ValueId from, ValueId to, const std::string& name) {
    Node c;
    c.name = name;
    c.op = "Cast";
    c.inputs = {from};
    c.outputs = {to};
    c.set_attr("to", std::string(dtype_name(g.value(to).dtype)));
    ++made.casts;
    return c;
  };
  auto bf16_twin = [&](ValueId v) {
    Value twin{g.unique_value_name(g.value(v).name + ".bf16"), DType::bf16, g.value(v).shape, {}, {}};
    return g.add_value(std::move(twin));
  };
  std::map<ValueId, ValueId> as_bf16;  // an f32 value -> its bf16 copy, made by a Cast
  std::vector<Node> nodes;
  nodes.reserve(count + 8);
  std::vector<Node> old = std::move(g.nodes);
  g.nodes.clear();
  for (size_t i = 0; i < count; ++i) {
    Node& n = old[i];
    if (!bf16[i]) {
      nodes.push_back(std::move(n));
      continue;
    }
    for (size_t slot : {size_t{0}, size_t{3}}) {
      if (!n.has_input(slot) || (slot == 3 && is_max_pool(n))) continue;
      const ValueId v = n.inputs[slot];
      if (g.value(v).dtype == DType::bf16) continue;
      auto [it, fresh] = as_bf16.try_emplace(v, kNoValue);
      if (fresh) {
        it->second = bf16_twin(v);
        nodes.push_back(cast_node(v, it->second, n.name + ".cast_bf16_" + std::to_string(slot)));
      }
      n.inputs[slot] = it->second;
    }
    n.kernel = {};
    const ValueId y = n.outputs[0];
    const std::vector<Use>& u = uses[static_cast<size_t>(y)];
    auto reads_bf16 = [&](const Use& use) { return chain_use(use) && bf16[use.node]; };
    const bool f32_readers = is_output[static_cast<size_t>(y)] || !std::all_of(u.begin(), u.end(), reads_bf16);
    if (!f32_readers) {
      g.value(y).dtype = DType::bf16;
      nodes.push_back(std::move(n));
      continue;
    }
    // The bf16 readers read a bf16 twin; the f32 value, read by the others, is cast from it.
    const ValueId twin = bf16_twin(y);
    for (const Use& use : u)
      if (reads_bf16(use)) old[use.node].inputs[use.slot] = twin;
    n.outputs[0] = twin;
    const std::string name = n.name + ".cast_f32";
    nodes.push_back(std::move(n));
    nodes.push_back(cast_node(twin, y, name));
  }
  g.nodes = std::move(nodes);
  return made;
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
  const Bf16Chains chains = to == DType::bf16 && cpu.amx ? keep_bf16_activations(g) : Bf16Chains{};
  drop_unused_values(g);
  std::string summary = "lowered " + count_of(lowered, "convolution or matrix product", "convolutions and matrix products") + " to " +
                        std::string(dtype_name(to)) + " (their weights " + format_bytes(bytes_before) + " -> " + format_bytes(bytes_after) + ")";
  if (chains.convs > 0)
    summary += "; " + count_of(chains.convs, "convolution", "convolutions") +
               (chains.pools > 0 ? " and " + count_of(chains.pools, "max pool", "max pools") : std::string()) +
               " read and write bf16 activations (" + count_of(chains.casts, "Cast", "Casts") + " where they meet f32 nodes)";
  if (!kept.empty()) {
    summary += "; kept f32 as it writes a graph output:";
    for (const std::string& k : kept) summary += " " + k;
  }
  return PassResult{true, summary};
}

}  // namespace kiln
