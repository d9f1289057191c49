// A small zip archive reader and writer, just enough for .npz files: members stored or
// deflated (zlib), zip64 sizes and offsets, CRC-32 verification. No encryption, no spanning,
// no other compression methods: those are rejected with a user error.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/status.h"

namespace kiln {

/// Called once per file member (directories are skipped), in central-directory order, with the
/// member's uncompressed bytes; the span is valid only during the call. A failed Status stops
/// the walk and is returned by read_zip.
using ZipMemberFn = std::function<Status(const std::string& name, std::span<const uint8_t> data)>;

/// Walks the members of a zip archive held in memory, checking every signature, bound and
/// CRC-32. Errors are user errors without a file name (the caller adds it); those about one
/// member have where = "member '<name>'".
Status read_zip(std::span<const uint8_t> archive, const ZipMemberFn& fn);

struct ZipWriteOptions {
  bool deflate = false;      ///< deflate members (numpy.savez_compressed) instead of storing them
  bool force_zip64 = false;  ///< write zip64 records even when no size or offset needs them
};

/// Builds a zip archive in memory. Timestamps are fixed (1980-01-01 00:00) so that the same
/// members always give the same bytes. Zip64 records are written where a size, offset or count
/// does not fit the classic fields, as Python's zipfile does.
class ZipWriter {
 public:
  explicit ZipWriter(ZipWriteOptions options = {}) : options_(options) {}

  /// Appends a member; names are stored as given (UTF-8).
  void add(std::string_view name, std::span<const uint8_t> data);
  /// Writes the central directory and returns the archive; the writer is empty afterwards.
  std::vector<uint8_t> finish();

 private:
  struct Entry {
    std::string name;
    uint32_t crc = 0;
    uint16_t method = 0;
    uint64_t size = 0;
    uint64_t compressed_size = 0;
    uint64_t offset = 0;
    bool zip64 = false;
  };
  ZipWriteOptions options_;
  std::vector<uint8_t> out_;
  std::vector<Entry> entries_;
};

}  // namespace kiln
