// Reference kernels of the shape family, layout part: Reshape, Flatten, Squeeze, Unsqueeze,
// Transpose, Concat, Split, Slice, Pad, Tile, Expand, DepthToSpace, SpaceToDepth,
// CenterCropPad. They only move bytes, so they work on every dtype by element size; contiguous
// inner blocks are copied with memcpy (Transpose, Concat, Slice and Gather are on the hot path
// of transformer models). Output shapes come from the op's inference (formats/ops/shape.cc).
#include <algorithm>

#include "formats/ops/shape_util.h"
#include "runtime/kernel.h"
#include "runtime/ref/shape_util.h"

namespace kiln {

using namespace ref_shape;

namespace {


// Reshape, Flatten, Squeeze, Unsqueeze: the same bytes under the inferred shape.
Status ref_copy(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  if (y.nbytes() != x.nbytes()) return ctx.error("cannot reshape " + shape_str(x.shape()) + " to " + shape_str(y.shape()));
  if (y.raw() != x.raw()) copy_bytes(y.raw(), x.raw(), x.nbytes());
  return {};
}

Status ref_transpose(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  std::vector<int64_t> perm = ctx.node().attr_ints("perm");
  if (!ctx.node().has_attr("perm"))
    for (int64_t i = x.rank() - 1; i >= 0; --i) perm.push_back(i);
  std::vector<int64_t> in_strides = strides_of(x.shape()), strides;
  for (int64_t p : perm) strides.push_back(in_strides[static_cast<size_t>(p)]);
  copy_strided(y.raw(), x.raw(), dtype_size(x.dtype()), y.shape(), strides, 0);
  return {};
}

Status ref_concat(KernelContext& ctx) {
  Tensor& y = ctx.output(0);
  int64_t r = y.rank();
  int64_t axis = ctx.node().attr_int("axis", 0);
  if (axis < 0) axis += r;
  size_t es = dtype_size(y.dtype());
  int64_t outer = dims_product(y.shape(), 0, static_cast<size_t>(axis));
  int64_t inner = dims_product(y.shape(), static_cast<size_t>(axis) + 1, static_cast<size_t>(r));
  size_t out_row = static_cast<size_t>(y.dim(axis) * inner) * es;
  size_t col = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& x = ctx.input(i);
    size_t row = static_cast<size_t>(x.dim(axis) * inner) * es;
    const char* src = static_cast<const char*>(x.raw());
    char* dst = static_cast<char*>(y.raw()) + col;
    for (int64_t o = 0; o < outer; ++o) copy_bytes(dst + static_cast<size_t>(o) * out_row, src + static_cast<size_t>(o) * row, row);
    col += row;
  }
  return {};
}

Status ref_split(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t axis = ctx.node().attr_int("axis", 0);
  if (axis < 0) axis += x.rank();
  size_t es = dtype_size(x.dtype());
  int64_t outer = dims_product(x.shape(), 0, static_cast<size_t>(axis));
  int64_t inner = dims_product(x.shape(), static_cast<size_t>(axis) + 1, x.shape().size());
  size_t in_row = static_cast<size_t>(x.dim(axis) * inner) * es;
  // Sizes from the split input or equal chunks (the last smaller), as the inference has them;
  // recomputed here because an omitted output has no buffer to read its size from.
  int64_t n = static_cast<int64_t>(ctx.num_outputs());
  std::vector<int64_t> sizes;
  if (ctx.has_input(1)) {
    sizes = ctx.input(1).to_int64_vector();
  } else {
    int64_t chunk = (x.dim(axis) + n - 1) / n;
    for (int64_t i = 0; i < n; ++i) sizes.push_back(i + 1 == n ? x.dim(axis) - chunk * (n - 1) : chunk);
  }
  size_t col = 0;
  for (size_t i = 0; i < ctx.num_outputs(); ++i) {
    size_t row = static_cast<size_t>(sizes[i] * inner) * es;
    if (ctx.node().outputs[i] != kNoValue) {
      Tensor& y = ctx.output(i);
      for (int64_t o = 0; o < outer; ++o)
        copy_bytes(static_cast<char*>(y.raw()) + static_cast<size_t>(o) * row,
                   static_cast<const char*>(x.raw()) + static_cast<size_t>(o) * in_row + col, row);
    }
    col += row;
  }
  return {};
}

// Y = X, then each update's rows copied over its slice of the axis, in order.
Status ref_replace_slices(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t axis = ctx.node().attr_int("axis", 0);
  if (axis < 0) axis += x.rank();
  const std::vector<int64_t> starts = ctx.node().attr_ints("starts");
  const size_t es = dtype_size(x.dtype());
  const int64_t outer = dims_product(x.shape(), 0, static_cast<size_t>(axis));
  const int64_t inner = dims_product(x.shape(), static_cast<size_t>(axis) + 1, x.shape().size());
  const size_t row = static_cast<size_t>(x.dim(axis) * inner) * es;
  if (y.raw() != x.raw()) copy_bytes(y.raw(), x.raw(), row * static_cast<size_t>(outer));
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    const Tensor& u = ctx.input(i);
    const size_t piece = static_cast<size_t>(u.dim(axis) * inner) * es, at = static_cast<size_t>(starts[i - 1] * inner) * es;
    for (int64_t o = 0; o < outer; ++o)
      copy_bytes(static_cast<char*>(y.raw()) + static_cast<size_t>(o) * row + at,
                 static_cast<const char*>(u.raw()) + static_cast<size_t>(o) * piece, piece);
  }
  return {};
}

