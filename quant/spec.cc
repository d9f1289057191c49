#include "quant/spec.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <limits>

namespace kiln::quant {

namespace {

bool dtype_range(DType t, int64_t& lo, int64_t& hi) {
  switch (t) {
    case DType::u8: lo = 0, hi = 255; return true;
    case DType::i8: lo = -128, hi = 127; return true;
    case DType::i32: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max(); return true;
    case DType::u4: lo = 0, hi = 15; return true;
    case DType::i4: lo = -8, hi = 7; return true;
    default: return false;
  }
}

bool per_channel_observer(ObserverKind k) {
  return k == ObserverKind::per_channel_min_max || k == ObserverKind::moving_average_per_channel_min_max;
}

}  // namespace

Status validate(const QuantSpec& s, const std::string& what) {
  int64_t lo = 0, hi = 0;
  if (!dtype_range(s.dtype, lo, hi))
    return user_error(what, "quantized dtype " + std::string(dtype_name(s.dtype)) + " is not one of u8, i8, i32, u4, i4");
  if (s.qmin > s.qmax) return user_error(what, "qmin " + std::to_string(s.qmin) + " is above qmax " + std::to_string(s.qmax));
  if (s.qmin < lo || s.qmax > hi)
    return user_error(what, "range " + std::to_string(s.qmin) + ".." + std::to_string(s.qmax) + " does not fit " +
                                std::string(dtype_name(s.dtype)) + " (" + std::to_string(lo) + ".." + std::to_string(hi) + ")");
  if (s.ch_axis < 0) return user_error(what, "ch_axis " + std::to_string(s.ch_axis) + " is negative");
  if (s.block_size < 0) return user_error(what, "block_size " + std::to_string(s.block_size) + " is negative");
  if (s.block_size > 0 && !s.per_channel()) return user_error(what, "a block_size needs a per-channel scheme");
  if (!(s.eps > 0)) return user_error(what, "eps must be positive");
  if (!(s.averaging_constant > 0 && s.averaging_constant <= 1)) return user_error(what, "averaging_constant must be in (0, 1]");
  if (per_channel_observer(s.observer) != s.per_channel() && s.observer != ObserverKind::placeholder)
    return user_error(what, s.per_channel() ? "a per-channel scheme needs a per-channel observer"
                                            : "a per-channel observer needs a per-channel scheme");
  if (s.observer == ObserverKind::histogram && s.is_dynamic) return user_error(what, "the histogram observer cannot be dynamic");
  if (s.is_dynamic != (s.observer == ObserverKind::placeholder))
    return user_error(what, s.is_dynamic ? "a dynamic spec gathers no statistics: its observer is the placeholder"
                                         : "the placeholder observer is for dynamic specs");
  return {};
}

ChannelIndex::ChannelIndex(const std::vector<int64_t>& shape, int64_t axis, int64_t block_size) {
  channels = axis < static_cast<int64_t>(shape.size()) ? std::max<int64_t>(shape[static_cast<size_t>(axis)], 1) : 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  inner = std::max<int64_t>(inner, 1);
  block = block_size;
  blocks = block ? (channels + block - 1) / block : channels;
}

int64_t ChannelIndex::count(int64_t numel) const {
  if (!block) return channels;
  return numel / (channels * inner) * blocks * inner;
}

QParams calculate_qparams(const std::vector<float>& min_vals, const std::vector<float>& max_vals, const QuantSpec& s) {
  QParams q;
  q.axis = s.per_channel() ? s.ch_axis : -1;
  q.block_size = s.per_channel() ? s.block_size : 0;
  const size_t n = std::min(min_vals.size(), max_vals.size());
  const float eps = static_cast<float>(s.eps);
  const float levels = static_cast<float>(s.qmax - s.qmin);
  const int saved = std::fegetround();
  std::fesetround(FE_TONEAREST);  // nearbyint: half to even, as torch.round
  for (size_t i = 0; i < n; ++i) {
    float scale = 1.0f;
    int64_t zp = 0;
    if (!(min_vals[i] > max_vals[i])) {  // observed (a never-observed range is +inf, -inf)
      const float lo = std::min(min_vals[i], 0.0f), hi = std::max(max_vals[i], 0.0f);
      if (s.symmetric()) {
        scale = std::max(std::max(-lo, hi) / (levels / 2), eps);
        zp = s.dtype == DType::u8 || s.dtype == DType::u4 ? (s.qmin + s.qmax) / 2 : 0;
      } else {
        scale = std::max((hi - lo) / levels, eps);
        zp = std::clamp<int64_t>(s.qmin - static_cast<int64_t>(std::nearbyint(lo / scale)), s.qmin, s.qmax);
      }
    }
    q.scale.push_back(scale);
    q.zero_point.push_back(zp);
  }
  std::fesetround(saved);
  return q;
}

}  // namespace kiln::quant
