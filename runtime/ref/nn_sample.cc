// Reference kernels for the resampling ops: Resize (separable, one axis at a time, computing
// in double like the ONNX reference), GridSample, RoiAlign and AffineGrid.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "formats/checked.h"
#include "formats/ops/nn_util.h"
#include "runtime/ref/nn_util.h"

namespace kiln::nn {

namespace {

// Writes doubles into `t`; integer types round half to even and saturate, like the ONNX reference.
void write_doubles(const std::vector<double>& v, Tensor& t) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_integral_v<T>) {
        double r = std::nearbyint(v[i]);
        r = std::clamp(r, static_cast<double>(std::numeric_limits<T>::lowest()), static_cast<double>(std::numeric_limits<T>::max()));
        p[i] = std::isnan(r) ? T{} : static_cast<T>(r);
      } else {
        p[i] = static_cast<T>(static_cast<float>(v[i]));
        if constexpr (std::is_same_v<T, double>) p[i] = v[i];
      }
    }
  });
}

struct ResizeParams {
  std::string mode, ctm, nearest_mode;
  double cubic_a = -0.75, extrapolation = 0;
  bool exclude_outside = false, antialias = false;
};

std::vector<double> resize_coeffs(const ResizeParams& p, double ratio, bool integral, double scale) {
  if (p.mode == "nearest") {
    if (integral) return {0, 1};
    if (p.nearest_mode == "round_prefer_ceil") return {ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0};
    if (p.nearest_mode == "floor") return {1, 0};
    if (p.nearest_mode == "ceil") return {0, 1};
    return {ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0};
  }
  if (p.mode == "linear") {
    if (!p.antialias) return {1 - ratio, ratio};
    // A triangle filter stretched by 1/scale when downsampling.
    const double s = std::min(scale, 1.0);
    const int64_t start = saturate_to_int64(std::floor(-1 / s)) + 1, n = 2 - 2 * start;
    std::vector<double> c(static_cast<size_t>(n));
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += c[static_cast<size_t>(i)] = std::clamp(1 - std::fabs((static_cast<double>(start + i) - ratio) * s), 0.0, 1.0);
    for (double& v : c) v /= sum;
    return c;
  }
  const double A = p.cubic_a;
  if (!p.antialias) {
    const double r1 = ratio + 1, q = 1 - ratio, q1 = q + 1;
    return {((A * r1 - 5 * A) * r1 + 8 * A) * r1 - 4 * A, ((A + 2) * ratio - (A + 3)) * ratio * ratio + 1,
            ((A + 2) * q - (A + 3)) * q * q + 1, ((A * q1 - 5 * A) * q1 + 8 * A) * q1 - 4 * A};
  }
  const double s = std::min(scale, 1.0);
  const int64_t start = saturate_to_int64(std::floor(-2 / s)) + 1, end = 2 - start;
  std::vector<double> c;
  double sum = 0;
  for (int64_t i = start; i < end; ++i) {
    const double x = std::fabs(s * (static_cast<double>(i) - ratio)), x2 = x * x, x3 = x2 * x;
    double v = x <= 1 ? (A + 2) * x3 - (A + 3) * x2 + 1 : x < 2 ? A * x3 - 5 * A * x2 + 8 * A * x - 4 * A : 0.0;
    c.push_back(v);
    sum += v;
  }
  for (double& v : c) v /= sum;
  return c;
}

