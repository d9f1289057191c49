// Observers: the statistics calibration gathers on an edge, batch after batch, and the scale
// and zero point they give. Each is PT2E's observer of the same name, to its defaults and
// algorithm (`../shared/reference/pt2-anchors.md` §1.3), so calibrating the same data gives the
// same quantization parameters. Memory is bounded: per tensor two floats, per channel two per
// channel, the histogram 2048 bins — whatever the number of batches.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "formats/tensor.h"
#include "quant/spec.h"

namespace kiln::quant {

class Observer {
 public:
  virtual ~Observer() = default;
  /// Folds one batch (a float tensor: f32, f16, bf16 or f64) into the statistics. NaNs are
  /// skipped; the histogram skips infinities too (they would make the range infinite).
  virtual Status observe(const Tensor& x) = 0;
  virtual QParams qparams() const = 0;
  /// The range the parameters come from (per channel: one per channel; the histogram: the
  /// range its search chose). Empty before the first batch.
  virtual std::vector<float> min_vals() const = 0;
  virtual std::vector<float> max_vals() const = 0;
};

/// The observer `spec.observer` names (validate(spec) first); null for the placeholder, which
/// gathers nothing.
std::unique_ptr<Observer> make_observer(const QuantSpec& spec);

/// PT2E's HistogramObserver, exposed for its tests: 2048 bins over the running min..max; a
/// batch that widens the range upsamples the old histogram 16× and re-bins it into the new
/// range; qparams() searches, from both ends, for the range whose quantization to 2^bits levels
/// has the least L2 error (caffe2's NormMinimization, step 1e-5), then quantizes that range.
class HistogramObserver final : public Observer {
 public:
  static constexpr int kBins = 2048;
  static constexpr int kUpsampleRate = 16;

  explicit HistogramObserver(const QuantSpec& spec);
  Status observe(const Tensor& x) override;
  QParams qparams() const override;
  std::vector<float> min_vals() const override;
  std::vector<float> max_vals() const override;

  const std::vector<float>& histogram() const { return histogram_; }
  /// The running range every batch fell in (+inf, -inf before any).
  float observed_min() const { return min_; }
  float observed_max() const { return max_; }
  /// The range the L2 search keeps: [min + width·start, min + width·(end + 1)].
  std::pair<float, float> search_range() const;

 private:
  std::vector<float> bin(std::span<const float> values, float lo, float hi) const;
  std::vector<float> upscale(float orig_min, float orig_max, float new_min, float new_max) const;
  double quantization_error(int start_bin, int end_bin) const;

  QuantSpec spec_;
  int dst_bins_;
  float min_, max_;
  std::vector<float> histogram_;
};

}  // namespace kiln::quant
