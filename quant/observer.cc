#include "quant/observer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>

namespace kiln::quant {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// x's values as floats: where they lie for a plain f32 tensor (a calibration run's activations),
// else converted into `held`.
Result<std::span<const float>> float_values(const Tensor& x, std::vector<float>& held) {
  if (!is_float(x.dtype()))
    return user_error("", "an observer takes floating-point values, got " + std::string(dtype_name(x.dtype())));
  if (x.dtype() == DType::f32 && !x.is_packed()) return std::span<const float>(x.data<float>(), static_cast<size_t>(x.numel()));
  std::vector<double> d = x.to_double_vector();
  held.assign(d.begin(), d.end());
  return std::span<const float>(held);
}

// min/max per tensor, plain or as a moving average (PT2E: the first batch sets them).
class MinMaxObserver final : public Observer {
 public:
  MinMaxObserver(const QuantSpec& spec, bool moving) : spec_(spec), moving_(moving) {}
  Status observe(const Tensor& x) override {
    std::vector<float> held;
    KILN_ASSIGN_OR_RETURN(std::span<const float> v, float_values(x, held));
    float lo = kInf, hi = -kInf;
    for (float f : v)
      if (!std::isnan(f)) lo = std::min(lo, f), hi = std::max(hi, f);
    if (lo > hi) return {};  // nothing but NaNs (or nothing)
    if (!seen_ || !moving_) {
      min_ = seen_ ? std::min(min_, lo) : lo;
      max_ = seen_ ? std::max(max_, hi) : hi;
    } else {
      const float c = static_cast<float>(spec_.averaging_constant);
      min_ = min_ + c * (lo - min_);
      max_ = max_ + c * (hi - max_);
    }
    seen_ = true;
    return {};
  }
  QParams qparams() const override { return calculate_qparams({seen_ ? min_ : kInf}, {seen_ ? max_ : -kInf}, spec_); }
  std::vector<float> min_vals() const override { return seen_ ? std::vector<float>{min_} : std::vector<float>{}; }
  std::vector<float> max_vals() const override { return seen_ ? std::vector<float>{max_} : std::vector<float>{}; }

 private:
  QuantSpec spec_;
  bool moving_;
  bool seen_ = false;
  float min_ = kInf, max_ = -kInf;
};

// min/max per index of ch_axis (or per block along it), plain or as a moving average.
class PerChannelObserver final : public Observer {
 public:
  PerChannelObserver(const QuantSpec& spec, bool moving) : spec_(spec), moving_(moving) {}
  Status observe(const Tensor& x) override {
    if (spec_.ch_axis >= x.rank())
      return user_error("", "ch_axis " + std::to_string(spec_.ch_axis) + " is past the rank " + std::to_string(x.rank()) + " of the values");
    std::vector<float> held;
    KILN_ASSIGN_OR_RETURN(std::span<const float> v, float_values(x, held));
    const ChannelIndex index(x.shape(), spec_.ch_axis, spec_.block_size);
    const int64_t channels = index.count(x.numel());
    if (!min_.empty() && static_cast<int64_t>(min_.size()) != channels)
      return user_error("", "values with " + std::to_string(channels) + " channels after " + std::to_string(min_.size()));
    std::vector<float> lo(static_cast<size_t>(channels), kInf), hi(static_cast<size_t>(channels), -kInf);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float f = v[static_cast<size_t>(i)];
      if (std::isnan(f)) continue;
      const auto c = static_cast<size_t>(index(i));
      lo[c] = std::min(lo[c], f);
      hi[c] = std::max(hi[c], f);
    }
    if (min_.empty()) {
      min_ = lo;
      max_ = hi;
      return {};
    }
    const float k = static_cast<float>(spec_.averaging_constant);
    for (size_t c = 0; c < lo.size(); ++c) {
      if (lo[c] > hi[c]) continue;
      if (min_[c] > max_[c] || !moving_) {  // a channel seen for the first time, or plain min/max
        min_[c] = std::min(min_[c], lo[c]);
        max_[c] = std::max(max_[c], hi[c]);
      } else {
        min_[c] = min_[c] + k * (lo[c] - min_[c]);
        max_[c] = max_[c] + k * (hi[c] - max_[c]);
      }
    }
    return {};
  }
  QParams qparams() const override {
    if (min_.empty()) return calculate_qparams({kInf}, {-kInf}, spec_);
    return calculate_qparams(min_, max_, spec_);
  }
  std::vector<float> min_vals() const override { return min_; }
  std::vector<float> max_vals() const override { return max_; }

