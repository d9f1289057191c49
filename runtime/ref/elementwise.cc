// Reference kernels of the elementwise family that are neither plain unary nor binary: Where,
// Clip, Cast and Identity; and the family's registration (unary and binary kernels live in
// elementwise_unary.cc and elementwise_binary.cc).
#include <cstring>
#include <string>

#include "runtime/ref/broadcast.h"
#include "runtime/ref/elementwise_util.h"

namespace kiln {

namespace ref {
namespace {

Status ref_where(KernelContext& ctx) {
  const Tensor& c = ctx.input(0);
  const Tensor& a = ctx.input(1);
  const Tensor& b = ctx.input(2);
  Tensor& y = ctx.output(0);
  if (c.dtype() != DType::boolean) return ctx.error("condition must be bool, got " + std::string(dtype_name(c.dtype())));
  return dispatch<IsAny>(ctx, a.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const bool* pc = c.data<bool>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* py = y.data<T>();
    BroadcastIter<3> it(y.shape(), {std::span<const int64_t>(c.shape()), std::span<const int64_t>(a.shape()),
                                    std::span<const int64_t>(b.shape())});
    it.for_each_row([&](int64_t o, const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
      for (int64_t j = 0; j < n; ++j)
        py[o + j] = pc[off[0] + j * st[0]] ? pa[off[1] + j * st[1]] : pb[off[2] + j * st[2]];
    });
    return {};
  });
}

// y = min(max(x, lo), hi): when lo > hi every element becomes hi, as in numpy.clip.
Status ref_clip(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  return dispatch<IsNumeric>(ctx, x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = compute_t<T>;
    C lo = std::numeric_limits<C>::lowest(), hi = std::numeric_limits<C>::max();
    for (size_t i = 1; i <= 2; ++i) {
      if (!ctx.has_input(i)) continue;
      const Tensor& bound = ctx.input(i);
      if (bound.numel() != 1)
        return ctx.error(std::string(i == 1 ? "min" : "max") + " must have one element, got shape " + shape_str(bound.shape()));
      if (bound.dtype() != x.dtype())
        return ctx.error(std::string(i == 1 ? "min" : "max") + " is " + std::string(dtype_name(bound.dtype())) +
                         " but the input is " + std::string(dtype_name(x.dtype())));
      (i == 1 ? lo : hi) = static_cast<C>(bound.data<T>()[0]);
    }
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) {
      C v = static_cast<C>(px[i]);
      if (v < lo) v = lo;
      if (v > hi) v = hi;
      py[i] = static_cast<T>(v);
    }
    return {};
  });
}

Status ref_cast(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  return dispatch<IsAny>(ctx, x.dtype(), [&](auto in_tag) -> Status {
    using I = decltype(in_tag);
    return dispatch<IsAny>(ctx, y.dtype(), [&](auto out_tag) -> Status {
      using O = decltype(out_tag);
      const I* px = x.data<I>();
      O* py = y.data<O>();
      for (int64_t i = 0, n = x.numel(); i < n; ++i) py[i] = cast_value<O>(px[i]);
      return {};
    });
  });
}

Status ref_identity(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  if (y.raw() != x.raw() && x.nbytes() > 0) std::memcpy(y.raw(), x.raw(), x.nbytes());
  return {};
}

}  // namespace
}  // namespace ref

void register_ref_elementwise(KernelRegistry& r) {
  ref::register_ref_elementwise_unary(r);
  ref::register_ref_elementwise_binary(r);
  r.add_reference("Where", ref::ref_where);
  r.add_reference("Clip", ref::ref_clip);
  r.add_reference("Cast", ref::ref_cast);
  r.add_reference("Identity", ref::ref_identity);
}

}  // namespace kiln
