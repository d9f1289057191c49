// Reference kernels for the pools (MaxPool with optional argmax indices, AveragePool, LpPool,
// the global pools), LRN and MaxUnpool. Windows are walked directly (no im2col): pools are
// cheap next to the convs around them. Spatial dims are padded to three as in nn_conv.cc.
#include <cmath>
#include <limits>
#include <string>

#include "formats/ops/nn_util.h"
#include "runtime/ref/layout.h"
#include "runtime/ref/nn_util.h"

namespace kiln::nn {

namespace {

enum class PoolKind { max, avg, lp };

std::vector<int64_t> spatial(const Tensor& t) { return {t.shape().begin() + 2, t.shape().end()}; }

template <class T>
Status pool_impl(KernelContext& ctx, PoolKind kind, const Tensor& x, Tensor& y, Tensor* indices) {
  const Node& node = ctx.node();
  std::vector<int64_t> in = spatial(x);
  if (in.size() > 3) return ctx.error("only 1, 2 and 3 spatial dims are supported, got " + std::to_string(in.size()));
  KILN_ASSIGN_OR_RETURN(Window w, resolve_window(node, in, {}, node.attr_int("ceil_mode", 0) != 0));
  const size_t r = w.rank();
  std::vector<int64_t> pb(w.pads.begin(), w.pads.begin() + static_cast<ptrdiff_t>(r)), pe(w.pads.begin() + static_cast<ptrdiff_t>(r), w.pads.end());
  const std::vector<int64_t> I = to3(in, 1), O = to3(w.out, 1), K = to3(w.kernel, 1), S = to3(w.strides, 1), D = to3(w.dilations, 1),
                             PB = to3(pb, 0), PE = to3(pe, 0);
  const bool include_pad = node.attr_int("count_include_pad", 0) != 0;
  const bool col_major = node.attr_int("storage_order", 0) != 0;
  const double p = static_cast<double>(node.attr_int("p", 2));
  const int64_t img = I[0] * I[1] * I[2], opix = O[0] * O[1] * O[2];
  const int64_t NC = x.dim(0) * x.dim(1);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  int64_t* pi = indices ? indices->data<int64_t>() : nullptr;
  for (int64_t nc = 0; nc < NC; ++nc) {
    const T* xs = px + nc * img;
    for (int64_t od = 0; od < O[0]; ++od)
      for (int64_t oh = 0; oh < O[1]; ++oh)
        for (int64_t ow = 0; ow < O[2]; ++ow) {
          const int64_t o = nc * opix + (od * O[1] + oh) * O[2] + ow;
          const int64_t s0 = od * S[0] - PB[0], s1 = oh * S[1] - PB[1], s2 = ow * S[2] - PB[2];
          double acc = 0;
          T best = std::numeric_limits<T>::lowest();
          int64_t best_at = -1, count = 0;
          for (int64_t k0 = 0; k0 < K[0]; ++k0) {
            const int64_t i0 = s0 + k0 * D[0];
            for (int64_t k1 = 0; k1 < K[1]; ++k1) {
              const int64_t i1 = s1 + k1 * D[1];
              for (int64_t k2 = 0; k2 < K[2]; ++k2) {
                const int64_t i2 = s2 + k2 * D[2];
                const bool inside = i0 >= 0 && i0 < I[0] && i1 >= 0 && i1 < I[1] && i2 >= 0 && i2 < I[2];
                if (!inside) {
                  // Padding counts toward the average only within the explicit pads, not the
                  // extra room ceil_mode adds.
                  if (include_pad && i0 < I[0] + PE[0] && i1 < I[1] + PE[1] && i2 < I[2] + PE[2]) ++count;
                  continue;
                }
                const T v = xs[(i0 * I[1] + i1) * I[2] + i2];
                ++count;
                if (kind == PoolKind::max) {
                  if (best_at < 0 || v > best) {
                    best = v;
                    best_at = col_major ? i0 + i1 * I[0] + i2 * I[0] * I[1] : (i0 * I[1] + i1) * I[2] + i2;
                  }
                } else if (kind == PoolKind::avg) {
                  acc += static_cast<double>(v);
                } else {
                  acc += std::pow(std::fabs(static_cast<double>(v)), p);
                }
              }
            }
          }
          if (kind == PoolKind::max) {
            py[o] = best;
            if (pi) pi[o] = best_at < 0 ? -1 : nc * img + best_at;
          } else if (kind == PoolKind::avg) {
            py[o] = static_cast<T>(count ? acc / static_cast<double>(count) : 0.0);
          } else {
            py[o] = static_cast<T>(std::pow(acc, 1.0 / p));
          }
        }
  }
  return {};
}

Status run_pool(KernelContext& ctx, PoolKind kind) {
  if (kind == PoolKind::lp && ctx.node().attr_int("p", 2) < 1) return ctx.error("p must be at least 1");
  Tensor* indices = ctx.num_outputs() > 1 && ctx.output(1).defined() ? &ctx.output(1) : nullptr;
  switch (ctx.input(0).dtype()) {
    case DType::i8: return pool_impl<int8_t>(ctx, kind, ctx.input(0), ctx.output(0), indices);
    case DType::u8: return pool_impl<uint8_t>(ctx, kind, ctx.input(0), ctx.output(0), indices);
    default: break;
  }
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return pool_impl<T>(ctx, kind, *in[0], *out[0], out.size() > 1 ? out[1] : nullptr);
  });
}

