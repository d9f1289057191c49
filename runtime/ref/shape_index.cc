// Reference kernels of the shape family, index part: Gather, GatherElements, GatherND,
// ScatterElements, ScatterND, Shape, Size, ConstantOfShape, Range, OneHot, Trilu, EyeLike,
// Compress, NonZero, Unique, ReverseSequence. Every index read from data is bounds-checked and
// reported as a user error naming the node; negative indices count from the end as ONNX allows.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "formats/checked.h"
#include "runtime/kernel.h"
#include "runtime/ref/shape_util.h"

namespace kiln {

using namespace ref_shape;

namespace {


// Checks a data index against a dim of size n; negative ones count from the end.
Result<int64_t> checked(KernelContext& ctx, int64_t idx, int64_t n, int64_t axis) {
  if (idx < -n || idx >= n)
    return ctx.error("index " + std::to_string(idx) + " is out of range for axis " + std::to_string(axis) + " of size " + std::to_string(n));
  return idx < 0 ? idx + n : idx;
}

int64_t norm_axis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

// ---- Gather family ------------------------------------------------------------------------------

Status ref_gather(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  Tensor& y = ctx.output(0);
  int64_t axis = norm_axis(ctx.node().attr_int("axis", 0), x.rank());
  int64_t n = x.dim(axis);
  size_t es = dtype_size(x.dtype());
  int64_t outer = dims_product(x.shape(), 0, static_cast<size_t>(axis));
  size_t block = static_cast<size_t>(dims_product(x.shape(), static_cast<size_t>(axis) + 1, x.shape().size())) * es;
  std::vector<int64_t> idx(static_cast<size_t>(ind.numel()));
  for (int64_t k = 0; k < ind.numel(); ++k) {
    KILN_ASSIGN_OR_RETURN(idx[static_cast<size_t>(k)], checked(ctx, index_at(ind, k), n, axis));
  }
  char* dst = static_cast<char*>(y.raw());
  const char* src = static_cast<const char*>(x.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i : idx) {
      copy_bytes(dst, src + (o * n + i) * static_cast<int64_t>(block), block);
      dst += block;
    }
  return {};
}

// Calls f(out_flat, idx) for every multi-index of `shape` in row-major order.
template <class F>
void for_each_index(const std::vector<int64_t>& shape, F&& f) {
  int64_t total = shape_numel(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t j = 0; j < total; ++j) {
    f(j, idx);
    for (size_t a = shape.size(); a-- > 0;) {
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
}

Status ref_gather_elements(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  Tensor& y = ctx.output(0);
  int64_t axis = norm_axis(ctx.node().attr_int("axis", 0), x.rank());
  size_t es = dtype_size(x.dtype());
  std::vector<int64_t> xs = strides_of(x.shape());
  for (int64_t a = 0; a < x.rank(); ++a)
    if (a != axis && ind.dim(a) > x.dim(a))
      return ctx.error("indices have shape " + shape_str(ind.shape()) + ", larger than the data's " + shape_str(x.shape()) +
                       " outside axis " + std::to_string(axis));
  Status st;
  for_each_index(ind.shape(), [&](int64_t j, const std::vector<int64_t>& idx) {
    if (!st.ok()) return;
    auto i = checked(ctx, index_at(ind, j), x.dim(axis), axis);
    if (!i.ok()) { st = i.status(); return; }
    int64_t src = 0;
    for (size_t a = 0; a < idx.size(); ++a) src += (static_cast<int64_t>(a) == axis ? *i : idx[a]) * xs[a];
    std::memcpy(static_cast<char*>(y.raw()) + j * static_cast<int64_t>(es),
                static_cast<const char*>(x.raw()) + src * static_cast<int64_t>(es), es);
  });
  return st;
}

// The data offsets GatherND/ScatterND address: one per index tuple, in elements. Data dims
// [0, b) are batch dims shared with indices; the tuple's k entries address dims [b, b + k).
Result<std::vector<int64_t>> nd_offsets(KernelContext& ctx, const Tensor& data, const Tensor& ind, int64_t b) {
  int64_t k = ind.dim(ind.rank() - 1);
  std::vector<int64_t> ds = strides_of(data.shape());
  int64_t batch = dims_product(ind.shape(), 0, static_cast<size_t>(b));
  int64_t per_batch = dims_product(ind.shape(), static_cast<size_t>(b), static_cast<size_t>(ind.rank() - 1));
  int64_t batch_stride = dims_product(data.shape(), static_cast<size_t>(b), data.shape().size());
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(batch * per_batch));
  const int64_t* iv = ind.data<int64_t>();
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t t = 0; t < per_batch; ++t) {
      int64_t off = bi * batch_stride;
      const int64_t* tuple = iv + (bi * per_batch + t) * k;
      for (int64_t j = 0; j < k; ++j) {
        KILN_ASSIGN_OR_RETURN(int64_t i, checked(ctx, tuple[j], data.dim(b + j), b + j));
        off += i * ds[static_cast<size_t>(b + j)];
      }
      out.push_back(off);
    }
  return out;
}

Status ref_gather_nd(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  Tensor& y = ctx.output(0);
  int64_t b = ctx.node().attr_int("batch_dims", 0);
  for (int64_t i = 0; i < b; ++i)
    if (x.dim(i) != ind.dim(i))
      return ctx.error("batch dim " + std::to_string(i) + " is " + std::to_string(x.dim(i)) + " in data but " +
                       std::to_string(ind.dim(i)) + " in indices");
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> offs, nd_offsets(ctx, x, ind, b));
  int64_t k = ind.dim(ind.rank() - 1);
  size_t es = dtype_size(x.dtype());
  size_t block = static_cast<size_t>(dims_product(x.shape(), static_cast<size_t>(b + k), x.shape().size())) * es;
  char* dst = static_cast<char*>(y.raw());
  for (int64_t off : offs) {
    copy_bytes(dst, static_cast<const char*>(x.raw()) + off * static_cast<int64_t>(es), block);
    dst += block;
  }
  return {};
}

// dst = reduce(dst, src) for the scatter reductions; f16/bf16 go through float.
template <class T>
void reduce_into(T& dst, T src, char red) {
  using C = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;
  C a = static_cast<C>(dst), b = static_cast<C>(src);
  switch (red) {
    case 'n': dst = src; break;
    case 'a':
      if constexpr (std::is_same_v<T, bool>) dst = a || b;
      else dst = static_cast<T>(a + b);
      break;
    case 'm':
      if constexpr (std::is_same_v<T, bool>) dst = a && b;
      else dst = static_cast<T>(a * b);
      break;
    case 'x': dst = static_cast<T>(std::max(a, b)); break;
    case 'i': dst = static_cast<T>(std::min(a, b)); break;
  }
}

char reduction_code(const Node& n) {
  std::string r = n.attr_string("reduction", "none");
  return r == "add" ? 'a' : r == "mul" ? 'm' : r == "max" ? 'x' : r == "min" ? 'i' : 'n';
}

Status ref_scatter_elements(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  Tensor& y = ctx.output(0);
  if (ind.shape() != upd.shape())
    return ctx.error("indices have shape " + shape_str(ind.shape()) + " but updates have " + shape_str(upd.shape()));
  int64_t axis = norm_axis(ctx.node().attr_int("axis", 0), x.rank());
  for (int64_t a = 0; a < x.rank(); ++a)
    if (a != axis && ind.dim(a) > x.dim(a))
      return ctx.error("indices have shape " + shape_str(ind.shape()) + ", larger than the data's " + shape_str(x.shape()) +
                       " outside axis " + std::to_string(axis));
  if (y.raw() != x.raw()) copy_bytes(y.raw(), x.raw(), x.nbytes());
  char red = reduction_code(ctx.node());
  std::vector<int64_t> xs = strides_of(x.shape());
  Status st;
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* out = y.data<T>();
    const T* u = upd.data<T>();
    for_each_index(ind.shape(), [&](int64_t j, const std::vector<int64_t>& idx) {
      if (!st.ok()) return;
      auto i = checked(ctx, index_at(ind, j), x.dim(axis), axis);
      if (!i.ok()) { st = i.status(); return; }
      int64_t dst = 0;
      for (size_t a = 0; a < idx.size(); ++a) dst += (static_cast<int64_t>(a) == axis ? *i : idx[a]) * xs[a];
      reduce_into(out[dst], u[j], red);
    });
  });
  return st;
}

