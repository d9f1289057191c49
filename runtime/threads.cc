#include "runtime/threads.h"

#include <cpuinfo.h>
#include <xmmintrin.h>

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>

#include "formats/ir.h"

#if __has_include(<omp.h>)
#include <omp.h>
#else
// clang ships omp.h only with LLVM's own OpenMP runtime; kiln links GNU OpenMP, whose C entry
// points are these.
extern "C" {
void omp_set_num_threads(int);
int omp_get_max_threads(void);
int omp_get_thread_num(void);
}
#endif

namespace kiln {

namespace {

constexpr unsigned kFtzDaz = 0x8040;  // MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6)

// Worker spans: one list per pool thread index, each written only by its thread inside a
// parallel region and read by thread 0 after the region's closing barrier.
constexpr int kMaxSpanThreads = 512;
std::atomic<bool> g_record_spans{false};
std::vector<WorkerSpanRecord> g_spans[kMaxSpanThreads];

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int physical_cores() {
  static const int cores = [] {
    if (!cpuinfo_initialize()) return 1;
    // The cores of the CPUs this process may run on (its affinity mask: `taskset`, a
    // container's cpuset), each once however many of its hyper-threads the mask holds: a thread
    // per core of the whole machine would share the allowed ones (int8 ResNet-50 under `taskset
    // -c 0` on a 2-core Xeon, OMP_WAIT_POLICY=active: 1.15-1.17x the time at two threads).
    std::set<const cpuinfo_core*> allowed;
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) == 0)
      for (uint32_t i = 0; i < cpuinfo_get_processors_count(); ++i) {
        const cpuinfo_processor* p = cpuinfo_get_processor(i);
        if (p->linux_id >= 0 && p->linux_id < CPU_SETSIZE && CPU_ISSET(p->linux_id, &mask)) allowed.insert(p->core);
      }
    const int n = allowed.empty() ? static_cast<int>(cpuinfo_get_cores_count()) : static_cast<int>(allowed.size());
    return n > 0 ? std::min(n, int{kMaxThreads}) : 1;
  }();
  return cores;
}

FlushDenormals::FlushDenormals(bool on) : saved_(_mm_getcsr()) {
  if (on) _mm_setcsr(saved_ | kFtzDaz);
}
FlushDenormals::~FlushDenormals() { _mm_setcsr(saved_); }

bool flushes_denormals() { return (_mm_getcsr() & kFtzDaz) == kFtzDaz; }

void use_threads(int threads) {
  // GNU OpenMP gives each thread that starts parallel regions its own pool and thread count.
  thread_local int configured = 0;  // the size this thread's workers were last set up for
  if (threads < 1) threads = 1;
  if (threads == configured) return;
  omp_set_num_threads(threads);
  // The workers persist between parallel regions, and so does their floating-point mode: set
  // it once in each. The calling thread (number 0) flushes only while it runs (FlushDenormals).
#pragma omp parallel num_threads(threads)
  if (omp_get_thread_num() != 0) _mm_setcsr(_mm_getcsr() | kFtzDaz);
  configured = threads;
}

int pool_threads() { return omp_get_max_threads(); }

void parallel_copy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kParallelBytes = size_t{1} << 18, kAlign = 64;
  const int64_t threads = omp_get_max_threads();
  if (bytes < kParallelBytes || threads < 2) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // One stretch per thread, whole cache lines of the destination.
  const size_t chunk = (bytes / static_cast<size_t>(threads) + kAlign - 1) / kAlign * kAlign;
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < threads; ++t) {
    const size_t begin = static_cast<size_t>(t) * chunk;
    if (begin < bytes) std::memcpy(d + begin, s + begin, std::min(chunk, bytes - begin));
  }
}

bool pool_flushes_denormals() {
  std::atomic<bool> all{true};
#pragma omp parallel num_threads(omp_get_max_threads())
  if (!flushes_denormals()) all = false;
  return all;
}

int thread_index() { return omp_get_thread_num(); }

void record_worker_spans(bool on) { g_record_spans.store(on, std::memory_order_relaxed); }

std::vector<WorkerSpanRecord> take_worker_spans() {
  std::vector<WorkerSpanRecord> out;
  const int threads = std::min(kMaxSpanThreads, omp_get_max_threads());
  for (int t = 0; t < threads; ++t) {
    out.insert(out.end(), g_spans[t].begin(), g_spans[t].end());
    g_spans[t].clear();
  }
  return out;
}

WorkerSpan::WorkerSpan() {
  if (g_record_spans.load(std::memory_order_relaxed)) begin_ns_ = now_ns();
}

WorkerSpan::~WorkerSpan() {
  if (begin_ns_ < 0) return;
  const int t = omp_get_thread_num();
  if (t < 0 || t >= kMaxSpanThreads) return;
  thread_local const int64_t tid = static_cast<int64_t>(syscall(SYS_gettid));
  g_spans[t].push_back({t, tid, begin_ns_, now_ns()});
}

}  // namespace kiln
