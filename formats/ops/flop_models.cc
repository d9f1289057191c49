// The FLOP model of every core op that its family does not count itself (the dense ops count
// theirs where they are registered: formats/ops/flops.h). One table, kModels, maps each op to
// its model; register_flop_models, run last when the registry is built, gives each op without a
// model its entry, and a test checks that no core op is left without one. The profiler's
// roofline places each kernel by these counts, and `kiln inspect` sums them.
//
// Conventions (docs/architecture.md):
// - Shapes are the graph's; symbolic and unknown dims count as 1, a shape of unknown rank that a
//   model needs gives 0, and counts past int64 saturate (CheckedInt): files may be hostile.
// - Each +, −, ×, ÷, min, max, comparison, select, abs, floor / ceil / round, logical or bitwise
//   op and sqrt counts 1. A transcendental function (exp, log, tanh, erf, sin, atan, pow, …),
//   which libraries evaluate as a short polynomial, counts kT = 4. A compound op costs the sum
//   of the operations of its definition (the constants below spell each one out).
// - Elementwise ops: output elements × their cost; variadic ones (inputs − 1) ops per element.
// - Reductions, scans, softmax and the normalizations: input elements × a per-element cost. The
//   once-per-row or once-per-channel work (a mean's divide, an inverse square root) is left out.
// - Windows (pools, LRN): output elements × window size; sampling ops (Resize, GridSample,
//   RoiAlign): output elements × 2 per interpolation tap.
// - Attention: 2·B·Hq·S·T·D for Q·Kᵀ, 2·B·Hq·S·T·Dv for P·V, and kAttentionScore per score for
//   the scale, mask, softcap and softmax, T = past + new keys. A causal mask is not subtracted:
//   the count is the dense problem's, whatever a kernel skips.
// - Recurrent layers: their matrix products as the dense ops count them (2 per MAC, every step),
//   plus a per-hidden-unit cost of their gates with the default activations.
// - Ops that do no arithmetic (they move, select, generate or describe data: Reshape, Gather,
//   Cast, Range, NonZero, …) use flops::none. So do If, Loop and Scan: their bodies are not
//   top-level nodes, so nothing counts them at the node.
#include <algorithm>
#include <bit>
#include <string_view>
#include <unordered_map>

#include "formats/checked.h"
#include "formats/op_schema.h"
#include "formats/ops/epilogue.h"
#include "formats/ops/flops.h"
#include "formats/ops/nn_util.h"

