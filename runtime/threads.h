// kiln's threads: one pool, GNU OpenMP's, which oneDNN shares, so kiln's parallel loops and the
// libraries' never oversubscribe the machine. Every thread that runs kiln's kernels flushes
// denormal floats to zero (FTZ and DAZ): denormal arithmetic is up to 100x slower on x86, and
// results that small are noise next to the tolerances kiln checks.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

/// The physical cores (not hyper-threads) this process may use: those of the CPUs in its
/// affinity mask (`taskset`, a container's cpuset; all the machine's where it cannot be read),
/// but no more than its cgroups' CPU quota allows (cgroup_cpu_limit), at most kMaxThreads; 1
/// when they cannot be read. The default thread count of every verb.
int available_cores();

/// The whole CPUs that the CFS quota of the cgroups holding this process allow it (`docker
/// --cpus`, a Kubernetes CPU limit), rounded up: the smallest of its own cgroup's and its
/// ancestors' limits, from cgroup v2's `cpu.max` and v1's `cpu.cfs_quota_us` /
/// `cpu.cfs_period_us`; 0 where none is set or none can be read. `self_cgroup` and `mountinfo`
/// hold the texts of /proc/self/cgroup and /proc/self/mountinfo; `root` is prefixed to the
/// mount points they name (a test's copy of the tree; empty for the system's).
int cgroup_cpu_limit(std::string_view self_cgroup, std::string_view mountinfo, const std::string& root = "");

/// Sizes the pool to `threads` (>= 1) and turns on FTZ/DAZ in each of its threads. Cheap when
/// the pool already has that size; call it before running kernels on another thread count.
void use_threads(int threads);

/// The pool's size, as use_threads last set it (OpenMP's default before that).
int pool_threads();
/// The calling thread's index in the current parallel region (0 outside one).
int thread_index();

/// The [begin, end) of `count` units that `part` of `parts` gets: even shares, the first
/// count % parts one unit longer.
inline std::pair<int64_t, int64_t> even_share(int64_t count, int parts, int part) {
  const int64_t base = count / parts, extra = count % parts;
  const int64_t begin = part * base + (part < extra ? part : extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

/// Units [0, count) that the threads of a parallel region share, a chunk at a time: each
/// part's even share (even_share's) is a queue that its own thread takes chunks from first, in
/// order, and a thread whose queue is empty then takes what is left of the others'. A thread
/// that runs slower or starts later than the rest (a vCPU whose core a neighbour's work shares)
/// so no longer holds the region up, while each share runs where a static split would run it
/// as long as the threads keep pace. Fill the queues before the threads take from them (before
/// the region, or before a barrier inside it that they all pass first), and not again until
/// every thread has finished taking. Only the queues of `parts` threads are ever written: one
/// costs no more to set up than the threads it serves.
class ShareQueues {
 public:
  static constexpr int kMaxParts = 64;

  /// Chunks of `chunk` units for `parts` threads; past kMaxParts threads, those after the
  /// first kMaxParts have no share of their own and take from the others'.
  ShareQueues(int parts, int64_t chunk) : parts_(std::clamp(parts, 1, kMaxParts)), chunk_(std::max<int64_t>(1, chunk)) {}
  ShareQueues(const ShareQueues&) = delete;
  ShareQueues& operator=(const ShareQueues&) = delete;

  /// The chunk that cuts each of `parts` shares of `units` into 16 (at least one unit): a
  /// two-thread product of kiln's GEMM took 0.92-1.01 of its time with the even split alone
  /// (2-32 chunks tried; BERT-base's and ViT-S/16's linear layers, GPT-2's LM head, ResNet-50's
  /// 56x56 expansions; an in-process harness alternating the two call by call).
  static int64_t chunk_for(int64_t units, int parts) { return units / std::max(parts, 1) / 16; }

  /// Every part's queue: its even share of [0, count).
  void fill(int64_t count) {
    for (int q = 0; q < parts_; ++q) {
      const auto [begin, end] = even_share(count, parts_, q);
      queues_[q].next = begin;
      queues_[q].end = end;
    }
  }

  /// Runs fn(begin, end, more) on every chunk that part `part`'s thread takes: its own queue's
  /// first, then the others'. `more`: the chunk's queue has units past `end` (the chunk that
  /// the same thread most likely takes next).
  template <class Fn>
  void drain(int part, Fn&& fn) {
    for (int i = 0; i < parts_; ++i) {
      Queue& q = queues_[(part + i) % parts_];
      for (;;) {
        const int64_t begin = std::atomic_ref<int64_t>(q.next).fetch_add(chunk_, std::memory_order_relaxed);
        if (begin >= q.end) break;
        const int64_t end = std::min(begin + chunk_, q.end);
        fn(begin, end, end < q.end);
      }
    }
  }

 private:
  // Plain integers (taken through atomic_ref), so that the queues past `parts` are never
  // initialised; a line each, so that two threads' queues never share one.
  struct alignas(64) Queue {
    int64_t next;
    int64_t end;
  };
  int parts_;
  int64_t chunk_;
  std::array<Queue, kMaxParts> queues_;
};

/// Copies `bytes` between non-overlapping buffers, split among the pool's threads when it is
/// large enough to gain from it (256 KiB): one core cannot fill the memory bandwidth of many.
void parallel_copy(void* dst, const void* src, size_t bytes);

/// Whether every thread of the pool (the caller included) flushes denormals now.
bool pool_flushes_denormals();

/// FTZ/DAZ on the calling thread for its lifetime (when `on`), restoring the caller's setting
/// after: a run flushes denormals without leaking the mode into the code that called it.
class FlushDenormals {
 public:
  explicit FlushDenormals(bool on = true);
  ~FlushDenormals();
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

/// Whether the calling thread flushes denormals (FTZ and DAZ both on).
bool flushes_denormals();

/// One stretch of work of one pool thread inside a kiln kernel's parallel region.
struct WorkerSpanRecord {
  int thread;        ///< index in the pool (0: the thread that runs the nodes)
  int64_t os_tid;    ///< the OS thread id
  int64_t begin_ns;  ///< std::chrono::steady_clock, since its epoch
  int64_t end_ns;
};

/// Worker spans, for the profiler's trace: while recording is on, each WorkerSpan placed at
/// the top of a parallel region of kiln's own kernels (GEMM, attention, depthwise convolution)
/// records its thread's stretch of work. Off, a WorkerSpan costs one relaxed atomic load.
void record_worker_spans(bool on);
/// The spans recorded since the last call, every thread's; call it after the parallel
/// regions have ended (between nodes), from the thread that runs the nodes.
std::vector<WorkerSpanRecord> take_worker_spans();

class WorkerSpan {
 public:
  WorkerSpan();
  ~WorkerSpan();
  WorkerSpan(const WorkerSpan&) = delete;
  WorkerSpan& operator=(const WorkerSpan&) = delete;

 private:
  int64_t begin_ns_ = -1;
};

}  // namespace kiln