Status ref_slice(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t r = x.rank();
  std::vector<int64_t> starts = ctx.input(1).to_int64_vector(), ends = ctx.input(2).to_int64_vector();
  std::vector<int64_t> axes, steps;
  if (ctx.has_input(3)) axes = ctx.input(3).to_int64_vector();
  else for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (ctx.has_input(4)) steps = ctx.input(4).to_int64_vector();
  else steps.assign(starts.size(), 1);
  std::vector<int64_t> in_strides = strides_of(x.shape());
  std::vector<int64_t> strides = in_strides;
  int64_t offset = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
    shape_ops::SliceDim s = shape_ops::slice_dim(x.dim(a), starts[i], ends[i], steps[i]);
    if (s.len != y.dim(a)) return ctx.error("internal slice length mismatch on axis " + std::to_string(a));
    offset += s.start * in_strides[static_cast<size_t>(a)];
    // With two or more elements |step| is at most the dim, so the product stays within the
    // input; with one, the step is never taken (and may be near 2^63).
    strides[static_cast<size_t>(a)] = s.len > 1 ? in_strides[static_cast<size_t>(a)] * s.step : 0;
  }
  copy_strided(y.raw(), x.raw(), dtype_size(x.dtype()), y.shape(), strides, offset);
  return {};
}

// Per-axis maps from output position to input position (-1: the fill value), then one pass
// over the output: Pad in every mode and CenterCropPad use it.
Status gather_by_maps(KernelContext& ctx, const Tensor& x, Tensor& y, const std::vector<std::vector<int64_t>>& maps,
                      const void* fill) {
  size_t es = dtype_size(x.dtype());
  size_t r = static_cast<size_t>(y.rank());
  if (y.numel() == 0) return {};
  std::vector<int64_t> in_strides = strides_of(x.shape());
  char* dst = static_cast<char*>(y.raw());
  const char* src = static_cast<const char*>(x.raw());
  if (r == 0) {
    std::memcpy(dst, src, es);
    return {};
  }
  int64_t n = y.dim(static_cast<int64_t>(r) - 1);
  const std::vector<int64_t>& last = maps[r - 1];
  std::vector<int64_t> idx(r - 1, 0);
  int64_t rows = y.numel() / n;
  for (int64_t row = 0; row < rows; ++row) {
    int64_t base = 0;
    bool valid = true;
    for (size_t a = 0; a + 1 < r; ++a) {
      int64_t m = maps[a][static_cast<size_t>(idx[a])];
      if (m < 0) { valid = false; break; }
      base += m * in_strides[a];
    }
    for (int64_t j = 0; j < n; ++j, dst += es) {
      int64_t m = valid ? last[static_cast<size_t>(j)] : -1;
      std::memcpy(dst, m < 0 ? fill : src + (base + m) * static_cast<int64_t>(es), es);
    }
    for (size_t a = r - 1; a-- > 0;) {
      if (++idx[a] < y.dim(static_cast<int64_t>(a))) break;
      idx[a] = 0;
    }
  }
  return {};
}

Status ref_pad(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t r = x.rank();
  std::string mode = ctx.node().attr_string("mode", "constant");
  std::vector<int64_t> pads = ctx.input(1).to_int64_vector(), axes;
  if (ctx.has_input(3)) axes = ctx.input(3).to_int64_vector();
  else for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  size_t k = axes.size();
  std::vector<int64_t> begin(static_cast<size_t>(r), 0);
  for (size_t i = 0; i < k; ++i) begin[static_cast<size_t>(axes[i] < 0 ? axes[i] + r : axes[i])] = pads[i];
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(r));
  for (int64_t a = 0; a < r; ++a) {
    int64_t d = x.dim(a), out = y.dim(a), pb = begin[static_cast<size_t>(a)];
    auto& m = maps[static_cast<size_t>(a)];
    m.resize(static_cast<size_t>(out));
    if (d == 0 && out > 0 && mode != "constant")
      return ctx.error("cannot " + mode + "-pad axis " + std::to_string(a) + " of size 0");
    for (int64_t o = 0; o < out; ++o) {
      int64_t i = o - pb;
      if (i >= 0 && i < d) { m[static_cast<size_t>(o)] = i; continue; }
      if (mode == "constant") i = -1;
      else if (mode == "edge") i = i < 0 ? 0 : d - 1;
      else if (mode == "wrap") i = ((i % d) + d) % d;
      else if (d == 1) i = 0;  // reflect of a single element
      else {
        int64_t period = 2 * (d - 1);
        i = ((i % period) + period) % period;
        if (i >= d) i = period - i;
      }
      m[static_cast<size_t>(o)] = i;
    }
  }
  std::vector<char> fill(dtype_size(x.dtype()), 0);
  if (ctx.has_input(2) && ctx.input(2).numel() > 0) std::memcpy(fill.data(), ctx.input(2).raw(), fill.size());
  return gather_by_maps(ctx, x, y, maps, fill.data());
}

