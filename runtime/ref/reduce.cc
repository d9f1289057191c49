// Reference kernels of the reduce family: Reduce* over any set of axes, ArgMax/ArgMin,
// CumSum/CumProd and TopK; and the family's registration (Softmax and the normalizations live in
// reduce_norm.cc). Reductions walk the input once, in memory order, accumulating into one
// accumulator per output element, so both "reduce the last axis" (LayerNorm-like) and
// "reduce a leading axis" run with a contiguous inner loop.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "runtime/ref/elementwise_util.h"

namespace kiln {

namespace ref {
namespace {

/// The input's dims merged into runs of reduced / kept dims, with each run's stride in the
/// output (0 for reduced runs).
struct ReducePlan {
  std::vector<int64_t> dims, out_strides;
  std::vector<bool> reduced;
  int64_t in_numel = 1, out_numel = 1;
};

ReducePlan make_plan(const std::vector<int64_t>& shape, const std::vector<bool>& reduced) {
  ReducePlan p;
  for (size_t i = 0; i < shape.size(); ++i) {
    p.in_numel *= shape[i];
    if (!reduced[i]) p.out_numel *= shape[i];
    if (shape[i] == 1) continue;
    if (!p.dims.empty() && p.reduced.back() == reduced[i]) {
      p.dims.back() *= shape[i];
    } else {
      p.dims.push_back(shape[i]);
      p.reduced.push_back(reduced[i]);
    }
  }
  p.out_strides.assign(p.dims.size(), 0);
  int64_t stride = 1;
  for (size_t i = p.dims.size(); i-- > 0;) {
    if (p.reduced[i]) continue;
    p.out_strides[i] = stride;
    stride *= p.dims[i];
  }
  return p;
}

/// Calls f(out_index, x[i]) for every input element in memory order.
template <class T, class F>
void for_each_reduced(const T* x, const ReducePlan& p, F&& f) {
  if (p.in_numel == 0) return;
  if (p.dims.empty()) {
    f(int64_t{0}, x[0]);
    return;
  }
  const size_t outer = p.dims.size() - 1;
  const int64_t inner = p.dims.back(), inner_stride = p.out_strides.back();
  std::vector<int64_t> idx(outer, 0);
  int64_t o = 0;
  for (int64_t i = 0; i < p.in_numel; i += inner) {
    const T* row = x + i;
    if (inner_stride == 0) {
      for (int64_t j = 0; j < inner; ++j) f(o, row[j]);
    } else {
      for (int64_t j = 0; j < inner; ++j) f(o + j, row[j]);
    }
    for (size_t d = outer; d-- > 0;) {
      if (++idx[d] < p.dims[d]) {
        o += p.out_strides[d];
        break;
      }
      o -= p.out_strides[d] * (p.dims[d] - 1);
      idx[d] = 0;
    }
  }
}

// Accumulators: double for floating point, 64-bit for integers (sums wrap like the type).
template <class T>
using acc_t = std::conditional_t<is_float_v<T>, double, std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>;

enum class ReduceKind { sum, mean, max, min, prod, l1, l2, log_sum, log_sum_exp, sum_square };

template <ReduceKind K>
Status ref_reduce(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  const int64_t rank = x.rank();
  std::vector<int64_t> axes;
  if (ctx.has_input(1)) axes = ctx.input(1).to_int64_vector();
  if (axes.empty() && ctx.node().attr_int("noop_with_empty_axes", 0) != 0) {
    if (x.nbytes()) std::memcpy(y.raw(), x.raw(), x.nbytes());
    return {};
  }
  std::vector<bool> reduced(static_cast<size_t>(rank), axes.empty());
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) return ctx.error("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    reduced[static_cast<size_t>(a < 0 ? a + rank : a)] = true;
  }
  const ReducePlan plan = make_plan(x.shape(), reduced);
  if (plan.out_numel != y.numel()) return internal_error(ctx.node().where(), "reduce output size mismatch");
  constexpr bool kAllowBool = K == ReduceKind::max || K == ReduceKind::min;
  return visit_dtype(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (!(is_numeric_v<T> || (kAllowBool && std::is_same_v<T, bool>))) {
      return ctx.error(ctx.node().op + " does not support " + std::string(dtype_name(x.dtype())));
    } else {
      using A = std::conditional_t<std::is_same_v<T, bool>, uint64_t, acc_t<T>>;
      const T* px = x.data<T>();
      T* py = y.data<T>();
      const int64_t n_out = plan.out_numel;
      const int64_t count = n_out ? plan.in_numel / n_out : 0;
      std::vector<A> acc(static_cast<size_t>(n_out));
      auto val = [](T v) { return static_cast<A>(static_cast<compute_t<T>>(v)); };
      A init = 0;
      if constexpr (K == ReduceKind::prod) init = 1;
      if constexpr (K == ReduceKind::max) init = is_float_v<T> ? -std::numeric_limits<A>::infinity() : A(val(std::numeric_limits<T>::lowest()));
      if constexpr (K == ReduceKind::min) init = is_float_v<T> ? std::numeric_limits<A>::infinity() : A(val(std::numeric_limits<T>::max()));
      if constexpr (K == ReduceKind::log_sum_exp && std::is_floating_point_v<A>) init = -std::numeric_limits<A>::infinity();
      std::fill(acc.begin(), acc.end(), init);
      auto wadd = [](A a, A b) { if constexpr (std::is_integral_v<A>) return wrap_add(a, b); else return a + b; };
      auto wmul = [](A a, A b) { if constexpr (std::is_integral_v<A>) return wrap_mul(a, b); else return a * b; };
      A* pa = acc.data();
      if constexpr (K == ReduceKind::sum || K == ReduceKind::mean || K == ReduceKind::log_sum) {
        for_each_reduced(px, plan, [&](int64_t o, T v) { pa[o] = wadd(pa[o], val(v)); });
      } else if constexpr (K == ReduceKind::prod) {
        for_each_reduced(px, plan, [&](int64_t o, T v) { pa[o] = wmul(pa[o], val(v)); });
      } else if constexpr (K == ReduceKind::max || K == ReduceKind::log_sum_exp) {
        // NaN propagates (v > acc is false for NaN, so test it explicitly).
        for_each_reduced(px, plan, [&](int64_t o, T v) {
          A a = val(v);
          if (a > pa[o] || a != a) pa[o] = a;
        });
      } else if constexpr (K == ReduceKind::min) {
        for_each_reduced(px, plan, [&](int64_t o, T v) {
          A a = val(v);
          if (a < pa[o] || a != a) pa[o] = a;
        });
      } else if constexpr (K == ReduceKind::l1) {
        for_each_reduced(px, plan, [&](int64_t o, T v) { A a = val(v); pa[o] = wadd(pa[o], a < A(0) ? A(0) - a : a); });
      } else if constexpr (K == ReduceKind::l2 || K == ReduceKind::sum_square) {
        for_each_reduced(px, plan, [&](int64_t o, T v) { A a = val(v); pa[o] = wadd(pa[o], wmul(a, a)); });
      }
      if constexpr (K == ReduceKind::log_sum_exp) {
        // Shift by the maximum so exp cannot overflow; an infinite maximum is not shifted by.
        std::vector<double> sum(static_cast<size_t>(n_out), 0.0);
        for_each_reduced(px, plan, [&](int64_t o, T v) {
          const double m = std::isfinite(static_cast<double>(pa[o])) ? static_cast<double>(pa[o]) : 0.0;
          sum[static_cast<size_t>(o)] += std::exp(static_cast<double>(val(v)) - m);
        });
        for (int64_t o = 0; o < n_out; ++o) {
          const double m = std::isfinite(static_cast<double>(pa[o])) ? static_cast<double>(pa[o]) : 0.0;
          py[o] = cast_value<T>(std::log(sum[static_cast<size_t>(o)]) + m);
        }
        return {};
      }
      for (int64_t o = 0; o < n_out; ++o) {
        A a = pa[o];
        if constexpr (K == ReduceKind::mean) {
          if constexpr (std::is_integral_v<A>) {
            if (count == 0) return ctx.error("ReduceMean of integers over an empty set");
            a = static_cast<A>(a / static_cast<A>(count));
          } else {
            a = a / static_cast<A>(count);
          }
        }
        if constexpr (K == ReduceKind::l2) {
          py[o] = cast_value<T>(std::sqrt(static_cast<double>(a)));
        } else if constexpr (K == ReduceKind::log_sum) {
          py[o] = cast_value<T>(std::log(static_cast<double>(a)));
        } else if constexpr (std::is_same_v<T, bool>) {
          py[o] = a != 0;
        } else {
          py[o] = cast_value<T>(a);
        }
      }
      return {};
    }
  });
}

/// Splits a shape around `axis` into (outer, n, inner) element counts.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisSplit split_at(const std::vector<int64_t>& shape, int64_t axis) {
  AxisSplit s;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    int64_t d = shape[static_cast<size_t>(i)];
    if (i < axis) s.outer *= d;
    else if (i == axis) s.n = d;
    else s.inner *= d;
  }
  return s;
}

