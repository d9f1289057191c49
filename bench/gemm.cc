// The f32 GEMM yardstick: this machine's measured FMA peak, and what oneDNN's matmul and kiln's
// own GEMM templates reach of it, on the shapes the templates are held to (M=N=K=1024 and
// BERT-base's 128x768x768, 128x768x3072, 128x3072x768), in the same run, calls interleaved, so
// that the percentages and the ratio compare.
//
//   kiln_bench_gemm [--runs N] [--threads T] [--sweep | --tiles] [--shape MxNxK]... [--no-amx] [--cold]
//   kiln_bench_gemm --woq [--group G] [--f32-path] [--runs N] [--threads T]
//
// The peak is probed, not looked up, by `kiln profile`'s ceilings probe (profile/ceilings.h):
// independent FMAs on 16 zmm or 12 ymm accumulators (enough to hide the FMA latency on two
// ports), AVX-512 where the CPU has it and AVX2+FMA otherwise, chosen at run time, timed as one
// more call between the kernels' (PeakBeside) so that each share compares two medians taken
// at the same clock; --sweep's rows use the probe taken at the start. Both
// libraries' B is constant and packed ahead (oneDNN's into the layout it picks, kiln's for its
// tile), as `kiln compile` stores it; each GEMM's time is the median of --runs calls. kiln runs
// its default parameters (gemm::default_params), or with --sweep the fastest of every tile, Kc,
// A packing and thread grid, each printed as it is timed. --tiles instead times every tile of
// the ISA with its default parameters, calls interleaved (no oneDNN), marking the default
// tile. --shape replaces the held shapes with others (e.g. GPT-2's LM head, --shape
// 32x50257x768).
//
// --woq times the weight-only-quantized GEMM (runtime/cpu/gemm/woq.h) instead: kiln's f32 GEMM
// (B packed f32) against the same product with B as int8 codes (a scale per column) and as
// int4 codes (a scale per group of G, 128 unless --group says), on an LLM's 4096×4096 weight
// and BERT-base's FFN up (768×3072) at M = 1 and 8 (decode, where reading B is the cost) and
// 128 (prefill); B's GB/s is its packed bytes over the time. The weight-only GEMM takes its
// 16-bit path where it would in a model (gemm::woq_splits_a on this CPU); --f32-path keeps its
// f32 paths everywhere, to compare the two.
//
// On a CPU with AMX, kiln's u8s8 and bf16 GEMMs run on its tiles and are rated against the
// tiles' probes; --no-amx runs them on their AVX-512 kernels instead (vpdpbusd, vdpbf16ps) rated
// against those instructions' probes, with oneDNN held to AVX512-BF16 too, as on a CPU without
// AMX.
//
// --cold flushes each library's B (packed or reordered ahead) from the caches before each of its
// timed calls (`clflush`), so that it streams from memory while A and C stay where the calls
// before left them, as a layer's weight does in a model's run (gone from the caches since the
// run before, where the activations are the layers' own, warm); without it the calls before
// leave B in L3, or in L2 when it fits. The default table and the f16 and lower-precision ones;
// not --sweep or --tiles.
#include <emmintrin.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "profile/ceilings.h"
#include "runtime/cpu/gemm/gemm.h"
#include "runtime/cpu/gemm/lowp.h"
#include "runtime/cpu/gemm/woq.h"
#include "runtime/target.h"
#include "runtime/threads.h"

namespace {

using clock_type = std::chrono::steady_clock;
using dnnl::memory;
namespace gemm = kiln::cpu::gemm;

int g_runs = 21;

// --cold: the weights the functions of the next interleaved run read, for each function (in
// order) the bytes to flush before each of its timed calls; the run clears it.
struct Bytes {
  const void* at;
  size_t size;
};
bool g_cold = false;
std::vector<std::vector<Bytes>> g_weights;

void flush(const Bytes& b) {
  const auto* p = static_cast<const char*>(b.at);
  for (size_t i = 0; i < b.size; i += 64) _mm_clflush(p + i);
  _mm_mfence();
}

// 64-byte aligned storage, as kiln's tensors and packed weights have (glibc hands out large
// blocks 16 bytes past a page boundary, where every vector load of a packed B would straddle two
// cache lines); blocks of 2 MB or more are 2 MB aligned and offered to transparent huge pages,
// as the page cache behind a mapped model file may hold them.
template <class T>
struct Aligned {
  using value_type = T;
  Aligned() = default;
  template <class U>
  Aligned(const Aligned<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHuge) return static_cast<T*>(::operator new(bytes, std::align_val_t{64}));
    void* p = ::operator new(bytes, std::align_val_t{kHuge});
    ::madvise(p, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    ::operator delete(p, std::align_val_t{n * sizeof(T) < kHuge ? 64 : kHuge});
  }
  static constexpr size_t kHuge = size_t{2} << 20;
  template <class U>
  bool operator==(const Aligned<U>&) const { return true; }
};
template <class T>
using avec = std::vector<T, Aligned<T>>;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

struct Shape {
  int64_t m, n, k;
  const char* what;
};

avec<float> filled(int64_t count, float step, bool cosine) {
  avec<float> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i) v[i] = cosine ? std::cos(static_cast<float>(i) * step) : std::sin(static_cast<float>(i) * step);
  return v;
}

