// The process-wide memory budget.
#include "formats/memory.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>

namespace kiln {

namespace {

std::atomic<size_t> g_in_use{0};
std::atomic<size_t> g_peak{0};
std::atomic<size_t> g_limit{0};  // 0: not read yet

// MemAvailable from /proc/meminfo (what can be allocated without swapping); physical memory
// when the kernel does not report it.
size_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return static_cast<size_t>(pages) * static_cast<size_t>(page);
  return size_t{1} << 34;
}

}  // namespace

size_t memory_limit() {
  size_t l = g_limit.load(std::memory_order_relaxed);
  if (l == 0) {
    size_t expected = 0;
    g_limit.compare_exchange_strong(expected, available_memory());
    l = g_limit.load(std::memory_order_relaxed);
  }
  return l;
}

void set_memory_limit(size_t bytes) { g_limit.store(bytes == 0 ? available_memory() : bytes); }
size_t memory_in_use() { return g_in_use.load(std::memory_order_relaxed); }
size_t memory_peak() { return g_peak.load(std::memory_order_relaxed); }
void reset_memory_peak() { g_peak.store(memory_in_use()); }

MemoryLimitExceeded::MemoryLimitExceeded(size_t requested, size_t in_use, size_t limit)
    : requested_(requested) {
  message_ = "needs " + format_bytes(requested) + " with " + format_bytes(in_use) +
             " already in use, past the memory limit of " + format_bytes(limit) + " (--max-memory)";
}

bool try_charge_memory(size_t bytes) {
  size_t limit = memory_limit();
  size_t cur = g_in_use.load(std::memory_order_relaxed);
  do {
    if (bytes > limit || cur > limit - bytes) return false;
  } while (!g_in_use.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  size_t now = cur + bytes, peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return true;
}

void charge_memory(size_t bytes) {
  if (!try_charge_memory(bytes)) throw MemoryLimitExceeded(bytes, memory_in_use(), memory_limit());
}

void release_memory(size_t bytes) noexcept {
  if (bytes) g_in_use.fetch_sub(bytes, std::memory_order_relaxed);
}

std::optional<size_t> parse_byte_size(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) ++i;
  std::string number(text.substr(0, i));
  std::string_view unit = text.substr(i);
  if (number.empty() || number == ".") return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return std::nullopt;
  if (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  double scale = 1;
  struct Unit { std::string_view name; double scale; };
  static constexpr Unit units[] = {
      {"", 1},          {"B", 1},
      {"K", 0x1p10},    {"KiB", 0x1p10}, {"KB", 1e3},
      {"M", 0x1p20},    {"MiB", 0x1p20}, {"MB", 1e6},
      {"G", 0x1p30},    {"GiB", 0x1p30}, {"GB", 1e9},
      {"T", 0x1p40},    {"TiB", 0x1p40}, {"TB", 1e12},
  };
  bool found = false;
  for (const Unit& u : units)
    if (unit == u.name) { scale = u.scale; found = true; }
  if (!found) return std::nullopt;
  double bytes = std::floor(v * scale);
  if (!(bytes >= 1) || bytes >= 0x1p63) return std::nullopt;
  return static_cast<size_t>(bytes);
}

std::string format_bytes(size_t bytes) {
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024 && u < 5) { v /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

std::optional<size_t> checked_bytes(int64_t count, size_t elem_size) {
  if (count < 0) return std::nullopt;
  size_t out = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(count), elem_size, &out)) return std::nullopt;
  return out;
}

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

}  // namespace kiln

// Every large heap allocation made with operator new (a kernel's std::vector sized by the data,
// a parsed protobuf, a string read from a file) is charged against the budget too, so that no
// buffer sized by a hostile file escapes it. Small ones are not: their count is bounded by the
// tensors and nodes, which are charged. The charge is the block's usable size, read the same
// way when it is freed. Tensor storage uses aligned_alloc and is charged by Tensor itself.
// Sanitizer builds keep the sanitizer's own operator new (it checks new/delete pairing); their
// fuzz runs bound allocations with libFuzzer's -malloc_limit_mb instead.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KILN_ASAN 1
#endif

#ifndef KILN_ASAN
namespace {

constexpr size_t kChargedAllocation = size_t{64} << 10;

void* charged_new(size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (!p) throw std::bad_alloc();
  size_t usable = malloc_usable_size(p);
  if (usable >= kChargedAllocation) {
    if (!kiln::try_charge_memory(usable)) {
      std::free(p);
      throw kiln::MemoryLimitExceeded(usable, kiln::memory_in_use(), kiln::memory_limit());
    }
  }
  return p;
}

void charged_delete(void* p) noexcept {
  if (!p) return;
  size_t usable = malloc_usable_size(p);
  if (usable >= kChargedAllocation) kiln::release_memory(usable);
  std::free(p);
}

}  // namespace

void* operator new(size_t n) { return charged_new(n); }
void* operator new[](size_t n) { return charged_new(n); }
void operator delete(void* p) noexcept { charged_delete(p); }
void operator delete[](void* p) noexcept { charged_delete(p); }
void operator delete(void* p, size_t) noexcept { charged_delete(p); }
void operator delete[](void* p, size_t) noexcept { charged_delete(p); }
#endif  // KILN_ASAN
