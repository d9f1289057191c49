// Order statistics of timings, shared by the report and the comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::profile {

/// Nearest-rank percentile of sorted values: the smallest value at least a fraction `q` of
/// them do not exceed; 0 for none.
inline double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

/// The median (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace kiln::profile
