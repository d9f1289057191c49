// Numpy-style broadcasting for reference kernels: the broadcast shape of several inputs, and an
// iterator that walks the output in contiguous rows while giving each input's offset and
// inner stride. Adjacent dims that broadcast the same way are merged first, so common cases
// ([N,C,H,W] + [1,C,1,1], [B,S,768] + [768]) run long inner loops. Header-only; any kernel
// family may use it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace kiln::ref {

/// The numpy broadcast of `shapes`, or nullopt when two dims conflict.
inline std::optional<std::vector<int64_t>> broadcast_shape(std::span<const std::vector<int64_t>> shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    size_t pad = rank - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      const int64_t d = s[i];
      int64_t& o = out[pad + i];
      if (d == o || d == 1) continue;
      if (o == 1) o = d;
      else return std::nullopt;
    }
  }
  return out;
}

/// Walks an output of shape `out_shape` (row-major, contiguous) as rows, for N inputs that
/// broadcast to it. Each input's shape must broadcast to `out_shape` (callers check that
/// first, e.g. with broadcast_shape); an input may have lower rank (right-aligned).
template <size_t N>
class BroadcastIter {
 public:
  BroadcastIter(std::span<const int64_t> out_shape, const std::array<std::span<const int64_t>, N>& in_shapes) {
    const size_t rank = out_shape.size();
    // Element strides of each input against the output's dims, 0 where the input broadcasts.
    std::vector<std::array<int64_t, N>> strides(rank);
    for (size_t k = 0; k < N; ++k) {
      std::span<const int64_t> s = in_shapes[k];
      size_t pad = rank - s.size();
      int64_t stride = 1;
      for (size_t i = rank; i-- > 0;) {
        int64_t d = i >= pad ? s[i - pad] : 1;
        strides[i][k] = d == 1 ? 0 : stride;
        stride *= d;
      }
    }
    numel_ = 1;
    for (int64_t d : out_shape) numel_ *= d;
    // Drop size-1 output dims and merge neighbours that every input walks the same way.
    for (size_t i = 0; i < rank; ++i) {
      int64_t d = out_shape[i];
      if (d == 1) continue;
      if (!dims_.empty()) {
        bool mergeable = true;
        for (size_t k = 0; k < N; ++k)
          if (strides_.back()[k] != strides[i][k] * d) mergeable = false;
        if (mergeable) {
          dims_.back() *= d;
          strides_.back() = strides[i];
          continue;
        }
      }
      dims_.push_back(d);
      strides_.push_back(strides[i]);
    }
  }

  /// Total output elements.
  int64_t numel() const { return numel_; }

  /// Calls f(out_offset, in_offsets, count, in_strides) for each contiguous output row:
  /// output elements [out_offset, out_offset + count) read input k at
  /// in_offsets[k] + j * in_strides[k] for j in [0, count).
  template <class F>
  void for_each_row(F&& f) const {
    if (numel_ == 0) return;
    std::array<int64_t, N> off{};
    if (dims_.empty()) {
      f(int64_t{0}, off, int64_t{1}, std::array<int64_t, N>{});
      return;
    }
    const size_t outer_rank = dims_.size() - 1;
    const int64_t inner = dims_.back();
    const std::array<int64_t, N>& inner_strides = strides_.back();
    std::vector<int64_t> idx(outer_rank, 0);
    for (int64_t out = 0; out < numel_; out += inner) {
      f(out, off, inner, inner_strides);
      // Advance the odometer over the outer dims, adjusting each input's offset.
      for (size_t d = outer_rank; d-- > 0;) {
        if (++idx[d] < dims_[d]) {
          for (size_t k = 0; k < N; ++k) off[k] += strides_[d][k];
          break;
        }
        for (size_t k = 0; k < N; ++k) off[k] -= strides_[d][k] * (dims_[d] - 1);
        idx[d] = 0;
      }
    }
  }

 private:
  int64_t numel_ = 0;
  std::vector<int64_t> dims_;
  std::vector<std::array<int64_t, N>> strides_;
};

/// out[i] = f(a[.], b[.]) over the broadcast of a and b into `out_shape`, with fast paths for
/// equal shapes and for one side broadcasting along the inner row (scalars, bias vectors).
template <class A, class B, class O, class F>
void broadcast_binary(const A* a, std::span<const int64_t> a_shape, const B* b, std::span<const int64_t> b_shape,
                      O* out, std::span<const int64_t> out_shape, F&& f) {
  BroadcastIter<2> it(out_shape, {a_shape, b_shape});
  it.for_each_row([&](int64_t o, const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
    const A* pa = a + off[0];
    const B* pb = b + off[1];
    O* po = out + o;
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t j = 0; j < n; ++j) po[j] = f(pa[j], pb[j]);
    } else if (st[0] == 1 && st[1] == 0) {
      const B bv = *pb;
      for (int64_t j = 0; j < n; ++j) po[j] = f(pa[j], bv);
    } else if (st[0] == 0 && st[1] == 1) {
      const A av = *pa;
      for (int64_t j = 0; j < n; ++j) po[j] = f(av, pb[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) po[j] = f(pa[j * st[0]], pb[j * st[1]]);
    }
  });
}

/// Copies `in` broadcast to `out_shape` into `out` (Expand-like), converting with `f`.
template <class I, class O, class F>
void broadcast_unary(const I* in, std::span<const int64_t> in_shape, O* out, std::span<const int64_t> out_shape,
                     F&& f) {
  BroadcastIter<1> it(out_shape, {in_shape});
  it.for_each_row([&](int64_t o, const std::array<int64_t, 1>& off, int64_t n, const std::array<int64_t, 1>& st) {
    const I* p = in + off[0];
    O* po = out + o;
    if (st[0] == 1) for (int64_t j = 0; j < n; ++j) po[j] = f(p[j]);
    else if (st[0] == 0) { const O v = f(*p); for (int64_t j = 0; j < n; ++j) po[j] = v; }
    else for (int64_t j = 0; j < n; ++j) po[j] = f(p[j * st[0]]);
  });
}

}  // namespace kiln::ref
