// SHA-256, for the provenance record of an input file.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kiln {

/// Lower-case hex SHA-256 of the bytes.
std::string sha256_hex(std::span<const uint8_t> bytes);

}  // namespace kiln
