// lower_precision (`kiln compile --precision bf16|fp16`): autocast for inference. Each f32
// convolution and matrix product by a constant weight becomes a FusedConv / FusedMatMul whose
// weight is stored converted (bf16 or f16, rounded to nearest even: half the bytes):
//
//   Conv | FusedConv (W constant f32)          -> FusedConv (W bf16 | f16)
//   MatMul | FusedMatMul (B constant 2-D f32)  -> FusedMatMul (B bf16 | f16)
//
// A bf16 weight makes its kernels round the activations to bf16 too and sum the products in f32
// (AVX512-BF16's vdpbf16ps; the op schemas say so); an f16 one is widened to f32 as it is packed.
// Everything else stays f32: the activations between nodes (but between convolutions on an
// AMX target, below), the bias and the epilogue, Softmax, the normalizations and reductions,
// attention (but on an AMX target, below), and the final layers: a node that
// writes a graph output keeps its f32 weight, so that the model's outputs (a classifier's
// logits, an LM head's) are computed in f32. torch.autocast
// would lower those linear layers too; GPT-2's LM head, 70 % of its run and bound by reading
// its 154 MB weight, is why its fp16 compile is no faster than fp32. `--lower-output-layers`
// (PassContext::lower_output_layers) lowers them as well: their weights converted, their
// outputs f32 all the same (f32 sums written as they are).
//
// On a target with AMX, activations also stay bf16 from one convolution to the next: a
// bf16-weight channels-last FusedConv whose output only such convolutions read (as X or as the
// residual Z) and channels-last max pools writes it in bf16 (`output_type` bf16), and so does a
// max pool after it whose readers are such. A convolution reads X of either type as it is:
// oneDNN's AMX convolutions read and write bf16 NHWC tensors as they are, where f32 activations
// cost each convolution a reorder of X to bf16 (15 % of ResNet-50's bf16 run at two threads)
// and twice the bytes written. Z must have Y's type: a Cast converts it where it has not
// (ResNet-50's last block, which writes f32 for the average pool, casts its bf16 residual). The
// reference computes the same: X and Z widened, Y rounded to bf16 as it is stored (a max
// commutes with the rounding).
//
// On a target with AMX, bf16 also lowers attention's two products: an f32 Attention (no
// scores output, not writing a graph output) gets `product_type` bf16, so Q, K, V and the
// softmax's probabilities are rounded to bf16 and multiplied on AMX tiles with f32 sums
// (kiln.attention_bf16_amx); the softmax stays f32. Without AMX, bf16 products run no faster
// than f32 ones (VDPBF16PS issues at half the rate of f32 FMAs), and fp16's FMAs sum in fp16, so
// attention stays f32 for those.
//
// The target must have the ISA the precision is for (avx512-bf16, avx512-fp16); `--target` names
// another machine to compile for.
#include <algorithm>
#include <map>

#include "compile/graph_util.h"
#include "compile/pass.h"
#include "formats/memory.h"
#include "formats/ops/nn_util.h"
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
  if (!n.domain.empty() || (!conv && !matmul) || !n.has_input(0) || !n.has_input(1) || n.outputs.size() != 1) return false;
  if (n.has_attr("x_parts")) return false;  // fuse_concat's: only kiln's f32 GEMM reads X in parts
  if (nn::x_channels_first(n)) return false;  // channels_last's: only kiln.direct_conv (f32) reads it
  const Value& x = g.value(n.inputs[0]);
  const Value& w = g.value(n.inputs[1]);
  if (x.dtype != DType::f32 || !w.is_constant() || w.dtype != DType::f32) return false;
  return conv || w.constant.rank() == 2;
}

// Whether the node is an f32 Attention whose products may go bf16 (the file's comment), unless
// it writes a graph output.
bool lowers_attention(const Graph& g, const Node& n) {
  if (n.op != "Attention" || !n.domain.empty() || n.has_attr("product_type") || !n.has_input(0) || !n.has_input(1) || !n.has_input(2))
    return false;
  for (size_t i = 0; i < 3; ++i)
    if (g.value(n.inputs[i]).dtype != DType::f32) return false;
  return n.outputs.size() <= 3 || n.outputs[3] == kNoValue;  // no scores output
}

bool is_max_pool(const Node& n) { return n.op == "MaxPool" && n.domain.empty(); }

// A channels-last FusedConv by a constant bf16 weight, all of whose activations are f32 now, or
// a channels-last MaxPool (without indices) of f32: a node that may read and write bf16.
bool bf16_chain_node(const Graph& g, const Node& n) {
  if (!n.domain.empty() || n.attr_int("channels_last", 0) != 1 || !n.captures.empty()) return false;
  if (is_max_pool(n)) return n.num_inputs() == 1 && n.outputs.size() == 1 && g.value(n.inputs[0]).dtype == DType::f32;
  if (n.op != "FusedConv" || n.has_attr("output_type")) return false;
  const Value& w = g.value(n.inputs[1]);
  if (!w.is_constant() || w.dtype != DType::bf16 || g.value(n.inputs[0]).dtype != DType::f32) return false;
  if (n.has_input(3) && g.value(n.inputs[3]).dtype != DType::f32) return false;
  return n.outputs.size() == 1 && g.value(n.outputs[0]).dtype == DType::f32;
}

struct Bf16Chains {
  size_t convs = 0, pools = 0, casts = 0;  ///< the nodes that write bf16, the Casts added
};

