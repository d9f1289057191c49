// Tensor storage.
#include "formats/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>

#include "formats/memory.h"

namespace kiln {

int64_t shape_numel(std::span<const int64_t> shape) {
  // The non-zero dims must multiply within int64 even when another dim is 0, so that every
  // stride of a valid shape fits (an empty 0 x 2^62 x 2^62 tensor is refused, not strided).
  int64_t n = 1;
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d == 0) {
      empty = true;
      continue;
    }
    if (n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return empty ? 0 : n;
}

std::string shape_str(std::span<const int64_t> shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s;
}

namespace {

constexpr size_t kTensorBookkeepingBytes = 256;

// Aligned storage of `bytes` (nullopt: past any limit), zero-filled where `zero`, charged
// against the memory budget; sets `data` and returns its owner.
std::shared_ptr<void> allocate(std::optional<size_t> bytes, void*& data, bool zero = true) {
  // A negative or overflowing shape cannot be allocated: report it as a request past any limit.
  if (!bytes || *bytes > SIZE_MAX - kTensorAlignment) throw MemoryLimitExceeded(SIZE_MAX, memory_in_use(), memory_limit());
  size_t rounded = (*bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (rounded == 0) rounded = kTensorAlignment;
  // The charge includes the bookkeeping around the data (allocator header, shared_ptr control
  // block, the Tensor and its shape), which dominates for the many tiny tensors a Loop can make.
  const size_t charge = rounded + kTensorBookkeepingBytes;
  charge_memory(charge);
  void* p = std::aligned_alloc(kTensorAlignment, rounded);
  if (!p) {
    release_memory(charge);
    throw std::bad_alloc();
  }
  if (zero) std::memset(p, 0, rounded);
  data = p;
  return std::shared_ptr<void>(p, [charge](void* q) {
    std::free(q);
    release_memory(charge);
  });
}

}  // namespace

Tensor::Tensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)), numel_(shape_numel(shape_)) {
  owner_ = allocate(storage_bytes(dtype_, numel_), data_);
}

Tensor Tensor::for_overwrite(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.owner_ = allocate(storage_bytes(t.dtype_, t.numel_), t.data_, false);
  return t;
}

Tensor Tensor::view(DType dtype, std::vector<int64_t> shape, void* data,
                    std::shared_ptr<void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = std::max<int64_t>(shape_numel(t.shape_), 0);
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::packed(DType dtype, std::vector<int64_t> shape, PackedLayout layout, size_t storage_bytes, void* data,
                      std::shared_ptr<void> owner) {
  Tensor t = view(dtype, std::move(shape), data, std::move(owner));
  t.layout_ = std::make_shared<const PackedLayout>(std::move(layout));
  t.packed_bytes_ = storage_bytes;
  return t;
}

Tensor Tensor::reshaped(std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.numel_ = std::max<int64_t>(shape_numel(t.shape_), 0);
  return t;
}

Tensor Tensor::part(size_t offset, DType dtype, std::vector<int64_t> shape) const {
  return view(dtype, std::move(shape), static_cast<char*>(data_) + offset, owner_);
}

Tensor Tensor::as_packed(DType dtype, std::vector<int64_t> shape, PackedLayout layout) const {
  return packed(dtype, std::move(shape), std::move(layout), nbytes(), data_, owner_);
}

Tensor Tensor::clone() const {
  if (layout_) {
    Tensor t = *this;
    t.owner_ = allocate(packed_bytes_, t.data_);
    if (packed_bytes_) std::memcpy(t.data_, data_, packed_bytes_);
    return t;
  }
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

double Tensor::as_double(int64_t i) const {
  if (is_int4(dtype_)) return int4_at(dtype_, data_, i);
  return visit_dtype(dtype_, [&](auto tag) -> double {
    using T = decltype(tag);
    return static_cast<double>(static_cast<const T*>(data_)[i]);
  });
}

int64_t Tensor::as_int64(int64_t i) const {
  if (is_int4(dtype_)) return int4_at(dtype_, data_, i);
  return visit_dtype(dtype_, [&](auto tag) -> int64_t {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
      return static_cast<int64_t>(static_cast<float>(static_cast<const T*>(data_)[i]));
    else
      return static_cast<int64_t>(static_cast<const T*>(data_)[i]);
  });
}

std::vector<int64_t> Tensor::to_int64_vector() const {
  std::vector<int64_t> v(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) v[static_cast<size_t>(i)] = as_int64(i);
  return v;
}

std::vector<double> Tensor::to_double_vector() const {
  std::vector<double> v(static_cast<size_t>(numel_));
  if (is_int4(dtype_)) {
    for (int64_t i = 0; i < numel_; ++i) v[static_cast<size_t>(i)] = int4_at(dtype_, data_, i);
    return v;
  }
  visit_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(data_);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(p[i]);
  });
  return v;
}

}  // namespace kiln
