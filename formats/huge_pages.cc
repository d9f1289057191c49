// Memory on transparent huge pages.
#include "formats/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>

namespace kiln {

bool huge_pages_enabled(std::string_view thp_mode) {
  return thp_mode.find("[always]") != std::string_view::npos || thp_mode.find("[madvise]") != std::string_view::npos;
}

const std::string& transparent_huge_pages() {
  static const std::string mode = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    std::getline(f, line);
    return line;
  }();
  return mode;
}

namespace {

size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

std::shared_ptr<HugePages> HugePages::map(size_t bytes) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes == 0 || bytes > SIZE_MAX / 2) return nullptr;
  bytes = round_up(bytes, page);
  if (!try_charge_memory(bytes)) return nullptr;
  MemoryCharge charge = MemoryCharge::adopt(bytes);
  // Room to start on a 2 MiB boundary; the slack either side goes back at once.
  const size_t length = bytes + kHugePageBytes;
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* const base = static_cast<uint8_t*>(p);
  auto* const start = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(p), kHugePageBytes));
  if (start > base) ::munmap(base, static_cast<size_t>(start - base));
  if (uint8_t* const end = start + bytes; end < base + length) ::munmap(end, static_cast<size_t>(base + length - end));
  if (const size_t whole = bytes / kHugePageBytes * kHugePageBytes; whole > 0) ::madvise(start, whole, MADV_HUGEPAGE);
  std::shared_ptr<HugePages> region(new HugePages());
  region->data_ = start;
  region->bytes_ = bytes;
  region->charge_ = std::move(charge);
  return region;
}

HugePages::~HugePages() {
  if (data_ && bytes_) ::munmap(data_, bytes_);
}

size_t HugePages::fault_in(const HugePageFault& fault, double& slow_budget_ms) {
  // The kernel hands out each huge page on its first touch.
  const HugePageFault touch = fault ? fault : [](uint8_t* page) {
    const auto t0 = std::chrono::steady_clock::now();
    *reinterpret_cast<volatile uint8_t*>(page) = 0;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const size_t whole = bytes_ / kHugePageBytes * kHugePageBytes;
  size_t faulted = 0;
  for (; faulted < whole && slow_budget_ms > 0; faulted += kHugePageBytes) {
    const double ms = touch(data_ + faulted);
    if (ms > kSlowHugePageMs) slow_budget_ms -= ms;
  }
  return faulted;
}

void HugePages::shrink(size_t offset) {
  const size_t keep = std::min(bytes_, round_up(offset, kHugePageBytes));
  if (keep == bytes_) return;
  ::munmap(data_ + keep, bytes_ - keep);
  bytes_ = keep;
  charge_ = MemoryCharge();  // released, then charged again for what stays
  charge_ = MemoryCharge(keep);
}

void HugePages::ordinary_pages_from(size_t offset) {
  const size_t from = std::min(bytes_, round_up(offset, kHugePageBytes));
  if (from < bytes_) ::madvise(data_ + from, bytes_ - from, MADV_NOHUGEPAGE);
}

std::shared_ptr<HugePages> huge_pages_if_quick(size_t bytes, std::string_view thp_mode, const HugePageFault& fault,
                                               double& slow_budget_ms) {
  if (bytes < kHugePageBytes || !huge_pages_enabled(thp_mode) || slow_budget_ms <= 0) return nullptr;
  std::shared_ptr<HugePages> region = HugePages::map(bytes);
  if (region) region->ordinary_pages_from(region->fault_in(fault, slow_budget_ms));
  return region;
}

namespace {

// The process's budget of slow huge pages, and the lock that orders its users.
std::mutex process_budget_mu;
double process_budget_ms = kSlowHugePagesBudgetMs;

}  // namespace

std::shared_ptr<HugePages> huge_pages_if_quick(size_t bytes) {
  std::lock_guard lock(process_budget_mu);
  return huge_pages_if_quick(bytes, transparent_huge_pages(), nullptr, process_budget_ms);
}

bool huge_pages_quick_so_far() {
  std::lock_guard lock(process_budget_mu);
  return process_budget_ms > 0;
}

namespace {

// `region` (null: none) as a tensor of `dtype` and `shape`, else Tensor(dtype, shape).
Tensor on(std::shared_ptr<HugePages> region, DType dtype, std::vector<int64_t> shape) {
  if (!region) return Tensor(dtype, std::move(shape));  // which throws what the budget says, if it does
  uint8_t* const data = region->data();
  return Tensor::view(dtype, std::move(shape), data, std::shared_ptr<void>(std::move(region), data));
}

}  // namespace

Tensor huge_page_tensor(DType dtype, std::vector<int64_t> shape, std::string_view thp_mode, const HugePageFault& fault,
                        double& slow_budget_ms) {
  const std::optional<size_t> bytes = storage_bytes(dtype, shape_numel(shape));
  return on(bytes ? huge_pages_if_quick(*bytes, thp_mode, fault, slow_budget_ms) : nullptr, dtype, std::move(shape));
}

Tensor huge_page_tensor(DType dtype, std::vector<int64_t> shape) {
  const std::optional<size_t> bytes = storage_bytes(dtype, shape_numel(shape));
  return on(bytes ? huge_pages_if_quick(*bytes) : nullptr, dtype, std::move(shape));
}

}  // namespace kiln
