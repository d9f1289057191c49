// fold_batchnorm: BatchNormalization (inference form: X, scale, B, mean, var) right after a
// Conv, ConvTranspose, Gemm or MatMul with constant weights is folded into them. With
//   s[c] = scale[c] / sqrt(var[c] + epsilon),  t[c] = B[c] - mean[c] * s[c]
// the weights are scaled along their output-channel axis (W' = W * s) and the bias becomes
// b' = b * s + t (b = 0 when absent). The output-channel axis of the weights is 0 for Conv
// ([C_out, C_in/group, k...]), 1 for ConvTranspose ([C_in, C_out/group, k...], within each
// group), N for Gemm (axis 1 of B, or 0 with transB) and the last axis of MatMul's B. MatMul has
// no bias input, so it becomes MatMul followed by Add of b'.
//
// Conditions: every tensor is f32 and constant except the producer's data input; the
// producer's output is read by the BatchNormalization alone (and is no graph output); for Gemm
// and MatMul the output is 2-D, so that BatchNormalization's channel axis (1) is N. The folded
// weights are new constants (the old ones may have other readers); the BatchNormalization and
// whatever only it read go.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "compile/graph_util.h"
#include "compile/pass.h"

namespace kiln {

namespace {

// The constant f32 tensor of `v`, or an undefined Tensor. A copy shares the data, and stays
// valid while the pass adds values to the graph.
Tensor f32_constant(const Graph& g, ValueId v) {
  if (v < 0 || !g.value(v).is_constant() || g.value(v).constant.dtype() != DType::f32) return Tensor();
  return g.value(v).constant;
}

// Per-channel s and t of the BatchNormalization, or empty when it cannot be folded.
struct Affine {
  std::vector<double> s, t;
};

std::optional<Affine> bn_affine(const Graph& g, const Node& bn) {
  Tensor p[4];  // scale, B, mean, var
  for (size_t i = 0; i < 4; ++i)
    if (!(p[i] = f32_constant(g, bn.inputs[i + 1])).defined() || p[i].numel() != p[0].numel()) return std::nullopt;
  const double eps = bn.attr_float("epsilon", 1e-5);
  Affine a;
  for (int64_t c = 0; c < p[0].numel(); ++c) {
    const double s = p[0].data<float>()[c] / std::sqrt(static_cast<double>(p[3].data<float>()[c]) + eps);
    a.s.push_back(s);
    a.t.push_back(p[1].data<float>()[c] - p[2].data<float>()[c] * s);
  }
  return a;
}

// W * s along the output channel: element i of W belongs to channel channel_of(i).
template <class ChannelOf>
Tensor scaled(const Tensor& w, const Affine& a, ChannelOf channel_of) {
  Tensor out(DType::f32, w.shape());
  for (int64_t i = 0; i < w.numel(); ++i)
    out.data<float>()[i] = static_cast<float>(w.data<float>()[i] * a.s[static_cast<size_t>(channel_of(i))]);
  return out;
}

// b * s + t per channel; an undefined b is zero.
Tensor folded_bias(const Tensor& b, const Affine& a) {
  Tensor out(DType::f32, {static_cast<int64_t>(a.s.size())});
  for (size_t c = 0; c < a.s.size(); ++c)
    out.data<float>()[c] = static_cast<float>((b.defined() ? b.data<float>()[c] : 0.0) * a.s[c] + a.t[c]);
  return out;
}

// The folded weights and bias for `prod`, or undefined tensors when its weights do not allow
// the fold. `beta` is Gemm's (the folded C absorbs it).
struct Folded {
  Tensor w, b;
};

Folded fold_weights(const Node& prod, const Tensor& w, const Tensor& b, const Affine& a) {
  const auto channels = static_cast<int64_t>(a.s.size());
  if (b.defined() && prod.op != "Gemm" && b.numel() != channels) return {};
  if (prod.op == "Conv") {
    if (w.rank() < 1 || w.dim(0) != channels) return {};
    const int64_t per = w.numel() / std::max<int64_t>(channels, 1);
    return {scaled(w, a, [per](int64_t i) { return i / per; }), folded_bias(b, a)};
  }
  if (prod.op == "ConvTranspose") {
    const int64_t group = prod.attr_int("group", 1);
    if (w.rank() < 2 || group <= 0 || w.dim(0) % group != 0 || w.dim(1) * group != channels || w.numel() == 0) return {};
    const int64_t per_out = w.dim(1), spatial = w.numel() / (w.dim(0) * w.dim(1)), in_per_group = w.dim(0) / group;
    // W[ci, j, ...] feeds output channel (ci / in_per_group) * per_out + j.
    auto channel_of = [=](int64_t i) {
      const int64_t ci = i / (per_out * spatial), j = i / spatial % per_out;
      return ci / in_per_group * per_out + j;
    };
    return {scaled(w, a, channel_of), folded_bias(b, a)};
  }
  if (prod.op == "Gemm") {
    const bool tb = prod.attr_int("transB", 0) != 0;
    if (w.rank() != 2 || w.dim(tb ? 0 : 1) != channels) return {};
    // C broadcasts onto [M, N]: rank <= 2, last dim 1 or N. Y = alpha*A*B + beta*C, so
    // BN(Y) = alpha*A*(B s) + (beta*C*s + t), with beta 1.
    int64_t rows = 1, c_last = 1;
    if (b.defined()) {
      if (b.rank() > 2 || (b.rank() >= 1 && b.dim(b.rank() - 1) != 1 && b.dim(b.rank() - 1) != channels)) return {};
      rows = b.rank() == 2 ? b.dim(0) : 1;
      c_last = b.rank() >= 1 ? b.dim(b.rank() - 1) : 1;
    }
    const double beta = prod.attr_float("beta", 1.0);
    Tensor c(DType::f32, b.defined() && b.rank() == 2 ? std::vector<int64_t>{rows, channels} : std::vector<int64_t>{channels});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = 0; n < channels; ++n) {
        const double old = b.defined() ? b.data<float>()[r * c_last + (c_last == 1 ? 0 : n)] : 0.0;
        c.data<float>()[r * channels + n] = static_cast<float>(beta * old * a.s[static_cast<size_t>(n)] + a.t[static_cast<size_t>(n)]);
      }
    if (tb) return {scaled(w, a, [k = w.dim(1)](int64_t i) { return i / k; }), c};
    return {scaled(w, a, [channels](int64_t i) { return i % channels; }), c};
  }
  // MatMul: B [K, N]; the bias goes to an Add.
  if (w.rank() != 2 || w.dim(1) != channels) return {};
  return {scaled(w, a, [channels](int64_t i) { return i % channels; }), folded_bias(Tensor(), a)};
}

// Rewrites `prod` and `bn` when the weights allow; returns whether it did. Conv, ConvTranspose
// and Gemm take the new weights and bias and write the BatchNormalization's output (whose name
// its readers know), and `bn` is to be dropped; for MatMul, `bn` becomes the bias Add, in its
// place: after the MatMul, before its readers.
bool fold_into(Graph& g, Node& prod, Node& bn, const Affine& a) {
  const Tensor w = f32_constant(g, prod.inputs[1]);
  if (!w.defined() || g.value(prod.inputs[0]).dtype != DType::f32) return false;
  if (prod.op == "MatMul" && g.value(prod.outputs[0]).shape.rank() != 2) return false;
  const bool has_bias = prod.op != "MatMul" && prod.has_input(2);
  const Tensor b = has_bias ? f32_constant(g, prod.inputs[2]) : Tensor();
  if (has_bias && !b.defined()) return false;
  Folded f = fold_weights(prod, w, b, a);
  if (!f.w.defined()) return false;

  const std::string w_name = g.value(prod.inputs[1]).name + "_bn";
  prod.inputs[1] = g.add_constant(w_name, f.w);
  if (prod.op == "MatMul") {
    const ValueId bias = g.add_constant(bn.name + ".bias", f.b);
    bn.op = "Add";
    bn.inputs = {prod.outputs[0], bias};
    bn.attrs.clear();
    bn.kernel = {};
    return true;
  }
  const std::string b_name = has_bias ? g.value(prod.inputs[2]).name + "_bn" : prod.name + ".bias";
  prod.inputs.resize(3, kNoValue);
  prod.inputs[2] = g.add_constant(b_name, f.b);
  if (prod.op == "Gemm") prod.set_attr("beta", 1.0);
  prod.outputs[0] = bn.outputs[0];
  prod.kernel = {};
  for (const std::string& s : bn.sources) prod.sources.push_back(s);
  return true;
}

}  // namespace

