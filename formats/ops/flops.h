// FLOP counts of the dense ops (OpTraits::flops), shared by the float and integer families, and
// the helpers every op's model uses (formats/ops/flop_models.cc has the models of the others).
#pragma once

#include <limits>

#include "formats/checked.h"
#include "formats/ir.h"

namespace kiln::flops {

inline int64_t dim_or_one(const Shape& s, size_t i) {
  if (!s.rank_known || i >= s.dims.size()) return 1;
  return s.dims[i].is_known() ? s.dims[i].value : 1;
}

inline CheckedInt numel_or_one(const Shape& s, size_t from = 0) {
  CheckedInt n = 1;
  for (size_t i = from; i < s.dims.size(); ++i) n *= dim_or_one(s, i);
  return n;
}

/// Counts past int64 (absurd declared dims) saturate rather than wrap.
inline int64_t saturate(CheckedInt v) { return v.ok() ? v.value() : std::numeric_limits<int64_t>::max(); }

/// The shapes of input `slot` and output 0, when both are present with known ranks.
inline const Shape* input_shape(const Node& n, const Graph& g, size_t slot) {
  if (!n.has_input(slot)) return nullptr;
  const Shape& s = g.value(n.inputs[slot]).shape;
  return s.rank_known ? &s : nullptr;
}
inline const Shape* output_shape(const Node& n, const Graph& g) {
  if (n.outputs.empty() || n.outputs[0] == kNoValue) return nullptr;
  const Shape& s = g.value(n.outputs[0]).shape;
  return s.rank_known ? &s : nullptr;
}

/// The model of an op that does no arithmetic (it moves, selects or describes data): a named
/// 0, so that "counted, and it is 0" reads differently from a missing model.
inline int64_t none(const Node&, const Graph&) { return 0; }

/// Convolution with weights at input `W`: y is N x Cout x spatial, w is Cout x Cin/group x
/// kernel, so each output element takes Cin/group x kernel MACs.
template <size_t W>
int64_t conv(const Node& n, const Graph& g) {
  const Shape* w = input_shape(n, g, W);
  const Shape* y = output_shape(n, g);
  if (!w || !y || w->dims.size() < 3) return 0;
  return saturate(CheckedInt(2) * numel_or_one(*y) * numel_or_one(*w, 1));
}

/// Transposed convolution: x is N x Cin x spatial, w is Cin x Cout/group x kernel; each input
/// element scatters into Cout/group x kernel outputs.
inline int64_t conv_transpose(const Node& n, const Graph& g) {
  const Shape* x = input_shape(n, g, 0);
  const Shape* w = input_shape(n, g, 1);
  if (!x || !w || w->dims.size() < 3) return 0;
  return saturate(CheckedInt(2) * numel_or_one(*x) * numel_or_one(*w, 1));
}

/// Matrix product with A at input `A`: each output element takes K (A's last dim) MACs.
template <size_t A>
int64_t matmul(const Node& n, const Graph& g) {
  const Shape* a = input_shape(n, g, A);
  const Shape* y = output_shape(n, g);
  if (!a || !y) return 0;
  return saturate(CheckedInt(2) * numel_or_one(*y) * dim_or_one(*a, a->dims.empty() ? 0 : a->dims.size() - 1));
}

/// Gemm: K is A's dim 0 when transA.
inline int64_t gemm(const Node& n, const Graph& g) {
  const Shape* a = input_shape(n, g, 0);
  const Shape* y = output_shape(n, g);
  if (!a || !y) return 0;
  const int64_t k = n.attr_int("transA", 0) ? dim_or_one(*a, 0) : dim_or_one(*a, a->dims.empty() ? 0 : a->dims.size() - 1);
  return saturate(CheckedInt(2) * numel_or_one(*y) * k);
}

}  // namespace kiln::flops
