// Reference kernels of the misc family: NonMaxSuppression and Det here; the recurrent layers in
// misc_rnn.cc and the signal ops in misc_signal.cc.
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/kernel.h"

namespace kiln {

void register_ref_misc_rnn(KernelRegistry& r);
void register_ref_misc_signal(KernelRegistry& r);

namespace {

// Whether boxes a and b overlap by more than `threshold` IoU (ONNX's rules: corners in any
// order for center_point_box 0; degenerate boxes never suppress).
bool suppresses(const float* a, const float* b, bool center, float threshold) {
  float ax0, ax1, ay0, ay1, bx0, bx1, by0, by1;
  if (!center) {
    ay0 = std::min(a[0], a[2]); ay1 = std::max(a[0], a[2]);
    ax0 = std::min(a[1], a[3]); ax1 = std::max(a[1], a[3]);
    by0 = std::min(b[0], b[2]); by1 = std::max(b[0], b[2]);
    bx0 = std::min(b[1], b[3]); bx1 = std::max(b[1], b[3]);
  } else {
    ax0 = a[0] - a[2] / 2; ax1 = a[0] + a[2] / 2; ay0 = a[1] - a[3] / 2; ay1 = a[1] + a[3] / 2;
    bx0 = b[0] - b[2] / 2; bx1 = b[0] + b[2] / 2; by0 = b[1] - b[3] / 2; by1 = b[1] + b[3] / 2;
  }
  float ix0 = std::max(ax0, bx0), ix1 = std::min(ax1, bx1);
  if (ix1 <= ix0) return false;
  float iy0 = std::max(ay0, by0), iy1 = std::min(ay1, by1);
  if (iy1 <= iy0) return false;
  float inter = (ix1 - ix0) * (iy1 - iy0);
  float area_a = (ax1 - ax0) * (ay1 - ay0), area_b = (bx1 - bx0) * (by1 - by0);
  float uni = area_a + area_b - inter;
  if (inter <= 0 || area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > threshold;
}

Status ref_nms(KernelContext& ctx) {
  const Tensor& boxes = ctx.input(0);
  const Tensor& scores = ctx.input(1);
  if (boxes.rank() != 3 || boxes.dim(2) != 4 || scores.rank() != 3 || scores.dim(0) != boxes.dim(0) ||
      scores.dim(2) != boxes.dim(1))
    return ctx.error("boxes " + shape_str(boxes.shape()) + " and scores " + shape_str(scores.shape()) +
                     " do not match [batch, boxes, 4] and [batch, classes, boxes]");
  auto scalar = [&](size_t i) -> const Tensor* { return ctx.has_input(i) && ctx.input(i).numel() > 0 ? &ctx.input(i) : nullptr; };
  const int64_t max_out = scalar(2) ? std::max<int64_t>(0, scalar(2)->as_int64(0)) : 0;
  const float iou = scalar(3) ? static_cast<float>(scalar(3)->as_double(0)) : 0.0f;
  const Tensor* score_thr = scalar(4);
  const float thr = score_thr ? static_cast<float>(score_thr->as_double(0)) : 0.0f;
  const bool center = ctx.node().attr_int("center_point_box", 0) != 0;
  const int64_t nb = boxes.dim(0), nc = scores.dim(1), nbox = boxes.dim(1);
  std::vector<float> bx(static_cast<size_t>(boxes.numel())), sc(static_cast<size_t>(scores.numel()));
  for (int64_t i = 0; i < boxes.numel(); ++i) bx[static_cast<size_t>(i)] = static_cast<float>(boxes.as_double(i));
  for (int64_t i = 0; i < scores.numel(); ++i) sc[static_cast<size_t>(i)] = static_cast<float>(scores.as_double(i));
  std::vector<int64_t> selected;  // triples
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 0; c < nc; ++c) {
      const float* s = sc.data() + (b * nc + c) * nbox;
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < nbox; ++i)
        if (!score_thr || s[i] > thr) cand.push_back(i);
      // Highest score first; ties keep the lower index first.
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) { return s[x] > s[y]; });
      std::vector<int64_t> keep;
      for (int64_t i : cand) {
        if (static_cast<int64_t>(keep.size()) >= max_out) break;
        bool drop = std::any_of(keep.begin(), keep.end(), [&](int64_t k) {
          return suppresses(bx.data() + (b * nbox + k) * 4, bx.data() + (b * nbox + i) * 4, center, iou);
        });
        if (!drop) keep.push_back(i);
      }
      for (int64_t k : keep) selected.insert(selected.end(), {b, c, k});
    }
  Tensor& y = ctx.allocate_output(0, DType::i64, {static_cast<int64_t>(selected.size() / 3), 3});
  std::copy(selected.begin(), selected.end(), y.data<int64_t>());
  return {};
}

// Determinant by LU decomposition with partial pivoting, in double.
Status ref_det(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t m = x.dim(x.rank() - 1);
  if (x.dim(x.rank() - 2) != m) return ctx.error("input has shape " + shape_str(x.shape()) + "; matrices must be square");
  const int64_t mats = m == 0 ? ctx.output(0).numel() : x.numel() / (m * m);
  std::vector<double> a(static_cast<size_t>(m * m));
  Tensor& y = ctx.output(0);
  return visit_dtype(y.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    for (int64_t k = 0; k < mats; ++k) {
      for (int64_t i = 0; i < m * m; ++i) a[static_cast<size_t>(i)] = x.as_double(k * m * m + i);
      double det = 1.0;
      for (int64_t col = 0; col < m; ++col) {
        int64_t piv = col;
        for (int64_t r = col + 1; r < m; ++r)
          if (std::fabs(a[static_cast<size_t>(r * m + col)]) > std::fabs(a[static_cast<size_t>(piv * m + col)])) piv = r;
        if (a[static_cast<size_t>(piv * m + col)] == 0.0) { det = 0.0; break; }
        if (piv != col) {
          for (int64_t c = 0; c < m; ++c) std::swap(a[static_cast<size_t>(piv * m + c)], a[static_cast<size_t>(col * m + c)]);
          det = -det;
        }
        const double p = a[static_cast<size_t>(col * m + col)];
        det *= p;
        for (int64_t r = col + 1; r < m; ++r) {
          const double f = a[static_cast<size_t>(r * m + col)] / p;
          for (int64_t c = col; c < m; ++c) a[static_cast<size_t>(r * m + c)] -= f * a[static_cast<size_t>(col * m + c)];
        }
      }
      if constexpr (std::is_same_v<T, double>) y.data<T>()[k] = det;
      else y.data<T>()[k] = static_cast<T>(static_cast<float>(det));
    }
    return {};
  });
}

}  // namespace

void register_ref_misc(KernelRegistry& r) {
  r.add_reference("NonMaxSuppression", ref_nms);
  r.add_reference("Det", ref_det);
  register_ref_misc_rnn(r);
  register_ref_misc_signal(r);
}

}  // namespace kiln
