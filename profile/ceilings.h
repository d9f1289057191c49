// The machine's ceilings, the roofs of a roofline: the peak multiply-add rate of each precision
// the CPU has and the memory bandwidth, measured by a short probe on the thread count the profile
// runs with (its DRAM part reads 4x the largest cache: 3.4 s on a 2-core Xeon whose L3 reports
// 300 MiB), and cached per machine in the user's cache folder.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "formats/status.h"
#include "runtime/target.h"

namespace kiln::profile {

/// One level of the memory hierarchy, as a roof: how fast the threads together read data that
/// fits in it.
struct MemoryLevel {
  std::string name;         ///< "L1", "L2", "L3" or "DRAM"
  int64_t capacity = 0;     ///< bytes the threads' share of it holds (private caches x threads); 0 for DRAM
  double gbps = 0;          ///< read bandwidth, GB/s (10^9 bytes)
};

struct Ceilings {
  /// Peak rate of `threads` threads together, multiply-adds x 2 per second, in G: "f32" (FMA, on
  /// f32_isa), and "bf16" (vdpbf16ps) and "int8" (vpdpbusd, GOP/s) where the CPU has them: on AMX
  /// tiles (tdpbf16ps, tdpbssd) where it has AMX.
  std::map<std::string, double> compute_gflops;
  std::string f32_isa;  ///< "avx512", "avx2" or "scalar"
  /// The caches the OS reports, smallest first, then DRAM.
  std::vector<MemoryLevel> memory;
  /// DRAM's: the better of a streaming read and STREAM's triad (a[i] = b[i] + s·c[i], counted
  /// as 3 arrays), over buffers far larger than the caches.
  double memory_gbps = 0;
  int threads = 1;
  std::string source;      ///< "probed" (this run) or "cache"
  std::string cache_file;  ///< where they were read from or stored; empty when not cached
};

/// The roof for a node that moves `bytes`: the smallest level that holds them (a cache-aware
/// roofline: a working set that stays in L2 is held to L2's bandwidth, not DRAM's).
const MemoryLevel& memory_roof(const Ceilings& c, int64_t bytes);

/// The CPU's model name ("AMD EPYC 9R14 96-Core Processor"), "unknown" when unreadable.
std::string cpu_model_name();

/// Runs the probes on `threads` threads of kiln's pool, and leaves the pool the size it found it
/// (a one-thread probe once left a caller's later two-thread work on one thread).
Ceilings probe_ceilings(const CpuFeatures& cpu, int threads);

/// The compute peaks alone (Ceilings::compute_gflops), probed now on `threads` threads, a few
/// tens of milliseconds a precision: measured one right after another, their ratio holds on a
/// busy machine, where a cached probe's may have been taken in another moment's load.
std::map<std::string, double> probe_compute_peaks(const CpuFeatures& cpu, int threads);

/// One of those peaks ("f32", "f16", "bf16" or "int8"), probed now on `threads` threads: the
/// best of `repeats` runs of a few milliseconds each; 0 where the CPU lacks the precision. A
/// benchmark calls it between the kernels it rates, so that the probe and the kernels run at the
/// clock the same moment gives them (on a 2-core AMX Xeon, an f32 GEMM between calls slowed the
/// f16 GEMM after it ~20 %: a probe taken at the start was no measure of that f16 GEMM's share).
double probe_compute_peak(const CpuFeatures& cpu, std::string_view precision, int threads, int repeats = 4);

struct CeilingsOptions {
  /// The cache folder: $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; empty when neither is set.
  std::string cache_dir = default_cache_dir();
  bool reprobe = false;  ///< probe even when the cache has this machine, and replace its entry
  /// How the machine is measured when the cache does not answer (tests of the cache give a
  /// cheaper one: the probe reads gigabytes on a machine with a large L3).
  std::function<Ceilings(const CpuFeatures&, int)> probe = probe_ceilings;
  static std::string default_cache_dir();
};

/// This machine's ceilings at `threads` threads: the cached entry for this CPU (model name and
/// features) and thread count, or a fresh probe, stored in the cache. A cache that cannot be
/// read or written is probed past (and, when unreadable, replaced): the ceilings never fail.
Ceilings machine_ceilings(const CpuFeatures& cpu, int threads, const CeilingsOptions& options = {});

nlohmann::ordered_json to_json(const Ceilings& c);

}  // namespace kiln::profile
