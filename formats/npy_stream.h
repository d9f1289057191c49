// The pieces of the .npy reader and writer that formats/npz.cc shares with formats/npy.cc: a
// .npy image read from a stream whose size its container declares (a file, a zip member being
// inflated), straight into the Tensor, and numpy's header for writing. Not a public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/status.h"
#include "formats/tensor.h"

namespace kiln::npy_detail {

/// Where .npy bytes come from.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  /// Reads up to `n` bytes into `dst`: how many were read (0 only at the end), or an error
  /// without a file name.
  virtual Result<size_t> read(void* dst, size_t n) = 0;
};

/// Reads a .npy image that its container says is `size` bytes long. Every size in the header is
/// checked against `size` before anything is allocated; the data is read straight into the
/// tensor, and the source must end exactly after `size` bytes (reading to the end is what makes
/// libzip check a member's CRC-32). `container` ("file", "member") names the container in
/// messages. Errors are user errors without a file name.
Result<Tensor> read_npy_stream(ByteSource& source, uint64_t size, std::string_view container);

/// numpy.save's header (magic, version, length, dict, padding) for a tensor of this dtype and
/// shape; the data follows it as is.
std::vector<uint8_t> npy_header(DType dtype, const std::vector<int64_t>& shape);

/// The tensor numpy should see: bf16 widened to f32, i4 / u4 to i8 / u8, everything else the
/// tensor itself.
Tensor npy_storable(const Tensor& t);

/// A user error about `file`.
Error file_error(std::string_view file, std::string where, std::string what);

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

/// Opens a file for reading; a user error naming it when it cannot be opened.
Result<FilePtr> open_file(const std::string& path);
/// The size of a regular file; nullopt for pipes, devices and the like, whose size is unknown.
std::optional<uint64_t> regular_file_size(std::FILE* f);
/// Appends the rest of an open file to `out`; a user error naming `path` when it cannot be read.
Status read_rest(std::FILE* f, const std::string& path, std::vector<uint8_t>& out);

}  // namespace kiln::npy_detail
