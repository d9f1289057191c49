// SHA-256, for the provenance record of an input file.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kiln {

/// Lower-case hex SHA-256 of the bytes: on the SHA extensions where the CPU has them (checked
/// when first asked), else in portable code.
std::string sha256_hex(std::span<const uint8_t> bytes);
/// The same digest in the portable code alone (what a CPU without the extensions runs).
std::string sha256_hex_portable(std::span<const uint8_t> bytes);

}  // namespace kiln
