// kiln's weight-only-quantized GEMM (runtime/cpu/gemm/woq.h) against an exact reference: B
// dequantized from its stored codes and the product taken in double. Every code type, a scale
// per column and per group (one that divides K and ones that do not), B plain and transposed,
// zero points absent and present, odd sizes (rows for the 16-bit path, for the dequantizing
// micro-kernel and for the dequantized slices, fewer panels than threads), strided A and C, with
// and without a bias + relu + residual epilogue, on one and two threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/gemm/woq.h"
#include "runtime/threads.h"

namespace kiln {
namespace {

namespace gemm = cpu::gemm;
using gemm::WoqCodes;

// 64-byte aligned storage, as pack_b_woq and the workspace want it.
struct alignas(64) Line {
  std::byte bytes[64];
};
std::vector<Line> lines(size_t bytes) { return std::vector<Line>((bytes + 63) / 64); }

const char* name(WoqCodes codes) {
  switch (codes) {
    case WoqCodes::s8: return "s8";
    case WoqCodes::u8: return "u8";
    case WoqCodes::s4: return "s4";
    case WoqCodes::u4: return "u4";
  }
  return "?";
}

bool nibbles(WoqCodes codes) { return codes == WoqCodes::s4 || codes == WoqCodes::u4; }

// The range of a code type's values, which its zero points share.
std::pair<int, int> code_range(WoqCodes codes) {
  switch (codes) {
    case WoqCodes::s8: return {-128, 127};
    case WoqCodes::u8: return {0, 255};
    case WoqCodes::s4: return {-8, 7};
    case WoqCodes::u4: return {0, 15};
  }
  return {0, 0};
}

// A quantized K×N weight as a model stores it (random codes, scales and zero points), and its
// values read back from the stored bytes the plain way.
struct Weight {
  gemm::WoqWeight w;
  std::vector<uint8_t> data;
  std::vector<float> scale;
  std::vector<int32_t> zero;

  Weight(WoqCodes codes, int64_t k, int64_t n, int64_t group, bool trans, bool zeros, std::mt19937& rng) {
    const int64_t count = k * n, groups = group > 0 ? (k + group - 1) / group : 1;
    data.resize(static_cast<size_t>(nibbles(codes) ? (count + 1) / 2 : count));
    for (auto& v : data) v = static_cast<uint8_t>(rng() % 256);
    const auto [lo, hi] = code_range(codes);
    std::uniform_real_distribution<float> s(0.005f, 0.02f);
    for (int64_t i = 0; i < groups * n; ++i) {
      scale.push_back(s(rng));
      if (zeros) zero.push_back(lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1)));
    }
    w = {.codes = codes, .data = data.data(), .trans = trans, .k = k, .n = n, .group = group, .scale = scale.data(),
         .zero = zeros ? zero.data() : nullptr};
  }

  int code(int64_t p, int64_t j) const {
    const int64_t at = w.trans ? j * w.k + p : p * w.n + j;
    switch (w.codes) {
      case WoqCodes::s8: return static_cast<int8_t>(data[static_cast<size_t>(at)]);
      case WoqCodes::u8: return data[static_cast<size_t>(at)];
      case WoqCodes::s4: {
        const int v = (data[static_cast<size_t>(at / 2)] >> (at % 2 * 4)) & 15;
        return v >= 8 ? v - 16 : v;
      }
      case WoqCodes::u4: return (data[static_cast<size_t>(at / 2)] >> (at % 2 * 4)) & 15;
    }
    return 0;
  }
  // The index of (p, j)'s scale and zero point.
  size_t param(int64_t p, int64_t j) const {
    if (w.group == 0) return static_cast<size_t>(j);
    const int64_t g = p / w.group, groups = (w.k + w.group - 1) / w.group;
    return static_cast<size_t>(w.trans ? j * groups + g : g * w.n + j);
  }
  double value(int64_t p, int64_t j) const {
    const size_t at = param(p, j);
    return (code(p, j) - (w.zero ? w.zero[at] : 0)) * double{scale[at]};
  }
  // A bound on the magnitudes the kernel's dequantization passes through for (p, j).
  double magnitude(int64_t p, int64_t j) const {
    const size_t at = param(p, j);
    return (std::abs(code(p, j)) + std::abs(w.zero ? w.zero[at] : 0) + 8) * double{scale[at]};
  }
};

struct WoqCase {
  WoqCodes codes;
  int64_t group;
  bool trans, zeros;
  int64_t m, n, k;
  int threads;
  bool f32_path = false;  // the f32 paths where the 16-bit path would run

