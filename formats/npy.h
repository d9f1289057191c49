// NumPy .npy and .npz files: the tensor files `kiln run` reads inputs from and writes outputs
// to, and that calibration data and reference outputs come in. Reading accepts what numpy
// writes (format versions 1.0, 2.0 and 3.0, C or Fortran order, either byte order, .npz stored
// or deflated, zip64) and rejects everything else with a user error naming the file. .npz
// archives are read and written with libzip (formats/npz.cc); .npy parsing is kiln's own
// (formats/npy.cc). Files are streamed: a .npy file or an .npz member is read straight into its
// tensor, so reading never holds a whole file or archive in memory besides the tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/status.h"
#include "formats/tensor.h"

namespace kiln {

/// Named tensors in file order (an .npz archive, a set of inputs or outputs).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// Parses a .npy image. `file` is set as Error::file on failure. Dtypes map as numpy names
/// them: '<f4' f32, '<f2' f16, '<f8' f64, '|i1' i8, '|u1' u8, '<i2' i16, '<u2' u16, '<i4' i32,
/// '<u4' u32, '<i8' i64, '<u8' u64, '|b1' bool. Big-endian data is byte-swapped and Fortran
/// order is transposed, so the result is always a row-major kiln Tensor; bool bytes other than
/// 0 are read as 1. Rejected: bad magic, versions other than 1.0/2.0/3.0, a malformed header,
/// object (pickled), string, structured, complex and datetime dtypes, negative or overflowing
/// shapes, and data shorter or longer than the shape needs. Sizes are checked against the
/// image's length before the tensor is allocated; a tensor that does not fit the memory budget
/// (formats/memory.h) is a user error naming its shape and size.
Result<Tensor> read_npy(std::span<const uint8_t> bytes, std::string_view file);
/// Reads a .npy file, streaming the data into the tensor (a pipe is read whole first).
Result<Tensor> read_npy_file(const std::string& path);

/// Serializes a tensor exactly as numpy.save does (format 1.0, 2.0 only if the header needs
/// it; little-endian; C order; the header padded with spaces and a newline to a multiple of 64
/// bytes, with numpy's spare room for the first dimension to grow). numpy has no bfloat16,
/// so a bf16 tensor is written as '<f4': the widening is exact and numpy users get the values
/// rather than raw bit patterns (reading such a file back gives f32). `t` must be defined.
std::vector<uint8_t> write_npy(const Tensor& t);
/// Writes a .npy file.
Status write_npy_file(const std::string& path, const Tensor& t);

/// Parses an .npz archive held in memory (numpy.savez: stored; numpy.savez_compressed:
/// deflate; zip64 records as numpy writes them). A member "x.npy" becomes the tensor "x";
/// members not ending in ".npy" keep their name and must still hold .npy data; directory
/// entries are skipped. Each member's .npy header is checked against the member's declared
/// size before its tensor is allocated, and a tensor that does not fit the memory budget
/// (formats/memory.h) is a user error naming the member and the size. Errors about one member
/// have where = "member 'x.npy'". Corrupt archives (bad signatures, central directory and local
/// headers that disagree, CRC mismatch, truncation, duplicate members, methods other than
/// stored and deflate, encryption) are rejected.
Result<NamedTensors> read_npz(std::span<const uint8_t> bytes, std::string_view file);
/// Reads an .npz file as read_npz does, streaming each member from the file into its tensor:
/// besides the tensors, memory holds little more than the central directory.
Result<NamedTensors> read_npz_file(const std::string& path);

struct NpzWriteOptions {
  bool compress = false;  ///< deflate the members, as numpy.savez_compressed does
};

/// Builds an .npz archive: member "<name>.npy" per tensor, in the given order, with fixed
/// timestamps (1980-01-01 00:00) and no extra fields, so the bytes are reproducible. Zip64
/// records are written only where a size or offset needs them. Fails on an empty or duplicate
/// name, or one holding a NUL byte.
Result<std::vector<uint8_t>> write_npz(const NamedTensors& tensors, const NpzWriteOptions& options = {});
/// Writes an .npz file atomically (formats/atomic_file.h).
Status write_npz_file(const std::string& path, const NamedTensors& tensors,
                      const NpzWriteOptions& options = {});

/// Reads a .npy or .npz image, told apart by content (the .npy magic or a zip signature). A
/// .npy gives one tensor named `npy_name`; an .npz gives its members.
Result<NamedTensors> read_tensors(std::span<const uint8_t> bytes, std::string_view file,
                                  std::string_view npy_name);
/// Reads a .npy or .npz file (streamed as read_npy_file and read_npz_file do). A .npy file's
/// tensor is named after the file: its base name without ".npy", percent-decoded (the inverse
/// of percent_encode_file_name).
Result<NamedTensors> read_tensors_file(const std::string& path);

/// Turns a value name into a safe file name component: bytes outside [A-Za-z0-9._-], and a
/// leading '.', become %XX (upper-case hex), so "input:0" → "input%3A0", "../x" → "%2E.%2Fx".
/// The mapping is one-to-one ('%' itself is encoded), so names never collide. Empty stays empty.
std::string percent_encode_file_name(std::string_view name);
/// The inverse: decodes every %XX; nullopt when a '%' is not followed by two hex digits.
std::optional<std::string> percent_decode_file_name(std::string_view encoded);

/// Reads a whole file into memory; a user error naming the file when it cannot be read.
Result<std::vector<uint8_t>> read_file_bytes(const std::string& path);
/// The same into a string (an ONNX model, a JSON file): a user error naming the file when it is
/// a directory, cannot be opened or read, or outgrows the memory budget while it is read.
Result<std::string> read_file_string(const std::string& path);
/// Writes a whole file atomically (formats/atomic_file.h), replacing it; a user error naming
/// the file when it cannot be written.
Status write_file_bytes(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace kiln
