// Reference kernels of the signal ops: window functions, MelWeightMatrix, DFT and STFT. The DFTs
// are direct O(n * L) sums in double with exact twiddle indices (k * t mod L), which is plenty
// for a reference and avoids an FFT's length restrictions.
#include <cmath>
#include <numbers>
#include <vector>

#include "formats/checked.h"
#include "runtime/kernel.h"

namespace kiln {

void register_ref_misc_signal(KernelRegistry& r);

namespace {

constexpr double kPi = std::numbers::pi;

void store_doubles(Tensor& t, const std::vector<double>& v) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_same_v<T, double>) p[i] = v[i];
      else if constexpr (std::is_same_v<T, bool>) p[i] = v[i] != 0;
      else p[i] = static_cast<T>(static_cast<float>(v[i]));
    }
  });
}

enum class Window { hann, hamming, blackman };

template <Window W>
Status ref_window(KernelContext& ctx) {
  const int64_t size = ctx.input(0).as_int64(0);
  const bool periodic = ctx.node().attr_int("periodic", 1) != 0;
  const double n1 = static_cast<double>(periodic ? size : size - 1);
  Tensor& out = ctx.output(0);  // sized by inference from `size`, within the memory budget
  std::vector<double> v(static_cast<size_t>(out.numel()));
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double x = static_cast<double>(i);
    double y;
    if constexpr (W == Window::hann) {
      double s = std::sin(x * kPi / n1);
      y = s * s;
    } else if constexpr (W == Window::hamming) {
      y = 25.0 / 46.0 - (1.0 - 25.0 / 46.0) * std::cos(x * kPi * 2 / n1);
    } else {
      y = 0.42 - 0.5 * std::cos(x * kPi * 2 / n1) + 0.08 * std::cos(x * kPi * 4 / n1);
    }
    v[static_cast<size_t>(i)] = y;
  }
  store_doubles(out, v);
  return {};
}

Status ref_mel(KernelContext& ctx) {
  const int64_t bins = ctx.input(0).as_int64(0), len = ctx.input(1).as_int64(0), rate = ctx.input(2).as_int64(0);
  const double lo = ctx.input(3).as_double(0), hi = ctx.input(4).as_double(0);
  if (rate <= 0) return ctx.error("sample_rate " + std::to_string(rate) + " must be positive");
  const int64_t spec = len / 2 + 1;
  const double lo_mel = 2595.0 * std::log10(1.0 + lo / 700.0), hi_mel = 2595.0 * std::log10(1.0 + hi / 700.0);
  const double step = (hi_mel - lo_mel) / static_cast<double>(bins + 2);
  std::vector<int64_t> f(static_cast<size_t>(bins + 2));
  for (int64_t i = 0; i < bins + 2; ++i) {
    double hz = 700.0 * (std::pow(10.0, (static_cast<double>(i) * step + lo_mel) / 2595.0) - 1.0);
    f[static_cast<size_t>(i)] = saturate_to_int64(std::floor(static_cast<double>(len + 1) * hz / static_cast<double>(rate)));
  }
  for (int64_t v : f)
    if (v < 0 || v >= spec)
      return ctx.error("mel band edge falls on spectrogram bin " + std::to_string(v) + ", outside 0.." + std::to_string(spec - 1) +
                       "; check the edge frequencies against sample_rate");
  std::vector<double> out(static_cast<size_t>(spec * bins), 0.0);
  for (int64_t i = 0; i < bins; ++i) {
    const int64_t l = f[static_cast<size_t>(i)], c = f[static_cast<size_t>(i + 1)], h = f[static_cast<size_t>(i + 2)];
    if (c == l) out[static_cast<size_t>(c * bins + i)] = 1.0;
    else
      for (int64_t j = l; j <= c; ++j) out[static_cast<size_t>(j * bins + i)] = static_cast<double>(j - l) / static_cast<double>(c - l);
    if (h > c)
      for (int64_t j = c; j < h; ++j) out[static_cast<size_t>(j * bins + i)] = static_cast<double>(h - j) / static_cast<double>(h - c);
  }
  store_doubles(ctx.output(0), out);
  return {};
}

// cos / sin of 2 pi m / L for m in [0, L).
struct Twiddles {
  std::vector<double> c, s;
  explicit Twiddles(int64_t L) : c(static_cast<size_t>(L)), s(static_cast<size_t>(L)) {
    for (int64_t m = 0; m < L; ++m) {
      double a = 2 * kPi * static_cast<double>(m) / static_cast<double>(L);
      c[static_cast<size_t>(m)] = std::cos(a);
      s[static_cast<size_t>(m)] = std::sin(a);
    }
  }
};

// One 1-D transform. in: n complex samples (im may be all zero); out: `count` samples.
// forward: X[k] = sum_t x[t] e^{-2 pi i k t / L}; inverse: x[t] = 1/L sum_k X[k] e^{2 pi i k t / L};
// irfft: the real inverse of a one-sided spectrum (Hermitian completion, like numpy.fft.irfft).
enum class Dft { forward, inverse, irfft };