namespace kiln {

namespace flops {
namespace {

// ---- per-element costs ---------------------------------------------------------------------

constexpr int64_t kT = 4;  // one transcendental function
constexpr int64_t kSigmoid = 1 + kT + 1 + 1;                 // 1 / (1 + e^-x): negate, exp, add, divide
constexpr int64_t kHardSigmoid = 2 + 2;                       // max(0, min(1, αx + β))
constexpr int64_t kHardSwish = kHardSigmoid + 1;              // x · HardSigmoid(x)
constexpr int64_t kLeakyRelu = 2;                             // x < 0 ? αx : x: multiply, select
constexpr int64_t kElu = kT + 1 + 1 + 1;                      // x < 0 ? α(e^x − 1) : x
constexpr int64_t kSelu = kElu + 1;                           // γ · Elu
constexpr int64_t kCelu = 1 + kT + 1 + 1 + 1 + 1 + 1;         // max(0, x) + min(0, α(e^(x/α) − 1))
constexpr int64_t kSoftplus = kT + 1 + kT;                    // log(1 + e^x)
constexpr int64_t kSoftsign = 3;                              // x / (1 + |x|)
constexpr int64_t kMish = kSoftplus + kT + 1;                 // x · tanh(softplus(x))
constexpr int64_t kSwish = 1 + kSigmoid + 1;                  // x · sigmoid(αx)
constexpr int64_t kSilu = kSigmoid + 1;                       // x · sigmoid(x)
constexpr int64_t kGelu = 1 + kT + 1 + 2;                     // x · 0.5 · (1 + erf(x / √2))
constexpr int64_t kGeluTanh = 3 + 1 + 1 + kT + 1 + 2;         // 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))
constexpr int64_t kShrink = 2 + 1;                            // two compares, add or subtract the bias
constexpr int64_t kClip = 2;                                  // min, max
constexpr int64_t kMod = 4;                                   // x − trunc(x / y) · y
constexpr int64_t kPRelu = kLeakyRelu;

constexpr int64_t kSoftmax = 1 + 1 + kT + 1 + 1;              // max, subtract, exp, sum, divide
constexpr int64_t kLogSoftmax = 1 + 1 + kT + 1 + 1;           // max, subtract, exp, sum, subtract the log-sum
constexpr int64_t kLayerNorm = 1 + 1 + 2 + 1 + 1 + 1;         // sum, − mean, square and sum, · 1/σ, · scale, + bias
constexpr int64_t kRmsNorm = 2 + 1 + 1;                       // square and sum, · 1/rms, · scale
constexpr int64_t kBatchNorm = 4;                             // (x − mean) / σ · scale + B, σ per channel
constexpr int64_t kLpNorm = 3;                                // |x| or x², sum, divide
constexpr int64_t kLogSumExp = 1 + 1 + kT + 1;                // max, subtract, exp, sum

constexpr int64_t kQuantize = 1 + 1 + 1 + kClip;              // divide, round, + zero point, saturate
constexpr int64_t kDequantize = 2;                            // (x − zero point) · scale
constexpr int64_t kDynamicQuantize = 2 + kQuantize;           // min and max of the data, then quantize

constexpr int64_t kHann = 1 + 1 + kT + 1;                     // sin²(πn / N): scale, divide, sin, square
constexpr int64_t kHamming = 1 + 1 + kT + 2;                  // a − b · cos(2πn / N)
constexpr int64_t kBlackman = 2 * (1 + 1 + kT + 1) + 2;       // a − b · cos(2πn / N) + c · cos(4πn / N)
constexpr int64_t kMel = 3;                                   // a triangle's rising or falling edge

constexpr int64_t kNll = 2;                                   // · weight, accumulate, per target
constexpr int64_t kIoU = 13;                                  // 4 min/max, 2 subtract, 2 clamp, area, union, ratio, compare
constexpr int64_t kRotary = 3;                                // per element: (c·x1 − s·x2, s·x1 + c·x2) per pair
constexpr int64_t kAttentionScore = 1 + kSoftmax;             // scale, softmax (+1 mask, + softcap)

// Per hidden unit and step, the gates' work besides the matrix products (default activations).
constexpr int64_t kRnnCell = 2 + kT;                          // + Wb + Rb, tanh
constexpr int64_t kGruCell = 3 * 2 + 2 * kSigmoid + kT + 1 + 3;   // biases, z and r, tanh, r ⊙, blend
constexpr int64_t kLstmCell = 4 * 2 + 3 * kSigmoid + 2 * kT + 3 + 1;  // biases, i f o, g and tanh(c), c, h

int64_t activation_cost(Activation a) {
  switch (a) {
    case Activation::none: return 0;
    case Activation::relu: return 1;
    case Activation::leaky_relu: return kLeakyRelu;
    case Activation::clip: return kClip;
    case Activation::sigmoid: return kSigmoid;
    case Activation::tanh: return kT;
    case Activation::hard_sigmoid: return kHardSigmoid;
    case Activation::hard_swish: return kHardSwish;
    case Activation::gelu: return kGelu;
    case Activation::gelu_tanh: return kGeluTanh;
    case Activation::silu: return kSilu;
  }
  return 0;
}

// ---- helpers -------------------------------------------------------------------------------

// A count as a model returns it: saturated past int64, never negative (hostile attributes).
int64_t count(CheckedInt v) { return std::max<int64_t>(saturate(v), 0); }

CheckedInt numel_of(const Shape* s) { return s ? numel_or_one(*s) : CheckedInt(0); }

// The one-element integer constant at input `slot`, when the graph holds it.
std::optional<int64_t> const_int(const Node& n, const Graph& g, size_t slot) {
  if (!n.has_input(slot)) return std::nullopt;
  const Value& v = g.value(n.inputs[slot]);
  if (!v.is_constant() || v.constant.numel() != 1 || !is_integer(v.constant.dtype())) return std::nullopt;
  return v.constant.as_int64(0);
}

// Dim `axis` (negative from the end) of a shape, 1 when unknown or out of range.
int64_t dim_at(const Shape& s, int64_t axis) {
  const auto r = static_cast<int64_t>(s.dims.size());
  if (axis < 0) axis += r;
  return axis >= 0 && axis < r ? dim_or_one(s, static_cast<size_t>(axis)) : 1;
}

// ⌈log2 n⌉, at least 1: the comparisons a sort or a heap spends per element.
int64_t log2_ceil(int64_t n) { return n <= 2 ? 1 : std::bit_width(static_cast<uint64_t>(n - 1)); }

// ---- models --------------------------------------------------------------------------------

// Elementwise: C per output element.
template <int64_t C>
int64_t per_output(const Node& n, const Graph& g) {
  return count(numel_of(output_shape(n, g)) * C);
}

// Reductions, scans, normalizations: C per element of input 0.
template <int64_t C>
int64_t per_input(const Node& n, const Graph& g) {
  return count(numel_of(input_shape(n, g, 0)) * C);
}

// Sum, Max, Min: inputs − 1 ops per output element; Mean (Extra 1) divides once more.
template <int64_t Extra>
int64_t variadic(const Node& n, const Graph& g) {
  return count(numel_of(output_shape(n, g)) * (static_cast<int64_t>(n.num_inputs()) - 1 + Extra));
}

int64_t gelu(const Node& n, const Graph& g) {
  return count(numel_of(output_shape(n, g)) * (n.attr_string("approximate", "none") == "tanh" ? kGeluTanh : kGelu));
}

// The pools: C per window element per output element.
template <int64_t C>
int64_t pool(const Node& n, const Graph& g) {
  CheckedInt window = 1;
  for (int64_t k : n.attr_ints("kernel_shape")) window *= std::max<int64_t>(k, 0);
  return count(numel_of(output_shape(n, g)) * window * C);
}

// LRN: the window's squares and sum, then scale, bias, power and divide.
int64_t lrn(const Node& n, const Graph& g) {
  const int64_t size = std::max<int64_t>(n.attr_int("size", 1), 0);
  return count(numel_of(output_shape(n, g)) * (CheckedInt(2) * size + 3 + kT));
}

// TopK: a heap of K, ⌈log2 K⌉ comparisons per input element.
int64_t topk(const Node& n, const Graph& g) {
  const Shape* y = output_shape(n, g);
  const int64_t k = y ? dim_at(*y, n.attr_int("axis", -1)) : 1;
  return count(numel_of(input_shape(n, g, 0)) * log2_ceil(k));
}

// Unique: sorting the elements (or the slices along axis).
int64_t unique(const Node& n, const Graph& g) {
  const Shape* x = input_shape(n, g, 0);
  if (!x) return 0;
  const CheckedInt all = numel_or_one(*x);
  const int64_t items = n.has_attr("axis") ? dim_at(*x, n.attr_int("axis", 0)) : saturate(all);
  return count(all * log2_ceil(items));
}

// ScatterElements, ScatterND: a reduction (add, mul, max, min) costs 1 per update element; a
// plain scatter only writes.
int64_t scatter(const Node& n, const Graph& g) {
  if (n.attr_string("reduction", "none") == "none") return 0;
  return count(numel_of(input_shape(n, g, 2)));
}

// Taps per output element of an interpolation over `axes` resampled dims: 2^axes (linear) or
// 4^axes (cubic); nearest interpolates nothing.
CheckedInt taps(const std::string& mode, int64_t axes) {
  if (mode == "nearest") return 0;
  CheckedInt t = 1;
  for (int64_t i = 0; i < axes; ++i) t *= mode == "cubic" ? 4 : 2;
  return t;
}

// Resize: a multiply and an add per tap; the taps span the axes whose size changes.
int64_t resize(const Node& n, const Graph& g) {
  const Shape* x = input_shape(n, g, 0);
  const Shape* y = output_shape(n, g);
  if (!x || !y) return 0;
  int64_t resized = 0;
  for (size_t i = 0; i < x->dims.size() && i < y->dims.size(); ++i)
    resized += dim_or_one(*x, i) != dim_or_one(*y, i);
  return count(numel_or_one(*y) * taps(n.attr_string("mode", "nearest"), resized) * 2);
}

// GridSample: 2 per tap over the spatial dims, plus unnormalizing each grid coordinate.
int64_t grid_sample(const Node& n, const Graph& g) {
  const Shape* y = output_shape(n, g);
  if (!y) return 0;
  const auto spatial = static_cast<int64_t>(y->dims.size() < 2 ? 0 : y->dims.size() - 2);
  return count(numel_or_one(*y) * taps(n.attr_string("mode", "linear"), spatial) * 2 + numel_of(input_shape(n, g, 1)) * 2);
}

// RoiAlign: sampling_ratio² bilinear samples (4 taps, 8 FLOPs) accumulated per output element;
// an adaptive ratio (0) depends on the boxes and counts 2.
int64_t roi_align(const Node& n, const Graph& g) {
  int64_t s = n.attr_int("sampling_ratio", 0);
  if (s <= 0) s = 2;
  return count(numel_of(output_shape(n, g)) * s * s * (8 + 1));
}

// AffineGrid: each output coordinate is a dot product of d + 1 terms (d multiplies, d adds).
int64_t affine_grid(const Node& n, const Graph& g) {
  const Shape* y = output_shape(n, g);
  return y ? count(numel_or_one(*y) * 2 * dim_at(*y, -1)) : 0;
}

// Einsum, evaluated as one loop over every label: per iteration, operands − 1 multiplies and one
// add when some label is summed away.
int64_t einsum(const Node& n, const Graph& g) {
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape* s = input_shape(n, g, i);
    if (!s) return 0;
    ranks.push_back(s->rank());
  }
  Result<nn::EinsumSpec> spec = nn::parse_einsum(n, n.attr_string("equation", ""), ranks);
  if (!spec.ok() || spec->inputs.size() != ranks.size()) return 0;
  std::vector<int64_t> size(static_cast<size_t>(std::max(spec->num_labels, 0)), 0);
  std::vector<bool> in_output(size.size(), false);
  for (int l : spec->output)
    if (l >= 0 && static_cast<size_t>(l) < size.size()) in_output[static_cast<size_t>(l)] = true;
  for (size_t i = 0; i < spec->inputs.size(); ++i) {
    const Shape& s = *input_shape(n, g, i);
    for (size_t d = 0; d < spec->inputs[i].size() && d < s.dims.size(); ++d) {
      const int l = spec->inputs[i][d];
      if (l >= 0 && static_cast<size_t>(l) < size.size())
        size[static_cast<size_t>(l)] = std::max(size[static_cast<size_t>(l)], dim_or_one(s, d));
    }
  }
  CheckedInt iterations = 1;
  bool summed = false;
  for (size_t l = 0; l < size.size(); ++l) {
    if (size[l] == 0) continue;  // a label no operand has
    iterations *= size[l];
    summed = summed || !in_output[l];
  }
  return count(iterations * (static_cast<int64_t>(ranks.size()) - 1 + (summed ? 1 : 0)));
}

// Det: an LU factorisation, 2M³/3 per matrix.
int64_t det(const Node& n, const Graph& g) {
  const Shape* x = input_shape(n, g, 0);
  if (!x || x->dims.size() < 2) return 0;
  CheckedInt matrices = 1;
  for (size_t i = 0; i + 2 < x->dims.size(); ++i) matrices *= dim_or_one(*x, i);
  const int64_t m = dim_at(*x, -1);
  return count(matrices * (CheckedInt(2) * m * m * m / 3));
}

// DFT as the direct sum the reference computes (not an FFT's 5·n·log2 n): each output component
// sums L products of a real (2 FLOPs) or complex (4) input sample; L is dft_length or the axis.
int64_t dft(const Node& n, const Graph& g) {
  const Shape* x = input_shape(n, g, 0);
  const Shape* y = output_shape(n, g);
  if (!x || !y) return 0;
  const int64_t axis = n.has_input(2) ? const_int(n, g, 2).value_or(-2) : -2;
  const int64_t length = const_int(n, g, 1).value_or(dim_at(*x, axis));
  return count(numel_or_one(*y) * length * 2 * dim_at(*x, -1));
}

// STFT: a DFT of each windowed frame (and the window's multiply).
int64_t stft(const Node& n, const Graph& g) {
  const Shape* x = input_shape(n, g, 0);
  const Shape* y = output_shape(n, g);
  if (!x || !y) return 0;
  const Shape* window = input_shape(n, g, 2);
  const int64_t frame = const_int(n, g, 3).value_or(window ? dim_at(*window, 0) : dim_at(*x, 1));
  const CheckedInt frames = CheckedInt(dim_at(*y, 0)) * dim_at(*y, 1);
  return count(numel_or_one(*y) * frame * 2 * dim_at(*x, -1) + frames * frame);
}

// NonMaxSuppression: per batch and class, sorting the N boxes by score, then each box against
// up to max_output_boxes_per_class kept ones (absent: 0, not constant: N).
int64_t nms(const Node& n, const Graph& g) {
  const Shape* scores = input_shape(n, g, 1);
  if (!scores) return 0;
  const int64_t boxes = dim_at(*scores, -1);
  int64_t keep = n.has_input(2) ? const_int(n, g, 2).value_or(boxes) : 0;
  keep = std::clamp<int64_t>(keep, 0, boxes);
  return count(numel_or_one(*scores) * (CheckedInt(log2_ceil(boxes)) + CheckedInt(keep) * kIoU));
}

// RNN, GRU, LSTM: X·Wᵀ and H·Rᵀ at every step (W [dirs, G·H, I], R [dirs, G·H, H]), and the
// cell's elementwise work per hidden unit. X is [S, B, I] or [B, S, I].
template <int64_t Gates, int64_t Cell>
int64_t recurrent(const Node& n, const Graph& g) {
  const Shape* x = input_shape(n, g, 0);
  const Shape* w = input_shape(n, g, 1);
  const Shape* r = input_shape(n, g, 2);
  if (!x || !w || !r || x->dims.size() != 3 || w->dims.size() != 3 || r->dims.size() != 3) return 0;
  const CheckedInt steps = CheckedInt(dim_or_one(*x, 0)) * dim_or_one(*x, 1);
  const CheckedInt units = CheckedInt(dim_or_one(*w, 0)) * dim_or_one(*w, 1) / Gates;  // dirs × H
  return count(steps * (CheckedInt(2) * (numel_or_one(*w) + numel_or_one(*r)) + units * Cell));
}

// Attention: Q [B, Hq, S, D] or [B, S, Hq·D]; K [B, Hkv, L, D] or [B, L, Hkv·D]; past_key
// [B, Hkv, P, D]; Y [B, Hq, S, Dv] or [B, S, Hq·Dv]. numel(Q) = B·Hq·S·D and numel(Y) =
// B·Hq·S·Dv in either layout, so Q·Kᵀ is 2·numel(Q)·T and P·V 2·numel(Y)·T; rotary caches
// add RotaryEmbedding's count over Q and K.
// Q·Kᵀ and P·V over `past` + K's keys, and the per-score work (a mask when `mask`; softcap).
CheckedInt attention_count(const Node& n, const Shape& q, const Shape& k, const Shape& y, CheckedInt past, bool mask) {
  const bool heads_first = q.dims.size() == 4;
  const CheckedInt keys = past + (heads_first ? dim_at(k, 2) : dim_at(k, 1));
  const int64_t heads = heads_first ? dim_at(q, 1) : std::max<int64_t>(n.attr_int("q_num_heads", 1), 1);
  const CheckedInt queries = CheckedInt(dim_at(q, 0)) * heads * (heads_first ? dim_at(q, 2) : dim_at(q, 1));  // B·Hq·S
  int64_t per_score = kAttentionScore;
  if (mask) per_score += 1;
  if (n.attr_float("softcap", 0) > 0) per_score += kT + 2;
  return CheckedInt(2) * keys * (numel_or_one(q) + numel_or_one(y)) + queries * keys * per_score;
}

int64_t attention(const Node& n, const Graph& g) {
  const Shape* q = input_shape(n, g, 0);
  const Shape* k = input_shape(n, g, 1);
  const Shape* y = output_shape(n, g);
  if (!q || !k || !y || q->dims.size() < 3) return 0;
  const Shape* past = input_shape(n, g, 4);
  CheckedInt rotated = 0;  // kiln's rotary inputs: Q and the new keys rotated once each
  if (n.has_input(7)) rotated = (numel_or_one(*q) + numel_or_one(*k)) * kRotary;
  return count(attention_count(n, *q, *k, *y, past ? CheckedInt(dim_at(*past, 2)) : CheckedInt(0), n.has_input(3)) + rotated);
}

// QAttention: Attention's count (Q input 0, K input 3, the mask input 9), plus kDequantize per
// element of Q, K and V and kQuantize per element of a quantized Y.
int64_t qattention(const Node& n, const Graph& g) {
  const Shape* q = input_shape(n, g, 0);
  const Shape* k = input_shape(n, g, 3);
  const Shape* v = input_shape(n, g, 6);
  const Shape* y = output_shape(n, g);
  if (!q || !k || !v || !y || q->dims.size() < 3) return 0;
  const CheckedInt dequantized = (numel_or_one(*q) + numel_or_one(*k) + numel_or_one(*v)) * kDequantize;
  const CheckedInt quantized = n.has_input(10) ? numel_or_one(*y) * kQuantize : CheckedInt(0);
  return count(attention_count(n, *q, *k, *y, 0, n.has_input(9)) + dequantized + quantized);
}

// RotaryEmbedding: kRotary per rotated element, the first rotary_embedding_dim of each head's
// Dh features (X [B, H, S, Dh] or [B, S, H·Dh]).
int64_t rotary(const Node& n, const Graph& g) {
  const Shape* x = input_shape(n, g, 0);
  if (!x || x->dims.empty()) return 0;
  const CheckedInt all = numel_or_one(*x);
  int64_t head = dim_at(*x, -1);
  if (x->dims.size() == 3 && n.attr_int("num_heads", 0) > 0) head /= n.attr_int("num_heads", 0);
  const int64_t rotated = n.attr_int("rotary_embedding_dim", 0);
  if (rotated > 0 && head > 0 && rotated < head) return count(all / head * rotated * kRotary);
  return count(all * kRotary);
}

// The loss ops: NegativeLogLikelihoodLoss gathers and weighs one input per target;
// SoftmaxCrossEntropyLoss takes the log-softmax of all the scores first.
int64_t nll(const Node& n, const Graph& g) { return count(numel_of(input_shape(n, g, 1)) * kNll); }
int64_t softmax_cross_entropy(const Node& n, const Graph& g) {
  return count(numel_of(input_shape(n, g, 0)) * kLogSoftmax + numel_of(input_shape(n, g, 1)) * kNll);
}

// FusedConv, FusedMatMul: the dense count, plus per output element the epilogue's bias add,
// activation, residual add and post-activation (epilogue.h).
int64_t activations_cost(const Node& n) {
  int64_t per = 0;
  for (std::string_view attr : {"activation", "post_activation"})
    if (Result<ActivationSpec> a = read_activation(n, attr); a.ok()) per += activation_cost(a->kind);
  return per;
}
int64_t fused_epilogue(const Node& n) { return (n.has_input(2) ? 1 : 0) + (n.has_input(3) ? 1 : 0) + activations_cost(n); }
int64_t fused_conv(const Node& n, const Graph& g) {
  return count(CheckedInt(conv<1>(n, g)) + numel_of(output_shape(n, g)) * fused_epilogue(n));
}
// PointwiseDepthwiseConv: its stages', each conv's multiply-adds and its bias and activation
// per element of its output; the pointwise one's output is X's pixels by W1's Cm, the
// depthwise one's Y's pixels by W2's Cm, the projection one's Y (plus Z's add).
int64_t pointwise_depthwise_conv(const Node& n, const Graph& g) {
  const Shape *x = input_shape(n, g, 0), *w2 = input_shape(n, g, 3), *y = output_shape(n, g);
  const Shape *w1 = n.has_input(1) ? input_shape(n, g, 1) : nullptr, *w3 = n.has_input(5) ? input_shape(n, g, 5) : nullptr;
  if (!x || !w2 || !y || x->dims.size() < 3 || y->dims.size() != x->dims.size() || w2->dims.size() != 4 ||
      (n.has_input(1) && (!w1 || w1->dims.size() != 4)) || (n.has_input(5) && (!w3 || w3->dims.size() != 4)))
    return 0;
  const size_t axis = n.attr_int("channels_last", 0) == 1 ? x->dims.size() - 1 : 1;
  auto pixels = [&](const Shape& s) {
    CheckedInt p = 1;
    for (size_t d = 0; d < s.dims.size(); ++d) if (d != axis) p *= dim_or_one(s, d);
    return p;
  };
  auto epilogue = [&](std::string_view act, bool bias) {
    const Result<ActivationSpec> a = read_activation(n, act);
    return (bias ? 1 : 0) + (a.ok() ? activation_cost(a->kind) : 0);
  };
  CheckedInt total = pixels(*y) * dim_or_one(*w2, 0) * (CheckedInt(2) * numel_or_one(*w2, 1) + epilogue("activation", n.has_input(4)));
  if (w1) total += pixels(*x) * dim_or_one(*w1, 0) * (CheckedInt(2) * dim_or_one(*w1, 1) + epilogue("pointwise_activation", n.has_input(2)));
  if (w3)
    total += numel_or_one(*y) * (CheckedInt(2) * dim_or_one(*w3, 1) + epilogue("projection_activation", n.has_input(6)) +
                                 (n.has_input(7) ? 1 : 0));
  return count(total);
}
// FusedMatMul's outputs, several when `splits` cuts its columns: K (A's last dim) multiply-adds
// and the epilogue per element of each (its activations on the outputs `activated` names). A
// gated product (gate_block) computes two columns, a value and its gate, for each output
// element: twice the multiply-adds and bias adds, the activation on the gate and a multiply.
int64_t fused_matmul(const Node& n, const Graph& g) {
  const Shape* a = input_shape(n, g, 0);
  if (!a) return 0;
  const CheckedInt k2 = CheckedInt(2) * dim_or_one(*a, a->dims.empty() ? 0 : a->dims.size() - 1);
  if (n.attr_int("gate_block", 0) > 0)
    return count(numel_of(output_shape(n, g)) * (k2 * 2 + (n.has_input(2) ? 2 : 0) + activations_cost(n) + 1));
  const CheckedInt per = k2 + fused_epilogue(n);
  const std::vector<int64_t> on = n.attr_ints("activated");
  CheckedInt total = 0;
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    const ValueId y = n.outputs[i];
    if (y == kNoValue || !g.value(y).shape.rank_known) continue;
    const bool plain = i < on.size() && on[i] == 0;
    total = total + numel_of(&g.value(y).shape) * (plain ? per - activations_cost(n) : per);
  }
  return count(total);
}

// QFusedConv, QFusedMatMul: the dense count, plus per output element the bias add,
// activations and residual add (on Z dequantized) of the fused epilogue and the output's
// requantization (QFusedMatMul's dense count: M·N·K from A and B, B transposed or not).
int64_t qfused_epilogue(const Node& n, const Graph& g) {
  int64_t per = (n.has_input(8) ? 1 : 0) + (n.has_input(9) ? 1 + kDequantize : 0) + (n.has_input(6) ? kQuantize : 0);
  for (std::string_view attr : {"activation", "post_activation"})
    if (Result<ActivationSpec> a = read_activation(n, attr); a.ok()) per += activation_cost(a->kind);
  return count(numel_of(output_shape(n, g)) * per);
}
int64_t qfused_conv(const Node& n, const Graph& g) { return count(CheckedInt(conv<3>(n, g)) + qfused_epilogue(n, g)); }
int64_t qfused_matmul(const Node& n, const Graph& g) {
  const Shape* b = input_shape(n, g, 3);
  const int64_t k = b ? dim_at(*b, n.attr_int("transB", 0) ? 1 : 0) : 1;
  return count(numel_of(output_shape(n, g)) * 2 * k + qfused_epilogue(n, g));
}

// WoqFusedMatMul: M·N·K multiply-adds and the epilogue, as FusedMatMul (B's dequantization is
// part of the loads).
int64_t woq_fused_matmul(const Node& n, const Graph& g) {
  const Shape* b = input_shape(n, g, 1);
  const int64_t k = b ? dim_at(*b, n.attr_int("transB", 0) ? 1 : 0) : 1;
  int64_t per = (n.has_input(4) ? 1 : 0) + (n.has_input(5) ? 1 : 0);
  for (std::string_view attr : {"activation", "post_activation"})
    if (Result<ActivationSpec> a = read_activation(n, attr); a.ok()) per += activation_cost(a->kind);
  return count(numel_of(output_shape(n, g)) * (2 * k + per));
}

// QAdd: per output element, both operands dequantized, the add, the activation, the quantization.
int64_t qadd(const Node& n, const Graph& g) {
  int64_t per = 2 * kDequantize + 1 + kQuantize;
  if (Result<ActivationSpec> a = read_activation(n, "activation"); a.ok()) per += activation_cost(a->kind);
  return count(numel_of(output_shape(n, g)) * per);
}

// ---- the table -----------------------------------------------------------------------------

struct Model {
  std::string_view op;
  FlopsFn flops;
};

const Model kModels[] = {
    // elementwise unary: 1 per element
    {"Abs", per_output<1>}, {"Neg", per_output<1>}, {"Sqrt", per_output<1>}, {"Reciprocal", per_output<1>},
    {"Floor", per_output<1>}, {"Ceil", per_output<1>}, {"Round", per_output<1>}, {"Sign", per_output<1>},
    {"Relu", per_output<1>}, {"ThresholdedRelu", per_output<1>}, {"IsNaN", per_output<1>}, {"IsInf", per_output<1>},
    {"Not", per_output<1>}, {"BitwiseNot", per_output<1>},
    // transcendental
    {"Exp", per_output<kT>}, {"Log", per_output<kT>}, {"Erf", per_output<kT>}, {"Tanh", per_output<kT>},
    {"Sin", per_output<kT>}, {"Cos", per_output<kT>}, {"Tan", per_output<kT>},
    {"Asin", per_output<kT>}, {"Acos", per_output<kT>}, {"Atan", per_output<kT>},
    {"Sinh", per_output<kT>}, {"Cosh", per_output<kT>}, {"Asinh", per_output<kT>}, {"Acosh", per_output<kT>},
    {"Atanh", per_output<kT>},
    // activations: the sum of their definitions
    {"Sigmoid", per_output<kSigmoid>}, {"HardSigmoid", per_output<kHardSigmoid>}, {"HardSwish", per_output<kHardSwish>},
    {"LeakyRelu", per_output<kLeakyRelu>}, {"Elu", per_output<kElu>}, {"Selu", per_output<kSelu>},
    {"Celu", per_output<kCelu>}, {"Softplus", per_output<kSoftplus>}, {"Softsign", per_output<kSoftsign>},
    {"Mish", per_output<kMish>}, {"Swish", per_output<kSwish>}, {"Gelu", gelu}, {"Shrink", per_output<kShrink>},
    {"Clip", per_output<kClip>},
    // elementwise binary, variadic and selection: per output element
    {"Add", per_output<1>}, {"Sub", per_output<1>}, {"Mul", per_output<1>}, {"Div", per_output<1>},
    {"Mod", per_output<kMod>}, {"Pow", per_output<kT>}, {"PRelu", per_output<kPRelu>},
    {"And", per_output<1>}, {"Or", per_output<1>}, {"Xor", per_output<1>},
    {"Equal", per_output<1>}, {"Less", per_output<1>}, {"Greater", per_output<1>},
    {"LessOrEqual", per_output<1>}, {"GreaterOrEqual", per_output<1>},
    {"BitShift", per_output<1>}, {"BitwiseAnd", per_output<1>}, {"BitwiseOr", per_output<1>}, {"BitwiseXor", per_output<1>},
    {"Max", variadic<0>}, {"Min", variadic<0>}, {"Sum", variadic<0>}, {"Mean", variadic<1>},
    {"Where", per_output<1>},
    // reductions and scans: per input element
    {"ReduceSum", per_input<1>}, {"ReduceMean", per_input<1>}, {"ReduceMax", per_input<1>}, {"ReduceMin", per_input<1>},
    {"ReduceProd", per_input<1>}, {"ReduceLogSum", per_input<1>}, {"ReduceL1", per_input<2>},
    {"ReduceL2", per_input<2>}, {"ReduceSumSquare", per_input<2>}, {"ReduceLogSumExp", per_input<kLogSumExp>},
    {"ArgMax", per_input<1>}, {"ArgMin", per_input<1>}, {"Hardmax", per_input<1>},
    {"CumSum", per_input<1>}, {"CumProd", per_input<1>}, {"TopK", topk}, {"Unique", unique},
    // softmax and normalizations: per input element
    {"Softmax", per_input<kSoftmax>}, {"LogSoftmax", per_input<kLogSoftmax>},
    {"LayerNormalization", per_input<kLayerNorm>}, {"QLayerNormalization", per_input<kDequantize + kLayerNorm + kQuantize>},
    {"QMul", per_output<kDequantize + 1 + kQuantize>}, {"QGlobalAveragePool", per_input<1>}, {"LookupTable", per_output<0>}, {"RMSNormalization", per_input<kRmsNorm>},
    {"BatchNormalization", per_input<kBatchNorm>}, {"InstanceNormalization", per_input<kLayerNorm>},
    {"GroupNormalization", per_input<kLayerNorm>}, {"LpNormalization", per_input<kLpNorm>},
    {"LRN", lrn},
    // pooling: per window element (global: per input element); |x|^p and sum for Lp
    {"MaxPool", pool<1>}, {"AveragePool", pool<1>}, {"LpPool", pool<2>},
    {"GlobalMaxPool", per_input<1>}, {"GlobalAveragePool", per_input<1>}, {"GlobalLpPool", per_input<2>},
    {"Col2Im", per_input<1>},  // sums overlapping blocks
    // fused, sampling and other network layers
    {"FusedConv", fused_conv}, {"PointwiseDepthwiseConv", pointwise_depthwise_conv}, {"FusedMatMul", fused_matmul}, {"QFusedConv", qfused_conv}, {"QFusedMatMul", qfused_matmul}, {"WoqFusedMatMul", woq_fused_matmul},
    {"Resize", resize}, {"GridSample", grid_sample}, {"RoiAlign", roi_align}, {"AffineGrid", affine_grid},
    {"Einsum", einsum}, {"Det", det},
    {"RNN", recurrent<1, kRnnCell>}, {"GRU", recurrent<3, kGruCell>}, {"LSTM", recurrent<4, kLstmCell>},
    {"Attention", attention}, {"QAttention", qattention}, {"RotaryEmbedding", rotary},
    {"NegativeLogLikelihoodLoss", nll}, {"SoftmaxCrossEntropyLoss", softmax_cross_entropy},
    // signal processing and detection
    {"DFT", dft}, {"STFT", stft}, {"HannWindow", per_output<kHann>}, {"HammingWindow", per_output<kHamming>},
    {"BlackmanWindow", per_output<kBlackman>}, {"MelWeightMatrix", per_output<kMel>}, {"NonMaxSuppression", nms},
    // quantization (the integer matrix products count theirs in quant.cc)
    {"QuantizeLinear", per_output<kQuantize>}, {"DequantizeLinear", per_output<kDequantize>},
    {"DynamicQuantizeLinear", per_input<kDynamicQuantize>}, {"QAdd", qadd},
    // scatters with a reduction: 1 per update element
    {"ScatterElements", scatter}, {"ScatterND", scatter},
    // no arithmetic: data movement, selection, generators, shape queries, conversion
    {"Identity", none}, {"Cast", none}, {"Reshape", none}, {"Flatten", none}, {"Squeeze", none},
    {"Unsqueeze", none}, {"Transpose", none}, {"Concat", none}, {"Split", none}, {"ReplaceSlices", none}, {"Slice", none},
    {"Pad", none}, {"Tile", none}, {"Expand", none}, {"DepthToSpace", none}, {"SpaceToDepth", none},
    {"CenterCropPad", none}, {"Gather", none}, {"GatherElements", none}, {"GatherND", none},
    {"Shape", none}, {"Size", none}, {"ConstantOfShape", none}, {"Range", none}, {"OneHot", none},
    {"Trilu", none}, {"EyeLike", none}, {"Compress", none}, {"NonZero", none}, {"ReverseSequence", none},
    {"MaxUnpool", none},
    // control flow: the bodies are not top-level nodes
    {"If", none}, {"Loop", none}, {"Scan", none},
};

}  // namespace
}  // namespace flops

void register_flop_models(OpRegistry& r) {
  std::unordered_map<std::string_view, FlopsFn> table;
  for (const flops::Model& m : flops::kModels) table.emplace(m.op, m.flops);
  for (const auto& [domain, schema] : r.all()) {
    if (schema->traits.flops) continue;  // the family counts this op itself (the dense ops)
    auto it = table.find(schema->name);
    if (it != table.end()) r.find_mutable(domain, schema->name)->traits.flops = it->second;
  }
}

}  // namespace kiln
