// Reference kernels of Softmax/LogSoftmax/Hardmax and the normalizations (Layer, RMS, Batch
// (inference), Instance, Group, Lp). Rows along the normalized dims are contiguous in the
// common cases (last axis, NCHW channels), and every row is processed in one pass over a
// float or double scratch copy, which keeps f16/bf16 accurate.
#include <cmath>
#include <string>
#include <vector>

#include "runtime/ref/broadcast.h"
#include "runtime/ref/elementwise_util.h"
#include "runtime/ref/shape_util.h"

namespace kiln::ref {

namespace {

Result<int64_t> axis_of(KernelContext& ctx, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    return ctx.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

enum class SoftKind { softmax, log_softmax, hardmax };

// Softmax family along one axis: the slice [n, inner] of each outer index is copied to a
// scratch buffer, then max, exp and sum run with `inner` contiguous (inner is 1 for the last
// axis, the transformer case).
template <SoftKind K>
Status ref_softmax(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, axis_of(ctx, ctx.node().attr_int("axis", -1), x.rank()));
  const size_t ax = static_cast<size_t>(axis);
  const int64_t outer = ref_shape::dims_product(x.shape(), 0, ax), n = x.dim(axis);
  const int64_t inner = ref_shape::dims_product(x.shape(), ax + 1, x.shape().size());
  return dispatch<IsFloat>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    std::vector<C> buf(static_cast<size_t>(n * inner)), mx(static_cast<size_t>(inner)), sum(static_cast<size_t>(inner));
    if (inner == 1 && K != SoftKind::hardmax) {
      // The last axis (attention scores): one contiguous row at a time.
      C* b = buf.data();
      for (int64_t o = 0; o < outer; ++o) {
        const T* in = px + o * n;
        T* out = py + o * n;
        C m = -std::numeric_limits<C>::infinity();
        for (int64_t i = 0; i < n; ++i) {
          b[i] = static_cast<C>(in[i]);
          m = std::max(m, b[i]);
        }
        C s = 0;
        for (int64_t i = 0; i < n; ++i) {
          b[i] = std::exp(b[i] - m);
          s += b[i];
        }
        if constexpr (K == SoftKind::softmax) {
          const C r = C(1) / s;
          for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(b[i] * r);
        } else {
          const C shift = std::log(s) + m;
          for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<C>(in[i]) - shift);
        }
      }
      return {};
    }
    for (int64_t o = 0; o < outer; ++o) {
      const T* in = px + o * n * inner;
      T* out = py + o * n * inner;
      for (int64_t i = 0; i < n * inner; ++i) buf[static_cast<size_t>(i)] = static_cast<C>(in[i]);
      std::fill(mx.begin(), mx.end(), -std::numeric_limits<C>::infinity());
      std::vector<int64_t> arg(K == SoftKind::hardmax ? static_cast<size_t>(inner) : 0, 0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const C v = buf[static_cast<size_t>(i * inner + j)];
          if (v > mx[static_cast<size_t>(j)]) {
            mx[static_cast<size_t>(j)] = v;
            if constexpr (K == SoftKind::hardmax) arg[static_cast<size_t>(j)] = i;
          }
        }
      if constexpr (K == SoftKind::hardmax) {
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < inner; ++j) out[i * inner + j] = static_cast<T>(C(arg[static_cast<size_t>(j)] == i ? 1 : 0));
        continue;
      } else {
        std::fill(sum.begin(), sum.end(), C(0));
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < inner; ++j) {
            C& v = buf[static_cast<size_t>(i * inner + j)];
            v = std::exp(v - mx[static_cast<size_t>(j)]);
            sum[static_cast<size_t>(j)] += v;
          }
        if constexpr (K == SoftKind::softmax) {
          for (int64_t j = 0; j < inner; ++j) sum[static_cast<size_t>(j)] = C(1) / sum[static_cast<size_t>(j)];
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < inner; ++j)
              out[i * inner + j] = static_cast<T>(buf[static_cast<size_t>(i * inner + j)] * sum[static_cast<size_t>(j)]);
        } else {
          for (int64_t j = 0; j < inner; ++j) sum[static_cast<size_t>(j)] = std::log(sum[static_cast<size_t>(j)]) + mx[static_cast<size_t>(j)];
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < inner; ++j)
              out[i * inner + j] = static_cast<T>(static_cast<C>(in[i * inner + j]) - sum[static_cast<size_t>(j)]);
        }
      }
    }
    return {};
  });
}