// ArgMax / ArgMin: strict comparison keeps the first index of ties; select_last_index keeps
// the last. Walks the axis with the inner dims contiguous.
template <bool kMax>
Status ref_arg(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t axis = ctx.node().attr_int("axis", 0);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return ctx.error("axis is out of range for rank " + std::to_string(x.rank()));
  const bool last = ctx.node().attr_int("select_last_index", 0) != 0;
  const AxisSplit s = split_at(x.shape(), axis);
  if (s.n == 0 && s.outer * s.inner > 0) return ctx.error("cannot take " + ctx.node().op + " over an empty axis");
  return dispatch<IsNumeric>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* px = x.data<T>();
    int64_t* py = y.data<int64_t>();
    std::vector<C> best(static_cast<size_t>(s.inner));
    for (int64_t o = 0; o < s.outer; ++o) {
      const T* base = px + o * s.n * s.inner;
      int64_t* out = py + o * s.inner;
      for (int64_t j = 0; j < s.inner; ++j) {
        best[static_cast<size_t>(j)] = static_cast<C>(base[j]);
        out[j] = 0;
      }
      for (int64_t i = 1; i < s.n; ++i) {
        const T* row = base + i * s.inner;
        for (int64_t j = 0; j < s.inner; ++j) {
          const C v = static_cast<C>(row[j]);
          C& b = best[static_cast<size_t>(j)];
          const bool better = kMax ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
          if (better) {
            b = v;
            out[j] = i;
          }
        }
      }
    }
    return {};
  });
}