// Keeps activations bf16 between the bf16 convolutions (the file's comment); `is_output` flags
// the graph's outputs.
Bf16Chains keep_bf16_activations(Graph& g, const std::vector<char>& is_output) {
  Bf16Chains made;
  const size_t count = g.nodes.size();
  std::vector<char> chain(count, 0), pool(count, 0);
  for (size_t i = 0; i < count; ++i) {
    chain[i] = bf16_chain_node(g, g.nodes[i]);
    pool[i] = chain[i] && is_max_pool(g.nodes[i]);
  }
  const std::vector<std::vector<Use>> uses = g.uses();
  const std::vector<int32_t> producer = g.producers();
  // Which chain nodes write bf16: starting from all, those whose every reader takes bf16, until
  // nothing changes. A convolution takes bf16 X whatever it writes, and a Z of the other type
  // through a Cast; a max pool takes bf16 when it writes bf16, and writes bf16 only after a
  // node that does.
  std::vector<char> out = chain;
  auto takes_bf16 = [&](const Use& u) {
    if (u.slot == Use::kCaptured || !chain[u.node]) return false;
    return pool[u.node] ? u.slot == 0 && out[u.node] : u.slot == 0 || u.slot == 3;
  };
  auto writes_bf16 = [&](ValueId v) {
    const int32_t p = v == kNoValue ? -1 : producer[static_cast<size_t>(v)];
    return p >= 0 && out[static_cast<size_t>(p)];
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < count; ++i) {
      if (!out[i]) continue;
      const Node& n = g.nodes[i];
      const ValueId y = n.outputs[0];
      const std::vector<Use>& u = uses[static_cast<size_t>(y)];
      bool keep = !is_output[static_cast<size_t>(y)] && !u.empty() && std::all_of(u.begin(), u.end(), takes_bf16);
      if (pool[i]) keep = keep && writes_bf16(n.inputs[0]);
      if (!keep) out[i] = 0, changed = true;
    }
  }
  for (size_t i = 0; i < count; ++i)
    if (out[i]) ++(pool[i] ? made.pools : made.convs);
  if (made.convs == 0) return made;

  std::map<ValueId, ValueId> cast_of;  // a residual Z -> its copy in the other type, made by a Cast
  std::vector<Node> nodes;
  nodes.reserve(count + 4);
  for (size_t i = 0; i < count; ++i) {
    Node& n = g.nodes[i];
    if (chain[i]) n.kernel = {};  // its activations' types may change: chosen again
    if (out[i]) {
      g.value(n.outputs[0]).dtype = DType::bf16;
      if (!pool[i]) n.set_attr("output_type", std::string("bf16"));
    }
    if (chain[i] && !pool[i] && n.has_input(3)) {
      const ValueId z = n.inputs[3];
      const DType want = out[i] ? DType::bf16 : DType::f32;
      if (g.value(z).dtype != want) {
        auto [it, fresh] = cast_of.try_emplace(z, kNoValue);
        if (fresh) {
          Value copy{g.unique_value_name(g.value(z).name + "." + std::string(dtype_name(want))), want, g.value(z).shape, {}, {}};
          it->second = g.add_value(std::move(copy));
          Node c;
          c.name = n.name + ".cast_z";
          c.op = "Cast";
          c.inputs = {z};
          c.outputs = {it->second};
          c.set_attr("to", std::string(dtype_name(want)));
          nodes.push_back(std::move(c));
          ++made.casts;
        }
        n.inputs[3] = it->second;
      }
    }
    nodes.push_back(std::move(n));
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
    if (is_output[static_cast<size_t>(n.outputs[0])] && !ctx.lower_output_layers) {
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
  size_t attentions = 0;
  for (Node& n : g.nodes) {
    if (to != DType::bf16 || !cpu.amx || !lowers_attention(g, n)) continue;
    if (is_output[static_cast<size_t>(n.outputs[0])] && !ctx.lower_output_layers) {
      kept.push_back("'" + n.name + "'");
      continue;
    }
    n.set_attr("product_type", std::string("bf16"));
    n.kernel = {};
    ++attentions;
  }
  if (lowered == 0 && attentions == 0) return PassResult{};
  const Bf16Chains chains = to == DType::bf16 && cpu.amx ? keep_bf16_activations(g, is_output) : Bf16Chains{};
  drop_unused_values(g);
  std::string summary;
  if (lowered > 0)
    summary = "lowered " + count_of(lowered, "convolution or matrix product", "convolutions and matrix products") + " to " +
              std::string(dtype_name(to)) + " (their weights " + format_bytes(bytes_before) + " -> " + format_bytes(bytes_after) + ")";
  if (attentions > 0)
    summary += (summary.empty() ? "lowered " : "; ") + count_of(attentions, "attention's products", "attentions' products") + " to bf16";
  if (chains.convs > 0)
    summary += "; " + count_of(chains.convs, "convolution", "convolutions") +
               (chains.pools > 0 ? " and " + count_of(chains.pools, "max pool", "max pools") : std::string()) +
               " write bf16 activations for the nodes after them" +
               (chains.casts > 0 ? " (" + count_of(chains.casts, "Cast of a residual", "Casts of residuals") + ")" : std::string());
  if (!kept.empty()) {
    summary += "; kept f32 as it writes a graph output:";
    for (const std::string& k : kept) summary += " " + k;
  }
  return PassResult{true, summary};
}

}  // namespace kiln
