// The passes that turn what exporters write back into whole ops: LayerNormalization,
// RMSNormalization, Gelu, RotaryEmbedding and Attention. Each rewrites the graph in place, keeps it verified and
// in order, and returns how many ops it made.
#pragma once

#include "formats/ir.h"

namespace kiln {

/// ReduceMean / Sub / Pow 2 / ReduceMean / Add eps / Sqrt / Div [/ Mul scale] [/ Add bias] over
/// the last axis -> LayerNormalization.
Result<size_t> fuse_layer_norm(Graph& g);
/// Pow 2 / ReduceMean / Add eps / Sqrt / (Div 1 | Reciprocal) / Mul x [/ Mul scale] over the last
/// axis -> RMSNormalization.
Result<size_t> fuse_rms_norm(Graph& g);
/// x * 0.5 * (1 + erf(x / sqrt 2)) and 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))),
/// in the association orders exporters write -> Gelu (approximate "none" / "tanh").
Result<size_t> fuse_gelu(Graph& g);
/// A GELU written out as fuse_gelu finds it: y = GELU(x) over `nodes` (indices into the graph's
/// nodes, none of whose intermediates anything else reads), `core` the Erf or Tanh among them.
struct GeluChain {
  ValueId x = kNoValue, y = kNoValue;
  std::vector<size_t> nodes;
  size_t core = 0;
  bool tanh = false;
};
/// Every GELU written out in `g` (f32), in the order of their Erf / Tanh; they may overlap.
std::vector<GeluChain> find_gelus(const Graph& g);
/// x · cos + Concat(Neg(x[..., D/2:]), x[..., :D/2]) · sin on 4-D heads, with constant tables
/// whose halves repeat -> RotaryEmbedding with [B, S, D/2] caches.
Result<size_t> fuse_rotary(Graph& g);
/// MatMul(Q, Kᵀ) [scaled] [+ mask | Where(mask, ·, -big)] / Softmax / MatMul(·, V) on 4-D
/// [batch, heads, seq, head] tensors -> Attention; K / V repeated for grouped-query heads
/// (Unsqueeze / Expand / Reshape) are read unrepeated.
Result<size_t> fuse_attention(Graph& g);

}  // namespace kiln
