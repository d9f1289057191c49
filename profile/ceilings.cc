// The ceilings probe: independent multiply-add chains on every thread at once (16 zmm or 12 ymm
// accumulators hide the latency on two FMA ports), and streaming passes over buffers far larger
// than the caches. Each is the best of a few short repeats: a neighbour's process can only make
// a repeat slower.
#include "profile/ceilings.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "formats/atomic_file.h"
#include "formats/ir.h"
#include "runtime/threads.h"

namespace kiln::profile {

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

// Bumped when a probe changes what it measures: cached entries of another version are probed again.
constexpr int kProbeVersion = 9;  // 5: bf16 and int8 on AMX tiles where the CPU has them; 6: f16; 7: AVX2's 12 chains; 8: AVX-512 in assembly; 9: f16 too

// The lanes added with stores (GCC 12's _mm512_reduce_add_* warn of uninitialized use).
__attribute__((target("avx512f"))) float lane_sum(__m512 v) {
  float lanes[16];
  _mm512_storeu_ps(lanes, v);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

// Sixteen independent chains in zmm0-zmm15, `op`'s two operands in zmm16 and zmm17, written out
// in assembly: left to the compiler, GCC 12 copied every accumulator through a second register
// and spilled one each step, which cost vpdpbusd up to a quarter of its rate on a Zen 5 core
// (690-950 GOP/s from one probe to the next while kiln's u8s8 GEMM ran at 840; 926-955 in
// assembly).
#define KILN_PROBE_CHAIN(op, r) op " %%zmm17, %%zmm16, %%zmm" #r "\n\t"
#define KILN_PROBE_STEP(op)                                                                                          \
  KILN_PROBE_CHAIN(op, 0) KILN_PROBE_CHAIN(op, 1) KILN_PROBE_CHAIN(op, 2) KILN_PROBE_CHAIN(op, 3)                   \
  KILN_PROBE_CHAIN(op, 4) KILN_PROBE_CHAIN(op, 5) KILN_PROBE_CHAIN(op, 6) KILN_PROBE_CHAIN(op, 7)                   \
  KILN_PROBE_CHAIN(op, 8) KILN_PROBE_CHAIN(op, 9) KILN_PROBE_CHAIN(op, 10) KILN_PROBE_CHAIN(op, 11)                 \
  KILN_PROBE_CHAIN(op, 12) KILN_PROBE_CHAIN(op, 13) KILN_PROBE_CHAIN(op, 14) KILN_PROBE_CHAIN(op, 15)
#define KILN_PROBE_LOOP(op, a, b, iters)                                                                              \
  asm volatile("vmovdqa64 %1, %%zmm16\n\tvmovdqa64 %2, %%zmm17\n\t"                                                \
               "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvmovdqa64 %%zmm0, %%zmm1\n\tvmovdqa64 %%zmm0, %%zmm2\n\t"            \
               "vmovdqa64 %%zmm0, %%zmm3\n\tvmovdqa64 %%zmm0, %%zmm4\n\tvmovdqa64 %%zmm0, %%zmm5\n\t"                 \
               "vmovdqa64 %%zmm0, %%zmm6\n\tvmovdqa64 %%zmm0, %%zmm7\n\tvmovdqa64 %%zmm0, %%zmm8\n\t"                 \
               "vmovdqa64 %%zmm0, %%zmm9\n\tvmovdqa64 %%zmm0, %%zmm10\n\tvmovdqa64 %%zmm0, %%zmm11\n\t"               \
               "vmovdqa64 %%zmm0, %%zmm12\n\tvmovdqa64 %%zmm0, %%zmm13\n\tvmovdqa64 %%zmm0, %%zmm14\n\t"              \
               "vmovdqa64 %%zmm0, %%zmm15\n\t"                                                                       \
               "1:\n\t" KILN_PROBE_STEP(op) "dec %0\n\tjnz 1b"                                                         \
               : "+r"(iters)                                                                                         \
               : "v"(a), "v"(b)                                                                                      \
               : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",      \
                 "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc")

// Each loop returns nothing of use (the sums stay in registers the assembly owns); the timing is
// the result.
__attribute__((target("avx512f"))) float fma_avx512(long iters) {
  if (iters < 1) return 0;
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  KILN_PROBE_LOOP("vfmadd231ps", a, b, iters);
  return 0;
}

// 12 chains: with the two operands, 14 of AVX2's 16 registers. (16 chains spilled one to the
// stack each step: 52.9 GFLOP/s on a Zen 3 core whose 12 chains make 93-95.)
constexpr int kAvx2Chains = 12;

__attribute__((target("avx2,fma"))) float fma_avx2(long iters) {
  __m256 acc[kAvx2Chains];
  for (int i = 0; i < kAvx2Chains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long n = 0; n < iters; ++n)
    for (int i = 0; i < kAvx2Chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < kAvx2Chains; ++i) s = _mm256_add_ps(s, acc[i]);
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

// Scalar multiply-adds, for a CPU with neither (8 chains: the compiler may not fuse them).
float fma_scalar(long iters) {
  float acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = static_cast<float>(i) * 1e-3f;
  for (long n = 0; n < iters; ++n)
    for (float& x : acc) x = x * 0.999999f + 1e-7f;
  float sum = 0;
  for (float x : acc) sum += x;
  return sum;
}

__attribute__((target("avx512f,avx512vnni"))) float vnni_loop(long iters) {
  if (iters < 1) return 0;
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
  KILN_PROBE_LOOP("vpdpbusd", a, b, iters);
  return 0;
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_loop(long iters) {
  if (iters < 1) return 0;
  const __m512i a = _mm512_set1_epi16(0x3f80), b = _mm512_set1_epi16(0x3380);  // bf16 1 and 6e-8
  KILN_PROBE_LOOP("vdpbf16ps", a, b, iters);
  return 0;
}

// AVX512-FP16's `vfmadd231ph` (32 f16 multiply-adds each); the operands are bit patterns, so the
// file needs no -mavx512fp16. In intrinsics (an array of 16 chains) a sanitizer build kept the
// chains on the stack and read 26 GFLOP/s on a core whose f32 probe read 331.
__attribute__((target("avx512f"))) float f16_fma_loop(long iters) {
  if (iters < 1) return 0;
  const __m512i a = _mm512_set1_epi16(0x3bfe), b = _mm512_set1_epi16(0x068e);  // f16 0.999 and 1e-4: normal products
  KILN_PROBE_LOOP("vfmadd231ph", a, b, iters);
  return 0;
}

// AMX: eight 16-row x 64-byte tiles, four accumulators C0-C3 fed by two A tiles (4, 5) and two B
// tiles (6, 7), four tile products an iteration (each 16x16 f32 or s32 sums of 32 bf16 or 64
// int8 products). The tiles are loaded once from small constants: the probe is the multiplier.
constexpr int kAmxTileBytes = 16 * 64;
alignas(64) const uint8_t kAmxOnes[kAmxTileBytes] = {};

__attribute__((target("amx-tile"))) void amx_configure() {
  alignas(64) uint8_t config[64] = {};
  config[0] = 1;  // palette 1
  for (int t = 0; t < 8; ++t) {
    config[16 + 2 * t] = 64;  // bytes per row (little-endian u16)
    config[48 + t] = 16;      // rows
  }
  _tile_loadconfig(config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, kAmxOnes, 64);
  _tile_loadd(5, kAmxOnes, 64);
  _tile_loadd(6, kAmxOnes, 64);
  _tile_loadd(7, kAmxOnes, 64);
}

__attribute__((target("amx-tile"))) float amx_finish() {
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

__attribute__((target("amx-tile,amx-bf16"))) float amx_bf16_loop(long iters) {
  amx_configure();
  for (long n = 0; n < iters; ++n) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  return amx_finish();
}

__attribute__((target("amx-tile,amx-int8"))) float amx_int8_loop(long iters) {
  amx_configure();
  for (long n = 0; n < iters; ++n) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  return amx_finish();
}

// G (multiply-adds x 2) per second of `loop` on every thread at once, the best of `repeats`;
// `ops_per_iter` is the multiply-adds one iteration of one thread makes.
double peak_rate(float (*loop)(long), long iters, double ops_per_iter, int threads, int repeats = 4) {
  double best = 0;
  std::vector<float> sink(static_cast<size_t>(threads));
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clock_type::now();
#pragma omp parallel num_threads(threads)
    sink[static_cast<size_t>(omp_get_thread_num())] += loop(iters);
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    best = std::max(best, static_cast<double>(iters) * ops_per_iter * 2 * threads / s / 1e9);
  }
  volatile float keep = 0;
  for (float x : sink) keep = keep + x;
  return best;
}

// Reads n floats (n a multiple of 64) with independent accumulators, enough to keep two loads
// a cycle in flight from L1.
__attribute__((target("avx512f"))) float read_avx512(const float* p, size_t n) {
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 128)
    for (int k = 0; k < 8; ++k) acc[k] = _mm512_add_ps(acc[k], _mm512_load_ps(p + i + 16 * k));
  for (int k = 1; k < 8; ++k) acc[0] = _mm512_add_ps(acc[0], acc[k]);
  return lane_sum(acc[0]);
}

__attribute__((target("avx2"))) float read_avx2(const float* p, size_t n) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 128)
    for (int k = 0; k < 16; ++k) acc[k % 8] = _mm256_add_ps(acc[k % 8], _mm256_load_ps(p + i + 8 * k));
  for (int k = 1; k < 8; ++k) acc[0] = _mm256_add_ps(acc[0], acc[k]);
  float lanes[8];
  _mm256_storeu_ps(lanes, acc[0]);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}

float read_scalar(const float* p, size_t n) {
  float acc[8] = {};
  for (size_t i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
  float sum = 0;
  for (float a : acc) sum += a;
  return sum;
}

using ReadLoop = float (*)(const float*, size_t);

ReadLoop read_loop(const CpuFeatures& cpu) { return cpu.avx512f ? read_avx512 : cpu.avx2 ? read_avx2 : read_scalar; }

struct Buffer {
  explicit Buffer(size_t bytes) : p(static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free) {}
  std::unique_ptr<float, decltype(&std::free)> p;
};

// GB/s of every thread reading its own `bytes` (a multiple of 512) `passes` times at once, the
// best of `repeats`. The buffers are first touched by the threads that read them.
double read_rate(ReadLoop read, int threads, size_t bytes, int passes, int repeats = 3) {
  const size_t n = bytes / sizeof(float);
  std::vector<Buffer> buffers;
  for (int t = 0; t < threads; ++t) buffers.emplace_back(bytes);
  for (const Buffer& b : buffers)
    if (!b.p) return 0;
  std::vector<float> sink(static_cast<size_t>(threads));
  double best = 0;
  for (int r = -1; r < repeats; ++r) {  // repeat -1 fills the buffers and warms the caches
    const auto t0 = clock_type::now();
#pragma omp parallel num_threads(threads)
    {
      const size_t t = static_cast<size_t>(omp_get_thread_num());
      float* p = buffers[t].p.get();
      if (r < 0) {
        for (size_t i = 0; i < n; ++i) p[i] = 1.0f;
      } else {
        float sum = 0;  // local: threads writing neighbouring sink entries every pass would share a line
        for (int pass = 0; pass < passes; ++pass) sum += read(p, n);
        sink[t] += sum;
      }
    }
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (r >= 0) best = std::max(best, static_cast<double>(bytes) * passes * threads / s / 1e9);
  }
  volatile float keep = 0;
  for (float x : sink) keep = keep + x;
  return best;
}

// STREAM's triad over `bytes` per array on every thread, GB/s counted as 3 arrays.
double triad_rate(int threads, size_t bytes, int repeats = 3) {
  const size_t n = bytes / sizeof(float);
  Buffer a(bytes), b(bytes), c(bytes);
  if (!a.p || !b.p || !c.p) return 0;
  float* pa = a.p.get();
  float* pb = b.p.get();
  float* pc = c.p.get();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) {
    pa[i] = 0;
    pb[i] = 1.0f;
    pc[i] = 2.0f;
  }
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const float scale = 0.5f + static_cast<float>(r);
    const auto t0 = clock_type::now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; ++i) pa[i] = pb[i] + scale * pc[i];
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    best = std::max(best, 3.0 * static_cast<double>(bytes) / s / 1e9);
  }
  volatile float keep = pa[n / 2];
  (void)keep;
  return best;
}