 private:
  QuantSpec spec_;
  bool moving_;
  std::vector<float> min_, max_;
};

// Values a block of kLanes at a time, each lane a running result of its own, so that the
// compiler takes a block as vectors.
constexpr size_t kLanes = 16;

// The smallest and the largest finite value, each the one std::minmax_element finds (the first
// smallest, the last largest: which of 0 and -0, where both are there); lo > hi where there is
// none.
std::pair<float, float> finite_range(std::span<const float> v) {
  float l[kLanes], h[kLanes];
  std::fill_n(l, kLanes, kInf);
  std::fill_n(h, kLanes, -kInf);
  size_t i = 0;
  for (; i + kLanes <= v.size(); i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) {
      const float f = v[i + j];
      const bool finite = f - f == 0.0f;  // NaN for infinities and NaNs
      l[j] = finite && f < l[j] ? f : l[j];
      h[j] = finite && f > h[j] ? f : h[j];
    }
  for (; i < v.size(); ++i) {
    const float f = v[i];
    if (f - f == 0.0f) l[0] = std::min(l[0], f), h[0] = std::max(h[0], f);
  }
  float lo = kInf, hi = -kInf;
  for (size_t j = 0; j < kLanes; ++j) lo = std::min(lo, l[j]), hi = std::max(hi, h[j]);
  // Equal floats are the same bits but for 0 and -0.
  if (lo == 0.0f) lo = *std::find(v.begin(), v.end(), 0.0f);
  if (hi == 0.0f) hi = *std::find(v.rbegin(), v.rend(), 0.0f);
  return {lo, hi};
}

}  // namespace

std::unique_ptr<Observer> make_observer(const QuantSpec& spec) {
  switch (spec.observer) {
    case ObserverKind::min_max: return std::make_unique<MinMaxObserver>(spec, false);
    case ObserverKind::moving_average_min_max: return std::make_unique<MinMaxObserver>(spec, true);
    case ObserverKind::per_channel_min_max: return std::make_unique<PerChannelObserver>(spec, false);
    case ObserverKind::moving_average_per_channel_min_max: return std::make_unique<PerChannelObserver>(spec, true);
    case ObserverKind::histogram: return std::make_unique<HistogramObserver>(spec);
    case ObserverKind::placeholder: return nullptr;
  }
  return nullptr;
}

// ---- HistogramObserver ----------------------------------------------------------------------

HistogramObserver::HistogramObserver(const QuantSpec& spec)
    : spec_(spec), dst_bins_(spec.dtype == DType::i32 ? 1 << 16 : 256), min_(kInf), max_(-kInf), histogram_(kBins, 0.0f) {}

