// What the linear-layer kernels (QFusedMatMul's, WoqFusedMatMul's, and the convolutions that
// are plain products) read off their query: A's rows M, and B's K and N from its 2-D shape
// ([K, N], or [N, K] with transB), or from a pointwise convolution's weight.
#pragma once

#include "formats/ops/nn_util.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/kernel.h"

namespace kiln::cpu {

struct LinearDims {
  int64_t m = 0, n = 0, k = 0;
  bool trans = false;
};

/// The dims of a product of input 0 (A, any rank, its last dim K) by input `b` (B, 2-D); a user
/// error naming the node when A's last dim is not B's K. Shapes must be concrete.
inline Result<LinearDims> linear_dims(const KernelQuery& q, size_t b) {
  const std::vector<int64_t> as = q.inputs[0].shape.concrete(), bs = q.inputs[b].shape.concrete();
  LinearDims d;
  d.trans = q.node.attr_int("transB", 0) != 0;
  d.k = d.trans ? bs[1] : bs[0];
  d.n = d.trans ? bs[0] : bs[1];
  if (as.back() != d.k)
    return user_error(q.node.where(), "A's last dim " + std::to_string(as.back()) + " is not B's K " + std::to_string(d.k));
  d.m = d.k > 0 ? shape_numel(as) / d.k : 0;
  return d;
}

/// Why a convolution (its weight input `w`) is not a plain matrix product by its shape, if it
/// is one: channels-last, 1x1 kernel, stride 1 (any stride when `strided`: its
/// pixels gathered first), no padding, no dilation, no groups. Its [N, H, W, C] input is then
/// [N·H·W, C] rows and its weight [K, C, 1, 1] is Bᵀ.
inline std::optional<std::string> pointwise_shape_declines(const KernelQuery& q, size_t w, bool strided = false) {
  if (q.node.attr_int("channels_last", 0) == 0) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4) return "not 2-D";
  if (!q.inputs[w].shape.is_concrete()) return "the weight's shape is not known ahead";
  const std::vector<int64_t> ws = q.inputs[w].shape.concrete();
  if (ws.size() != 4 || ws[2] != 1 || ws[3] != 1 || q.node.attr_int("group", 1) != 1) return "not a 1x1 ungrouped convolution";
  for (int64_t v : q.node.attr_ints("dilations")) if (v != 1) return "dilations other than 1";
  for (int64_t v : q.node.attr_ints("strides")) if (v != 1 && !(strided && v > 1)) return "strides other than 1";
  for (int64_t v : q.node.attr_ints("pads")) if (v != 0) return "padding";
  if (const std::string pad = q.node.attr_string("auto_pad", "NOTSET"); pad != "NOTSET" && pad != "VALID") return "auto_pad";
  return std::nullopt;
}

/// pointwise_shape_declines, and the weight a constant (packed ahead).
inline std::optional<std::string> pointwise_declines(const KernelQuery& q, size_t w, bool strided = false) {
  if (q.node.attr_int("channels_last", 0) == 0) return "not channels-last";
  if (q.inputs[0].shape.rank() != 4) return "not 2-D";
  if (!q.inputs[w].value) return "the weights are computed at run time";
  return pointwise_shape_declines(q, w, strided);
}

/// A stride-1 pointwise convolution's product (pointwise_declines accepts it): M the pixels, K
/// the input channels, N the output channels, its weight [N, K, 1, 1] read as Bᵀ.
inline Result<LinearDims> pointwise_dims(const KernelQuery& q, size_t w) {
  const std::vector<int64_t> xs = q.inputs[0].shape.concrete(), ws = q.inputs[w].shape.concrete();
  LinearDims d{.n = ws[0], .k = ws[1], .trans = true};
  if (xs.back() != d.k)
    return user_error(q.node.where(), "X's channels " + std::to_string(xs.back()) + " are not the weight's " + std::to_string(d.k));
  d.m = shape_numel(xs) / d.k;
  return d;
}

/// A channels-last convolution's windows (its weight input `w`): its input and output sizes,
/// filter, strides, dilations and top/left padding (X [N, H, W, C], or [N, C, H, W] where
/// x_channels_first).
inline Result<gemm::ImageWindows> image_windows(const KernelQuery& q, size_t w = 1) {
  std::vector<int64_t> x = q.inputs[0].shape.concrete();
  const std::vector<int64_t> y = q.outputs[0].shape.concrete(), ws = q.inputs[w].shape.concrete();
  if (nn::x_channels_first(q.node)) x = {x[0], x[2], x[3], x[1]};
  KILN_ASSIGN_OR_RETURN(const nn::Window win, nn::resolve_window(q.node, {x[1], x[2]}, {ws[2], ws[3]}, false));
  return gemm::ImageWindows{.h = x[1], .w = x[2], .c = x[3], .oh = y[1], .ow = y[2], .kh = ws[2], .kw = ws[3], .sh = win.strides[0],
                            .sw = win.strides[1], .dh = win.dilations[0], .dw = win.dilations[1], .pt = win.pads[0], .pl = win.pads[1]};
}

/// A convolution's weight [K, C, KH, KW] (f32, f16 bits or s8) laid out [K, KH, KW, C], the
/// order of its windows' rows: B transposed, K×(KH·KW·C).
template <typename T>
Tensor in_windows_order(const T* w, DType dtype, int64_t k, const gemm::ImageWindows& g) {
  const int64_t taps = g.kh * g.kw;
  Tensor order(dtype, {k, taps * g.c});
  T* to = order.data<T>();
  for (int64_t o = 0; o < k; ++o)
    for (int64_t ch = 0; ch < g.c; ++ch)
      for (int64_t t = 0; t < taps; ++t) to[(o * taps + t) * g.c + ch] = w[(o * g.c + ch) * taps + t];
  return order;
}

/// Output rows [r0, r1) (of the images × OH) of a channels-last image `x`'s windows (`g`'s) into
/// `rows`, each pixel's row K = KH·KW runs of C elements: `copy(to, from)` a tap inside the
/// image, `fill(to)` one that leaves it.
template <typename T, typename Copy, typename Fill>
void gather_windows(const gemm::ImageWindows& g, const T* x, T* rows, int64_t r0, int64_t r1, Copy&& copy, Fill&& fill) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* image = x + (r / g.oh) * g.h * g.w * g.c;
    const int64_t oy = r % g.oh;
    T* row = rows + r * g.ow * g.k();
    for (int64_t ox = 0; ox < g.ow; ++ox)
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.sh - g.pt + ky * g.dh;
        for (int64_t kx = 0; kx < g.kw; ++kx, row += g.c) {
          const int64_t ix = ox * g.sw - g.pl + kx * g.dw;
          if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) copy(row, image + (iy * g.w + ix) * g.c);
          else fill(row);
        }
      }
  }
}

}  // namespace kiln::cpu