Status ref_scatter_nd(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  Tensor& y = ctx.output(0);
  int64_t k = ind.dim(ind.rank() - 1);
  std::vector<int64_t> want(ind.shape().begin(), ind.shape().end() - 1);
  want.insert(want.end(), x.shape().begin() + k, x.shape().end());
  if (upd.shape() != want)
    return ctx.error("updates have shape " + shape_str(upd.shape()) + " but indices and data need " + shape_str(want));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> offs, nd_offsets(ctx, x, ind, 0));
  if (y.raw() != x.raw()) copy_bytes(y.raw(), x.raw(), x.nbytes());
  int64_t block = dims_product(x.shape(), static_cast<size_t>(k), x.shape().size());
  char red = reduction_code(ctx.node());
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* out = y.data<T>();
    const T* u = upd.data<T>();
    for (size_t t = 0; t < offs.size(); ++t)
      for (int64_t j = 0; j < block; ++j) reduce_into(out[offs[t] + j], u[static_cast<int64_t>(t) * block + j], red);
  });
  return {};
}

// ---- Shape, Size, ConstantOfShape, Range --------------------------------------------------------

Status ref_shape_of(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t r = x.rank();
  auto clampi = [r](int64_t v) { if (v < 0) v += r; return v < 0 ? 0 : v > r ? r : v; };
  int64_t start = clampi(ctx.node().attr_int("start", 0));
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = x.dim(start + i);
  return {};
}

