// Reference kernels for Conv, ConvTranspose and Col2Im. All three go through one im2col /
// col2im pair and the shared GEMM loop (nn_util.h): Conv is W_g @ im2col(X_g) per image and
// group, ConvTranspose is col2im(W_g^T @ X_g), Col2Im is col2im alone. The spatial dims are
// padded to three (D, H, W) so one loop nest serves 1-D, 2-D and 3-D.
#include <cstring>
#include <string>

#include "formats/ops/nn_util.h"
#include "runtime/ref/layout.h"
#include "runtime/ref/nn_util.h"

namespace kiln::nn {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return a / b + ((a % b != 0) && ((a > 0) == (b > 0)) ? 1 : 0); }

// The geometry of a forward convolution over a 3-D image: image size, kernel, output grid.
struct Geom {
  int64_t img[3], k[3], out[3], s[3], d[3], p[3];
  int64_t img_size() const { return img[0] * img[1] * img[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  // Whether im2col would be the identity (1x1 kernel, stride 1, no padding).
  bool trivial() const {
    for (int i = 0; i < 3; ++i)
      if (k[i] != 1 || s[i] != 1 || p[i] != 0 || img[i] != out[i]) return false;
    return true;
  }
};

Result<Geom> make_geom(KernelContext& ctx, const std::vector<int64_t>& img, const Window& w, const std::vector<int64_t>& out) {
  if (img.size() > 3) return ctx.error("only 1, 2 and 3 spatial dims are supported, got " + std::to_string(img.size()));
  Geom g;
  std::vector<int64_t> i3 = to3(img, 1), k3 = to3(w.kernel, 1), o3 = to3(out, 1), s3 = to3(w.strides, 1), d3 = to3(w.dilations, 1);
  std::vector<int64_t> begins(w.pads.begin(), w.pads.begin() + static_cast<ptrdiff_t>(w.rank()));
  std::vector<int64_t> p3 = to3(begins, 0);
  for (int i = 0; i < 3; ++i) {
    g.img[i] = i3[static_cast<size_t>(i)];
    g.k[i] = k3[static_cast<size_t>(i)];
    g.out[i] = o3[static_cast<size_t>(i)];
    g.s[i] = s3[static_cast<size_t>(i)];
    g.d[i] = d3[static_cast<size_t>(i)];
    g.p[i] = p3[static_cast<size_t>(i)];
  }
  return g;
}

// For kernel offset kw along W: the output columns [lo, hi) whose input column is inside the image.
void valid_range(const Geom& g, int64_t kw, int64_t& lo, int64_t& hi) {
  const int64_t off = kw * g.d[2] - g.p[2];
  lo = std::clamp<int64_t>(ceil_div(-off, g.s[2]), 0, g.out[2]);
  hi = std::clamp<int64_t>(ceil_div(g.img[2] - off, g.s[2]), lo, g.out[2]);
}

// col[c, kd, kh, kw][od, oh, ow] = x[c][od*s - p + kd*d, ...] (0 outside the image).
template <class T>
void im2col(const T* x, int64_t channels, const Geom& g, T* col) {
  const int64_t P = g.out_size(), OW = g.out[2];
  T* row = col;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t kd = 0; kd < g.k[0]; ++kd)
      for (int64_t kh = 0; kh < g.k[1]; ++kh)
        for (int64_t kw = 0; kw < g.k[2]; ++kw, row += P) {
          int64_t lo, hi;
          valid_range(g, kw, lo, hi);
          const int64_t woff = kw * g.d[2] - g.p[2];
          for (int64_t od = 0; od < g.out[0]; ++od) {
            const int64_t id = od * g.s[0] - g.p[0] + kd * g.d[0];
            for (int64_t oh = 0; oh < g.out[1]; ++oh) {
              const int64_t ih = oh * g.s[1] - g.p[1] + kh * g.d[1];
              T* dst = row + (od * g.out[1] + oh) * OW;
              if (id < 0 || id >= g.img[0] || ih < 0 || ih >= g.img[1]) {
                std::fill(dst, dst + OW, T{});
                continue;
              }
              const T* src = x + ((c * g.img[0] + id) * g.img[1] + ih) * g.img[2];
              std::fill(dst, dst + lo, T{});
              if (hi <= lo) {
              } else if (g.s[2] == 1) std::copy(src + (lo + woff), src + (hi + woff), dst + lo);
              else
                for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * g.s[2] + woff];
              std::fill(dst + hi, dst + OW, T{});
            }
          }
        }
}