// Resizes `data` (shape `shape`) along `axis` to `out_w` elements.
void resize_axis(const ResizeParams& p, std::vector<double>& data, std::vector<int64_t>& shape, size_t axis, int64_t out_w,
                 double scale, const double* roi) {
  const int64_t in_w = shape[axis];
  const double out_f = scale * static_cast<double>(in_w);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<double> out(static_cast<size_t>(outer * out_w * inner));
  std::vector<int64_t> idx;
  std::vector<double> w;
  for (int64_t yo = 0; yo < out_w; ++yo) {
    const double y = static_cast<double>(yo);
    double x = 0;
    bool extrapolate = false;
    if (p.ctm == "align_corners") x = out_f == 1 ? 0 : y * static_cast<double>(in_w - 1) / (out_f - 1);
    else if (p.ctm == "asymmetric") x = y / scale;
    else if (p.ctm == "tf_crop_and_resize") {
      x = out_f == 1 ? (roi[1] - roi[0]) * static_cast<double>(in_w - 1) / 2 : y * (roi[1] - roi[0]) * static_cast<double>(in_w - 1) / (out_f - 1);
      x += roi[0] * static_cast<double>(in_w - 1);
      extrapolate = x < 0 || x > static_cast<double>(in_w - 1);
    } else if (p.ctm == "pytorch_half_pixel") x = out_f == 1 ? -0.5 : (y + 0.5) / scale - 0.5;
    else if (p.ctm == "half_pixel_symmetric") {
      const double center = static_cast<double>(in_w) / 2, adjustment = static_cast<double>(out_w) / out_f;
      x = center * (1 - adjustment) + (y + 0.5) / scale - 0.5;
    } else x = (y + 0.5) / scale - 0.5;
    const double fl = std::floor(x);
    const bool integral = x == fl;
    std::vector<double> c = resize_coeffs(p, integral ? 1.0 : x - fl, integral, scale);
    const int64_t n = static_cast<int64_t>(c.size()), pad = (n + 1) / 2;
    // The n taps nearest x, preferring lower indices (the reference's neighbour rule).
    const double xp = x + static_cast<double>(pad);
    const double pf = std::floor(xp), frac = xp - pf;
    int64_t off = n % 2 == 0 ? (frac == 0 ? -(n / 2) : -(n / 2) + 1) : (frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1);
    const int64_t start = static_cast<int64_t>(pf) + off - pad;
    if (p.exclude_outside) {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (start + j < 0 || start + j >= in_w) c[static_cast<size_t>(j)] = 0;
        sum += c[static_cast<size_t>(j)];
      }
      if (sum != 0)
        for (double& v : c) v /= sum;
    }
    for (int64_t o = 0; o < outer; ++o) {
      double* dst = out.data() + (o * out_w + yo) * inner;
      if (extrapolate) {
        std::fill(dst, dst + inner, p.extrapolation);
        continue;
      }
      std::fill(dst, dst + inner, 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double cj = c[static_cast<size_t>(j)];
        if (cj == 0) continue;
        const int64_t src_i = std::clamp<int64_t>(start + j, 0, in_w - 1);
        const double* src = data.data() + (o * in_w + src_i) * inner;
        for (int64_t i = 0; i < inner; ++i) dst[i] += cj * src[i];
      }
    }
  }
  data.swap(out);
  shape[axis] = out_w;
}

Status ref_resize(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor* scales = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const Tensor* sizes = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  KILN_ASSIGN_OR_RETURN(ResizeGeometry g, resolve_resize(node, x.shape(), scales, sizes));
  Tensor& y = ctx.output(0);
  if (y.shape() != g.out) return internal_error(node.where(), "Resize output was allocated as " + shape_str(y.shape()));
  ResizeParams p;
  p.mode = node.attr_string("mode", "nearest");
  p.ctm = node.attr_string("coordinate_transformation_mode", "half_pixel");
  p.nearest_mode = node.attr_string("nearest_mode", "round_prefer_floor");
  p.cubic_a = node.attr_float("cubic_coeff_a", -0.75);
  p.extrapolation = node.attr_float("extrapolation_value", 0.0);
  p.exclude_outside = node.attr_int("exclude_outside", 0) != 0;
  p.antialias = node.attr_int("antialias", 0) != 0 && p.mode != "nearest";
  const size_t r = x.shape().size();
  // roi per dim: [start, end] in normalized coordinates, [0, 1] for dims the roi leaves out.
  std::vector<double> roi(2 * r);
  for (size_t i = 0; i < r; ++i) roi[2 * i] = 0, roi[2 * i + 1] = 1;
  if (p.ctm == "tf_crop_and_resize") {
    if (!ctx.has_input(1)) return ctx.error("tf_crop_and_resize needs the roi input");
    std::vector<double> given = ctx.input(1).to_double_vector();
    const size_t na = g.axes.size();
    if (given.size() != 2 * na) return ctx.error("roi has " + std::to_string(given.size()) + " values but " + std::to_string(2 * na) + " are needed");
    for (size_t i = 0; i < na; ++i) {
      roi[2 * static_cast<size_t>(g.axes[i])] = given[i];
      roi[2 * static_cast<size_t>(g.axes[i]) + 1] = given[na + i];
    }
  }
  std::vector<double> data = x.to_double_vector();
  std::vector<int64_t> shape = x.shape();
  for (int64_t a : g.axes) {
    const size_t ax = static_cast<size_t>(a);
    const bool full_roi = std::fabs(roi[2 * ax]) < 1e-9 && std::fabs(roi[2 * ax + 1] - 1) < 1e-9;
    if (std::fabs(g.scales[ax] - 1.0) <= 1e-9 && g.out[ax] == shape[ax] && (p.ctm != "tf_crop_and_resize" || full_roi)) continue;
    if (shape[ax] == 0 && g.out[ax] > 0) return ctx.error("cannot resize an empty axis " + std::to_string(a) + " to " + std::to_string(g.out[ax]));
    resize_axis(p, data, shape, ax, g.out[ax], g.scales[ax], &roi[2 * ax]);
  }
  write_doubles(data, y);
  return {};
}

