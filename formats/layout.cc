// Packed layouts: checking, offsets, pack and unpack.
#include "formats/layout.h"

#include <cstring>

#include "formats/checked.h"
#include "formats/memory.h"
#include "formats/tensor.h"

namespace kiln {

namespace {

// oneDNN's limit on dims (DNNL_MAX_NDIMS) and on inner blocks: a layout past it is malformed.
constexpr size_t kMaxLayoutDims = 12;

// Each dim's block: the product of the inner blocks that split it.
std::vector<int64_t> dim_blocks(const PackedLayout& l) {
  std::vector<int64_t> b(l.dims.size(), 1);
  for (size_t k = 0; k < l.inner_blocks.size(); ++k) b[static_cast<size_t>(l.inner_dims[k])] *= l.inner_blocks[k];
  return b;
}

// Walks the elements in row-major order of `dims`, calling f(plain index, storage offset).
// The offsets are those of oneDNN's memory_desc_wrapper::off_v.
template <class F>
void for_each_offset(const PackedLayout& l, F&& f) {
  const size_t rank = l.dims.size(), nblk = l.inner_blocks.size();
  const int64_t numel = shape_numel(l.dims);
  if (numel <= 0) return;
  // The inner-block strides: row-major over the blocks, innermost last.
  std::vector<int64_t> blk_stride(nblk);
  int64_t s = 1;
  for (size_t k = nblk; k-- > 0;) {
    blk_stride[k] = s;
    s *= l.inner_blocks[k];
  }
  const int64_t inner = l.dims.empty() ? 1 : l.dims.back();
  std::vector<int64_t> idx(rank, 0), pos(rank);
  for (int64_t base = 0; base < numel; base += inner) {
    // Offsets along the last dim change with its index only: computed per element there.
    for (int64_t j = 0; j < inner; ++j) {
      if (rank) idx[rank - 1] = j;
      int64_t off = 0;
      for (size_t d = 0; d < rank; ++d) pos[d] = idx[d];
      for (size_t k = nblk; k-- > 0;) {
        const auto d = static_cast<size_t>(l.inner_dims[k]);
        off += pos[d] % l.inner_blocks[k] * blk_stride[k];
        pos[d] /= l.inner_blocks[k];
      }
      for (size_t d = 0; d < rank; ++d) off += pos[d] * l.strides[d];
      f(base + j, off);
    }
    for (size_t d = rank - 1; d-- > 0;) {
      if (++idx[d] < l.dims[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

int64_t PackedLayout::storage_elements() const {
  // The largest offset: every outer index and every inner index at its last padded position.
  const std::vector<int64_t> blocks = dim_blocks(*this);
  CheckedInt last = 0;
  for (size_t d = 0; d < dims.size(); ++d) last = last + (CheckedInt(padded_dims[d] / blocks[d]) - 1) * strides[d];
  CheckedInt inner = 1;
  for (int64_t b : inner_blocks) inner = inner * b;
  const CheckedInt n = last + inner;
  return n.ok() ? n.value() : -1;
}

bool PackedLayout::same_placement(const PackedLayout& o) const {
  return dims == o.dims && padded_dims == o.padded_dims && strides == o.strides && inner_blocks == o.inner_blocks &&
         inner_dims == o.inner_dims;
}

std::string PackedLayout::str() const {
  std::string s = shape_str(dims);
  if (padded_dims != dims) s += " padded to " + shape_str(padded_dims);
  if (!inner_blocks.empty()) {
    s += " in " + shape_str(inner_blocks) + " blocks on dim" + (inner_blocks.size() > 1 ? "s " : " ");
    for (size_t k = 0; k < inner_dims.size(); ++k) {
      if (k) s += ',';
      s += std::to_string(inner_dims[k]);
    }
  }
  s += ", strides " + shape_str(strides);
  return s;
}

std::optional<std::string> check_layout(const PackedLayout& l, int64_t numel, size_t storage_bytes, size_t element_size) {
  const size_t rank = l.dims.size();
  if (rank == 0 || rank > kMaxLayoutDims) return "a packed layout has 1 to " + std::to_string(kMaxLayoutDims) + " dims, not " + std::to_string(rank);
  if (l.padded_dims.size() != rank || l.strides.size() != rank)
    return "packed layout has " + std::to_string(rank) + " dims but " + std::to_string(l.padded_dims.size()) + " padded dims and " +
           std::to_string(l.strides.size()) + " strides";
  if (l.inner_blocks.size() != l.inner_dims.size() || l.inner_blocks.size() > kMaxLayoutDims)
    return "packed layout has " + std::to_string(l.inner_blocks.size()) + " inner blocks and " + std::to_string(l.inner_dims.size()) +
           " block dims (at most " + std::to_string(kMaxLayoutDims) + ")";
  if (shape_numel(l.dims) != numel || numel <= 0)
    return "packed layout dims " + shape_str(l.dims) + " do not hold the tensor's " + std::to_string(numel) + " elements";
  for (size_t k = 0; k < l.inner_blocks.size(); ++k) {
    if (l.inner_dims[k] < 0 || static_cast<size_t>(l.inner_dims[k]) >= rank)
      return "packed layout block " + std::to_string(k) + " splits dim " + std::to_string(l.inner_dims[k]) + " of " + std::to_string(rank);
    if (l.inner_blocks[k] < 1 || l.inner_blocks[k] > (int64_t{1} << 16))
      return "packed layout block " + std::to_string(k) + " has size " + std::to_string(l.inner_blocks[k]);
  }
  // Blocks are at most 2^16 and at most 12: their products are checked as they grow.
  std::vector<int64_t> blocks(rank, 1);
  for (size_t k = 0; k < l.inner_blocks.size(); ++k) {
    const CheckedInt b = CheckedInt(blocks[static_cast<size_t>(l.inner_dims[k])]) * l.inner_blocks[k];
    if (!b.ok() || b.value() > (int64_t{1} << 32)) return "packed layout blocks of dim " + std::to_string(l.inner_dims[k]) + " are too large";
    blocks[static_cast<size_t>(l.inner_dims[k])] = b.value();
  }
  for (size_t d = 0; d < rank; ++d) {
    if (l.padded_dims[d] < l.dims[d] || l.padded_dims[d] % blocks[d] != 0)
      return "packed layout dim " + std::to_string(d) + " of " + std::to_string(l.dims[d]) + " is padded to " + std::to_string(l.padded_dims[d]) +
             ", not a multiple of its block " + std::to_string(blocks[d]) + " at least as large";
    if (l.strides[d] < 0) return "packed layout dim " + std::to_string(d) + " has stride " + std::to_string(l.strides[d]);
  }
  if (shape_numel(l.padded_dims) < 0) return "packed layout padded dims " + shape_str(l.padded_dims) + " overflow";
  const int64_t elements = l.storage_elements();
  const std::optional<size_t> need = checked_bytes(elements, element_size);
  if (elements < 0 || !need) return "packed layout offsets overflow";
  if (*need > storage_bytes)
    return "packed layout " + l.str() + " addresses " + std::to_string(*need) + " bytes but the data has " + std::to_string(storage_bytes);
  if (storage_bytes < static_cast<size_t>(numel) * element_size)
    return "packed data of " + std::to_string(storage_bytes) + " bytes is smaller than its " + std::to_string(numel) + " elements";
  return std::nullopt;
}

Tensor unpack(const Tensor& packed) {
  Tensor plain(packed.dtype(), packed.shape());
  const size_t es = dtype_size(packed.dtype());
  const auto* src = static_cast<const std::byte*>(packed.raw());
  auto* dst = static_cast<std::byte*>(plain.raw());
  for_each_offset(*packed.layout(), [&](int64_t i, int64_t off) {
    std::memcpy(dst + static_cast<size_t>(i) * es, src + static_cast<size_t>(off) * es, es);
  });
  return plain;
}

Tensor pack(const Tensor& plain, PackedLayout layout) {
  const size_t es = dtype_size(plain.dtype());
  const auto bytes = static_cast<size_t>(layout.storage_elements()) * es;
  Tensor storage(DType::u8, {static_cast<int64_t>(bytes)});
  const auto* src = static_cast<const std::byte*>(plain.raw());
  auto* dst = static_cast<std::byte*>(storage.raw());
  for_each_offset(layout, [&](int64_t i, int64_t off) {
    std::memcpy(dst + static_cast<size_t>(off) * es, src + static_cast<size_t>(i) * es, es);
  });
  return Tensor::packed(plain.dtype(), plain.shape(), std::move(layout), bytes, storage.raw(),
                        std::shared_ptr<void>(storage.raw(), [storage](void*) {}));
}

}  // namespace kiln
