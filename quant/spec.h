// What a quantized edge is: PT2E's QuantizationSpec as kiln spells it, and the scale and zero
// point an observer's statistics turn into (PT2E's `_calculate_qparams`, to the float32 rounding:
// a user moving from PT2E gets the same numbers). `../shared/reference/pt2-anchors.md` §1.2–1.3.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "formats/status.h"

namespace kiln::quant {

enum class QScheme { per_tensor_affine, per_tensor_symmetric, per_channel_affine, per_channel_symmetric };

/// How an edge's statistics are gathered (PT2E's observer classes).
enum class ObserverKind {
  min_max,                             ///< MinMaxObserver
  moving_average_min_max,              ///< MovingAverageMinMaxObserver
  per_channel_min_max,                 ///< PerChannelMinMaxObserver
  moving_average_per_channel_min_max,  ///< MovingAveragePerChannelMinMaxObserver
  histogram,                           ///< HistogramObserver: 2048 bins, L2 search of the range
  placeholder,                         ///< no statistics: dynamic activations, scales made at run time
};

/// Every built-in PT2E config sets the observers' eps to 2^-12 (their class default is
/// float32's epsilon); kiln's specs carry it.
inline constexpr double kDefaultEps = 1.0 / 4096;

struct QuantSpec {
  DType dtype = DType::u8;  ///< u8, i8, i32 (derived biases), or u4 / i4 (weight-only int4)
  int64_t qmin = 0;
  int64_t qmax = 255;
  QScheme qscheme = QScheme::per_tensor_affine;
  int64_t ch_axis = 0;  ///< per-channel schemes: the axis each scale belongs to
  ObserverKind observer = ObserverKind::min_max;
  double eps = kDefaultEps;               ///< the smallest scale
  double averaging_constant = 0.01;       ///< moving-average observers: x ← (1 − c)·x + c·new
  bool is_dynamic = false;
  /// Per-channel schemes: 0, one scale per index of ch_axis; else blocked (grouped, as weight-
  /// only quantization's --group-size): `block_size` consecutive elements along ch_axis share
  /// one scale, and every index of the other axes has its own (ONNX's blocked quantization).
  int64_t block_size = 0;

  bool per_channel() const { return qscheme == QScheme::per_channel_affine || qscheme == QScheme::per_channel_symmetric; }
  bool symmetric() const { return qscheme == QScheme::per_tensor_symmetric || qscheme == QScheme::per_channel_symmetric; }
};

/// PT2E's QuantizationSpec checks: dtype u8, i8, i32, u4 or i4; qmin ≤ qmax, both inside the
/// dtype; ch_axis ≥ 0; block_size ≥ 0, and positive only per channel; per-channel observers
/// with per-channel schemes only (and the other way round);
/// the histogram observer per tensor and not dynamic; a dynamic spec with the placeholder.
/// The error names `what` (the edge or config entry).
Status validate(const QuantSpec& spec, const std::string& what);

/// Per tensor: one scale and zero point, axis −1. Per channel: one per index of `axis`.
/// Blocked: one per block of `block_size` along `axis` and index of the other axes, in the
/// row-major order of the tensor's shape with dim `axis` replaced by its number of blocks.
struct QParams {
  std::vector<float> scale;
  std::vector<int64_t> zero_point;
  int64_t axis = -1;
  int64_t block_size = 0;
};

/// Where the parameters of a per-channel or blocked spec sit for a tensor of `shape`: the
/// index of element i's scale (ONNX's blocked and per-axis DequantizeLinear indexing).
struct ChannelIndex {
  int64_t inner = 1, channels = 1, block = 0, blocks = 1;
  ChannelIndex(const std::vector<int64_t>& shape, int64_t axis, int64_t block_size);
  /// How many scales the tensor has.
  int64_t count(int64_t numel) const;
  int64_t operator()(int64_t i) const {
    const int64_t c = (i / inner) % channels;
    if (!block) return c;
    return ((i / (inner * channels)) * blocks + c / block) * inner + i % inner;
  }
};

/// Scale and zero point from observed ranges (one pair per tensor, or per channel), as PT2E
/// computes them: the range is widened to hold 0; symmetric: scale = max(|min|, max) / ((qmax −
/// qmin) / 2), zero point 0 for i8 and (qmin + qmax) / 2 rounded down for u8; affine: scale =
/// (max − min) / (qmax − qmin), zero point = clamp(qmin − round(min / scale)); scales at least
/// eps; float32 arithmetic, round half to even. A range never observed (min > max: +inf, −inf)
/// gives scale 1 and zero point 0.
QParams calculate_qparams(const std::vector<float>& min_vals, const std::vector<float>& max_vals, const QuantSpec& spec);

}  // namespace kiln::quant