// ---- GridSample ------------------------------------------------------------------------------

// Reflects x into [lo, hi] (the ONNX reference's rule).
double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    const double dx = lo - x;
    const int64_t n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const int64_t n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

void cubic_coeffs(double t, double* c) {
  const double A = -0.75, x = std::fabs(t);
  c[0] = ((A * (x + 1) - 5 * A) * (x + 1) + 8 * A) * (x + 1) - 4 * A;
  c[1] = ((A + 2) * x - (A + 3)) * x * x + 1;
  c[2] = ((A + 2) * (1 - x) - (A + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((A * (2 - x) - 5 * A) * (2 - x) + 8 * A) * (2 - x) - 4 * A;
}

template <class T>
Status grid_sample_impl(KernelContext& ctx, const Tensor& x, const Tensor& grid, Tensor& y) {
  const Node& node = ctx.node();
  const std::string mode = node.attr_string("mode", "linear"), pm = node.attr_string("padding_mode", "zeros");
  const bool align = node.attr_int("align_corners", 0) != 0;
  const size_t nd = static_cast<size_t>(x.rank() - 2);
  if (nd < 1 || nd > 3) return ctx.error("GridSample supports 1 to 3 spatial dims, got " + std::to_string(nd));
  std::vector<int64_t> dims(x.shape().begin() + 2, x.shape().end());
  if (std::find(dims.begin(), dims.end(), 0) != dims.end())
    return ctx.error("X " + shape_str(x.shape()) + " has an empty spatial dim: there is nothing to sample");
  const int64_t N = x.dim(0), C = x.dim(1);
  int64_t img = 1, opix = 1;
  for (int64_t d : dims) img *= d;
  for (int64_t i = 1; i + 1 < grid.rank(); ++i) opix *= grid.dim(i);
  std::vector<double> lo(nd), hi(nd);
  for (size_t i = 0; i < nd; ++i) {
    lo[i] = align ? 0.0 : -0.5;
    hi[i] = align ? static_cast<double>(dims[i] - 1) : static_cast<double>(dims[i]) - 0.5;
  }
  const int taps = mode == "nearest" ? 1 : mode == "linear" ? 2 : 4;
  const T* pg = grid.data<T>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < opix; ++o) {
      // Grid holds (x, y, z): the last spatial dim first.
      double coord[3];
      int64_t base[3];
      double w[3][4];
      for (size_t i = 0; i < nd; ++i) {
        const double g = static_cast<double>(pg[(n * opix + o) * static_cast<int64_t>(nd) + static_cast<int64_t>(nd - 1 - i)]);
        const double len = static_cast<double>(dims[i]);
        double c = align ? (g + 1) / 2 * (len - 1) : ((g + 1) * len - 1) / 2;
        if (mode == "nearest") c = std::nearbyint(c);
        if (c < lo[i] || c > hi[i]) {
          if (pm == "border") c = std::clamp(c, 0.0, len - 1);
          else if (pm == "reflection") c = reflect(c, lo[i], hi[i]);
        }
        // Grids may hold NaN, infinities or huge values: every tap of a coordinate this far out
        // reads padding, so clamping keeps the float -> int64 conversions below defined.
        if (std::isnan(c)) c = -4;
        c = std::clamp(c, -4.0, len + 3);
        coord[i] = c;
        if (mode == "nearest") {
          base[i] = static_cast<int64_t>(c);
          w[i][0] = 1;
        } else {
          const double f = std::floor(c);
          const double t = c - f;
          if (mode == "linear") {
            base[i] = static_cast<int64_t>(f);
            w[i][0] = 1 - t;
            w[i][1] = t;
          } else {
            base[i] = static_cast<int64_t>(f) - 1;
            cubic_coeffs(t, w[i]);
          }
        }
      }
      (void)coord;
      for (int64_t c = 0; c < C; ++c) {
        const T* xs = x.data<T>() + (n * C + c) * img;
        double acc = 0;
        int t[3] = {0, 0, 0};
        int64_t total = 1;
        for (size_t i = 0; i < nd; ++i) total *= taps;
        for (int64_t k = 0; k < total; ++k) {
          double wt = 1;
          int64_t at = 0;
          bool zero = false;
          for (size_t i = 0; i < nd; ++i) {
            int64_t idx = base[i] + t[i];
            wt *= w[i][t[i]];
            if (idx < 0 || idx >= dims[i]) {
              if (pm == "zeros") zero = true;
              else if (pm == "border") idx = std::clamp<int64_t>(idx, 0, dims[i] - 1);
              else idx = std::clamp<int64_t>(static_cast<int64_t>(reflect(static_cast<double>(idx), lo[i], hi[i])), 0, dims[i] - 1);
            }
            at = at * dims[i] + idx;
          }
          if (!zero) acc += wt * static_cast<double>(xs[at]);
          for (size_t i = nd; i-- > 0;) {
            if (++t[i] < taps) break;
            t[i] = 0;
          }
        }
        y.data<T>()[(n * C + c) * opix + o] = static_cast<T>(acc);
      }
    }
  return {};
}

Status ref_grid_sample(KernelContext& ctx) {
  if (ctx.input(1).dtype() != ctx.input(0).dtype()) return ctx.error("grid must have X's type");
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return grid_sample_impl<T>(ctx, *in[0], *in[1], *out[0]);
  });
}

