// Memory on transparent huge pages for the weights kernels stream on every run: with 4 KiB
// pages the hardware's prefetchers stop at every page and the TLB misses, so a GEMM whose packed
// weight comes from memory runs slower than from 2 MiB pages. A mapped model file may be on huge
// pages already (the page cache's large folios); what kiln allocates is not, unless it asks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/memory.h"
#include "formats/tensor.h"

namespace kiln {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

/// Whether the kernel's transparent huge pages can back memory given MADV_HUGEPAGE, from
/// /sys/kernel/mm/transparent_hugepage/enabled's text ("always [madvise] never": the bracketed
/// mode; false for "never" or text that names none).
bool huge_pages_enabled(std::string_view thp_mode);
/// This machine's /sys/kernel/mm/transparent_hugepage/enabled text, read once ("" where there is
/// none).
const std::string& transparent_huge_pages();

/// Faults in the 2 MiB page at `page` and returns the milliseconds it took.
using HugePageFault = std::function<double(uint8_t* page)>;
/// A huge page slower to fault in than this (2 MiB at under 2 GB/s; zeroing one takes 0.1-0.3 ms)
/// counts against a budget of kSlowHugePagesBudgetMs, which bounds what is spent on slow ones: a
/// virtual machine whose host backs fresh memory on demand gave pages at 0.25 ms each while the
/// guest reused memory the host had backed, then at 5-30 ms each.
inline constexpr double kSlowHugePageMs = 1.0;
inline constexpr double kSlowHugePagesBudgetMs = 5.0;

/// An anonymous mapping that starts on a 2 MiB boundary and whose whole 2 MiB pages ask for
/// transparent huge pages (MADV_HUGEPAGE), charged against the memory budget; unmapped, and its
/// charge returned, when the last owner lets go.
class HugePages {
 public:
  /// `bytes` rounded up to whole 4 KiB pages, zero-filled (faulted in on first touch); null
  /// where the memory budget has no room or the machine refuses the mapping.
  static std::shared_ptr<HugePages> map(size_t bytes);
  ~HugePages();
  HugePages(const HugePages&) = delete;
  HugePages& operator=(const HugePages&) = delete;

  uint8_t* data() const { return data_; }
  /// Faults the whole 2 MiB pages in from the start, one at a time, by `fault` (null: the first
  /// byte touched, timed), until the pages that each took over kSlowHugePageMs have cost
  /// `slow_budget_ms`, which it lowers by what they cost. Returns the bytes faulted (whole pages).
  size_t fault_in(const HugePageFault& fault, double& slow_budget_ms);
  /// Gives back the pages from `offset` (rounded up to 2 MiB) to the end, and their charge.
  void shrink(size_t offset);
  /// The pages from `offset` (rounded up to 2 MiB) to the end on ordinary 4 KiB pages
  /// (MADV_NOHUGEPAGE), where the machine gave huge ones slowly.
  void ordinary_pages_from(size_t offset);

 private:
  HugePages() = default;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryCharge charge_;
};

/// `bytes` on huge pages where they come quickly: a HugePages region of `bytes` faulted in, past
/// whose pages that came slowly (`slow_budget_ms` spent, as HugePages::fault_in) the rest is on
/// ordinary pages; null where `bytes` is under 2 MiB, `thp_mode` (huge_pages_enabled's text)
/// offers no huge pages, the budget is spent, the memory budget has no room or the machine
/// refuses the mapping.
std::shared_ptr<HugePages> huge_pages_if_quick(size_t bytes, std::string_view thp_mode, const HugePageFault& fault,
                                               double& slow_budget_ms);
/// The same on this machine, within one budget of kSlowHugePagesBudgetMs for the process. `fault`
/// (null: the first byte touched, timed) may fill each page as it faults it in.
std::shared_ptr<HugePages> huge_pages_if_quick(size_t bytes, const HugePageFault& fault = nullptr);
/// Whether the process's budget is not spent: huge_pages_if_quick(bytes) still maps huge pages
/// where this machine offers them.
bool huge_pages_quick_so_far();

/// Zero-filled storage for a weight that a kernel packs while planning and reads on every run
/// (a model compiled without --input-shape, an exported one run as it is): where it is 2 MiB or
/// more, on huge_pages_if_quick's region; otherwise Tensor(dtype, shape). LLaMA's 65 MB
/// language-model head ran 1.2x the time from 4 KiB pages. Throws as Tensor(dtype, shape) does.
Tensor huge_page_tensor(DType dtype, std::vector<int64_t> shape, std::string_view thp_mode, const HugePageFault& fault,
                        double& slow_budget_ms);
/// The same on this machine, within the process's budget.
Tensor huge_page_tensor(DType dtype, std::vector<int64_t> shape);

/// Address ranges, each [first, second), disjoint (page_use would count an overlap twice).
using AddressRanges = std::vector<std::pair<uintptr_t, uintptr_t>>;
/// The HugePages regions mapped now.
AddressRanges huge_page_regions();

/// What the pages of some address ranges are: resident bytes, and how many of them lie on 2 MiB
/// pages.
struct PageUse {
  uint64_t resident_bytes = 0;
  uint64_t huge_page_bytes = 0;
};
/// The part of `smaps` (/proc/PID/smaps's text) that lies in `ranges`: each mapping's Rss and
/// its 2 MiB pages (AnonHugePages, FilePmdMapped, ShmemPmdMapped), whole where the mapping lies
/// in the ranges and in proportion to its overlap where it lies partly in them (mappings the
/// kernel merged). Lines it does not read as a mapping or a size in kB count nothing.
PageUse page_use(std::string_view smaps, const AddressRanges& ranges);
/// This process's /proc/self/smaps ("" where it cannot be read).
std::string self_smaps();

}  // namespace kiln