Status ref_max_pool(KernelContext& ctx) { return run_pool(ctx, PoolKind::max); }
Status ref_average_pool(KernelContext& ctx) { return run_pool(ctx, PoolKind::avg); }
Status ref_lp_pool(KernelContext& ctx) { return run_pool(ctx, PoolKind::lp); }

template <class T>
Status global_pool_impl(KernelContext& ctx, PoolKind kind, const Tensor& x, Tensor& y) {
  const int64_t NC = x.rank() >= 2 ? x.dim(0) * x.dim(1) : 0;
  const int64_t S = NC ? x.numel() / NC : 0;
  const double p = static_cast<double>(ctx.node().attr_int("p", 2));
  if (kind == PoolKind::lp && p < 1) return ctx.error("p must be at least 1");
  for (int64_t nc = 0; nc < NC; ++nc) {
    const T* xs = x.data<T>() + nc * S;
    double acc = 0;
    T best = std::numeric_limits<T>::lowest();
    for (int64_t i = 0; i < S; ++i) {
      if (kind == PoolKind::max) best = i == 0 || xs[i] > best ? xs[i] : best;
      else if (kind == PoolKind::avg) acc += static_cast<double>(xs[i]);
      else acc += std::pow(std::fabs(static_cast<double>(xs[i])), p);
    }
    y.data<T>()[nc] = kind == PoolKind::max ? best
                      : kind == PoolKind::avg ? static_cast<T>(S ? acc / static_cast<double>(S) : 0.0)
                                              : static_cast<T>(std::pow(acc, 1.0 / p));
  }
  return {};
}

Status run_global_pool(KernelContext& ctx, PoolKind kind) {
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return global_pool_impl<T>(ctx, kind, *in[0], *out[0]);
  });
}

Status ref_global_max_pool(KernelContext& ctx) { return run_global_pool(ctx, PoolKind::max); }
Status ref_global_average_pool(KernelContext& ctx) { return run_global_pool(ctx, PoolKind::avg); }
Status ref_global_lp_pool(KernelContext& ctx) { return run_global_pool(ctx, PoolKind::lp); }

// y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta.
template <class T>
Status lrn_impl(KernelContext& ctx, const Tensor& x, Tensor& y) {
  const Node& node = ctx.node();
  const double alpha = node.attr_float("alpha", 1e-4), beta = node.attr_float("beta", 0.75), bias = node.attr_float("bias", 1.0);
  const int64_t size = node.attr_int("size", 1);
  const int64_t N = x.dim(0), C = x.dim(1), S = N * C != 0 ? x.numel() / (N * C) : 0;
  const int64_t before = (size - 1) / 2, after = size - 1 - before;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) {
        double sum = 0;
        for (int64_t j = std::max<int64_t>(0, c - before); j <= std::min(C - 1, c + after); ++j) {
          const double v = static_cast<double>(px[(n * C + j) * S + s]);
          sum += v * v;
        }
        const int64_t at = (n * C + c) * S + s;
        py[at] = static_cast<T>(static_cast<double>(px[at]) / std::pow(bias + alpha / static_cast<double>(size) * sum, beta));
      }
  return {};
}

Status ref_lrn(KernelContext& ctx) {
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return lrn_impl<T>(ctx, *in[0], *out[0]);
  });
}

