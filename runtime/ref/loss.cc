// Reference kernels of the loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
// Both gather -weight[t] * logp[n, t, d...] per target element, computed and accumulated in
// double; "mean" divides by the sum of the gathered weights (ignored targets weigh 0).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/kernel.h"

namespace kiln {
namespace loss {
namespace {

void store(const double* v, Tensor& t) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, double>) p[i] = v[i];
      else p[i] = static_cast<T>(static_cast<float>(v[i]));
    }
  });
}

// In place over [N, C, D]: each (n, d) column becomes its log-softmax over C.
void log_softmax(std::vector<double>& x, int64_t n, int64_t c, int64_t d) {
  for (int64_t ni = 0; ni < n; ++ni) {
    double* base = x.data() + ni * c * d;
    for (int64_t di = 0; di < d; ++di) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t ci = 0; ci < c; ++ci) mx = std::max(mx, base[ci * d + di]);
      double sum = 0;
      for (int64_t ci = 0; ci < c; ++ci) sum += std::exp(base[ci * d + di] - mx);
      const double lse = mx + std::log(sum);
      for (int64_t ci = 0; ci < c; ++ci) base[ci * d + di] -= lse;
    }
  }
}

Status run_loss(KernelContext& ctx, bool softmax) {
  const Node& node = ctx.node();
  const Tensor &x = ctx.input(0), &target = ctx.input(1);
  const int64_t n = x.dim(0), c = x.dim(1);
  int64_t d = 1;
  for (int64_t i = 2; i < x.rank(); ++i) d *= x.dim(i);
  std::vector<double> logp = x.to_double_vector();
  if (softmax) log_softmax(logp, n, c, d);
  if (softmax && ctx.num_outputs() > 1 && ctx.output(1).defined()) store(logp.data(), ctx.output(1));
  const std::vector<int64_t> t = target.to_int64_vector();
  std::vector<double> weight;
  if (ctx.has_input(2)) weight = ctx.input(2).to_double_vector();
  const bool has_ignore = node.has_attr("ignore_index");
  const int64_t ignore = node.attr_int("ignore_index", 0);
  const std::string reduction = node.attr_string("reduction", "mean");

  std::vector<double> loss(static_cast<size_t>(n * d));
  double loss_sum = 0, weight_sum = 0;
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t di = 0; di < d; ++di) {
      const size_t i = static_cast<size_t>(ni * d + di);
      const int64_t cls = t[i];
      if (has_ignore && cls == ignore) {
        loss[i] = 0;
        continue;
      }
      if (cls < 0 || cls >= c)
        return ctx.error("target value " + std::to_string(cls) + " is out of range for " + std::to_string(c) + " classes");
      const double w = weight.empty() ? 1.0 : weight[static_cast<size_t>(cls)];
      loss[i] = -w * logp[static_cast<size_t>((ni * c + cls) * d + di)];
      loss_sum += loss[i];
      weight_sum += w;
    }
  }
  if (reduction == "none") {
    store(loss.data(), ctx.output(0));
  } else {
    // 0 / 0 (every target ignored) is NaN, as in the ONNX reference.
    const double r = reduction == "sum" ? loss_sum : loss_sum / weight_sum;
    store(&r, ctx.output(0));
  }
  return {};
}

Status ref_nll(KernelContext& ctx) { return run_loss(ctx, false); }
Status ref_sce(KernelContext& ctx) { return run_loss(ctx, true); }

}  // namespace
}  // namespace loss

void register_ref_loss(KernelRegistry& r) {
  r.add_reference("NegativeLogLikelihoodLoss", loss::ref_nll);
  r.add_reference("SoftmaxCrossEntropyLoss", loss::ref_sce);
}

}  // namespace kiln