// torch.histc: kBins equal bins over [lo, hi], a value at hi in the last bin, values outside
// left out; an empty range [v, v] widens to [v − 1, v + 1].
std::vector<float> HistogramObserver::bin(std::span<const float> values, float lo, float hi) const {
  if (lo == hi) lo -= 1, hi += 1;
  // Counted in integers, in four histograms the values take in turn (a run of values in one bin
  // then does not wait on its own sums): the counts a float's += 1 makes while a bin holds fewer
  // than 2^24 values of one call, exact past that.
  constexpr size_t kWays = 4;
  std::vector<uint32_t> counts(kWays * kBins, 0);
  // A value's bin, in float as torch.histc computes on f32 values; -1 outside [lo, hi] (NaN
  // too). A quotient just past the last bin is the last; one past the float range (where the
  // range itself is: infinite or NaN) bin 0, as the x86 conversion clamped put it before.
  const float scale = static_cast<float>(kBins), width = hi - lo;
  auto bin_of = [&](float v) {
    const bool in = v >= lo && v <= hi;
    const float r = (in ? v - lo : 0.0f) * scale / width;
    return !in ? -1 : r < scale ? static_cast<int32_t>(r) : r - r == 0.0f ? kBins - 1 : 0;
  };
  // Each block's bins first (the compiler takes a whole block as vectors), then counted.
  int32_t bins[kLanes];
  for (size_t i = 0; i < values.size(); i += kLanes) {
    const size_t n = std::min(kLanes, values.size() - i);
    if (n == kLanes) {
      for (size_t j = 0; j < kLanes; ++j) bins[j] = bin_of(values[i + j]);
    } else {
      for (size_t j = 0; j < n; ++j) bins[j] = bin_of(values[i + j]);
    }
    for (size_t j = 0; j < n; ++j)
      if (bins[j] >= 0) ++counts[j % kWays * kBins + static_cast<size_t>(bins[j])];
  }
  std::vector<float> h(kBins);
  for (size_t b = 0; b < kBins; ++b) {
    uint64_t n = 0;
    for (size_t w = 0; w < kWays; ++w) n += counts[w * kBins + b];
    h[b] = static_cast<float>(n);
  }
  return h;
}

// The histogram of [orig_min, orig_max] re-binned into [new_min, new_max]: each bin split into
// kUpsampleRate equal parts, each part's count placed at its midpoint (PT2E's _upscale_histogram).
std::vector<float> HistogramObserver::upscale(float orig_min, float orig_max, float new_min, float new_max) const {
  std::vector<float> out(kBins, 0.0f);
  const int fine = kBins * kUpsampleRate;
  const double width = (static_cast<double>(orig_max) - orig_min) / fine;
  const double new_width = (static_cast<double>(new_max) - new_min) / kBins;
  for (int i = 0; i < fine; ++i) {
    const double mid = orig_min + (i + 0.5) * width;
    int64_t b = new_width > 0 ? static_cast<int64_t>(std::floor((mid - new_min) / new_width)) : 0;
    b = std::clamp<int64_t>(b, 0, kBins - 1);
    out[static_cast<size_t>(b)] += histogram_[static_cast<size_t>(i / kUpsampleRate)] / kUpsampleRate;
  }
  return out;
}

Status HistogramObserver::observe(const Tensor& x) {
  std::vector<float> held;
  KILN_ASSIGN_OR_RETURN(std::span<const float> v, float_values(x, held));
  // Infinities would make the range infinite; they are clamped when quantized anyway (and bin
  // leaves them out, as it does NaNs, being outside any finite range).
  const auto [lo, hi] = finite_range(v);
  if (lo > hi) return {};  // nothing finite (or nothing)
  if (min_ > max_) {  // the first batch
    min_ = lo;
    max_ = hi;
    histogram_ = bin(v, lo, hi);
    return {};
  }
  const float new_min = std::min(min_, lo), new_max = std::max(max_, hi);
  std::vector<float> update = bin(v, new_min, new_max);
  if (new_min == min_ && new_max == max_) {
    for (int i = 0; i < kBins; ++i) histogram_[static_cast<size_t>(i)] += update[static_cast<size_t>(i)];
  } else if (min_ == max_) {
    // Every earlier value was min_: they all land in its bin of the new range.
    float count = std::accumulate(histogram_.begin(), histogram_.end(), 0.0f);
    const float seen[] = {min_};
    std::vector<float> old = bin(seen, new_min, new_max);
    for (int i = 0; i < kBins; ++i) histogram_[static_cast<size_t>(i)] = update[static_cast<size_t>(i)] + old[static_cast<size_t>(i)] * count;
  } else {
    std::vector<float> old = upscale(min_, max_, new_min, new_max);
    for (int i = 0; i < kBins; ++i) histogram_[static_cast<size_t>(i)] = update[static_cast<size_t>(i)] + old[static_cast<size_t>(i)];
  }
  min_ = new_min;
  max_ = new_max;
  return {};
}