// The adjoint of im2col: x[c][od*s - p + kd*d, ...] += col[c, kd, kh, kw][od, oh, ow].
template <class T>
void col2im(const T* col, int64_t channels, const Geom& g, T* x) {
  const int64_t P = g.out_size(), OW = g.out[2];
  const T* row = col;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t kd = 0; kd < g.k[0]; ++kd)
      for (int64_t kh = 0; kh < g.k[1]; ++kh)
        for (int64_t kw = 0; kw < g.k[2]; ++kw, row += P) {
          int64_t lo, hi;
          valid_range(g, kw, lo, hi);
          const int64_t woff = kw * g.d[2] - g.p[2];
          for (int64_t od = 0; od < g.out[0]; ++od) {
            const int64_t id = od * g.s[0] - g.p[0] + kd * g.d[0];
            if (id < 0 || id >= g.img[0]) continue;
            for (int64_t oh = 0; oh < g.out[1]; ++oh) {
              const int64_t ih = oh * g.s[1] - g.p[1] + kh * g.d[1];
              if (ih < 0 || ih >= g.img[1]) continue;
              const T* src = row + (od * g.out[1] + oh) * OW;
              T* dst = x + ((c * g.img[0] + id) * g.img[1] + ih) * g.img[2];
              for (int64_t ow = lo; ow < hi; ++ow) dst[ow * g.s[2] + woff] += src[ow];
            }
          }
        }
}

std::vector<int64_t> spatial(const Tensor& t) { return {t.shape().begin() + 2, t.shape().end()}; }

template <class T>
Status conv_impl(KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t group = ctx.node().attr_int("group", 1);
  const int64_t N = x.dim(0), C = x.dim(1), M = w.dim(0);
  if (C != w.dim(1) * group || M % group != 0)
    return ctx.error("X has " + std::to_string(C) + " channels but W " + shape_str(w.shape()) + " with group " + std::to_string(group) + " expects " + std::to_string(w.dim(1) * group));
  if (b && b->numel() != M) return ctx.error("bias has " + std::to_string(b->numel()) + " elements but the conv has " + std::to_string(M) + " output channels");
  KILN_ASSIGN_OR_RETURN(Window win, resolve_window(ctx.node(), spatial(x), spatial(w), false));
  KILN_ASSIGN_OR_RETURN(Geom g, make_geom(ctx, spatial(x), win, win.out));
  const int64_t icg = C / group, ocg = M / group, Kc = icg * g.k_size(), P = g.out_size(), img = g.img_size();
  const bool trivial = g.trivial();
  std::vector<T> col(trivial ? 0 : static_cast<size_t>(Kc * P));
  const T* pw = w.data<T>();
  T* py = y.data<T>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t gi = 0; gi < group; ++gi) {
      const T* xg = x.data<T>() + (n * C + gi * icg) * img;
      T* yg = py + (n * M + gi * ocg) * P;
      for (int64_t oc = 0; oc < ocg; ++oc) std::fill(yg + oc * P, yg + (oc + 1) * P, b ? b->data<T>()[gi * ocg + oc] : T{});
      if (P == 0 || Kc == 0) continue;
      if (!trivial) im2col(xg, icg, g, col.data());
      gemm_acc<T>(ocg, P, Kc, pw + gi * ocg * Kc, Kc, trivial ? xg : col.data(), P, yg, P);
    }
  return {};
}

Status ref_conv(KernelContext& ctx) {
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return conv_impl<T>(ctx, *in[0], *in[1], in.size() > 2 ? in[2] : nullptr, *out[0]);
  });
}

Status ref_fused_conv(KernelContext& ctx) {
  if (ctx.input(0).dtype() != DType::f32) return ctx.error("FusedConv is f32 only");
  KILN_RETURN_IF_ERROR(ref_conv(ctx));
  return fused_epilogue(ctx, ctx.output(0));
}

template <class T>
Status conv_transpose_impl(KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t group = ctx.node().attr_int("group", 1);
  const int64_t N = x.dim(0), C = x.dim(1);
  if (C != w.dim(0) || C % group != 0) return ctx.error("X has " + std::to_string(C) + " channels but W is " + shape_str(w.shape()));
  const int64_t icg = C / group, ocg = w.dim(1), M = ocg * group;
  if (b && b->numel() != M) return ctx.error("bias has " + std::to_string(b->numel()) + " elements but the output has " + std::to_string(M) + " channels");
  KILN_ASSIGN_OR_RETURN(Window win, resolve_transpose_window(ctx.node(), spatial(x), spatial(w)));
  // The forward conv this is the adjoint of maps the output image onto the input grid.
  KILN_ASSIGN_OR_RETURN(Geom g, make_geom(ctx, win.out, win, spatial(x)));
  const int64_t Kk = g.k_size(), Pin = g.out_size(), img = g.img_size(), Kc = ocg * Kk;
  std::vector<T> wt, col(static_cast<size_t>(Kc * Pin));
  T* py = y.data<T>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) std::fill(py + (n * M + m) * img, py + (n * M + m + 1) * img, b ? b->data<T>()[m] : T{});
  for (int64_t gi = 0; gi < group; ++gi) {
    transpose_into(w.data<T>() + gi * icg * Kc, icg, Kc, Kc, wt);  // [Kc, icg]
    for (int64_t n = 0; n < N; ++n) {
      std::fill(col.begin(), col.end(), T{});
      gemm_acc<T>(Kc, Pin, icg, wt.data(), icg, x.data<T>() + (n * C + gi * icg) * Pin, Pin, col.data(), Pin);
      col2im(col.data(), ocg, g, py + (n * M + gi * ocg) * img);
    }
  }
  return {};
}