Status ref_size(KernelContext& ctx) {
  ctx.output(0).data<int64_t>()[0] = ctx.input(0).numel();
  return {};
}

Status ref_constant_of_shape(KernelContext& ctx) {
  Tensor& y = ctx.output(0);
  const Tensor* value = ctx.node().attr_tensor("value");
  size_t es = dtype_size(y.dtype());
  char* dst = static_cast<char*>(y.raw());
  if (!value) {
    std::memset(dst, 0, y.nbytes());
    return {};
  }
  for (int64_t i = 0; i < y.numel(); ++i) std::memcpy(dst + static_cast<size_t>(i) * es, value->raw(), es);
  return {};
}

Status ref_range(KernelContext& ctx) {
  Tensor& y = ctx.output(0);
  const Tensor& s = ctx.input(0);
  const Tensor& d = ctx.input(2);
  visit_dtype(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = y.data<T>();
    int64_t n = y.numel();
    if constexpr (std::is_same_v<T, bool>) {
    } else if constexpr (std::is_same_v<T, double>) {
      for (int64_t i = 0; i < n; ++i) o[i] = s.as_double(0) + static_cast<double>(i) * d.as_double(0);
    } else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>) {
      double start = s.as_double(0), delta = d.as_double(0);
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(static_cast<float>(start + static_cast<double>(i) * delta));
    } else {
      int64_t start = s.as_int64(0), delta = d.as_int64(0);
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(range_element(start, delta, i));
    }
  });
  return {};
}

// ---- OneHot, Trilu, EyeLike ---------------------------------------------------------------------

Status ref_one_hot(KernelContext& ctx) {
  const Tensor& ind = ctx.input(0);
  const Tensor& vals = ctx.input(2);
  Tensor& y = ctx.output(0);
  int64_t axis = norm_axis(ctx.node().attr_int("axis", -1), y.rank());
  int64_t depth = y.dim(axis);
  int64_t outer = dims_product(ind.shape(), 0, static_cast<size_t>(axis));
  int64_t inner = dims_product(ind.shape(), static_cast<size_t>(axis), ind.shape().size());
  size_t es = dtype_size(y.dtype());
  const char* off = static_cast<const char*>(vals.raw());
  const char* on = off + es;
  char* dst = static_cast<char*>(y.raw());
  for (int64_t i = 0; i < y.numel(); ++i) std::memcpy(dst + static_cast<size_t>(i) * es, off, es);
  // ONNX: indices outside [-depth, depth) give an all-off row (not an error).
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      double v = ind.as_double(o * inner + j);
      if (!(v >= -static_cast<double>(depth) && v < static_cast<double>(depth))) continue;
      int64_t k = static_cast<int64_t>(v);
      if (k < 0) k += depth;
      std::memcpy(dst + static_cast<size_t>((o * depth + k) * inner + j) * es, on, es);
    }
  return {};
}

Status ref_trilu(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t k = ctx.has_input(1) && ctx.input(1).numel() > 0 ? ctx.input(1).as_int64(0) : 0;
  bool upper = ctx.node().attr_int("upper", 1) != 0;
  int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
  size_t es = dtype_size(x.dtype());
  int64_t mats = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
  if (y.raw() != x.raw()) copy_bytes(y.raw(), x.raw(), x.nbytes());
  char* base = static_cast<char*>(y.raw());
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t i = 0; i < rows; ++i) {
      char* row = base + static_cast<size_t>((m * rows + i) * cols) * es;
      // upper keeps j >= i + k; lower keeps j <= i + k. Clamp the zeroed range to [0, cols].
      int64_t lo = upper ? 0 : std::clamp<int64_t>(i + k + 1, 0, cols);
      int64_t hi = upper ? std::clamp<int64_t>(i + k, 0, cols) : cols;
      if (hi > lo) std::memset(row + static_cast<size_t>(lo) * es, 0, static_cast<size_t>(hi - lo) * es);
    }
  return {};
}