// CumSum and CumProd: running sum or product along the axis input.
template <bool kProd>
Status ref_cumulative(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  if (ctx.input(1).numel() != 1) return ctx.error("axis must have one element");
  int64_t axis = ctx.input(1).as_int64(0);
  const int64_t rank = x.rank();
  if (axis < -rank || axis >= rank) return ctx.error("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (axis < 0) axis += rank;
  const bool exclusive = ctx.node().attr_int("exclusive", 0) != 0;
  const bool reverse = ctx.node().attr_int("reverse", 0) != 0;
  const AxisSplit s = split_at(x.shape(), axis);
  return dispatch<IsNumeric>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    std::vector<A> acc(static_cast<size_t>(s.inner));
    for (int64_t o = 0; o < s.outer; ++o) {
      std::fill(acc.begin(), acc.end(), A(kProd ? 1 : 0));
      for (int64_t step = 0; step < s.n; ++step) {
        const int64_t i = reverse ? s.n - 1 - step : step;
        const T* row = px + (o * s.n + i) * s.inner;
        T* out = py + (o * s.n + i) * s.inner;
        for (int64_t j = 0; j < s.inner; ++j) {
          const A v = static_cast<A>(static_cast<compute_t<T>>(row[j]));
          A& a = acc[static_cast<size_t>(j)];
          if (exclusive) out[j] = cast_value<T>(a);
          if constexpr (kProd) {
            if constexpr (std::is_integral_v<A>) a = wrap_mul(a, v);
            else a *= v;
          } else {
            if constexpr (std::is_integral_v<A>) a = wrap_add(a, v);
            else a += v;
          }
          if (!exclusive) out[j] = cast_value<T>(a);
        }
      }
    }
    return {};
  });
}

