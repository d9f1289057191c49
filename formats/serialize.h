// Saving and loading .kiln files (schema: formats/kiln.fbs).
//
// A .kiln file is a size-prefixed FlatBuffer (identifier "KILN") followed by zero padding to a
// multiple of 64 and the weight blob; every tensor's data sits at a 64-aligned offset in the
// blob. Loading reads the whole file into one 64-byte-aligned buffer and makes every constant
// (and tensor attribute) a view into it, so weights are never copied. Models whose weights
// pass SaveOptions::sidecar_threshold keep the blob in a sidecar file `<model>.<16 hex>.weights`
// named after its content, so replacing a model never rewrites the sidecar an older copy uses.
//
// Versioning: kSchemaMajor.kSchemaMinor is written into every file. Within a major the schema
// is append-only; a reader accepts any minor of its own major and rejects another major, naming
// both versions.
//
// Saving is deterministic: the same Model gives the same bytes (no timestamps, model order
// kept, tensors that share storage are written once).
//
// Limits: the FlatBuffer part (everything but the weights) must stay under 2 GiB, and
// subgraphs may nest about 40 levels deep (the verifier's depth bound).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/huge_pages.h"
#include "formats/ir.h"
#include "formats/status.h"

namespace kiln {

/// The schema version this kiln writes. Bump the minor for every appended field or enum
/// value; bump the major only for an incompatible change.
inline constexpr uint16_t kSchemaMajor = 1;
/// 1.1: explicit subgraph captures. 1.2: typed kernel parameters, the target and the memory
/// plan of compiled models. 1.3: packed weights (TensorData.layout). 1.4: the 4-bit integer
/// dtypes i4 and u4.
inline constexpr uint16_t kSchemaMinor = 4;

/// The FlatBuffers file identifier, at byte 8 of every .kiln file.
inline constexpr char kKilnFileIdentifier[] = "KILN";

/// Suffix appended to the model's file name to name its sidecar weights file.
inline constexpr char kSidecarSuffix[] = ".weights";

struct SaveOptions {
  /// When the weight blob is larger than this many bytes it goes to `<path>.<16 hex>.weights` instead of
  /// the model file. Tests set it low to exercise the sidecar.
  uint64_t sidecar_threshold = uint64_t{2} << 30;
};

struct LoadOptions {
  /// Run verify_model() after reading. The structural checks that keep the loader memory safe
  /// (FlatBuffers verification, dtypes and sizes of tensor data, blob bounds) always run; turning
  /// this off lets `inspect` show a model whose graph is inconsistent.
  bool verify = true;
  /// Where given, set to the hex SHA-256 of the file's bytes as read (the provenance that
  /// compile and quant record), hashed where they are mapped.
  std::string* sha256 = nullptr;
};

/// Writes `model` to `path` atomically: the file (and its sidecar, if any) is written to a
/// temporary file in the same directory and renamed into place, so a failure never leaves a
/// half-written or clobbered output; temporary files are removed on failure. Does not verify
/// the model (call verify_model first when the model comes from outside kiln's own passes).
Status save_model(const Model& model, const std::string& path, const SaveOptions& options = {});

/// The bytes of a .kiln file holding `model`, with the weight blob inline whatever its size
/// (for writing to stdout).
Result<std::vector<uint8_t>> serialize_model(const Model& model);

/// Reads, verifies and returns the model at `path`. Errors carry `path` in Error::file. A
/// sidecar weights file is looked up next to `path`.
Result<Model> load_model(const std::string& path, const LoadOptions& options = {});

/// Gives the memory pages that hold `t`'s data back to the page cache when they lie in a model
/// file load_model memory-mapped (nothing otherwise): the next read faults them in again from
/// the file. Planning calls it for weights a kernel has packed into memory of its own, so that
/// a process holds each weight once.
void release_file_pages(const Tensor& t);
/// The same for the bytes [data, data + bytes), which need no longer be a tensor's.
void release_file_pages(const void* data, size_t bytes);
/// The model files load_model memory-mapped and has not unmapped yet: their pages' address ranges.
AddressRanges mapped_model_files();
/// Where the pages of the mapped model files and of the HugePages regions are now (page_use
/// over /proc/self/smaps): each absent where there is none, both where smaps cannot be read.
struct ModelPageUse {
  std::optional<PageUse> model_files, huge_page_buffers;
};
ModelPageUse model_page_use();

/// What weights_on_huge_pages moved.
struct HugePageWeights {
  /// `g` with the moved weights in their new place, or null: nothing moved.
  std::shared_ptr<const Graph> graph;
  size_t moved_bytes = 0;     ///< the weights moved
  size_t eligible_bytes = 0;  ///< the weights that would have moved had the pages come quickly
};

/// Moves a model's packed constants whose type is not f32 (a compiled model's int8, int4, bf16
/// and f16 weights) that no convolution reads out of a model file load_model memory-mapped, in
/// a copy of `g`, into one anonymous region that asks for transparent huge pages
/// (MADV_HUGEPAGE), their file pages given back: the AMX and VNNI GEMMs stream such weights at
/// memory speed, where 4 KiB pages stop the hardware's prefetchers at every page and miss the
/// TLB. The region's pages are faulted in one at a time, in the weights' order, by `fault`
/// (null: touched and timed), and the moving stops once the pages that each took over
/// kSlowHugePageMs have cost kSlowHugePagesBudgetMs in all (a virtual machine whose host backs
/// fresh memory on demand, or a kernel compacting memory for free 2 MiB blocks): the weights
/// past there stay in the file. Nothing moves when `thp_mode` (huge_pages_enabled's text) says
/// no, less than 2 MiB would, the memory budget has no room, the machine refuses the region or
/// its first pages came slowly.
HugePageWeights weights_on_huge_pages(const Graph& g, std::string_view thp_mode, const HugePageFault& fault = nullptr);
/// Like load_model for what an open descriptor holds from its offset on (`-`: stdin). A regular
/// file read from its start is mapped as load_model maps it; a pipe is read in 2 MiB pieces,
/// each released as it is copied into the model's buffer, so the peak is the model and one
/// piece. `name` is used in messages (e.g. "<stdin>"); a sidecar weights file is looked up in
/// `sidecar_dir` (the current directory when empty). Does not close `fd`.
Result<Model> load_model_from_fd(int fd, const std::string& name, const LoadOptions& options = {},
                                 const std::string& sidecar_dir = "");

/// Like load_model for bytes already in memory. `name` is used in messages (e.g.
/// "<stdin>"); the bytes are copied once into an aligned buffer that the constants view. A
/// sidecar weights file is looked up in `sidecar_dir` (the current directory when empty).
Result<Model> load_model_from_bytes(std::span<const uint8_t> bytes, const std::string& name,
                                    const LoadOptions& options = {},
                                    const std::string& sidecar_dir = "");


}  // namespace kiln
