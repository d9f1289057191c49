// The f32 GEMM yardstick: this machine's measured FMA peak and what oneDNN's matmul reaches of
// it, on the shapes kiln's own GEMM templates will be held to (M=N=K=1024 and BERT-base's
// 128x768x768, 128x768x3072, 128x3072x768), in the same run so that the percentages compare.
//
//   kiln_bench_gemm [--runs N] [--threads T]
//
// The peak is probed, not looked up: a loop of independent FMAs on 16 vector accumulators
// (enough to hide the FMA latency on two ports), AVX-512 where the CPU has it and AVX2+FMA
// otherwise, chosen at run time. oneDNN's B is constant and reordered ahead into the layout
// it picks, as `kiln compile` stores it; each GEMM's time is the median of --runs calls.
#include <immintrin.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/target.h"
#include "runtime/threads.h"

namespace {

using clock_type = std::chrono::steady_clock;
using dnnl::memory;

int g_runs = 21;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// 16 independent accumulators; returns a value that depends on all of them, so that nothing is
// optimised away.
__attribute__((target("avx512f"))) float fma_loop_avx512(long iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long n = 0; n < iters; ++n)
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, s);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(long iters) {
  __m256 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long n = 0; n < iters; ++n)
    for (int i = 0; i < 16; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm256_add_ps(s, acc[i]);
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

// GFLOP/s of one thread's FMAs: the best of several half-second-ish probes (a probe that a
// neighbour's process interrupts only comes out slower).
double fma_peak_gflops(const kiln::CpuFeatures& cpu, const char*& isa) {
  const bool avx512 = cpu.avx512f;
  isa = avx512 ? "avx512" : "avx2";
  const int lanes = avx512 ? 16 : 8;
  const long iters = 20'000'000;
  volatile float sink = 0;
  double best = 0;
  for (int probe = 0; probe < 5; ++probe) {
    const auto t0 = clock_type::now();
    sink = sink + (avx512 ? fma_loop_avx512(iters) : fma_loop_avx2(iters));
    const double s = seconds_since(t0);
    best = std::max(best, static_cast<double>(iters) * 16 * lanes * 2 / s / 1e9);
  }
  return best;
}

struct Shape {
  int64_t m, n, k;
  const char* what;
};

// Median seconds of oneDNN's f32 matmul [m, k] x [k, n] with B reordered ahead.
double onednn_matmul_seconds(const Shape& s) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::desc a_md({s.m, s.k}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc b_plain({s.k, s.n}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc b_any({s.k, s.n}, memory::data_type::f32, memory::format_tag::any);
  const memory::desc c_md({s.m, s.n}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), eng);
  std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)), c(static_cast<size_t>(s.m * s.n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(static_cast<float>(i) * 0.01f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(static_cast<float>(i) * 0.01f);
  memory a_mem(a_md, eng, a.data()), b_src(b_plain, eng, b.data()), c_mem(c_md, eng, c.data());
  memory b_mem(pd.weights_desc(), eng);
  dnnl::reorder(b_src, b_mem).execute(strm, b_src, b_mem);
  dnnl::matmul prim(pd);
  auto run = [&] {
    prim.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    strm.wait();
  };
  for (int i = 0; i < 3; ++i) run();
  std::vector<double> t;
  for (int r = 0; r < g_runs; ++r) {
    const auto t0 = clock_type::now();
    run();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) g_runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: kiln_bench_gemm [--runs N] [--threads T]\n");
      return 2;
    }
  }
  const kiln::CpuFeatures& cpu = kiln::CpuFeatures::host();
  if (!cpu.avx2 || !cpu.fma) {
    std::fprintf(stderr, "kiln_bench_gemm: this CPU has no AVX2+FMA to probe\n");
    return 1;
  }
  kiln::use_threads(threads);  // oneDNN runs on kiln's pool, GNU OpenMP's
  const char* isa = "";
  const double core_peak = fma_peak_gflops(cpu, isa);
  const double peak = core_peak * threads;
  std::printf("# f32 FMA peak (%s, probed on one thread): %.1f GFLOP/s per core, %.1f for %d thread(s)\n", isa, core_peak, peak,
              threads);
  std::printf("# oneDNN %d.%d matmul, B reordered ahead; median of %d calls\n", dnnl_version()->major, dnnl_version()->minor,
              g_runs);
  std::printf("%-34s %10s %10s %8s\n", "shape (MxNxK)", "ms", "GFLOP/s", "of peak");
  for (const Shape& s : {Shape{1024, 1024, 1024, "square"}, Shape{128, 768, 768, "BERT attention proj"},
                         Shape{128, 3072, 768, "BERT FFN up"}, Shape{128, 768, 3072, "BERT FFN down"}}) {
    const double sec = onednn_matmul_seconds(s);
    const double gflops = 2.0 * static_cast<double>(s.m * s.n * s.k) / sec / 1e9;
    const std::string name = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " " + s.what;
    std::printf("%-34s %10.3f %10.1f %7.0f%%\n", name.c_str(), sec * 1e3, gflops, 100.0 * gflops / peak);
  }
  return 0;
}