// The values scatter to the flat positions I names within the shape MaxPool's input had
// (inferred from kernel, strides and pads); that block is then placed at the origin of the
// requested output shape, the rest of which is zero (the ONNX reference's rule).
template <class T>
Status max_unpool_impl(KernelContext& ctx, const Tensor& x, const Tensor& idx, Tensor& y) {
  const Node& node = ctx.node();
  if (idx.shape() != x.shape()) return ctx.error("I " + shape_str(idx.shape()) + " must have X's shape " + shape_str(x.shape()));
  if (y.rank() != x.rank() || y.dim(0) != x.dim(0) || y.dim(1) != x.dim(1))
    return ctx.error("output shape " + shape_str(y.shape()) + " must keep X's batch and channel dims " + shape_str(x.shape()));
  const size_t n = static_cast<size_t>(x.rank() - 2);
  std::vector<int64_t> k = node.attr_ints("kernel_shape"), s = node.attr_ints("strides", std::vector<int64_t>(n, 1)),
                       p = node.attr_ints("pads", std::vector<int64_t>(2 * n, 0));
  if (k.size() != n || s.size() != n || p.size() != 2 * n) return ctx.error("kernel_shape, strides and pads must match the " + std::to_string(n) + " spatial dims");
  std::vector<int64_t> inferred = {x.dim(0), x.dim(1)};
  for (size_t i = 0; i < n; ++i) inferred.push_back(std::max<int64_t>(0, (x.dim(static_cast<int64_t>(i + 2)) - 1) * s[i] - p[i] - p[n + i] + k[i]));
  const int64_t total = shape_numel(inferred);
  std::vector<T> buf(static_cast<size_t>(total), T{});
  const int64_t* pi = idx.data<int64_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (pi[i] < 0 || pi[i] >= total)
      return ctx.error("index " + std::to_string(pi[i]) + " is out of range for an unpooled tensor of " + std::to_string(total) + " elements");
    buf[static_cast<size_t>(pi[i])] = x.data<T>()[i];
  }
  T* py = y.data<T>();
  std::fill(py, py + y.numel(), T{});
  if (inferred == y.shape()) {
    std::copy(buf.begin(), buf.end(), py);
    return {};
  }
  // Copy the overlap of the two shapes element by element.
  const size_t r = inferred.size();
  std::vector<int64_t> at(r, 0);
  for (int64_t i = 0; i < total; ++i) {
    bool inside = true;
    int64_t o = 0;
    for (size_t d = 0; d < r; ++d) {
      inside = inside && at[d] < y.dim(static_cast<int64_t>(d));
      o = o * y.dim(static_cast<int64_t>(d)) + at[d];
    }
    if (inside) py[o] = buf[static_cast<size_t>(i)];
    for (size_t d = r; d-- > 0;) {
      if (++at[d] < inferred[d]) break;
      at[d] = 0;
    }
  }
  return {};
}

Status ref_max_unpool(KernelContext& ctx) {
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return max_unpool_impl<T>(ctx, *in[0], *in[1], *out[0]);
  });
}

// The pools that take channels_last (runtime/ref/layout.h).
Status ref_max_pool_any(KernelContext& ctx) { return ref::run_any_layout(ctx, ref_max_pool); }
Status ref_average_pool_any(KernelContext& ctx) { return ref::run_any_layout(ctx, ref_average_pool); }
Status ref_global_max_pool_any(KernelContext& ctx) { return ref::run_any_layout(ctx, ref_global_max_pool); }
Status ref_global_average_pool_any(KernelContext& ctx) { return ref::run_any_layout(ctx, ref_global_average_pool); }

}  // namespace

void register_ref_nn_pool(KernelRegistry& r) {
  r.add_reference("MaxPool", ref_max_pool_any);
  r.add_reference("AveragePool", ref_average_pool_any);
  r.add_reference("LpPool", ref_lp_pool);
  r.add_reference("GlobalMaxPool", ref_global_max_pool_any);
  r.add_reference("GlobalAveragePool", ref_global_average_pool_any);
  r.add_reference("GlobalLpPool", ref_global_lp_pool);
  r.add_reference("LRN", ref_lrn);
  r.add_reference("MaxUnpool", ref_max_unpool);
}

}  // namespace kiln::nn

namespace kiln::ref {
Status global_average_pool(KernelContext& ctx) { return nn::ref_global_average_pool_any(ctx); }
}  // namespace kiln::ref
