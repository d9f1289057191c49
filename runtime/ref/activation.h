// The activations as scalar functions over a compute type C (float for f16/bf16/f32, double
// for f64): the unary reference kernels and the fused ops' epilogues (FusedConv, FusedMatMul)
// both call these, so a fused node computes exactly what the nodes it replaced did.
#pragma once

#include <algorithm>
#include <cmath>

#include "formats/ops/epilogue.h"

namespace kiln::act {

template <class C> C relu(C x) { return x < C(0) ? C(0) : x; }
template <class C> C leaky_relu(C x, C alpha) { return x < C(0) ? alpha * x : x; }
/// Clip's rule: below lo gives lo, above hi gives hi, NaN passes through.
template <class C> C clip(C x, C lo, C hi) {
  if (x < lo) x = lo;
  if (x > hi) x = hi;
  return x;
}
template <class C> C sigmoid(C x) {
  if (x >= C(0)) return C(1) / (C(1) + std::exp(-x));
  const C e = std::exp(x);
  return e / (C(1) + e);
}
template <class C> C tanh(C x) { return std::tanh(x); }
template <class C> C hard_sigmoid(C x, C alpha, C beta) { return std::max(C(0), std::min(C(1), alpha * x + beta)); }
template <class C> C hard_swish(C x) { return x * std::max(C(0), std::min(C(1), x / C(6) + C(0.5))); }
template <class C> C gelu(C x) { return C(0.5) * x * (C(1) + std::erf(x * C(0.7071067811865476))); }
template <class C> C gelu_tanh(C x) {
  const C k = C(0.7978845608028654);  // sqrt(2 / pi)
  return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
}
/// x * sigmoid(x): what exporters write as Mul(x, Sigmoid(x)).
template <class C> C silu(C x) { return x * sigmoid(x); }

/// Applies `spec` to n values in place.
template <class C>
void apply(const ActivationSpec& spec, C* y, int64_t n) {
  const C a = static_cast<C>(spec.a), b = static_cast<C>(spec.b);
  switch (spec.kind) {
    case Activation::none: return;
    case Activation::relu: for (int64_t i = 0; i < n; ++i) y[i] = relu(y[i]); return;
    case Activation::leaky_relu: for (int64_t i = 0; i < n; ++i) y[i] = leaky_relu(y[i], a); return;
    case Activation::clip: for (int64_t i = 0; i < n; ++i) y[i] = clip(y[i], a, b); return;
    case Activation::sigmoid: for (int64_t i = 0; i < n; ++i) y[i] = sigmoid(y[i]); return;
    case Activation::tanh: for (int64_t i = 0; i < n; ++i) y[i] = tanh(y[i]); return;
    case Activation::hard_sigmoid: for (int64_t i = 0; i < n; ++i) y[i] = hard_sigmoid(y[i], a, b); return;
    case Activation::hard_swish: for (int64_t i = 0; i < n; ++i) y[i] = hard_swish(y[i]); return;
    case Activation::gelu: for (int64_t i = 0; i < n; ++i) y[i] = gelu(y[i]); return;
    case Activation::gelu_tanh: for (int64_t i = 0; i < n; ++i) y[i] = gelu_tanh(y[i]); return;
    case Activation::silu: for (int64_t i = 0; i < n; ++i) y[i] = silu(y[i]); return;
  }
}

}  // namespace kiln::act