Status ref_conv_transpose(KernelContext& ctx) {
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return conv_transpose_impl<T>(ctx, *in[0], *in[1], in.size() > 2 ? in[2] : nullptr, *out[0]);
  });
}

template <class T>
Status col2im_impl(KernelContext& ctx, const Tensor& x, Tensor& y) {
  std::vector<int64_t> image = ctx.input(1).to_int64_vector(), block = ctx.input(2).to_int64_vector();
  KILN_ASSIGN_OR_RETURN(Window win, resolve_window(ctx.node(), image, block, false));
  KILN_ASSIGN_OR_RETURN(Geom g, make_geom(ctx, image, win, win.out));
  const int64_t N = x.dim(0), C = y.dim(1), Kk = g.k_size(), L = g.out_size(), img = g.img_size();
  if (x.dim(1) != C * Kk || x.dim(2) != L)
    return ctx.error("input " + shape_str(x.shape()) + " does not match " + std::to_string(C) + " channels x " + std::to_string(Kk) +
                     " block elements and " + std::to_string(L) + " block positions");
  T* py = y.data<T>();
  std::fill(py, py + y.numel(), T{});
  for (int64_t n = 0; n < N; ++n) col2im(x.data<T>() + n * C * Kk * L, C, g, py + n * C * img);
  return {};
}

Status ref_col2im(KernelContext& ctx) {
  return run_float(ctx, [&](auto tag, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
    using T = decltype(tag);
    return col2im_impl<T>(ctx, *in[0], *out[0]);
  });
}


}  // namespace

Status ref_fused_conv_any(KernelContext& ctx) {
  return ref::run_joined(ctx, [](KernelContext& joined) {
    return ref::run_any_layout(joined, [](KernelContext& view) { return ref::run_widened(view, ref_fused_conv); });
  });
}

namespace {

// PointwiseDepthwiseConv: its pointwise stage's FusedConv into a whole intermediate tensor (X
// itself without W1), its depthwise stage's FusedConv of that, then with W3 its projection
// stage's FusedConv of that.
Status ref_pointwise_depthwise_conv(KernelContext& ctx) {
  if (!ctx.has_input(3)) return ctx.error("W2 is required");
  auto input = [&](size_t i) { return ctx.has_input(i) ? ctx.input(i) : Tensor(); };
  const Tensor& x = ctx.input(0);
  const Tensor& w2 = ctx.input(3);
  if (x.rank() < 3 || w2.rank() != 4)
    return ctx.error("X " + shape_str(x.shape()) + " and W2 " + shape_str(w2.shape()) + " are not a 2-D convolution's");
  const size_t axis = channels_last(ctx.node()) ? static_cast<size_t>(x.rank()) - 1 : 1;
  // A stage's output: `shape` with `channels` channels.
  auto with_channels = [&](std::vector<int64_t> shape, int64_t channels) {
    shape[axis] = channels;
    return Tensor(DType::f32, std::move(shape));
  };
  Tensor t = x;
  if (ctx.has_input(1)) {
    ref::ViewContext first(ctx, pointwise_stage(ctx.node()), {x, ctx.input(1), input(2)}, with_channels(x.shape(), ctx.input(1).dim(0)));
    KILN_RETURN_IF_ERROR(ref_fused_conv_any(first));
    t = first.y();
  }
  // The depthwise stage's output: Y's pixels by T's channels (Y itself without W3).
  ref::ViewContext second(ctx, depthwise_stage(ctx.node()), {t, w2, input(4)}, with_channels(ctx.output(0).shape(), w2.dim(0)));
  KILN_RETURN_IF_ERROR(ref_fused_conv_any(second));
  Tensor y = second.y();
  if (ctx.has_input(5)) {
    ref::ViewContext third(ctx, projection_stage(ctx.node()), {y, ctx.input(5), input(6), input(7)},
                           Tensor(DType::f32, ctx.output(0).shape()));
    KILN_RETURN_IF_ERROR(ref_fused_conv_any(third));
    y = third.y();
  }
  if (y.shape() != ctx.output(0).shape()) return ctx.error("the last stage's output " + shape_str(y.shape()) + " is not Y's");
  std::memcpy(ctx.output(0).raw(), y.raw(), y.nbytes());
  return {};
}

}  // namespace

void register_ref_nn_conv(KernelRegistry& r) {
  r.add_reference("Conv", ref_conv);
  r.add_reference("FusedConv", ref_fused_conv_any);
  r.add_reference("PointwiseDepthwiseConv", ref_pointwise_depthwise_conv);
  r.add_reference("ConvTranspose", ref_conv_transpose);
  r.add_reference("Col2Im", ref_col2im);
}

}  // namespace kiln::nn