Status ref_eye_like(KernelContext& ctx) {
  Tensor& y = ctx.output(0);
  int64_t k = ctx.node().attr_int("k", 0);
  std::memset(y.raw(), 0, y.nbytes());
  int64_t rows = y.dim(0), cols = y.dim(1);
  visit_dtype(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < rows; ++i) {
      int64_t j = i + k;
      if (j >= 0 && j < cols) y.data<T>()[i * cols + j] = static_cast<T>(1.0f);
    }
  });
  return {};
}

// ---- Compress, NonZero, Unique, ReverseSequence -------------------------------------------------

Status ref_compress(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& cond = ctx.input(1);
  bool has_axis = ctx.node().has_attr("axis");
  int64_t axis = has_axis ? norm_axis(ctx.node().attr_int("axis", 0), x.rank()) : 0;
  int64_t n = has_axis ? x.dim(axis) : x.numel();
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < cond.numel(); ++i) {
    if (!cond.data<bool>()[i]) continue;
    if (i >= n) return ctx.error("condition is true at " + std::to_string(i) + ", past the " + std::to_string(n) + " elements of the axis");
    keep.push_back(i);
  }
  size_t es = dtype_size(x.dtype());
  std::vector<int64_t> shape = has_axis ? x.shape() : std::vector<int64_t>{n};
  shape[static_cast<size_t>(axis)] = static_cast<int64_t>(keep.size());
  Tensor& y = output_for(ctx, 0, x.dtype(), shape);
  int64_t outer = has_axis ? dims_product(x.shape(), 0, static_cast<size_t>(axis)) : 1;
  size_t block = static_cast<size_t>(has_axis ? dims_product(x.shape(), static_cast<size_t>(axis) + 1, x.shape().size()) : 1) * es;
  char* dst = static_cast<char*>(y.raw());
  const char* src = static_cast<const char*>(x.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i : keep) {
      copy_bytes(dst, src + static_cast<size_t>(o * n + i) * block, block);
      dst += block;
    }
  return {};
}

Status ref_non_zero(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> flat;
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i)
      if (static_cast<float>(p[i]) != 0.0f) flat.push_back(i);
  });
  int64_t r = x.rank(), cnt = static_cast<int64_t>(flat.size());
  Tensor& y = output_for(ctx, 0, DType::i64, {r, cnt});
  std::vector<int64_t> xs = strides_of(x.shape());
  for (int64_t j = 0; j < cnt; ++j) {
    int64_t rem = flat[static_cast<size_t>(j)];
    for (int64_t a = 0; a < r; ++a) {
      y.data<int64_t>()[a * cnt + j] = rem / xs[static_cast<size_t>(a)];
      rem %= xs[static_cast<size_t>(a)];
    }
  }
  return {};
}