Result<PassResult> fold_batchnorm(Model& model, PassContext&) {
  Graph& g = model.graph;
  std::vector<int32_t> producer = g.producers();
  std::vector<size_t> readers = reader_counts(g);
  std::vector<char> drop(g.nodes.size(), 0);
  std::map<std::string, size_t> folded;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& bn = g.nodes[i];
    if (bn.op != "BatchNormalization" || !bn.domain.empty() || bn.num_inputs() != 5) continue;
    const ValueId x = bn.inputs[0];
    const int32_t p = producer[static_cast<size_t>(x)];
    if (p < 0 || readers[static_cast<size_t>(x)] != 1 || g.value(x).dtype != DType::f32) continue;
    Node& prod = g.nodes[static_cast<size_t>(p)];
    const std::string op = prod.op;
    if (!prod.domain.empty() || (op != "Conv" && op != "ConvTranspose" && op != "Gemm" && op != "MatMul")) continue;
    if (prod.outputs.size() != 1 || !prod.has_input(1)) continue;
    std::optional<Affine> a = bn_affine(g, bn);
    if (!a || !fold_into(g, prod, bn, *a)) continue;
    if (op != "MatMul") drop[i] = 1;
    ++folded[op];
  }
  if (folded.empty()) return PassResult{};
  erase_nodes(g, drop);
  drop_unused_values(g);
  std::string summary;
  for (const auto& [op, n] : folded)
    summary += (summary.empty() ? "folded " : ", ") + count_of(n, "BatchNormalization", "BatchNormalization") + " into " + op;
  return PassResult{true, summary};
}

}  // namespace kiln
