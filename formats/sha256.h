// SHA-256, for the provenance record of an input file.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace kiln {

/// A SHA-256 over bytes that arrive in pieces (a file hashed as it streams past): the digest of
/// all update()s together is sha256_hex of their concatenation. On the SHA extensions where the
/// CPU has them.
class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> bytes);
  /// The lower-case hex digest of everything given so far; ends the hash (call once).
  std::string hex();

 private:
  std::array<uint32_t, 8> h_;
  uint8_t pending_[64];
  size_t pending_size_ = 0;
  uint64_t total_ = 0;
};

/// Lower-case hex SHA-256 of the bytes: on the SHA extensions where the CPU has them (checked
/// when first asked), else in portable code.
std::string sha256_hex(std::span<const uint8_t> bytes);
/// The same digest in the portable code alone (what a CPU without the extensions runs).
std::string sha256_hex_portable(std::span<const uint8_t> bytes);

}  // namespace kiln
