// Packed layouts: how a compiled model stores a weight in the layout its kernel reads, so that
// loading it costs a memory map instead of a reorder. The description is the blocked layout
// of oneDNN (and of kiln's own packed GEMMs to come), written without the library, so that
// every kiln can check it and unpack it with no provider at hand.
//
// The layout covers `dims`, a reshape of the tensor's shape (the same elements in the same
// row-major order). Each dim d is padded to padded_dims[d] and split into an outer index and
// the inner blocks that name it; an element's offset in the storage is
//   sum_d outer_d * strides[d] + the row-major offset of its inner-block indices,
// where the inner blocks are listed outermost first (oneDNN's `inner_blks` / `inner_idxs`).
// oneDNN's `BA16a64b4a` on dims [a, b] padded to [A, B] (multiples of 64) is inner blocks
// {16, 64, 4} on dims {0, 1, 0}, 4096-element blocks, with strides {4096, A / 64 * 4096}: the
// blocks along a lie next to each other, those along b outermost. Padding elements hold zeros.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

class Tensor;

struct PackedLayout {
  std::vector<int64_t> dims;
  std::vector<int64_t> padded_dims;
  std::vector<int64_t> strides;       ///< per dim, in elements, of its outer index
  std::vector<int64_t> inner_blocks;  ///< block sizes, outermost first
  std::vector<int32_t> inner_dims;    ///< the dim each inner block splits
  /// What the layout was made for ("onednn 2.6.3 matmul"): shown to users, never compared.
  std::string packed_for;

  /// Storage elements the layout addresses: the largest offset plus one.
  int64_t storage_elements() const;
  /// Same placement of elements (packed_for aside).
  bool same_placement(const PackedLayout& other) const;
  /// "768x3072 in 16x64x4 blocks on dims 0,1,0" for messages and the text form.
  std::string str() const;
};

/// Why `layout` cannot describe a tensor of `numel` elements stored in `storage_bytes` bytes of
/// `element_size`-byte elements, if it cannot: ranks, dims that do not reshape the tensor,
/// paddings, negative or overflowing strides, offsets past the storage, and storage smaller
/// than the plain tensor (so a reader unaware of the layout still reads in bounds).
std::optional<std::string> check_layout(const PackedLayout& layout, int64_t numel, size_t storage_bytes,
                                        size_t element_size);

/// The plain row-major tensor a packed tensor holds (a new allocation).
Tensor unpack(const Tensor& packed);

/// `plain` placed in `layout` (zero padding): the inverse of unpack, for tests and for kernels
/// that pack without a library.
Tensor pack(const Tensor& plain, PackedLayout layout);

}  // namespace kiln
