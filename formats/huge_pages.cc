// Memory on transparent huge pages.
#include "formats/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

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

// The HugePages regions mapped now: start -> end address.
struct Regions {
  std::mutex mu;
  std::map<uintptr_t, uintptr_t> ranges;
};
Regions& regions() {
  static Regions* r = new Regions;  // never destroyed: regions may be unmapped at exit
  return *r;
}

void set_region(const uint8_t* data, size_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(data);
  std::lock_guard lock(regions().mu);
  if (bytes == 0)
    regions().ranges.erase(start);
  else
    regions().ranges[start] = start + bytes;
}

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
  set_region(start, bytes);
  return region;
}

HugePages::~HugePages() {
  if (!data_ || !bytes_) return;
  set_region(data_, 0);
  ::munmap(data_, bytes_);
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
  set_region(data_, keep);
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

std::shared_ptr<HugePages> huge_pages_if_quick(size_t bytes, const HugePageFault& fault) {
  std::lock_guard lock(process_budget_mu);
  return huge_pages_if_quick(bytes, transparent_huge_pages(), fault, process_budget_ms);
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

AddressRanges huge_page_regions() {
  std::lock_guard lock(regions().mu);
  return AddressRanges(regions().ranges.begin(), regions().ranges.end());
}

namespace {

// Whether `text` is a hex number, into `value`.
bool hex(std::string_view text, uintptr_t& value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

// The bytes of "Name:   N kB" after its name, if that is how it reads.
std::optional<uint64_t> kilobytes(std::string_view rest) {
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  uint64_t kb = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kb);
  if (ec != std::errc() || std::string_view(end, rest.data() + rest.size() - end) != " kB" || kb > (UINT64_MAX >> 10))
    return std::nullopt;
  return kb << 10;
}

}  // namespace

PageUse page_use(std::string_view smaps, const AddressRanges& ranges) {
  double share = 0;  // of the mapping whose lines follow: the part of it in `ranges`
  double resident = 0, huge = 0;
  while (!smaps.empty()) {
    const size_t eol = smaps.find('\n');
    const std::string_view line = smaps.substr(0, eol);
    smaps.remove_prefix(eol == std::string_view::npos ? smaps.size() : eol + 1);
    const size_t colon = line.find(':'), dash = line.find('-'), space = line.find(' ');
    uintptr_t start = 0, end = 0;
    if (dash < space && space != std::string_view::npos && hex(line.substr(0, dash), start) &&
        hex(line.substr(dash + 1, space - dash - 1), end)) {  // "start-end perms offset dev inode path"
      share = 0;
      if (end <= start) continue;
      uintptr_t inside = 0;
      for (const auto& [first, last] : ranges)
        if (first < end && last > start) inside += std::min(end, last) - std::max(start, first);
      share = static_cast<double>(inside) / static_cast<double>(end - start);
      continue;
    }
    if (share == 0 || colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    const std::optional<uint64_t> bytes = kilobytes(line.substr(colon + 1));
    if (!bytes) continue;
    if (name == "Rss") resident += share * static_cast<double>(*bytes);
    if (name == "AnonHugePages" || name == "FilePmdMapped" || name == "ShmemPmdMapped")
      huge += share * static_cast<double>(*bytes);
  }
  auto bytes = [](double sum) {  // past what 64 bits hold (text that is not the kernel's): the most they do
    return sum < 0x1p64 ? static_cast<uint64_t>(sum + 0.5) : UINT64_MAX;
  };
  return PageUse{.resident_bytes = bytes(resident), .huge_page_bytes = bytes(huge)};
}

std::string self_smaps() {
  std::ifstream f("/proc/self/smaps");
  if (!f) return "";
  std::ostringstream text;
  text << f.rdbuf();
  return f.bad() ? "" : text.str();
}

}  // namespace kiln