  std::string str() const {
    return std::string(name(codes)) + " group=" + std::to_string(group) + (trans ? " transB" : "") +
           (zeros ? " zero points" : "") + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           " threads=" + std::to_string(threads) + (f32_path ? " f32 path" : "");
  }
};

// The step to which gemm_woq rounds each of a row's K values of A (woq.h), and the blocks of
// K it rounds them in; no blocks and steps of 0 where it takes an f32 path: per block of
// kWoqABlock values within each group, the block's largest |a| / 32767 / 2^15.
struct Steps {
  std::vector<double> of;
  int64_t blocks = 0;
};
Steps rounding_steps(const WoqCase& t, bool split_a, const float* row) {
  Steps step{std::vector<double>(static_cast<size_t>(t.k), 0.0)};
  if (!split_a) return step;
  const int64_t length = t.group > 0 ? t.group : t.k;
  for (int64_t g0 = 0; g0 < t.k; g0 += length)
    for (int64_t k0 = g0; k0 < std::min(t.k, g0 + length); k0 += gemm::kWoqABlock, ++step.blocks) {
      const int64_t end = std::min({t.k, g0 + length, k0 + gemm::kWoqABlock});
      double top = 0;
      for (int64_t p = k0; p < end; ++p) top = std::max(top, double{std::abs(row[p])});
      for (int64_t p = k0; p < end; ++p) step.of[static_cast<size_t>(p)] = top / 32767 / 32768;
    }
  return step;
}

// Runs one case twice, C = A·B and C = relu(A·B + bias) + Z (A with `outlier` every 37 values
// where it is not 0), and checks both against the
// reference within a bound on f32's rounding over K terms (and, where gemm_woq splits A into
// 16-bit integers, half a step of each value times its weight); C's padding must stay untouched.
void check(const WoqCase& t, std::mt19937& rng, float outlier = 0) {
  SCOPED_TRACE(t.str());
  const int64_t lda = t.k + 3, ldc = t.n + 5;
  const Weight b(t.codes, t.k, t.n, t.group, t.trans, t.zeros, rng);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(t.m * lda)), bias(static_cast<size_t>(t.n)), z(static_cast<size_t>(t.m * t.n));
  for (auto& v : a) v = dist(rng);
  for (size_t i = 0; outlier != 0 && i < a.size(); i += 37) a[i] = outlier;  // a value far above the rest of its block
  for (auto& v : bias) v = dist(rng);
  for (auto& v : z) v = dist(rng);
  std::vector<Line> packed = lines(static_cast<size_t>(gemm::packed_b_woq_bytes(b.w)));
  gemm::pack_b_woq(b.w, packed[0].bytes);
  const bool split_a = !t.f32_path && gemm::woq_splits_a(CpuFeatures::host(), t.m, t.group);
  std::vector<Line> ws = lines(gemm::woq_workspace_bytes(t.m, t.n, t.k, t.group, t.threads, split_a));
  for (Line& l : ws) std::memset(l.bytes, 0x5a, sizeof l.bytes);  // a workspace is not zeroed
  // B's values and magnitudes, K×N, read once for all the rows.
  std::vector<double> bv(static_cast<size_t>(t.k * t.n)), bm(bv.size());
  for (int64_t p = 0; p < t.k; ++p)
    for (int64_t j = 0; j < t.n; ++j) {
      bv[static_cast<size_t>(p * t.n + j)] = b.value(p, j);
      bm[static_cast<size_t>(p * t.n + j)] = b.magnitude(p, j);
    }
  const gemm::Epilogue fused{.bias = bias.data(), .z = z.data(), .ldz = t.n, .act = {Activation::relu}};
  for (const gemm::Epilogue& ep : {gemm::Epilogue{}, fused}) {
    const float sentinel = 12345.f;
    std::vector<float> c(static_cast<size_t>(t.m * ldc), sentinel);
    gemm::gemm_woq(t.m, t.n, t.k, a.data(), lda, packed[0].bytes, t.codes, t.group, split_a, ep, c.data(), ldc, t.threads,
                   ws.empty() ? nullptr : ws[0].bytes);
    for (int64_t i = 0; i < t.m; ++i) {
      const Steps step = rounding_steps(t, split_a, a.data() + i * lda);
      for (int64_t j = 0; j < t.n; ++j) {
        double s = 0, mag = 0, rounding = 0;
        for (int64_t p = 0; p < t.k; ++p) {
          const double av = a[static_cast<size_t>(i * lda + p)];
          s += av * bv[static_cast<size_t>(p * t.n + j)];
          mag += std::abs(av) * bm[static_cast<size_t>(p * t.n + j)];
          rounding += step.of[static_cast<size_t>(p)] / 2 * std::abs(bv[static_cast<size_t>(p * t.n + j)]);
        }
        if (ep.bias) s = std::max(0.0, s + bias[static_cast<size_t>(j)]) + z[static_cast<size_t>(i * t.n + j)];
        // The 16-bit path's sums are exact integers, rounded a few times a block: its bound
        // counts blocks, not K's terms.
        const double terms = static_cast<double>(step.blocks > 0 ? step.blocks + 4 : t.k + 2);
        const double tol = 8 * std::ldexp(1.0, -24) * terms * (mag + 2) + 1.001 * rounding;
        ASSERT_NEAR(c[static_cast<size_t>(i * ldc + j)], s, tol) << "at " << i << "," << j << (ep.bias ? " fused" : "");
      }
      for (int64_t j = t.n; j < ldc; ++j)
        ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], sentinel) << "padding written at " << i << "," << j;
    }
  }
}