// The largest |x - y| over the largest |y|.
template <class V>
double max_rel_diff(const V& x, const V& y) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::abs(static_cast<double>(y[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// One shape's operands, and both libraries ready to run on them: oneDNN's matmul with B
// reordered ahead into the layout it picks, kiln's GEMM with B packed ahead (as `kiln compile`
// stores a weight).
struct Problem {
  Shape s;
  avec<float> a, b, c_onednn, c_kiln, b_packed;
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  memory a_mem, b_mem, c_mem;

  explicit Problem(const Shape& shape) : s(shape) {
    a = filled(s.m * s.k, 0.01f, false);
    b = filled(s.k * s.n, 0.01f, true);
    c_onednn.resize(static_cast<size_t>(s.m * s.n));
    c_kiln.resize(c_onednn.size());
    const memory::desc a_md({s.m, s.k}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc b_plain({s.k, s.n}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc b_any({s.k, s.n}, memory::data_type::f32, memory::format_tag::any);
    const memory::desc c_md({s.m, s.n}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), eng);
    a_mem = memory(a_md, eng, a.data());
    c_mem = memory(c_md, eng, c_onednn.data());
    memory b_src(b_plain, eng, b.data());
    b_mem = memory(pd.weights_desc(), eng);
    dnnl::reorder(b_src, b_mem).execute(strm, b_src, b_mem);
    strm.wait();
    prim = dnnl::matmul(pd);
  }
  void onednn() {
    prim.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    strm.wait();
  }
  // kiln's GEMM with these parameters; B packed for the parameters' tile.
  struct Kiln {
    gemm::GemmParams p;
    gemm::GemmProblem g;
    avec<std::byte> ws;
    avec<float> b_own;  // B packed for this one's tile (own_b), else in the problem's b_packed
  };
  // own_b: B packed into the returned one, so that several tiles can run side by side.
  Kiln kiln(const gemm::GemmParams& p, bool own_b = false) {
    Kiln k{p, {}, {}, {}};
    avec<float>& packed = own_b ? k.b_own : b_packed;
    packed.assign(static_cast<size_t>(gemm::packed_b_floats(s.k, s.n, p.tile.nr)), 0.f);
    gemm::pack_b(b.data(), s.n, false, s.k, s.n, p.tile.nr, packed.data());
    k.g = gemm::GemmProblem{.m = s.m, .n = s.n, .k = s.k, .a = a.data(), .lda = s.k, .b = packed.data(), .b_packed = true,
                            .c = c_kiln.data(), .ldc = s.n};
    k.ws.resize(gemm::workspace_bytes(p, k.g));
    return k;
  }
  static void run(Kiln& k) {
    gemm::run(k.p, k.g, k.ws.data());
  }
  // The largest difference between the two libraries' C, relative to C's largest magnitude.
  double disagreement() const { return max_rel_diff(c_kiln, c_onednn); }
};

template <class V>
Bytes bytes_of(const V& v) {
  return {v.data(), v.size() * sizeof(v[0])};
}
Bytes weights_of(const memory& m) { return {m.get_data_handle(), m.get_desc().get_size()}; }

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One precision's peak probed as a call of an interleaved run (one repeat, a few milliseconds),
// so that it runs at the clock the kernels beside it run at; its readings' median is the peak
// they are rated against. On the 2-core AMX Xeon an f32 GEMM between the calls slowed the f16
// GEMM after it and this probe alike (128x768x768: 0.37 -> 0.46 ms; the probe 455-475 -> 390-430
// GFLOP/s), where a probe taken alone at the start ran at f16's own clock.
struct PeakBeside {
  const kiln::CpuFeatures& cpu;
  std::string precision;
  int threads = 1;
  std::vector<double> readings;  // GFLOP/s of each call
  void operator()() { readings.push_back(kiln::profile::probe_compute_peak(cpu, precision, threads, 1)); }
};

// oneDNN's lower-precision matmul on one shape, as kiln's runtime/onednn/matmul.cc runs it
// (AMX where the CPU has it): u8 A with its zero point · s8 B (reordered ahead) scaled to f32,
// or f32 A reordered to bf16 on each call · bf16 B (reordered ahead) to f32.
struct OnednnLowp {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  std::optional<dnnl::reorder> to_bf16;
  memory a_in, a_mem, b_mem, c_mem;

  OnednnLowp(const Shape& s, bool int8, void* a, const float* b_f32, const int8_t* b_s8, float* c, int32_t a_zero, float scale) {
    using dt = memory::data_type;
    const dt lowp = int8 ? dt::s8 : dt::bf16;
    const memory::desc a_md({s.m, s.k}, int8 ? dt::u8 : dt::bf16, memory::format_tag::ab);
    const memory::desc b_any({s.k, s.n}, lowp, memory::format_tag::any);
    const memory::desc c_md({s.m, s.n}, dt::f32, memory::format_tag::ab);
    dnnl::primitive_attr attr;
    if (int8) {
      attr.set_output_scales(0, {scale});
      attr.set_zero_points(DNNL_ARG_SRC, 0, {a_zero});
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), attr, eng);
    c_mem = memory(c_md, eng, c);
    b_mem = memory(pd.weights_desc(), eng);
    if (int8) {
      a_mem = memory(a_md, eng, a);
      memory b_src({{s.k, s.n}, dt::s8, memory::format_tag::ab}, eng, const_cast<int8_t*>(b_s8));
      dnnl::reorder(b_src, b_mem).execute(strm, b_src, b_mem);
    } else {
      a_in = memory({{s.m, s.k}, dt::f32, memory::format_tag::ab}, eng, a);
      a_mem = memory(a_md, eng);
      to_bf16 = dnnl::reorder(a_in, a_mem);
      memory b_src({{s.k, s.n}, dt::f32, memory::format_tag::ab}, eng, const_cast<float*>(b_f32));
      dnnl::reorder(b_src, b_mem).execute(strm, b_src, b_mem);
    }
    strm.wait();
    prim = dnnl::matmul(pd);
  }
  void run() {
    if (to_bf16) to_bf16->execute(strm, a_in, a_mem);
    prim.execute(strm, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    strm.wait();
  }
};

// Median seconds of each function, their calls interleaved so that a neighbour's load falls
// on both alike; (max - min) / median of each is returned in `spread`.
std::vector<double> interleaved_all(std::vector<double>& spread, const std::vector<std::function<void()>>& f) {
  for (int w = 0; w < 3; ++w)
    for (auto& fn : f) fn();
  std::vector<std::vector<double>> t(f.size());
  for (int r = 0; r < g_runs; ++r)
    for (size_t i = 0; i < f.size(); ++i) {
      if (g_cold && i < g_weights.size())
        for (const Bytes& b : g_weights[i]) flush(b);
      const auto t0 = clock_type::now();
      f[i]();
      t[i].push_back(seconds_since(t0));
    }
  g_weights.clear();
  std::vector<double> med;
  spread.clear();
  for (auto& ti : t) {
    med.push_back(median(ti));
    spread.push_back((*std::max_element(ti.begin(), ti.end()) - *std::min_element(ti.begin(), ti.end())) / med.back());
  }
  return med;
}
template <class... F>
std::vector<double> interleaved(std::vector<double>& spread, F&&... fns) {
  return interleaved_all(spread, {fns...});
}

double gflops(const Shape& s, double sec) { return 2.0 * static_cast<double>(s.m * s.n * s.k) / sec / 1e9; }

std::string shape_name(const Shape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + " " + s.what;
}

// `bytes` rounded up to whole cache lines.
std::byte* aligned(avec<std::byte>& v, size_t bytes) {
  v.resize((bytes + 63) / 64 * 64);
  return v.data();
}

// --woq: the f32 GEMM against the int8 and int4 weight-only GEMMs, one row per shape.
int weight_only(int threads, int64_t group, bool f32_path) {
  if (auto why = gemm::woq_lacks(kiln::CpuFeatures::host())) {
    std::fprintf(stderr, "kiln_bench_gemm: %s, which the weight-only GEMM needs\n", why->c_str());
    return 1;
  }
  kiln::use_threads(threads);
  std::printf("# kiln's f32 GEMM (B packed f32), int8 weight-only (s8, a scale per column), int4 weight-only (s4, a scale "
              "per group of %lld), calls interleaved; median of %d calls each, spread = (max - min) / median, %d thread(s)%s\n",
              static_cast<long long>(group), g_runs, threads, f32_path ? "; the f32 paths only" : "");
  std::printf("%-26s %8s %6s %6s | %8s %6s %6s %6s | %8s %6s %6s %6s\n", "shape (MxNxK)", "f32 ms", "spread", "B GB/s",
              "int8 ms", "spread", "B GB/s", "x f32", "int4 ms", "spread", "B GB/s", "x f32");
  const Shape shapes[] = {{1, 4096, 4096, "LLM decode"},  {8, 4096, 4096, "LLM decode"},  {128, 4096, 4096, "LLM prefill"},
                          {1, 3072, 768, "BERT FFN up"}, {8, 3072, 768, "BERT FFN up"}, {128, 3072, 768, "BERT FFN up"}};
  const kiln::cpu::Isa isa = kiln::cpu::Isa::avx512;
  for (const Shape& s : shapes) {
    const avec<float> a = filled(s.m * s.k, 0.01f, false), b = filled(s.k * s.n, 0.01f, true);
    avec<float> c(static_cast<size_t>(s.m * s.n));
    // f32: B packed for the default tile, the default parameters.
    const gemm::GemmParams p =
        gemm::default_params(isa, gemm::default_tile(isa, s.m, s.n, s.k, gemm::CacheSizes::host()), gemm::CacheSizes::host(), s.m, s.n,
                             s.k, threads);
    avec<float> bf(static_cast<size_t>(gemm::packed_b_floats(s.k, s.n, p.tile.nr)));
    gemm::pack_b(b.data(), s.n, false, s.k, s.n, p.tile.nr, bf.data());
    const gemm::GemmProblem g{.m = s.m, .n = s.n, .k = s.k, .a = a.data(), .lda = s.k, .b = bf.data(), .b_packed = true,
                              .c = c.data(), .ldc = s.n};
    avec<std::byte> f32_ws_store;
    std::byte* f32_ws = aligned(f32_ws_store, gemm::workspace_bytes(p, g));
    // int8 and int4 codes of the same size (not B's values: the time does not depend on them).
    avec<uint8_t> q8(static_cast<size_t>(s.k * s.n)), q4(static_cast<size_t>((s.k * s.n + 1) / 2));
    for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 13 % 251);
    for (size_t i = 0; i < q4.size(); ++i) q4[i] = static_cast<uint8_t>(i * 7 % 256);
    const int64_t groups = (s.k + group - 1) / group;
    avec<float> scale8(static_cast<size_t>(s.n), 1e-3f), scale4(static_cast<size_t>(groups * s.n), 1e-2f);
    const gemm::WoqWeight w8{.codes = gemm::WoqCodes::s8, .data = q8.data(), .k = s.k, .n = s.n, .scale = scale8.data()};
    const gemm::WoqWeight w4{.codes = gemm::WoqCodes::s4, .data = q4.data(), .k = s.k, .n = s.n, .group = group,
                             .scale = scale4.data()};
    avec<std::byte> b8_store, b4_store, ws8_store, ws4_store;
    std::byte* b8 = aligned(b8_store, static_cast<size_t>(gemm::packed_b_woq_bytes(w8)));
    std::byte* b4 = aligned(b4_store, static_cast<size_t>(gemm::packed_b_woq_bytes(w4)));
    gemm::pack_b_woq(w8, b8);
    gemm::pack_b_woq(w4, b4);
    const bool split8 = !f32_path && gemm::woq_splits_a(kiln::CpuFeatures::host(), s.m, 0),
               split4 = !f32_path && gemm::woq_splits_a(kiln::CpuFeatures::host(), s.m, group);
    std::byte* ws8 = aligned(ws8_store, gemm::woq_workspace_bytes(s.m, s.n, s.k, 0, threads, split8));
    std::byte* ws4 = aligned(ws4_store, gemm::woq_workspace_bytes(s.m, s.n, s.k, group, threads, split4));
    std::vector<double> spread;
    const std::vector<double> sec = interleaved(
        spread, [&] { gemm::run(p, g, f32_ws); },
        [&] { gemm::gemm_woq(s.m, s.n, s.k, a.data(), s.k, b8, gemm::WoqCodes::s8, 0, split8, {}, c.data(), s.n, threads, ws8); },
        [&] { gemm::gemm_woq(s.m, s.n, s.k, a.data(), s.k, b4, gemm::WoqCodes::s4, group, split4, {}, c.data(), s.n, threads, ws4); });
    const double bytes[] = {4.0 * static_cast<double>(bf.size()), static_cast<double>(gemm::packed_b_woq_bytes(w8)),
                            static_cast<double>(gemm::packed_b_woq_bytes(w4))};
    std::printf("%-26s %8.3f %5.0f%% %6.1f | %8.3f %5.0f%% %6.1f %6.2f | %8.3f %5.0f%% %6.1f %6.2f\n", shape_name(s).c_str(),
                sec[0] * 1e3, 100 * spread[0], bytes[0] / sec[0] / 1e9, sec[1] * 1e3, 100 * spread[1], bytes[1] / sec[1] / 1e9,
                sec[0] / sec[1], sec[2] * 1e3, 100 * spread[2], bytes[2] / sec[2] / 1e9, sec[0] / sec[2]);
  }
  return 0;
}

}  // namespace

// --tiles: each tile of the ISA with its default parameters for the shape, calls interleaved,
// one row each; `*` marks the tile default_tile picks.
void tiles_side_by_side(kiln::cpu::Isa isa, const std::vector<Shape>& shapes, int threads) {
  const gemm::CacheSizes& caches = gemm::CacheSizes::host();
  std::printf("%-28s   %-50s %9s %7s %6s %6s\n", "shape (MxNxK)", "kiln template", "ms", "GFLOP/s", "peak", "spread");
  for (const Shape& s : shapes) {
    Problem pr(s);
    const gemm::Tile chosen = gemm::default_tile(isa, s.m, s.n, s.k, caches);
    std::vector<Problem::Kiln> runs;
    std::vector<std::function<void()>> calls;
    for (const gemm::Tile& t : gemm::tiles(isa)) runs.push_back(pr.kiln(gemm::default_params(isa, t, caches, s.m, s.n, s.k, threads), true));
    for (Problem::Kiln& k : runs) calls.push_back([&k] { Problem::run(k); });
    PeakBeside probe{kiln::CpuFeatures::host(), "f32", threads};
    calls.push_back([&probe] { probe(); });
    std::vector<double> spread;
    const std::vector<double> sec = interleaved_all(spread, calls);
    const double peak = median(probe.readings);
    std::printf("# %s: the probe beside them %.1f GFLOP/s\n", shape_name(s).c_str(), peak);
    for (size_t i = 0; i < runs.size(); ++i)
      std::printf("%-28s %c %-50s %9.3f %7.1f %5.0f%% %5.0f%%\n", shape_name(s).c_str(), runs[i].p.tile == chosen ? '*' : ' ',
                  runs[i].p.name().c_str(), sec[i] * 1e3, gflops(s, sec[i]), 100.0 * gflops(s, sec[i]) / peak, 100 * spread[i]);
  }
}

int main(int argc, char** argv) {
  int threads = 1;
  bool sweep = false, woq = false, tiles = false, f32_path = false, no_amx = false, cold = false;
  int64_t group = 128;
  std::vector<Shape> shapes = {{1024, 1024, 1024, "square"}, {128, 768, 768, "BERT attn proj"},
                               {128, 3072, 768, "BERT FFN up"}, {128, 768, 3072, "BERT FFN down"}};
  bool shapes_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) g_runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) threads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--sweep") sweep = true;
    else if (a == "--tiles") tiles = true;
    else if (a == "--woq") woq = true;
    else if (a == "--f32-path") f32_path = true;
    else if (a == "--no-amx") no_amx = true;
    else if (a == "--cold") cold = true;
    else if (a == "--group" && i + 1 < argc) group = std::max(1, std::atoi(argv[++i]));
    else if (Shape s{0, 0, 0, "given"}; a == "--shape" && i + 1 < argc &&
             std::sscanf(argv[++i], "%" SCNd64 "x%" SCNd64 "x%" SCNd64, &s.m, &s.n, &s.k) == 3 && s.m > 0 && s.n > 0 && s.k > 0) {
      if (!shapes_given) shapes.clear();
      shapes_given = true;
      shapes.push_back(s);
    } else {
      std::fprintf(stderr, "usage: kiln_bench_gemm [--runs N] [--threads T] [--sweep | --tiles] [--shape MxNxK]... [--no-amx] [--cold]\n"
                           "       kiln_bench_gemm --woq [--group G] [--f32-path] [--runs N] [--threads T]\n");
      return 2;
    }
  }
  if (sweep && tiles) {
    std::fprintf(stderr, "kiln_bench_gemm: --sweep and --tiles are two different runs; ask for one\n");
    return 2;
  }
  if (f32_path && !woq) {
    std::fprintf(stderr, "kiln_bench_gemm: --f32-path is an option of --woq\n");
    return 2;
  }
  if (no_amx && woq) {
    std::fprintf(stderr, "kiln_bench_gemm: --no-amx is not an option of --woq\n");
    return 2;
  }
  if (cold && (woq || sweep || tiles)) {
    std::fprintf(stderr, "kiln_bench_gemm: --cold is not an option of --woq, --sweep or --tiles\n");
    return 2;
  }
  if (woq) return weight_only(threads, group, f32_path);
  kiln::CpuFeatures cpu = kiln::CpuFeatures::host();
  if (no_amx) {  // before oneDNN creates its first primitive
    cpu.amx = false;
    if (dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16) != dnnl::status::success) {
      std::fprintf(stderr, "kiln_bench_gemm: oneDNN would not be held to AVX512-BF16\n");
      return 1;
    }
  }
  const std::optional<kiln::cpu::Isa> isa = kiln::cpu::best_isa(cpu);
  if (!isa) {
    std::fprintf(stderr, "kiln_bench_gemm: this CPU has no AVX2+FMA to probe\n");
    return 1;
  }
  kiln::use_threads(threads);  // oneDNN and kiln run on kiln's pool, GNU OpenMP's
  // The f32 peak of `kiln profile`'s ceilings probe, on one thread (--sweep's yardstick; the
  // tables rate each kernel against the probe timed beside it).
  const char* probe_isa = cpu.avx512f ? "avx512" : "avx2";
  const double core_peak = kiln::profile::probe_compute_peak(cpu, "f32", 1);
  const double peak = core_peak * threads;
  const gemm::CacheSizes& caches = gemm::CacheSizes::host();
  std::printf("# f32 FMA peak (%s, probed on one thread at the start, the best of 4): %.1f GFLOP/s per core, %.1f for %d "
              "thread(s)\n",
              probe_isa, core_peak, peak, threads);
  std::printf("# caches per core: L1d %lld KiB, L2 %lld KiB, L3 %lld KiB\n", static_cast<long long>(caches.l1d >> 10),
              static_cast<long long>(caches.l2 >> 10), static_cast<long long>(caches.l3 >> 10));
  g_cold = cold;
  if (cold) std::printf("# --cold: each library's B flushed from the caches before each of its calls (read from memory)\n");
  if (tiles) {
    std::printf("# kiln's GEMM, each tile with its default parameters (B packed ahead), and the FMA probe (one repeat a call), "
                "calls interleaved; median of %d calls each; peak = the share of the probe's median beside them, spread = (max - "
                "min) / median\n",
                g_runs);
    tiles_side_by_side(*isa, shapes, threads);
    return 0;
  }
  std::printf("# oneDNN %d.%d matmul (B reordered ahead), kiln's GEMM (B packed ahead) and the FMA probe (one repeat a call), "
              "calls interleaved; median of %d calls each; peak = the share of the probe's median beside them, spread = (max - "
              "min) / median\n",
              dnnl_version()->major, dnnl_version()->minor, g_runs);
  std::printf("%-28s %9s %7s %6s %6s | %9s %7s %6s %6s | %7s | %6s  %s\n", "shape (MxNxK)", "onednn ms", "GFLOP/s", "peak",
              "spread", "kiln ms", "GFLOP/s", "peak", "spread", "probe", "ratio", "kiln template");
  for (const Shape& s : shapes) {
    Problem pr(s);
    const gemm::GemmParams def = gemm::default_params(*isa, gemm::default_tile(*isa, s.m, s.n, s.k, caches), caches, s.m, s.n, s.k, threads);
    gemm::GemmParams chosen = def;
    if (sweep) {  // every tile, Kc, packing of A and thread grid; the fastest replaces the default
      std::vector<int64_t> kcs;  // the slices shorter than K, and K whole
      for (int64_t kc : {128, 256, 512, 768, 1024, 1536, 3072})
        if (kc < s.k) kcs.push_back(kc);
      kcs.push_back(s.k);
      double best_sec = 1e30;
      for (const gemm::Tile& t : gemm::tiles(*isa))
        for (int64_t kc : kcs)
          for (bool pack_a : {false, true})
            for (int tm = 1; tm <= threads; ++tm) {
              if (threads % tm != 0) continue;
              gemm::GemmParams p = gemm::default_params(*isa, t, caches, s.m, s.n, s.k, threads);
              p.kc = kc;
              p.pack_a = pack_a;
              p.tm = tm;
              p.tn = threads / tm;
              Problem::Kiln k = pr.kiln(p);
              std::vector<double> spread;
              const double sec = interleaved(spread, [&] { Problem::run(k); })[0];
              std::printf("#   %-26s %-50s %8.3f ms %6.0f%%\n", shape_name(s).c_str(), p.name().c_str(), sec * 1e3,
                          100.0 * gflops(s, sec) / peak);
              if (sec < best_sec) best_sec = sec, chosen = p;
            }
    }
    Problem::Kiln best = pr.kiln(chosen);  // packs B for the chosen tile
    std::vector<double> spread;
    PeakBeside f32_peak{cpu, "f32", threads};
    g_weights = {{weights_of(pr.b_mem)}, {bytes_of(pr.b_packed)}};
    const std::vector<double> sec = interleaved(spread, [&] { pr.onednn(); }, [&] { Problem::run(best); }, [&] { f32_peak(); });
    const double beside = median(f32_peak.readings);
    std::printf("%-28s %9.3f %7.1f %5.0f%% %5.0f%% | %9.3f %7.1f %5.0f%% %5.0f%% | %7.1f | %6.2f  %s (max rel diff %.1e)\n",
                shape_name(s).c_str(), sec[0] * 1e3, gflops(s, sec[0]), 100.0 * gflops(s, sec[0]) / beside, 100 * spread[0],
                sec[1] * 1e3, gflops(s, sec[1]), 100.0 * gflops(s, sec[1]) / beside, 100 * spread[1], beside, sec[0] / sec[1],
                best.p.name().c_str(), pr.disagreement());
  }
  // The lower-precision templates against kiln's f32 one on the same shapes: u8·s8 (the
  // speed-up over f32 is the number to hold), bf16 and f16 (the share of their own probed peaks);
  // u8·s8 and bf16 on AMX tiles where the CPU has them, each beside oneDNN's matmul of its types.
  const bool vnni = !kiln::cpu::gemm::lowp_lacks(cpu, kiln::cpu::gemm::Lowp::u8s8);
  const bool bf16 = !kiln::cpu::gemm::lowp_lacks(cpu, kiln::cpu::gemm::Lowp::bf16);
  if (!kiln::cpu::gemm::lowp_lacks(cpu, kiln::cpu::gemm::Lowp::f16)) {
    std::printf("# f16 GEMM (A rounded to f16 on each call, B packed ahead): beside kiln's f32 GEMM, calls interleaved, for the "
                "speed-up; then beside the vfmadd231ph probe (one repeat a call), calls interleaved, for the share of the peak "
                "both ran at\n");
    std::printf("%-28s %9s %9s %6s | %9s %8s %8s %6s\n", "shape (MxNxK)", "f32 ms", "f16 ms", "x f32", "f16 ms", "GFLOP/s",
                "peak", "share");
    for (const Shape& s : shapes) {
      Problem pr(s);
      Problem::Kiln f32 = pr.kiln(gemm::default_params(*isa, gemm::default_tile(*isa, s.m, s.n, s.k, caches), caches, s.m, s.n, s.k, threads));
      avec<uint16_t> bh(static_cast<size_t>(s.k * s.n)), bhp(static_cast<size_t>(gemm::packed_b_f16_elements(s.k, s.n)));
      for (size_t i = 0; i < bh.size(); ++i) bh[i] = kiln::half(pr.b[i]).bits;
      gemm::pack_b_f16(bh.data(), s.n, false, s.k, s.n, bhp.data());
      avec<std::byte> ws(gemm::f16_workspace_bytes(s.m, s.k));
      avec<float> c(static_cast<size_t>(s.m * s.n));
      auto f16 = [&] { gemm::gemm_f16(s.m, s.n, s.k, pr.a.data(), s.k, bhp.data(), {}, c.data(), s.n, threads, ws.data()); };
      std::vector<double> spread;
      g_weights = {{bytes_of(pr.b_packed)}, {bytes_of(bhp)}};
      const std::vector<double> vs_f32 = interleaved(spread, [&] { Problem::run(f32); }, f16);
      PeakBeside f16_peak{cpu, "f16", threads};
      g_weights = {{bytes_of(bhp)}};
      const double alone = interleaved(spread, f16, [&] { f16_peak(); })[0], peak16 = median(f16_peak.readings);
      std::printf("%-28s %9.3f %9.3f %6.2f | %9.3f %8.1f %8.1f %5.0f%%\n", shape_name(s).c_str(), vs_f32[0] * 1e3, vs_f32[1] * 1e3,
                  vs_f32[0] / vs_f32[1], alone * 1e3, gflops(s, alone), peak16, 100 * gflops(s, alone) / peak16);
    }
  }
  if (!vnni && !bf16) {
    std::printf("# this CPU has neither AVX512-VNNI nor AVX512-BF16: no u8s8 or bf16 rows\n");
    return 0;
  }
  std::printf("# u8s8 and bf16 GEMMs beside kiln's f32 one and oneDNN's matmul of the same types, with the u8s8 and bf16 "
              "probes (%s, one repeat a call), calls interleaved; peak = the share of the probe's median beside them (0: the "
              "CPU lacks it)\n",
              cpu.amx ? "AMX tiles, which kiln's lower-precision GEMMs run on here" : "vpdpbusd and vdpbf16ps");
  std::printf("%-28s %9s | %9s %8s %7s %8s %9s | %9s %8s %7s %9s\n", "shape (MxNxK)", "f32 ms", "u8s8 ms", "GOP/s", "peak", "x f32",
              "oneDNN ms", "bf16 ms", "GFLOP/s", "peak", "oneDNN ms");
  for (const Shape& s : shapes) {
    Problem pr(s);
    Problem::Kiln f32 = pr.kiln(gemm::default_params(*isa, gemm::default_tile(*isa, s.m, s.n, s.k, caches), caches, s.m, s.n, s.k, threads));
    avec<uint8_t> a8(static_cast<size_t>(s.m * s.k));
    avec<int8_t> b8(static_cast<size_t>(s.k * s.n)), b8p(static_cast<size_t>(gemm::packed_b_s8_bytes(s.k, s.n)));
    for (size_t i = 0; i < a8.size(); ++i) a8[i] = static_cast<uint8_t>(i * 7 % 251);
    for (size_t i = 0; i < b8.size(); ++i) b8[i] = static_cast<int8_t>(i * 13 % 255 - 127);
    avec<int32_t> sums(static_cast<size_t>(s.n));
    gemm::pack_b_s8(b8.data(), s.n, false, s.k, s.n, b8p.data(), sums.data());
    avec<float> scale(static_cast<size_t>(s.n), 1e-3f), c(static_cast<size_t>(s.m * s.n)), c_dnnl(c.size());
    avec<uint16_t> bbf(static_cast<size_t>(gemm::packed_b_bf16_elements(s.k, s.n)));
    gemm::pack_b_bf16(pr.b.data(), s.n, false, s.k, s.n, bbf.data());
    avec<std::byte> ws(gemm::bf16_workspace_bytes(s.m, s.k));
    const gemm::QuantEpilogue qep{.col_sums = sums.data(), .a_zero = 128, .scale = scale.data()};
    const bool amx8 = gemm::u8s8_on_amx(cpu, s.m, s.k), amx16 = gemm::bf16_on_amx(cpu, s.k);
    std::optional<OnednnLowp> d8, d16;
    PeakBeside peak8{cpu, "int8", threads}, peak16{cpu, "bf16", threads};
    // f32; then u8s8, oneDNN's and the probe; then bf16, oneDNN's and the probe.
    std::vector<std::function<void()>> fns = {[&] { Problem::run(f32); }};
    g_weights = {{bytes_of(pr.b_packed)}};
    if (vnni) {
      d8.emplace(s, true, a8.data(), nullptr, b8.data(), c_dnnl.data(), 128, 1e-3f);
      fns.push_back([&] { gemm::gemm_u8s8(s.m, s.n, s.k, a8.data(), s.k, b8p.data(), qep, c.data(), s.n, threads, 0, amx8); });
      fns.push_back([&] { d8->run(); });
      fns.push_back([&] { peak8(); });
      g_weights.insert(g_weights.end(), {{bytes_of(b8p)}, {weights_of(d8->b_mem)}, {}});
    }
    const size_t first16 = fns.size();
    if (bf16) {
      d16.emplace(s, false, pr.a.data(), pr.b.data(), nullptr, c_dnnl.data(), 0, 1.f);
      fns.push_back([&] { gemm::gemm_bf16(s.m, s.n, s.k, pr.a.data(), s.k, bbf.data(), {}, c.data(), s.n, threads, ws.data(), 0, amx16); });
      fns.push_back([&] { d16->run(); });
      fns.push_back([&] { peak16(); });
      g_weights.insert(g_weights.end(), {{bytes_of(bbf)}, {weights_of(d16->b_mem)}, {}});
    }
    std::vector<double> spread;
    const std::vector<double> sec = interleaved_all(spread, fns);
    const double t8 = vnni ? sec[1] : 0, d8t = vnni ? sec[2] : 0, tb = bf16 ? sec[first16] : 0, dbt = bf16 ? sec[first16 + 1] : 0;
    const double vnni_peak = vnni ? median(peak8.readings) : 0, bf16_peak = bf16 ? median(peak16.readings) : 0;
    // Each of kiln's results against oneDNN's (the last call of each left it in c and c_dnnl).
    const double diff16 = bf16 ? max_rel_diff(c, c_dnnl) : 0;  // the bf16 calls ran last
    double diff8 = 0;
    if (vnni) {
      fns[1]();
      fns[2]();
      diff8 = max_rel_diff(c, c_dnnl);
    }
    std::printf("%-28s %9.3f | %9.3f %8.1f %6.0f%% %8.2f %9.3f | %9.3f %8.1f %6.0f%% %9.3f (max rel diff %.1e, %.1e)\n",
                shape_name(s).c_str(), sec[0] * 1e3, t8 * 1e3, vnni ? gflops(s, t8) : 0.0, vnni ? 100 * gflops(s, t8) / vnni_peak : 0.0,
                vnni ? sec[0] / t8 : 0.0, d8t * 1e3, tb * 1e3, bf16 ? gflops(s, tb) : 0.0, bf16 ? 100 * gflops(s, tb) / bf16_peak : 0.0,
                dbt * 1e3, diff8, diff16);
  }
  return 0;
}
