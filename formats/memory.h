// kiln's memory budget (`--max-memory`): every allocation whose size comes from a model or a
// data file (tensors, memory arenas, large kernel buffers) is charged against one process-wide
// limit before it is made, so that a few-KB hostile file fails with a user error naming the
// value and the size instead of exhausting the machine. The default limit is the memory the
// machine has available, read once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

/// The limit in bytes; the machine's available memory unless set_memory_limit was called.
size_t memory_limit();
/// Sets the limit (`--max-memory`). 0 restores the default.
void set_memory_limit(size_t bytes);
/// Bytes currently charged.
size_t memory_in_use();
/// The most bytes charged at once since start (or since reset_memory_peak).
size_t memory_peak();
void reset_memory_peak();
/// The process's peak resident set so far, in bytes, as the OS counts it (mapped weight pages a
/// kernel touched included, unlike memory_peak).
int64_t peak_rss_bytes();

/// Thrown when a charge would take the total past the limit. It is a std::bad_alloc, so code
/// that only knows about allocation failure still handles it; the executor and the loaders
/// catch it and report a user error with the node or value it happened in.
class MemoryLimitExceeded : public std::bad_alloc {
 public:
  MemoryLimitExceeded(size_t requested, size_t in_use, size_t limit);
  const char* what() const noexcept override { return message_.c_str(); }
  size_t requested() const { return requested_; }

 private:
  size_t requested_;
  std::string message_;
};

/// What to say when the machine refuses an allocation that the budget allowed.
inline constexpr char kMachineOutOfMemory[] = "out of memory (the machine refused an allocation below --max-memory)";

/// Charges `bytes` against the budget; throws MemoryLimitExceeded when it does not fit.
void charge_memory(size_t bytes);
/// Charges `bytes` if they fit; false (and nothing charged) otherwise.
bool try_charge_memory(size_t bytes);
/// Returns a charge.
void release_memory(size_t bytes) noexcept;

/// A charge released when the object is destroyed (a kernel's scratch buffer, an arena).
class MemoryCharge {
 public:
  MemoryCharge() = default;
  explicit MemoryCharge(size_t bytes) : bytes_(bytes) { charge_memory(bytes); }
  /// Takes over a charge already made (by try_charge_memory).
  static MemoryCharge adopt(size_t bytes) {
    MemoryCharge c;
    c.bytes_ = bytes;
    return c;
  }
  MemoryCharge(MemoryCharge&& o) noexcept : bytes_(o.bytes_) { o.bytes_ = 0; }
  MemoryCharge& operator=(MemoryCharge&& o) noexcept {
    if (this != &o) {
      release_memory(bytes_);
      bytes_ = o.bytes_;
      o.bytes_ = 0;
    }
    return *this;
  }
  MemoryCharge(const MemoryCharge&) = delete;
  MemoryCharge& operator=(const MemoryCharge&) = delete;
  ~MemoryCharge() { release_memory(bytes_); }

 private:
  size_t bytes_ = 0;
};

/// "256MiB", "4G", "1.5GiB", "300MB", "1048576" (bytes): binary units for K/M/G/T with or
/// without "i" and "B" (as `ulimit` and most tools read them); nullopt when malformed.
std::optional<size_t> parse_byte_size(std::string_view text);
/// "12.0 GiB", "256 MiB", "812 bytes".
std::string format_bytes(size_t bytes);
/// Bytes of `count` elements of `elem_size` bytes each; nullopt on overflow or a negative count.
std::optional<size_t> checked_bytes(int64_t count, size_t elem_size);

}  // namespace kiln