// A per-element parameter (scale or bias) broadcast over the normalized dims [axis, rank),
// as doubles; empty when the input is absent.
Result<std::vector<double>> expand_param(KernelContext& ctx, size_t input, const std::vector<int64_t>& norm_shape) {
  if (!ctx.has_input(input)) return std::vector<double>{};
  const Tensor& p = ctx.input(input);
  std::vector<int64_t> ps = p.shape();
  bool ok = ps.size() <= norm_shape.size();
  for (size_t k = 0; ok && k < ps.size(); ++k) {
    const int64_t nd = norm_shape[norm_shape.size() - ps.size() + k];
    ok = ps[k] == 1 || ps[k] == nd;
  }
  if (!ok)
    return ctx.error((input == 1 ? "scale" : "bias") + std::string(" of shape ") + shape_str(ps) +
                     " does not broadcast to the normalized shape " + shape_str(norm_shape));
  std::vector<double> out(static_cast<size_t>(shape_numel(norm_shape)));
  KILN_RETURN_IF_ERROR(dispatch<IsFloat>(ctx, p.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    broadcast_unary(p.data<T>(), ps, out.data(), norm_shape,
                    [](T v) { return static_cast<double>(static_cast<compute_t<T>>(v)); });
    return {};
  }));
  return out;
}

// Per-channel parameter [C] as doubles.
Result<std::vector<double>> channel_param(KernelContext& ctx, size_t input, int64_t channels) {
  const Tensor& p = ctx.input(input);
  if (p.numel() != channels)
    return ctx.error("input " + std::to_string(input) + " has " + std::to_string(p.numel()) + " elements but X has " +
                     std::to_string(channels) + " channels");
  std::vector<double> out(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) out[static_cast<size_t>(c)] = p.as_double(c);
  return out;
}

// LayerNormalization (with optional Mean and InvStdDev outputs) and RMSNormalization: each
// row of the dims [axis, rank) is normalized with statistics in double.
template <bool kRms>
Status ref_layer_norm(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, axis_of(ctx, ctx.node().attr_int("axis", -1), x.rank()));
  const double eps = ctx.node().attr_float("epsilon", 1e-5f);
  std::vector<int64_t> norm_shape(x.shape().begin() + axis, x.shape().end());
  const int64_t rows = ref_shape::dims_product(x.shape(), 0, static_cast<size_t>(axis)), n = shape_numel(norm_shape);
  KILN_ASSIGN_OR_RETURN(std::vector<double> scale, expand_param(ctx, 1, norm_shape));
  std::vector<double> bias;
  if (!kRms) {
    KILN_ASSIGN_OR_RETURN(bias, expand_param(ctx, 2, norm_shape));
  }
  Tensor* mean_out = !kRms && ctx.num_outputs() > 1 && ctx.output(1).defined() ? &ctx.output(1) : nullptr;
  Tensor* inv_out = !kRms && ctx.num_outputs() > 2 && ctx.output(2).defined() ? &ctx.output(2) : nullptr;
  return dispatch<IsFloat>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* in = px + r * n;
      T* out = py + r * n;
      double mean = 0, var = 0;
      if constexpr (!kRms) {
        for (int64_t i = 0; i < n; ++i) mean += static_cast<double>(static_cast<C>(in[i]));
        mean /= static_cast<double>(n);
      }
      for (int64_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(static_cast<C>(in[i])) - mean;
        var += d * d;
      }
      var /= static_cast<double>(n);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t i = 0; i < n; ++i) {
        double v = (static_cast<double>(static_cast<C>(in[i])) - mean) * inv * scale[static_cast<size_t>(i)];
        if (!bias.empty()) v += bias[static_cast<size_t>(i)];
        out[i] = static_cast<T>(static_cast<C>(v));
      }
      auto store = [&](Tensor* t, double v) {
        visit_dtype(t->dtype(), [&](auto stag) {
          using S = decltype(stag);
          t->data<S>()[r] = cast_value<S>(v);
        });
      };
      if (mean_out) store(mean_out, mean);
      if (inv_out) store(inv_out, inv);
    }
    return {};
  });
}

// BatchNormalization (inference), InstanceNormalization and GroupNormalization on
// [N, C, spatial…]: y = (x - mean) * inv_std * scale[c] + bias[c], where mean and inv_std come
// from the inputs (BatchNormalization) or from each (n, c) / (n, group) block.
enum class ChannelKind { batch, instance, group };

