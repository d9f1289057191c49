// Tensor: a dtype, a concrete shape and 64-byte-aligned data, shared by reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "formats/layout.h"

namespace kiln {

/// Alignment of every buffer kiln allocates and of every weight in a .kiln file.
inline constexpr size_t kTensorAlignment = 64;

/// Product of dims (1 for rank 0); -1 if any dim is negative or the product of the non-zero
/// dims overflows int64 (such a shape has strides that do not fit, even when it is empty).
int64_t shape_numel(std::span<const int64_t> shape);
/// "1x3x224x224"; "scalar" for rank 0.
std::string shape_str(std::span<const int64_t> shape);

/// A dense row-major tensor. Copies share the data (like a shared_ptr); use clone() for a copy.
/// A packed tensor (a compiled model's weight stored in its kernel's layout) holds its elements
/// in a PackedLayout instead: only kernels that read that layout take it as it is; the
/// execution plan unpacks it for every other reader.
class Tensor {
 public:
  Tensor() = default;
  /// Allocates zero-filled, aligned storage, charged against the memory budget
  /// (formats/memory.h): throws MemoryLimitExceeded when it does not fit or when the shape has
  /// a negative dim or its byte count overflows.
  Tensor(DType dtype, std::vector<int64_t> shape);
  /// Allocates as the constructor does but leaves the storage unwritten, for a caller that
  /// writes every byte before anything reads it: the zeros cost a pass over memory it is about
  /// to write (a shaped ResNet-50's Winograd transforms, 30 MB: 12 % of its session).
  static Tensor for_overwrite(DType dtype, std::vector<int64_t> shape);
  /// Wraps memory owned by `owner` (an arena, a mapped file) without copying.
  static Tensor view(DType dtype, std::vector<int64_t> shape, void* data,
                     std::shared_ptr<void> owner);
  /// Wraps `storage_bytes` of memory holding the elements in `layout`, which the caller has
  /// checked (check_layout) against the shape and the storage.
  static Tensor packed(DType dtype, std::vector<int64_t> shape, PackedLayout layout, size_t storage_bytes, void* data,
                       std::shared_ptr<void> owner);
  /// A rank-0 or 1-D tensor from values, for tests and constants.
  template <class T>
  static Tensor from(std::vector<int64_t> shape, const std::vector<T>& values) {
    Tensor t(dtype_of<T>::value, std::move(shape));
    for (size_t i = 0; i < values.size() && i < static_cast<size_t>(t.numel()); ++i)
      t.data<T>()[i] = values[i];
    return t;
  }

  bool defined() const { return dtype_ != DType::undefined; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[static_cast<size_t>(i)]; }
  int64_t numel() const { return numel_; }
  /// The bytes of its storage: numel × element size (half a byte for i4 / u4), or a packed
  /// layout's storage.
  size_t nbytes() const { return layout_ ? packed_bytes_ : storage_bytes(dtype_, numel_).value_or(0); }
  /// The packed layout of the data, null for a plain row-major tensor.
  const PackedLayout* layout() const { return layout_.get(); }
  bool is_packed() const { return layout_ != nullptr; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <class T> T* data() { return static_cast<T*>(data_); }
  template <class T> const T* data() const { return static_cast<const T*>(data_); }
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(data_), nbytes()};
  }

  /// Same data, another shape with the same element count (plain tensors only).
  Tensor reshaped(std::vector<int64_t> shape) const;
  /// A view of part of its storage, sharing it: `shape`'s elements of `dtype` from byte
  /// `offset` on (plain tensors only; the part must lie within).
  Tensor part(size_t offset, DType dtype, std::vector<int64_t> shape) const;
  /// Its whole storage, sharing it, as a packed tensor of `dtype` and `shape` in `layout` (a
  /// kernel's packed weight, which the caller has laid out so).
  Tensor as_packed(DType dtype, std::vector<int64_t> shape, PackedLayout layout) const;
  /// Whether this tensor is the only holder of its storage (no copy or view of it is alive).
  bool sole_owner() const { return owner_ && owner_.use_count() == 1; }
  /// A deep copy with its own storage (and the same layout).
  Tensor clone() const;
  /// Element i converted to double / int64 (any dtype), for shape operands and printing.
  double as_double(int64_t i) const;
  int64_t as_int64(int64_t i) const;
  /// All elements as int64 (shape operands: Reshape shapes, Slice starts, …).
  std::vector<int64_t> to_int64_vector() const;
  /// All elements as double (bool as 0 / 1), for kernels that compute in double.
  std::vector<double> to_double_vector() const;

 private:
  DType dtype_ = DType::undefined;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
  std::shared_ptr<const PackedLayout> layout_;
  size_t packed_bytes_ = 0;
};

}  // namespace kiln