Status ref_center_crop_pad(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(x.rank()));
  for (int64_t a = 0; a < x.rank(); ++a) {
    int64_t d = x.dim(a), out = y.dim(a);
    // Crop: the window starts at (d - out) / 2; pad: the input starts at (out - d) / 2.
    int64_t shift = out <= d ? (d - out) / 2 : -((out - d) / 2);
    auto& m = maps[static_cast<size_t>(a)];
    for (int64_t o = 0; o < out; ++o) {
      int64_t i = o + shift;
      m.push_back(i >= 0 && i < d ? i : -1);
    }
  }
  std::vector<char> zero(dtype_size(x.dtype()), 0);
  return gather_by_maps(ctx, x, y, maps, zero.data());
}

Status ref_tile(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  // Output dim a of size reps*d is the pair (rep, i) with strides (0, stride of i).
  std::vector<int64_t> in_strides = strides_of(x.shape()), shape, strides;
  for (int64_t a = 0; a < x.rank(); ++a) {
    int64_t d = x.dim(a);
    shape.push_back(d == 0 ? 0 : y.dim(a) / d);
    strides.push_back(0);
    shape.push_back(d);
    strides.push_back(in_strides[static_cast<size_t>(a)]);
  }
  copy_strided(y.raw(), x.raw(), dtype_size(x.dtype()), shape, strides, 0);
  return {};
}

Status ref_expand(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  size_t r = static_cast<size_t>(y.rank()), off = r - static_cast<size_t>(x.rank());
  std::vector<int64_t> in_strides = strides_of(x.shape()), strides(r, 0);
  for (size_t a = off; a < r; ++a) {
    int64_t d = x.dim(static_cast<int64_t>(a - off));
    if (d != 1 && d != y.dim(static_cast<int64_t>(a)))
      return ctx.error("cannot expand shape " + shape_str(x.shape()) + " to " + shape_str(y.shape()));
    strides[a] = d == 1 ? 0 : in_strides[a - off];
  }
  copy_strided(y.raw(), x.raw(), dtype_size(x.dtype()), y.shape(), strides, 0);
  return {};
}

Status ref_depth_to_space(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t b = ctx.node().attr_int("blocksize", 1);
  int64_t n = x.dim(0), c = x.dim(1) / (b * b), h = x.dim(2), w = x.dim(3);
  bool crd = ctx.node().attr_string("mode", "DCR") == "CRD";
  // View the input as 6-D, then walk it in output order [n, c, h, b1, w, b2].
  int64_t sw = 1, sh = w, sc = h * w;
  int64_t s_b1, s_b2, s_c;
  if (crd) {  // input channel = (c, b1, b2)
    s_b2 = sc;
    s_b1 = b * sc;
    s_c = b * b * sc;
  } else {  // DCR: input channel = (b1, b2, c)
    s_c = sc;
    s_b2 = c * sc;
    s_b1 = b * c * sc;
  }
  copy_strided(y.raw(), x.raw(), dtype_size(x.dtype()), {n, c, h, b, w, b},
               {x.dim(1) * sc, s_c, sh, s_b1, sw, s_b2}, 0);
  return {};
}

Status ref_space_to_depth(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t b = ctx.node().attr_int("blocksize", 1);
  int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2) / b, w = x.dim(3) / b;
  int64_t W = x.dim(3), H = x.dim(2);
  // Output channel = (b1, b2, c); output spatial (h, w); input [n, c, h*b + b1, w*b + b2].
  copy_strided(y.raw(), x.raw(), dtype_size(x.dtype()), {n, b, b, c, h, w},
               {c * H * W, W, 1, H * W, b * W, b}, 0);
  return {};
}

}  // namespace

void register_ref_shape_index(KernelRegistry& r);

void register_ref_shape(KernelRegistry& r) {
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) r.add_reference(op, ref_copy);
  r.add_reference("Transpose", ref_transpose);
  r.add_reference("Concat", ref_concat);
  r.add_reference("Split", ref_split);
  r.add_reference("Slice", ref_slice);
  r.add_reference("ReplaceSlices", ref_replace_slices);
  r.add_reference("Pad", ref_pad);
  r.add_reference("CenterCropPad", ref_center_crop_pad);
  r.add_reference("Tile", ref_tile);
  r.add_reference("Expand", ref_expand);
  r.add_reference("DepthToSpace", ref_depth_to_space);
  r.add_reference("SpaceToDepth", ref_space_to_depth);
  register_ref_shape_index(r);
}

}  // namespace kiln