Status ref_unique(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  bool has_axis = ctx.node().has_attr("axis");
  bool sorted = ctx.node().attr_int("sorted", 1) != 0;
  int64_t axis = has_axis ? norm_axis(ctx.node().attr_int("axis", 0), x.rank()) : 0;
  // Items are the slices along axis (or single elements): item i, part o, offset j.
  int64_t n = has_axis ? x.dim(axis) : x.numel();
  int64_t outer = has_axis ? dims_product(x.shape(), 0, static_cast<size_t>(axis)) : 1;
  int64_t inner = has_axis ? dims_product(x.shape(), static_cast<size_t>(axis) + 1, x.shape().size()) : 1;
  std::vector<int64_t> first, inverse(static_cast<size_t>(n)), counts;
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;
    const T* p = x.data<T>();
    auto at = [&](int64_t item, int64_t k) { return static_cast<C>(p[((k / inner) * n + item) * inner + k % inner]); };
    int64_t len = outer * inner;
    auto less = [&](int64_t a, int64_t b) {
      for (int64_t k = 0; k < len; ++k) {
        C u = at(a, k), v = at(b, k);
        if (u < v) return true;
        if (v < u) return false;
      }
      return false;
    };
    auto equal = [&](int64_t a, int64_t b) { return !less(a, b) && !less(b, a); };
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), less);  // stable: first occurrence leads each group
    std::vector<int64_t> group(static_cast<size_t>(n));
    for (size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || !equal(order[i - 1], order[i])) {
        first.push_back(order[i]);
        counts.push_back(0);
      }
      group[static_cast<size_t>(order[i])] = static_cast<int64_t>(first.size()) - 1;
      ++counts.back();
    }
    std::vector<int64_t> rank(first.size());  // output position of each sorted group
    std::iota(rank.begin(), rank.end(), 0);
    if (!sorted) {
      std::vector<int64_t> by_first(first.size());
      std::iota(by_first.begin(), by_first.end(), 0);
      std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return first[static_cast<size_t>(a)] < first[static_cast<size_t>(b)]; });
      std::vector<int64_t> f2, c2;
      for (size_t i = 0; i < by_first.size(); ++i) {
        rank[static_cast<size_t>(by_first[i])] = static_cast<int64_t>(i);
        f2.push_back(first[static_cast<size_t>(by_first[i])]);
        c2.push_back(counts[static_cast<size_t>(by_first[i])]);
      }
      first = std::move(f2);
      counts = std::move(c2);
    }
    for (int64_t i = 0; i < n; ++i) inverse[static_cast<size_t>(i)] = rank[static_cast<size_t>(group[static_cast<size_t>(i)])];
  });
  int64_t u = static_cast<int64_t>(first.size());
  std::vector<int64_t> yshape = has_axis ? x.shape() : std::vector<int64_t>{u};
  if (has_axis) yshape[static_cast<size_t>(axis)] = u;
  Tensor& y = output_for(ctx, 0, x.dtype(), yshape);
  size_t es = dtype_size(x.dtype());
  size_t block = static_cast<size_t>(inner) * es;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < u; ++i)
      copy_bytes(static_cast<char*>(y.raw()) + static_cast<size_t>(o * u + i) * block,
                 static_cast<const char*>(x.raw()) + static_cast<size_t>(o * n + first[static_cast<size_t>(i)]) * block, block);
  auto put = [&](size_t i, const std::vector<int64_t>& v) {
    if (i >= ctx.num_outputs() || ctx.node().outputs[i] == kNoValue) return;
    Tensor& t = output_for(ctx, i, DType::i64, {static_cast<int64_t>(v.size())});
    copy_bytes(t.raw(), v.data(), v.size() * sizeof(int64_t));
  };
  put(1, first);
  put(2, inverse);
  put(3, counts);
  return {};
}

Status ref_reverse_sequence(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& lens = ctx.input(1);
  Tensor& y = ctx.output(0);
  int64_t ba = ctx.node().attr_int("batch_axis", 1), ta = ctx.node().attr_int("time_axis", 0);
  int64_t batch = x.dim(ba), time = x.dim(ta);
  if (lens.numel() != batch)
    return ctx.error("sequence_lens has " + std::to_string(lens.numel()) + " entries but the batch is " + std::to_string(batch));
  size_t es = dtype_size(x.dtype());
  size_t block = static_cast<size_t>(dims_product(x.shape(), 2, x.shape().size())) * es;
  auto offset = [&](int64_t b, int64_t t) {
    int64_t i0 = ta == 0 ? t : b, i1 = ta == 0 ? b : t;
    return static_cast<size_t>(i0 * x.dim(1) + i1) * block;
  };
  for (int64_t b = 0; b < batch; ++b) {
    int64_t len = lens.data<int64_t>()[b];
    if (len < 0 || len > time)
      return ctx.error("sequence_lens[" + std::to_string(b) + "] is " + std::to_string(len) +
                       " but the time axis has " + std::to_string(time) + " steps");
    for (int64_t t = 0; t < time; ++t) {
      int64_t src = t < len ? len - 1 - t : t;
      copy_bytes(static_cast<char*>(y.raw()) + offset(b, t), static_cast<const char*>(x.raw()) + offset(b, src), block);
    }
  }
  return {};
}

}  // namespace

/// Registers the index half of the shape family's reference kernels.
void register_ref_shape_index(KernelRegistry& r) {
  r.add_reference("Gather", ref_gather);
  r.add_reference("GatherElements", ref_gather_elements);
  r.add_reference("GatherND", ref_gather_nd);
  r.add_reference("ScatterElements", ref_scatter_elements);
  r.add_reference("ScatterND", ref_scatter_nd);
  r.add_reference("Shape", ref_shape_of);
  r.add_reference("Size", ref_size);
  r.add_reference("ConstantOfShape", ref_constant_of_shape);
  r.add_reference("Range", ref_range);
  r.add_reference("OneHot", ref_one_hot);
  r.add_reference("Trilu", ref_trilu);
  r.add_reference("EyeLike", ref_eye_like);
  r.add_reference("Compress", ref_compress);
  r.add_reference("NonZero", ref_non_zero);
  r.add_reference("Unique", ref_unique);
  r.add_reference("ReverseSequence", ref_reverse_sequence);
}

}  // namespace kiln