template <ChannelKind K>
Status ref_channel_norm(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  if (x.rank() < 2) return ctx.error("X must have rank 2 or more, got shape " + shape_str(x.shape()));
  const int64_t batch = x.dim(0), channels = x.dim(1), spatial = ref_shape::dims_product(x.shape(), 2, x.shape().size());
  const double eps = ctx.node().attr_float("epsilon", 1e-5f);
  KILN_ASSIGN_OR_RETURN(std::vector<double> scale, channel_param(ctx, 1, channels));
  KILN_ASSIGN_OR_RETURN(std::vector<double> bias, channel_param(ctx, 2, channels));
  std::vector<double> bn_mean, bn_inv;
  if constexpr (K == ChannelKind::batch) {
    KILN_ASSIGN_OR_RETURN(bn_mean, channel_param(ctx, 3, channels));
    KILN_ASSIGN_OR_RETURN(bn_inv, channel_param(ctx, 4, channels));
    for (double& v : bn_inv) v = 1.0 / std::sqrt(v + eps);
  }
  int64_t groups = channels;
  if constexpr (K == ChannelKind::group) {
    groups = ctx.node().attr_int("num_groups", 0);
    if (groups <= 0 || channels % groups != 0)
      return ctx.error(std::to_string(channels) + " channels do not divide into " + std::to_string(groups) + " groups");
  }
  const int64_t per_group = groups ? channels / groups : 0;
  return dispatch<IsFloat>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t g = 0; g < groups; ++g) {
        // The block of channels [c0, c0 + per_group) is contiguous in memory.
        const int64_t c0 = g * per_group, len = per_group * spatial;
        const T* in = px + (b * channels + c0) * spatial;
        T* out = py + (b * channels + c0) * spatial;
        double mean = 0, inv = 1;
        if constexpr (K != ChannelKind::batch) {
          for (int64_t i = 0; i < len; ++i) mean += static_cast<double>(static_cast<C>(in[i]));
          mean /= static_cast<double>(len);
          double var = 0;
          for (int64_t i = 0; i < len; ++i) {
            const double d = static_cast<double>(static_cast<C>(in[i])) - mean;
            var += d * d;
          }
          inv = 1.0 / std::sqrt(var / static_cast<double>(len) + eps);
        }
        for (int64_t c = c0; c < c0 + per_group; ++c) {
          const size_t ci = static_cast<size_t>(c);
          double m = mean, a = inv;
          if constexpr (K == ChannelKind::batch) {
            m = bn_mean[ci];
            a = bn_inv[ci];
          }
          const double mul = a * scale[ci], add = bias[ci] - m * mul;
          const T* row = in + (c - c0) * spatial;
          T* orow = out + (c - c0) * spatial;
          for (int64_t i = 0; i < spatial; ++i)
            orow[i] = static_cast<T>(static_cast<C>(static_cast<double>(static_cast<C>(row[i])) * mul + add));
        }
      }
    }
    return {};
  });
}

// LpNormalization: x / ||x||_p along one axis (p = 1 or 2); a zero norm gives 0.
Status ref_lp_norm(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, axis_of(ctx, ctx.node().attr_int("axis", -1), x.rank()));
  const int64_t p = ctx.node().attr_int("p", 2);
  if (p != 1 && p != 2) return ctx.error("p must be 1 or 2, got " + std::to_string(p));
  const size_t ax = static_cast<size_t>(axis);
  const int64_t outer = ref_shape::dims_product(x.shape(), 0, ax), n = x.dim(axis);
  const int64_t inner = ref_shape::dims_product(x.shape(), ax + 1, x.shape().size());
  return dispatch<IsFloat>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    std::vector<double> norm(static_cast<size_t>(inner));
    for (int64_t o = 0; o < outer; ++o) {
      const T* in = px + o * n * inner;
      T* out = py + o * n * inner;
      std::fill(norm.begin(), norm.end(), 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const double v = static_cast<double>(static_cast<C>(in[i * inner + j]));
          norm[static_cast<size_t>(j)] += p == 1 ? std::abs(v) : v * v;
        }
      if (p == 2) for (double& v : norm) v = std::sqrt(v);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const double d = norm[static_cast<size_t>(j)];
          const double v = static_cast<double>(static_cast<C>(in[i * inner + j]));
          out[i * inner + j] = static_cast<T>(static_cast<C>(d == 0 ? 0.0 : v / d));
        }
    }
    return {};
  });
}

}  // namespace

Status layer_normalization(KernelContext& ctx) { return ref_layer_norm<false>(ctx); }

void register_ref_reduce_norm(KernelRegistry& r) {
  r.add_reference("Softmax", ref_softmax<SoftKind::softmax>);
  r.add_reference("LogSoftmax", ref_softmax<SoftKind::log_softmax>);
  r.add_reference("Hardmax", ref_softmax<SoftKind::hardmax>);
  r.add_reference("LayerNormalization", ref_layer_norm<false>);
  r.add_reference("RMSNormalization", ref_layer_norm<true>);
  r.add_reference("BatchNormalization", ref_channel_norm<ChannelKind::batch>);
  r.add_reference("InstanceNormalization", ref_channel_norm<ChannelKind::instance>);
  r.add_reference("GroupNormalization", ref_channel_norm<ChannelKind::group>);
  r.add_reference("LpNormalization", ref_lp_norm);
}

}  // namespace kiln::ref