// The data and unified caches the OS lists for CPU 0: (level, bytes, CPUs sharing it).
struct CacheInfo {
  int level;
  int64_t bytes;
  int sharing;
};

std::vector<CacheInfo> data_caches() {
  std::vector<CacheInfo> out;
  for (int i = 0; i < 8; ++i) {
    const fs::path dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    std::ifstream level(dir / "level"), type(dir / "type"), size(dir / "size"), shared(dir / "shared_cpu_list");
    std::string t, sz, list;
    int lv = 0;
    if (!(level >> lv) || !(type >> t) || !(size >> sz) || t == "Instruction") continue;
    int64_t bytes = std::atoll(sz.c_str());
    if (!sz.empty() && (sz.back() == 'K' || sz.back() == 'k')) bytes <<= 10;
    if (!sz.empty() && sz.back() == 'M') bytes <<= 20;
    // "0-1,4-5": count the CPUs in the ranges.
    int sharing = 0;
    std::getline(shared, list);
    for (size_t pos = 0; pos < list.size();) {
      size_t comma = list.find(',', pos);
      std::string range = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      size_t dash = range.find('-');
      sharing += dash == std::string::npos ? 1 : std::atoi(range.c_str() + dash + 1) - std::atoi(range.c_str()) + 1;
      pos = comma == std::string::npos ? list.size() : comma + 1;
    }
    if (bytes > 0) out.push_back({lv, bytes, std::max(sharing, 1)});
  }
  std::sort(out.begin(), out.end(), [](const CacheInfo& a, const CacheInfo& b) { return a.level < b.level; });
  return out;
}

