#include "runtime/threads.h"

#include <cpuinfo.h>
#include <xmmintrin.h>

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <string>

#include "formats/ir.h"
#include "formats/npy.h"

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

// A file's text; nullopt where it cannot be read (a cgroup file the kernel does not have).
std::optional<std::string> read_text(const std::string& path) {
  auto text = read_file_string(path);
  if (!text.ok()) return std::nullopt;
  return std::move(*text);
}

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  for (size_t begin = 0;;) {
    const size_t end = text.find(sep, begin);
    parts.push_back(text.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin));
    if (end == std::string_view::npos) return parts;
    begin = end + 1;
  }
}

bool holds(std::string_view list, std::string_view item) {
  for (std::string_view part : split(list, ','))
    if (part == item) return true;
  return false;
}

// ceil(quota / period) from the texts of one cgroup's files; 0 for none ("max", -1) or what
// does not parse.
int64_t whole_cpus(std::string_view quota, std::string_view period) {
  int64_t q = 0, p = 0;
  const auto number = [](std::string_view t, int64_t& v) {
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc{} && end == t.data() + t.size();
  };
  if (!number(quota, q) || !number(period, p) || q <= 0 || p <= 0) return 0;
  return (q + p - 1) / p;
}

}  // namespace

int cgroup_cpu_limit(std::string_view self_cgroup, std::string_view mountinfo, const std::string& root) {
  int64_t limit = 0;
  for (std::string_view line : split(mountinfo, '\n')) {
    // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS"
    const size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    const std::vector<std::string_view> before = split(line.substr(0, dash), ' '), after = split(line.substr(dash + 3), ' ');
    if (before.size() < 5 || after.size() < 3) continue;
    const bool v2 = after[0] == "cgroup2";
    if (!v2 && !(after[0] == "cgroup" && holds(after[2], "cpu"))) continue;
    // This process's cgroup in that hierarchy: "0::PATH" (v2), "ID:CONTROLLERS:PATH" with cpu
    // among the controllers (v1).
    std::optional<std::string_view> path;
    for (std::string_view entry : split(self_cgroup, '\n')) {
      const size_t a = entry.find(':'), b = a == std::string_view::npos ? a : entry.find(':', a + 1);
      if (b == std::string_view::npos) continue;
      const std::string_view controllers = entry.substr(a + 1, b - a - 1);
      if (v2 ? entry.substr(0, a) == "0" && controllers.empty() : holds(controllers, "cpu")) path = entry.substr(b + 1);
    }
    if (!path) continue;
    // The mount shows the hierarchy from its ROOT down (a container's own cgroup, without a
    // cgroup namespace); the process's path names it from the top.
    const std::string_view mount_root = before[3];
    std::string_view below = *path;
    if (mount_root != "/") {
      if (below.substr(0, mount_root.size()) != mount_root) below = "";
      else below.remove_prefix(mount_root.size());
    }
    const std::filesystem::path top = std::filesystem::path(root + std::string(before[4])).lexically_normal();
    std::filesystem::path dir = (top / std::filesystem::path(std::string(below)).relative_path()).lexically_normal();
    // Its own cgroup's limit and every ancestor's within the mount: the smallest binds.
    for (;;) {
      int64_t cpus = 0;
      if (v2) {
        if (const auto max = read_text((dir / "cpu.max").string())) {
          const std::vector<std::string_view> fields = split(*max, ' ');
          if (fields.size() == 2) cpus = whole_cpus(fields[0], fields[1]);
        }
      } else if (const auto quota = read_text((dir / "cpu.cfs_quota_us").string())) {
        if (const auto period = read_text((dir / "cpu.cfs_period_us").string())) cpus = whole_cpus(*quota, *period);
      }
      if (cpus > 0 && (limit == 0 || cpus < limit)) limit = cpus;
      if (dir == top || !dir.has_relative_path() || dir.parent_path() == dir) break;
      dir = dir.parent_path();
    }
  }
  return static_cast<int>(std::min<int64_t>(limit, std::numeric_limits<int>::max()));
}

int available_cores() {
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
    int n = allowed.empty() ? static_cast<int>(cpuinfo_get_cores_count()) : static_cast<int>(allowed.size());
    // A CPU quota (`docker --cpus 2` on a 64-core host) leaves every CPU in the mask but lets
    // the process use only so many at once: threads past it wait for the next period, and each
    // parallel region waits for the slowest (EfficientNet-B0 in a cgroup allowed one CPU of the
    // 2-core Xeon: a mean run of 44.5-45.8 ms at two threads, 30.4-33.5 at one).
    const int quota = cgroup_cpu_limit(read_text("/proc/self/cgroup").value_or(""), read_text("/proc/self/mountinfo").value_or(""));
    if (quota > 0) n = std::min(n, quota);
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
