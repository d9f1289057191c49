// Tensor comparison for `kiln run --check-against` and the kernel tests.
#include "runtime/compare.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <type_traits>

namespace kiln {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Shortest text that reads back to the same 16-bit float (0.2 rather than 0.19995117).
template <class T>
std::string shortest_16(T v) {
  const float f = static_cast<float>(v);
  if (!std::isfinite(f)) return fmt_g(f);
  char buf[32];
  for (int digits = 1; digits < 10; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (T(std::strtof(buf, nullptr)).bits == v.bits) break;
  }
  return buf;
}

// Shortest text that reads back to the same value in the element's own precision.
std::string fmt_value(const Tensor& t, int64_t i) {
  char buf[64];
  std::to_chars_result r{};
  switch (t.dtype()) {
    case DType::f64: r = std::to_chars(buf, buf + sizeof buf, t.data<double>()[i]); break;
    case DType::f32: r = std::to_chars(buf, buf + sizeof buf, t.data<float>()[i]); break;
    case DType::f16: return shortest_16(t.data<half>()[i]);
    case DType::bf16: return shortest_16(t.data<bfloat16>()[i]);
    case DType::u64: r = std::to_chars(buf, buf + sizeof buf, t.data<uint64_t>()[i]); break;
    case DType::boolean: return t.data<bool>()[i] ? "true" : "false";
    default: r = std::to_chars(buf, buf + sizeof buf, t.as_int64(i)); break;
  }
  return std::string(buf, r.ptr);
}

std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = i % shape[k];
    i /= shape[k];
  }
  return idx;
}

// Running state of one comparison: the best candidates for "worst" and the error sums.
struct Scan {
  int64_t mismatches = 0;
  int64_t worst_fail = -1, worst_any = -1;
  double worst_fail_measure = -1, worst_any_measure = -1;
  double max_abs = 0, sum_d2 = 0, sum_b2 = 0;
  bool nonfinite_mismatch = false;

  // `measure` is how far past its tolerance the element is (> 1 fails, inf for non-finite).
  void add(int64_t i, bool ok, double measure) {
    if (!ok) {
      ++mismatches;
      if (measure > worst_fail_measure) {
        worst_fail_measure = measure;
        worst_fail = i;
      }
    }
    if (measure > worst_any_measure) {
      worst_any_measure = measure;
      worst_any = i;
    }
  }
};

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return static_cast<float>(v);
  else return static_cast<double>(v);
}

template <class TA, class TB>
void scan_float(const TA* a, const TB* b, int64_t n, const CompareOptions& o, Scan& s) {
  for (int64_t i = 0; i < n; ++i) {
    double x = to_double(a[i]), y = to_double(b[i]);
    if (std::isnan(x) || std::isnan(y) || std::isinf(x) || std::isinf(y)) {
      bool ok = (std::isnan(x) && std::isnan(y)) || x == y;
      if (!ok) {
        s.nonfinite_mismatch = true;
        s.max_abs = kInf;
      }
      s.add(i, ok, ok ? 0 : kInf);
      continue;
    }
    double d = std::fabs(x - y);
    double tol = o.atol + o.rtol * std::fabs(y);
    bool ok = d <= tol;
    s.add(i, ok, tol > 0 ? d / tol : (d > 0 ? kInf : 0));
    s.max_abs = std::max(s.max_abs, d);
    s.sum_d2 += d * d;
    s.sum_b2 += y * y;
  }
}

template <class T>
void scan_exact(const T* a, const T* b, int64_t n, Scan& s) {
  for (int64_t i = 0; i < n; ++i) {
    double d;
    if constexpr (std::is_signed_v<T>)  // in double: a 64-bit difference may overflow
      d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    else  // larger minus smaller keeps full precision for unsigned values
      d = static_cast<double>(a[i] >= b[i] ? a[i] - b[i] : b[i] - a[i]);
    bool ok = a[i] == b[i];
    s.add(i, ok, d);
    s.max_abs = std::max(s.max_abs, d);
    s.sum_d2 += d * d;
    s.sum_b2 += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
}

}  // namespace

std::string index_str(const std::vector<int64_t>& index) {
  std::string s = "[";
  for (size_t i = 0; i < index.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(index[i]);
  }
  return s + "]";
}

CompareResult compare_tensors(const Tensor& actual, const Tensor& expected, const CompareOptions& options) {
  CompareResult r;
  const DType da = actual.dtype(), db = expected.dtype();
  if (da != db && !(da == DType::bf16 && db == DType::f32)) {
    r.kind = CompareResult::Kind::dtype_mismatch;
    r.pass = false;
    r.summary = "dtype mismatch: got " + std::string(dtype_name(da)) + ", expected " + std::string(dtype_name(db));
    return r;
  }
  if (actual.shape() != expected.shape()) {
    r.kind = CompareResult::Kind::shape_mismatch;
    r.pass = false;
    r.summary = "shape mismatch: got " + shape_str(actual.shape()) + ", expected " + shape_str(expected.shape());
    return r;
  }
  r.numel = actual.numel();
  const bool exact = !is_float(da);
  Scan s;
  if (da == DType::bf16 && db == DType::f32) {
    scan_float(actual.data<bfloat16>(), expected.data<float>(), r.numel, options, s);
  } else if (is_int4(da)) {
    const std::vector<int64_t> a = actual.to_int64_vector(), b = expected.to_int64_vector();
    scan_exact(a.data(), b.data(), r.numel, s);
  } else {
    visit_dtype(da, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>)
        scan_exact(actual.data<uint8_t>(), expected.data<uint8_t>(), r.numel, s);
      else if constexpr (std::is_integral_v<T>)
        scan_exact(actual.data<T>(), expected.data<T>(), r.numel, s);
      else
        scan_float(actual.data<T>(), expected.data<T>(), r.numel, options, s);
    });
  }

  r.mismatches = s.mismatches;
  r.pass = s.mismatches == 0;
  r.kind = r.pass ? CompareResult::Kind::ok : CompareResult::Kind::value_mismatch;
  r.max_abs_error = s.max_abs;
  double num = std::sqrt(s.sum_d2), den = std::sqrt(s.sum_b2);
  r.rel_l2_error = s.nonfinite_mismatch ? kInf : den > 0 ? num / den : num > 0 ? kInf : 0;
  int64_t worst = r.pass ? s.worst_any : s.worst_fail;
  if (worst >= 0) {
    r.has_worst = true;
    r.worst_index = unravel(worst, actual.shape());
    r.worst_actual = actual.as_double(worst);
    r.worst_expected = expected.as_double(worst);
  }

  std::string rule = exact ? "exact match required for " + std::string(dtype_name(da))
                           : "atol " + fmt_g(options.atol) + ", rtol " + fmt_g(options.rtol);
  std::string errors = "max abs error " + fmt_g(r.max_abs_error) + ", relative l2 error " + fmt_g(r.rel_l2_error);
  std::string count = std::to_string(r.numel) + (r.numel == 1 ? " element" : " elements");
  if (r.numel == 0) {
    r.summary = "no elements to compare (shape " + shape_str(actual.shape()) + ")";
  } else if (r.pass) {
    r.summary = "all " + count + " match (" + rule + "); " + errors;
  } else {
    r.summary = std::to_string(r.mismatches) + " of " + count + " differ (" + rule + "); worst at " +
                index_str(r.worst_index) + ": got " + fmt_value(actual, worst) + ", expected " +
                fmt_value(expected, worst) + "; " + errors;
  }
  return r;
}

}  // namespace kiln