// TopK: ties go to the smaller index; NaN counts as larger than every number.
Status ref_topk(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (ctx.input(1).numel() != 1) return ctx.error("K must have one element");
  const int64_t k = ctx.input(1).as_int64(0);
  int64_t axis = ctx.node().attr_int("axis", -1);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return ctx.error("axis is out of range for rank " + std::to_string(x.rank()));
  const AxisSplit s = split_at(x.shape(), axis);
  if (k < 0 || k > s.n) return ctx.error("K " + std::to_string(k) + " is out of range for an axis of size " + std::to_string(s.n));
  std::vector<int64_t> out_shape = x.shape();
  out_shape[static_cast<size_t>(axis)] = k;
  Tensor& values = ctx.output_allocated(0) ? ctx.output(0) : ctx.allocate_output(0, x.dtype(), out_shape);
  Tensor& indices = ctx.output_allocated(1) ? ctx.output(1) : ctx.allocate_output(1, DType::i64, out_shape);
  const bool largest = ctx.node().attr_int("largest", 1) != 0;
  return dispatch<IsNumeric>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* pv = values.data<T>();
    int64_t* pi = indices.data<int64_t>();
    auto greater = [](C a, C b) {
      if constexpr (is_float_v<C>) {
        if (std::isnan(a)) return !std::isnan(b);
        if (std::isnan(b)) return false;
      }
      return a > b;
    };
    std::vector<std::pair<C, int64_t>> items(static_cast<size_t>(s.n));
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t j = 0; j < s.inner; ++j) {
        const T* base = px + o * s.n * s.inner + j;
        for (int64_t i = 0; i < s.n; ++i) items[static_cast<size_t>(i)] = {static_cast<C>(base[i * s.inner]), i};
        auto before = [&](const std::pair<C, int64_t>& a, const std::pair<C, int64_t>& b) {
          if (largest ? greater(a.first, b.first) : greater(b.first, a.first)) return true;
          if (largest ? greater(b.first, a.first) : greater(a.first, b.first)) return false;
          return a.second < b.second;
        };
        std::partial_sort(items.begin(), items.begin() + k, items.end(), before);
        for (int64_t i = 0; i < k; ++i) {
          const int64_t at = (o * k + i) * s.inner + j;
          pv[at] = base[items[static_cast<size_t>(i)].second * s.inner];
          pi[at] = items[static_cast<size_t>(i)].second;
        }
      }
    }
    return {};
  });
}

}  // namespace
}  // namespace ref

void register_ref_reduce(KernelRegistry& r) {
  using ref::ReduceKind;
  r.add_reference("ReduceSum", ref::ref_reduce<ReduceKind::sum>);
  r.add_reference("ReduceMean", ref::ref_reduce<ReduceKind::mean>);
  r.add_reference("ReduceMax", ref::ref_reduce<ReduceKind::max>);
  r.add_reference("ReduceMin", ref::ref_reduce<ReduceKind::min>);
  r.add_reference("ReduceProd", ref::ref_reduce<ReduceKind::prod>);
  r.add_reference("ReduceL1", ref::ref_reduce<ReduceKind::l1>);
  r.add_reference("ReduceL2", ref::ref_reduce<ReduceKind::l2>);
  r.add_reference("ReduceLogSum", ref::ref_reduce<ReduceKind::log_sum>);
  r.add_reference("ReduceLogSumExp", ref::ref_reduce<ReduceKind::log_sum_exp>);
  r.add_reference("ReduceSumSquare", ref::ref_reduce<ReduceKind::sum_square>);
  r.add_reference("ArgMax", ref::ref_arg<true>);
  r.add_reference("ArgMin", ref::ref_arg<false>);
  r.add_reference("CumSum", ref::ref_cumulative<false>);
  r.add_reference("CumProd", ref::ref_cumulative<true>);
  r.add_reference("TopK", ref::ref_topk);
  ref::register_ref_reduce_norm(r);
}

}  // namespace kiln