// ---- RoiAlign --------------------------------------------------------------------------------

template <class T>
Status roi_align_impl(KernelContext& ctx, const Tensor& x, const Tensor& rois, const Tensor& bi, Tensor& y) {
  const Node& node = ctx.node();
  const bool half_pixel = node.attr_string("coordinate_transformation_mode", "half_pixel") == "half_pixel";
  const bool avg = node.attr_string("mode", "avg") == "avg";
  const int64_t sampling = node.attr_int("sampling_ratio", 0);
  const double scale = node.attr_float("spatial_scale", 1.0);
  const int64_t R = rois.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), PH = y.dim(2), PW = y.dim(3);
  if (bi.numel() != R) return ctx.error("batch_indices has " + std::to_string(bi.numel()) + " values but there are " + std::to_string(R) + " rois");
  const T* pr = rois.data<T>();
  for (int64_t r = 0; r < R; ++r) {
    const int64_t b = bi.data<int64_t>()[r];
    if (b < 0 || b >= x.dim(0)) return ctx.error("batch index " + std::to_string(b) + " is out of range for a batch of " + std::to_string(x.dim(0)));
    const double off = half_pixel ? 0.5 : 0.0;
    const double x0 = static_cast<double>(pr[r * 4]) * scale - off, y0 = static_cast<double>(pr[r * 4 + 1]) * scale - off;
    double rw = static_cast<double>(pr[r * 4 + 2]) * scale - off - x0, rh = static_cast<double>(pr[r * 4 + 3]) * scale - off - y0;
    if (!half_pixel) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
    const double bh = rh / static_cast<double>(PH), bw = rw / static_cast<double>(PW);
    const int64_t gh = sampling > 0 ? sampling : saturate_to_int64(std::ceil(rh / static_cast<double>(PH)));
    const int64_t gw = sampling > 0 ? sampling : saturate_to_int64(std::ceil(rw / static_cast<double>(PW)));
    const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
    for (int64_t c = 0; c < C; ++c) {
      const T* xs = x.data<T>() + (b * C + c) * H * W;
      for (int64_t ph = 0; ph < PH; ++ph)
        for (int64_t pw = 0; pw < PW; ++pw) {
          double out = 0;
          bool first = true;
          for (int64_t iy = 0; iy < gh; ++iy)
            for (int64_t ix = 0; ix < gw; ++ix) {
              double yy = y0 + static_cast<double>(ph) * bh + (static_cast<double>(iy) + 0.5) * bh / static_cast<double>(gh);
              double xx = x0 + static_cast<double>(pw) * bw + (static_cast<double>(ix) + 0.5) * bw / static_cast<double>(gw);
              double v[4] = {0, 0, 0, 0}, wt[4] = {0, 0, 0, 0};
              if (!(yy < -1.0 || yy > static_cast<double>(H) || xx < -1.0 || xx > static_cast<double>(W))) {
                yy = std::max(yy, 0.0);
                xx = std::max(xx, 0.0);
                int64_t yl = static_cast<int64_t>(yy), xl = static_cast<int64_t>(xx), yh, xh;
                if (yl >= H - 1) yh = yl = H - 1, yy = static_cast<double>(yl);
                else yh = yl + 1;
                if (xl >= W - 1) xh = xl = W - 1, xx = static_cast<double>(xl);
                else xh = xl + 1;
                const double ly = yy - static_cast<double>(yl), lx = xx - static_cast<double>(xl), hy = 1 - ly, hx = 1 - lx;
                wt[0] = hy * hx, wt[1] = hy * lx, wt[2] = ly * hx, wt[3] = ly * lx;
                v[0] = static_cast<double>(xs[yl * W + xl]), v[1] = static_cast<double>(xs[yl * W + xh]);
                v[2] = static_cast<double>(xs[yh * W + xl]), v[3] = static_cast<double>(xs[yh * W + xh]);
              }
              if (avg) {
                out += wt[0] * v[0] + wt[1] * v[1] + wt[2] * v[2] + wt[3] * v[3];
              } else {
                const double m = std::max({wt[0] * v[0], wt[1] * v[1], wt[2] * v[2], wt[3] * v[3]});
                out = first ? m : std::max(out, m);
                first = false;
              }
            }
          y.data<T>()[((r * C + c) * PH + ph) * PW + pw] = static_cast<T>(avg ? out / count : out);
        }
    }
  }
  return {};
}