void dft_1d(Dft mode, const std::vector<double>& re, const std::vector<double>& im, int64_t L, int64_t count,
            const Twiddles& tw, std::vector<double>& ore, std::vector<double>& oim) {
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(re.size()), L);
  for (int64_t k = 0; k < count; ++k) {
    double sr = 0, si = 0;
    if (mode == Dft::irfft) {
      const int64_t half = L / 2;
      for (int64_t j = 0; j <= half && j < static_cast<int64_t>(re.size()); ++j) {
        const size_t m = static_cast<size_t>((j * k) % L);
        const double xr = re[static_cast<size_t>(j)], xi = im[static_cast<size_t>(j)];
        if (j == 0 || (L % 2 == 0 && j == half)) sr += xr * tw.c[m];
        else sr += 2 * (xr * tw.c[m] - xi * tw.s[m]);
      }
      ore[static_cast<size_t>(k)] = sr / static_cast<double>(L);
      continue;
    }
    const double sign = mode == Dft::forward ? -1.0 : 1.0;
    for (int64_t t = 0; t < n; ++t) {
      const size_t m = static_cast<size_t>((k * t) % L);
      const double c = tw.c[m], s = sign * tw.s[m];
      const double xr = re[static_cast<size_t>(t)], xi = im[static_cast<size_t>(t)];
      sr += xr * c - xi * s;
      si += xr * s + xi * c;
    }
    if (mode == Dft::inverse) { sr /= static_cast<double>(L); si /= static_cast<double>(L); }
    ore[static_cast<size_t>(k)] = sr;
    oim[static_cast<size_t>(k)] = si;
  }
}

Status ref_dft(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Node& node = ctx.node();
  const bool inverse = node.attr_int("inverse", 0) != 0, onesided = node.attr_int("onesided", 0) != 0;
  int64_t axis = ctx.has_input(2) ? ctx.input(2).as_int64(0) : -2;
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank() - 1) return ctx.error("axis is out of range");
  const int64_t n = x.dim(axis), comps = x.dim(x.rank() - 1);
  int64_t L = ctx.has_input(1) ? ctx.input(1).as_int64(0) : (inverse && onesided ? 2 * (n - 1) : n);
  if (L <= 0) return ctx.error("dft_length " + std::to_string(L) + " must be positive");
  Tensor& y = ctx.output(0);
  const Dft mode = !inverse ? Dft::forward : onesided ? Dft::irfft : Dft::inverse;
  const int64_t count = y.dim(axis), ocomps = y.dim(y.rank() - 1);
  int64_t pre = 1, mid = 1;
  for (int64_t d = 0; d < axis; ++d) pre *= x.dim(d);
  for (int64_t d = axis + 1; d < x.rank() - 1; ++d) mid *= x.dim(d);
  Twiddles tw(L);
  std::vector<double> re(static_cast<size_t>(n)), im(static_cast<size_t>(n)), ore(static_cast<size_t>(count)),
      oim(static_cast<size_t>(count)), out(static_cast<size_t>(y.numel()));
  for (int64_t p = 0; p < pre; ++p)
    for (int64_t q = 0; q < mid; ++q) {
      for (int64_t t = 0; t < n; ++t) {
        const int64_t base = ((p * n + t) * mid + q) * comps;
        re[static_cast<size_t>(t)] = x.as_double(base);
        im[static_cast<size_t>(t)] = comps == 2 ? x.as_double(base + 1) : 0.0;
      }
      dft_1d(mode, re, im, L, count, tw, ore, oim);
      for (int64_t k = 0; k < count; ++k) {
        const int64_t base = ((p * count + k) * mid + q) * ocomps;
        out[static_cast<size_t>(base)] = ore[static_cast<size_t>(k)];
        if (ocomps == 2) out[static_cast<size_t>(base + 1)] = oim[static_cast<size_t>(k)];
      }
    }
  store_doubles(y, out);
  return {};
}

Status ref_stft(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const int64_t step = ctx.input(1).as_int64(0);
  const Tensor* window = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const int64_t batch = x.dim(0), len = x.dim(1), comps = x.dim(2);
  int64_t flen = ctx.has_input(3) ? ctx.input(3).as_int64(0) : window ? window->dim(0) : len;
  if (window && window->numel() != flen)
    return ctx.error("window has " + std::to_string(window->numel()) + " elements but the frame length is " + std::to_string(flen));
  if (step <= 0 || flen <= 0 || flen > len) return ctx.error("frame_step or frame length is out of range");
  Tensor& y = ctx.output(0);
  const int64_t frames = y.dim(1), bins = y.dim(2);
  Twiddles tw(flen);
  std::vector<double> re(static_cast<size_t>(flen)), im(static_cast<size_t>(flen)), ore(static_cast<size_t>(bins)),
      oim(static_cast<size_t>(bins)), out(static_cast<size_t>(y.numel()));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t f = 0; f < frames; ++f) {
      for (int64_t t = 0; t < flen; ++t) {
        const int64_t s = f * step + t;
        const double w = window ? window->as_double(t) : 1.0;
        const int64_t base = (b * len + s) * comps;
        re[static_cast<size_t>(t)] = s < len ? x.as_double(base) * w : 0.0;
        im[static_cast<size_t>(t)] = s < len && comps == 2 ? x.as_double(base + 1) * w : 0.0;
      }
      dft_1d(Dft::forward, re, im, flen, bins, tw, ore, oim);
      for (int64_t k = 0; k < bins; ++k) {
        const int64_t base = ((b * frames + f) * bins + k) * 2;
        out[static_cast<size_t>(base)] = ore[static_cast<size_t>(k)];
        out[static_cast<size_t>(base + 1)] = oim[static_cast<size_t>(k)];
      }
    }
  store_doubles(y, out);
  return {};
}

}  // namespace

void register_ref_misc_signal(KernelRegistry& r) {
  r.add_reference("HannWindow", ref_window<Window::hann>);
  r.add_reference("HammingWindow", ref_window<Window::hamming>);
  r.add_reference("BlackmanWindow", ref_window<Window::blackman>);
  r.add_reference("MelWeightMatrix", ref_mel);
  r.add_reference("DFT", ref_dft);
  r.add_reference("STFT", ref_stft);
}

}  // namespace kiln