// Every size, group, layout and zero point of one code type on one thread (an odd group keeps
// the f32 paths for the rows the 16-bit path takes on a CPU with VNNI; f32_path keeps them at
// the groups it takes too). On two threads, groups with zero points, both layouts, and the sizes that split B's panels (N = 130) or, with
// fewer panels than threads, M (N = 47): the split depends on nothing else, and a parallel
// region costs milliseconds on a loaded machine.
void check_all(WoqCodes codes) {
  if (auto why = gemm::woq_lacks(CpuFeatures::host())) GTEST_SKIP() << *why;
  std::mt19937 rng(static_cast<unsigned>(codes) + 1);
  const std::vector<int64_t> ms = {1, 3, 12, 17, 70}, ks = {1, 5, 64, 100, 300};
  for (int threads : {1, 2}) {
    use_threads(threads);
    const std::vector<int64_t> ns = threads == 1 ? std::vector<int64_t>{1, 47, 64, 130} : std::vector<int64_t>{47, 130};
    for (int64_t group : {0, 32, 33})
      for (bool trans : {false, true})
        for (bool zeros : {false, true}) {
          if (threads == 2 && (group == 0 || !zeros)) continue;
          for (int64_t m : ms)
            for (int64_t n : ns)
              for (int64_t k : ks) check({codes, group, trans, zeros, m, n, k, threads}, rng);
        }
  }
  // The f32 paths on the rows and groups the 16-bit path takes on a CPU with VNNI.
  use_threads(1);
  for (int64_t group : {0, 32})
    for (int64_t m : {1, 3})
      for (int64_t k : ks) check({codes, group, false, true, m, 47, k, 1, true}, rng);
  use_threads(available_cores());
}

TEST(GemmWoq, S8) { check_all(WoqCodes::s8); }
TEST(GemmWoq, U8) { check_all(WoqCodes::u8); }
TEST(GemmWoq, S4) { check_all(WoqCodes::s4); }
TEST(GemmWoq, U4) { check_all(WoqCodes::u4); }

// A K longer than the dequantized slices (on any L2 up to 2 MB), with a group that straddles
// them and one that is K itself, on rows for the 16-bit path (2: many blocks a group), the
// micro-kernel (5) and the slices (20).
TEST(GemmWoq, LongGroups) {
  if (auto why = gemm::woq_lacks(CpuFeatures::host())) GTEST_SKIP() << *why;
  std::mt19937 rng(7);
  for (int64_t m : {2, 5, 20})
    for (int64_t group : {5000, 12000}) check({WoqCodes::s4, group, false, true, m, 70, 12000, 1}, rng);
}

// The 16-bit path keeps A to f32's precision where one value of a block is 10^4 times the others
// (one 16-bit integer a value would round those others by up to a third of their size).
TEST(GemmWoq, SixteenBitPathKeepsSmallValues) {
  if (!gemm::woq_splits_a(CpuFeatures::host(), 1, 32)) GTEST_SKIP() << "the 16-bit path needs avx512-vnni";
  std::mt19937 rng(11);
  for (WoqCodes codes : {WoqCodes::u4, WoqCodes::s8})
    for (int64_t group : {0, 32, 128})
      for (int64_t m : {1, 2, 4}) check({codes, group, false, true, m, 70, 300, 1}, rng, 1e4f);
}

}  // namespace
}  // namespace kiln