Status ref_roi_align(KernelContext& ctx) {
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return roi_align_impl<T>(ctx, *in[0], *in[1], *in[2], *out[0]);
  });
}

// ---- AffineGrid ------------------------------------------------------------------------------

template <class T>
Status affine_grid_impl(KernelContext& ctx, const Tensor& theta, Tensor& y) {
  const bool align = ctx.node().attr_int("align_corners", 0) != 0;
  std::vector<int64_t> size = ctx.input(1).to_int64_vector();
  const int64_t nd = static_cast<int64_t>(size.size()) - 2, N = size[0];
  if (theta.dim(0) != N) return ctx.error("theta has " + std::to_string(theta.dim(0)) + " matrices but size asks for " + std::to_string(N));
  // Normalized coordinate of index i along a dim of length len.
  auto base = [&](int64_t i, int64_t len) {
    if (len <= 1) return 0.0;
    const double l = static_cast<double>(len), v = static_cast<double>(i);
    return align ? -1 + 2 * v / (l - 1) : (2 * v + 1) / l - 1;
  };
  const int64_t D = nd == 3 ? size[2] : 1, H = size[static_cast<size_t>(nd)], W = size[static_cast<size_t>(nd + 1)];
  T* py = y.data<T>();
  const T* pt = theta.data<T>();
  int64_t o = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) {
          // Homogeneous source point (x, y[, z], 1); the grid stores theta @ point.
          const double pnt[4] = {base(w, W), base(h, H), nd == 3 ? base(d, D) : 1.0, 1.0};
          const int64_t cols = nd + 1;
          for (int64_t r = 0; r < nd; ++r) {
            double acc = 0;
            for (int64_t c = 0; c < cols; ++c) acc += static_cast<double>(pt[(n * nd + r) * cols + c]) * pnt[c];
            py[o++] = static_cast<T>(acc);
          }
        }
  return {};
}

Status ref_affine_grid(KernelContext& ctx) {
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return affine_grid_impl<T>(ctx, *in[0], *out[0]);
  });
}

}  // namespace

void register_ref_nn_sample(KernelRegistry& r) {
  r.add_reference("Resize", ref_resize);
  r.add_reference("GridSample", ref_grid_sample);
  r.add_reference("RoiAlign", ref_roi_align);
  r.add_reference("AffineGrid", ref_affine_grid);
}

}  // namespace kiln::nn