std::string cache_key(const std::string& cpu_name, const CpuFeatures& cpu, int threads) {
  return cpu_name + "|" + cpu.str() + "|" + std::to_string(threads) + "|v" + std::to_string(kProbeVersion);
}

std::optional<Ceilings> from_entry(const nlohmann::json& e) {
  try {
    Ceilings c;
    for (const auto& [k, v] : e.at("compute_gflops").items()) c.compute_gflops[k] = v.get<double>();
    c.f32_isa = e.at("f32_isa").get<std::string>();
    c.memory_gbps = e.at("memory_gbps").get<double>();
    for (const auto& level : e.at("memory"))
      c.memory.push_back({level.at("level").get<std::string>(), level.at("capacity_bytes").get<int64_t>(), level.at("gbps").get<double>()});
    if (c.memory.empty() || c.memory.back().name != "DRAM") return std::nullopt;
    c.threads = e.at("threads").get<int>();
    if (!c.compute_gflops.count("f32") || !(c.compute_gflops["f32"] > 0) || !(c.memory_gbps > 0)) return std::nullopt;
    return c;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

namespace {

// Sets kiln's pool to a thread count for the probes, and back to what it was after them (a
// one-thread probe once left a caller's later two-thread work on one thread).
struct PoolFor {
  int before = pool_threads();
  explicit PoolFor(int threads) { use_threads(threads); }
  ~PoolFor() { use_threads(before); }
};

// One precision's probe on this CPU: its loop, the iterations of a repeat (tens of
// milliseconds at most) and the multiply-adds an iteration makes on one thread; no loop where the
// CPU lacks the precision. f32 on the widest FMA it has; bf16 and int8 on AMX tiles where it has
// them (oneDNN's bf16 and int8 primitives use them there).
struct PeakProbe {
  float (*loop)(long) = nullptr;
  long iters = 0;
  double ops_per_iter = 0;
};

PeakProbe peak_probe(const CpuFeatures& cpu, std::string_view precision) {
  if (precision == "f32") {
    if (cpu.avx512f) return {fma_avx512, 2'000'000, 16.0 * 16};
    if (cpu.avx2 && cpu.fma) return {fma_avx2, 4'000'000, 8.0 * kAvx2Chains};
    return {fma_scalar, 8'000'000, 8.0};
  }
  if (precision == "f16" && cpu.avx512_fp16) return {f16_fma_loop, 1'000'000, 16.0 * 32};
  if (precision == "bf16") {
    if (cpu.amx) return {amx_bf16_loop, 250'000, 4.0 * 16 * 16 * 32};
    if (cpu.avx512_bf16) return {bf16_loop, 1'000'000, 16.0 * 32};
  }
  if (precision == "int8") {
    if (cpu.amx) return {amx_int8_loop, 250'000, 4.0 * 16 * 16 * 64};
    if (cpu.avx512_vnni) return {vnni_loop, 1'000'000, 16.0 * 64};
  }
  return {};
}

constexpr std::string_view kPrecisions[] = {"f32", "f16", "bf16", "int8"};

// The peaks of every precision the CPU has, on `threads` threads of the pool, one right after
// another.
void probe_compute(const CpuFeatures& cpu, int threads, Ceilings& c) {
  c.f32_isa = cpu.avx512f ? "avx512" : cpu.avx2 && cpu.fma ? "avx2" : "scalar";
  for (std::string_view precision : kPrecisions)
    if (const PeakProbe p = peak_probe(cpu, precision); p.loop)
      c.compute_gflops[std::string(precision)] = peak_rate(p.loop, p.iters, p.ops_per_iter, threads);
}

}  // namespace

std::map<std::string, double> probe_compute_peaks(const CpuFeatures& cpu, int threads) {
  threads = std::max(threads, 1);
  const PoolFor pool(threads);
  Ceilings c;
  probe_compute(cpu, threads, c);
  return c.compute_gflops;
}

double probe_compute_peak(const CpuFeatures& cpu, std::string_view precision, int threads, int repeats) {
  const PeakProbe p = peak_probe(cpu, precision);
  if (!p.loop) return 0;
  threads = std::max(threads, 1);
  const PoolFor pool(threads);
  return peak_rate(p.loop, p.iters, p.ops_per_iter, threads, std::max(repeats, 1));
}

Ceilings probe_ceilings(const CpuFeatures& cpu, int threads) {
  threads = std::max(threads, 1);
  const PoolFor pool(threads);
  Ceilings c;
  c.threads = threads;
  c.source = "probed";
  probe_compute(cpu, threads, c);
  // Each cache: every thread reads half of its share of it, over and over (~512 MiB a thread:
  // a millisecond or more, so that waking the pool's threads is no part of the rate).
  const ReadLoop read = read_loop(cpu);
  int64_t largest = 0;
  for (const CacheInfo& cache : data_caches()) {
    // A shared cache gives each thread its share of it (all of it to one thread).
    const int64_t per_thread = cache.bytes / std::min(cache.sharing, threads);
    const size_t bytes = static_cast<size_t>(per_thread / 2) / 512 * 512;
    if (bytes < 4096) continue;
    const int passes = static_cast<int>(std::max<size_t>(1, (size_t{512} << 20) / bytes));
    MemoryLevel level;
    level.name = "L";  // appended, not "L" + ...: GCC 12 warns falsely (-Wrestrict) on that here
    level.name += std::to_string(cache.level);
    level.capacity = per_thread * threads;
    level.gbps = read_rate(read, threads, bytes, passes);
    largest = std::max(largest, level.capacity);
    if (level.gbps > 0) c.memory.push_back(level);
  }
  // DRAM: 4x the largest cache (64 MiB at least), split among the threads; the triad's three
  // arrays take half that each.
  const size_t dram_total = std::max<size_t>(size_t{64} << 20, static_cast<size_t>(largest) * 4);
  const double dram_read = read_rate(read, threads, dram_total / static_cast<size_t>(threads) / 512 * 512, 1);
  const double triad = triad_rate(threads, dram_total / 2);
  c.memory_gbps = std::max(dram_read, triad);
  c.memory.push_back({"DRAM", 0, c.memory_gbps});
  return c;
}

std::string CeilingsOptions::default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return (fs::path(xdg) / "kiln").string();
  if (const char* home = std::getenv("HOME"); home && *home) return (fs::path(home) / ".cache" / "kiln").string();
  return "";
}

Ceilings machine_ceilings(const CpuFeatures& cpu, int threads, const CeilingsOptions& options) {
  const std::string name = cpu_model_name();
  const std::string key = cache_key(name, cpu, threads);
  const std::string file = options.cache_dir.empty() ? "" : (fs::path(options.cache_dir) / "ceilings.json").string();
  // The cache: {"schema": "kiln.ceilings", "schema_version": 1, "machines": {key: entry}}.
  nlohmann::json cache;
  if (!file.empty()) {
    std::ifstream in(file);
    if (in) {
      cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!cache.is_object() || cache.value("schema", "") != "kiln.ceilings" || !cache.contains("machines") ||
          !cache["machines"].is_object())
        cache = nlohmann::json();
    }
    if (!options.reprobe && cache.is_object() && cache["machines"].contains(key)) {
      if (auto c = from_entry(cache["machines"][key])) {
        c->source = "cache";
        c->cache_file = file;
        return *c;
      }
    }
  }
  Ceilings c = options.probe(cpu, threads);
  if (file.empty()) return c;
  if (!cache.is_object()) cache = {{"schema", "kiln.ceilings"}, {"schema_version", 1}, {"machines", nlohmann::json::object()}};
  nlohmann::json entry = to_json(c);
  entry.erase("source");
  entry.erase("cache_file");
  entry["cpu"] = name;
  entry["features"] = cpu.str();
  cache["machines"][key] = entry;
  std::error_code ec;
  fs::create_directories(options.cache_dir, ec);
  const std::string text = cache.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!ec && write_file_atomic(file, {reinterpret_cast<const uint8_t*>(text.data()), text.size()}).ok()) c.cache_file = file;
  return c;
}

const MemoryLevel& memory_roof(const Ceilings& c, int64_t bytes) {
  static const MemoryLevel none{"DRAM", 0, 0};
  if (c.memory.empty()) return none;
  for (const MemoryLevel& m : c.memory)
    if (m.capacity > 0 && bytes <= m.capacity) return m;
  return c.memory.back();
}

nlohmann::ordered_json to_json(const Ceilings& c) {
  nlohmann::ordered_json j;
  nlohmann::ordered_json compute = nlohmann::ordered_json::object();
  for (const char* k : {"f32", "f16", "bf16", "int8"})
    if (auto it = c.compute_gflops.find(k); it != c.compute_gflops.end()) compute[k] = it->second;
  j["compute_gflops"] = compute;
  j["f32_isa"] = c.f32_isa;
  j["memory_gbps"] = c.memory_gbps;
  nlohmann::ordered_json levels = nlohmann::ordered_json::array();
  for (const MemoryLevel& m : c.memory) levels.push_back({{"level", m.name}, {"capacity_bytes", m.capacity}, {"gbps", m.gbps}});
  j["memory"] = levels;
  j["threads"] = c.threads;
  j["source"] = c.source;
  if (!c.cache_file.empty()) j["cache_file"] = c.cache_file;
  return j;
}

}  // namespace kiln::profile