// The L2 error of quantizing the histogram's bins start..end to dst_bins_ levels: within each
// destination bin the values are spread uniformly over their source bins, and each is moved to
// its destination bin's centre (PT2E's _compute_quantization_error).
double HistogramObserver::quantization_error(int start_bin, int end_bin) const {
  const double bin_width = (static_cast<double>(max_) - min_) / kBins;
  const double dst_width = bin_width * (end_bin - start_bin + 1) / dst_bins_;
  if (dst_width == 0.0) return 0.0;
  auto norm = [](double begin, double end, double density) { return density * (end * end * end - begin * begin * begin) / 3; };
  double total = 0;
  for (int src = 0; src < kBins; ++src) {
    const double density = histogram_[static_cast<size_t>(src)] / bin_width;
    if (density == 0) continue;
    const double begin = (src - start_bin) * bin_width, end = begin + bin_width;
    const double dst_of_begin = std::clamp(std::floor(begin / dst_width), 0.0, dst_bins_ - 1.0);
    const double dst_of_end = std::clamp(std::floor(end / dst_width), 0.0, dst_bins_ - 1.0);
    const double begin_centre = (dst_of_begin + 0.5) * dst_width;
    const double end_centre = dst_of_end * dst_width + dst_width / 2;
    total += norm(begin - begin_centre, dst_width / 2, density);
    total += (dst_of_end - dst_of_begin - 1) * norm(-dst_width / 2, dst_width / 2, density);
    total += norm(-dst_width / 2, end - end_centre, density);
  }
  return total;
}

// PT2E's _non_linear_param_search: narrow the range from whichever end holds less of the mass,
// 1e-5 of it at a time, while the quantization error keeps falling.
std::pair<float, float> HistogramObserver::search_range() const {
  double total = 0;
  std::vector<double> csum(kBins);
  for (int i = 0; i < kBins; ++i) csum[static_cast<size_t>(i)] = total += histogram_[static_cast<size_t>(i)];
  const double step = 1e-5;
  double alpha = 0, beta = 1, norm_min = std::numeric_limits<double>::infinity();
  int start_bin = 0, end_bin = kBins - 1;
  while (alpha < beta) {
    const double next_alpha = alpha + step, next_beta = beta - step;
    int l = start_bin, r = end_bin;
    while (l < end_bin && csum[static_cast<size_t>(l)] <= next_alpha * total) ++l;
    while (r > start_bin && csum[static_cast<size_t>(r)] > next_beta * total) --r;
    int next_start = start_bin, next_end = end_bin;
    if (l - start_bin > end_bin - r) {
      next_start = l;
      alpha = next_alpha;
    } else {
      next_end = r;
      beta = next_beta;
    }
    if (next_start == start_bin && next_end == end_bin) continue;
    const double norm = quantization_error(next_start, next_end);
    if (norm > norm_min) break;
    norm_min = norm;
    start_bin = next_start;
    end_bin = next_end;
  }
  const float width = (max_ - min_) / kBins;
  return {min_ + width * static_cast<float>(start_bin), min_ + width * static_cast<float>(end_bin + 1)};
}

QParams HistogramObserver::qparams() const {
  if (min_ > max_) return calculate_qparams({kInf}, {-kInf}, spec_);
  auto [lo, hi] = search_range();
  return calculate_qparams({lo}, {hi}, spec_);
}

std::vector<float> HistogramObserver::min_vals() const {
  return min_ > max_ ? std::vector<float>{} : std::vector<float>{search_range().first};
}
std::vector<float> HistogramObserver::max_vals() const {
  return min_ > max_ ? std::vector<float>{} : std::vector<float>{search_range().second};
}

}  // namespace kiln::quant
