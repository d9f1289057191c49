// kiln's data-movement kernels: Concat, Split, ReplaceSlices, Transpose and nearest Resize by
// integer factors, for any dtype (they move elements by size), planned once on the concrete
// shapes and split across threads when there is enough to move. The reference kernels walk
// indices element by element or call memcpy per row; after the channels_last pass,
// concatenating channels copies a short row per pixel, so the copies here are inline loops,
// not library calls.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <type_traits>

#include <omp.h>

#include "runtime/cpu/rows.h"
#include "runtime/kernel.h"
#include "runtime/threads.h"

namespace kiln::cpu {

namespace {

// Below this, one thread moves it faster.
constexpr int64_t kParallelBytes = 1 << 18;
// What a thread copies at a time of a long row.
constexpr size_t kChunkBytes = 1 << 16;

// Copies n bytes between non-overlapping buffers; short copies stay inline.
inline void move_bytes(std::byte* dst, const std::byte* src, size_t n) {
  if (n > 512) {
    std::memcpy(dst, src, n);
    return;
  }
  size_t i = 0;
  for (; i + 32 <= n; i += 32) __builtin_memcpy(dst + i, src + i, 32);
  for (; i + 4 <= n; i += 4) __builtin_memcpy(dst + i, src + i, 4);
  for (; i < n; ++i) dst[i] = src[i];
}

std::optional<std::string> concrete_io(const KernelQuery& q) {
  for (const InferInput& in : q.inputs)
    if (in.dtype != DType::undefined && !in.shape.is_concrete()) return "shapes not known ahead";
  for (const InferOutput& out : q.outputs)
    if (out.dtype != DType::undefined && !out.shape.is_concrete()) return "shapes not known ahead";
  return std::nullopt;
}

int64_t product(const std::vector<int64_t>& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

size_t axis_of(const Node& n, size_t rank) {
  int64_t axis = n.attr_int("axis", 0);
  return static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(rank) : axis);
}

// Concat and Split: `rows` rows, each the pieces' chunks side by side in the joined tensor.
// Concat copies every piece's chunk into the joined row; Split the other way. The threads share
// the rows, or, when there are few long ones, each row's pieces in chunks of kChunkBytes.
class JoinKernel final : public Kernel {
 public:
  explicit JoinKernel(bool split) : split_(split) {}
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    const std::vector<int64_t> joined = split_ ? q.inputs[0].shape.concrete() : q.outputs[0].shape.concrete();
    const DType dtype = split_ ? q.inputs[0].dtype : q.outputs[0].dtype;
    const size_t axis = axis_of(q.node, joined.size()), es = dtype_size(dtype);
    rows_ = product(joined, 0, axis);
    const int64_t inner = product(joined, axis + 1, joined.size());
    row_ = static_cast<size_t>(joined[axis] * inner) * es;
    if (split_) {
      // Omitted outputs still take their place in the row: their sizes come from the split input or
      // equal parts (the last smaller), as the inference has them.
      const auto n = static_cast<int64_t>(q.outputs.size());
      std::vector<int64_t> sizes;
      if (q.inputs.size() > 1 && q.inputs[1].dtype != DType::undefined) {
        sizes = q.inputs[1].value->to_int64_vector();
      } else {
        const int64_t chunk = (joined[axis] + n - 1) / n;
        for (int64_t i = 0; i < n; ++i) sizes.push_back(i + 1 == n ? joined[axis] - chunk * (n - 1) : chunk);
      }
      if (static_cast<int64_t>(sizes.size()) != n) return internal_error(q.node.where(), "Split sizes do not match its outputs");
      for (size_t i = 0; i < q.outputs.size(); ++i) {
        bytes_.push_back(static_cast<size_t>(sizes[i] * inner) * es);
        wanted_.push_back(q.outputs[i].dtype != DType::undefined);
      }
    } else {
      for (const InferInput& in : q.inputs) {
        bytes_.push_back(static_cast<size_t>(in.shape.concrete()[axis] * inner) * es);
        wanted_.push_back(true);
      }
    }
    pieces_.assign(bytes_.size(), nullptr);
    // Few long rows (a Concat along axis 1 of a batch of one: YOLO's three scales of boxes into
    // its output, 2.1 MB in one row): the threads share each row's pieces in chunks instead.
    chunks_.clear();
    if (rows_ < 4 && rows_ * static_cast<int64_t>(row_) >= kParallelBytes) {
      size_t col = 0;
      for (size_t i = 0; i < bytes_.size(); ++i) {
        for (size_t at = 0; at < bytes_[i]; at += kChunkBytes) chunks_.push_back({i, col + at, at, std::min(kChunkBytes, bytes_[i] - at)});
        col += bytes_[i];
      }
    }
    return {};
  }

  Status run(KernelContext& ctx) override {
    std::vector<std::byte*>& pieces = pieces_;
    std::byte* joined = nullptr;
    if (split_) {
      joined = const_cast<std::byte*>(static_cast<const std::byte*>(ctx.input(0).raw()));
      for (size_t i = 0; i < pieces.size(); ++i)
        if (wanted_[i]) pieces[i] = static_cast<std::byte*>(ctx.output(i).raw());
    } else {
      joined = static_cast<std::byte*>(ctx.output(0).raw());
      for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = const_cast<std::byte*>(static_cast<const std::byte*>(ctx.input(i).raw()));
    }
    const int64_t rows = rows_;
    const bool split = split_;
    if (!chunks_.empty()) {
      const auto items = static_cast<int64_t>(chunks_.size()) * rows;
#pragma omp parallel for schedule(static)
      for (int64_t it = 0; it < items; ++it) {
        const Chunk& c = chunks_[static_cast<size_t>(it) % chunks_.size()];
        const auto r = static_cast<size_t>(it) / chunks_.size();
        if (!pieces[c.piece]) continue;
        std::byte* piece = pieces[c.piece] + r * bytes_[c.piece] + c.in_piece;
        std::byte* whole = joined + r * row_ + c.in_row;
        if (split) std::memcpy(piece, whole, c.bytes);
        else std::memcpy(whole, piece, c.bytes);
      }
      return {};
    }
#pragma omp parallel for schedule(static) if (rows * static_cast<int64_t>(row_) >= kParallelBytes)
    for (int64_t r = 0; r < rows; ++r) {
      size_t col = 0;
      for (size_t i = 0; i < pieces.size(); ++i) {
        const size_t n = bytes_[i];
        if (pieces[i]) {
          std::byte* piece = pieces[i] + static_cast<size_t>(r) * n;
          std::byte* whole = joined + static_cast<size_t>(r) * row_ + col;
          if (split) move_bytes(piece, whole, n);
          else move_bytes(whole, piece, n);
        }
        col += n;
      }
    }
    return {};
  }

 private:
  bool split_;
  int64_t rows_ = 0;
  size_t row_ = 0;
  std::vector<size_t> bytes_;  ///< per piece: its chunk of a row
  std::vector<bool> wanted_;
  std::vector<std::byte*> pieces_;  ///< per piece: its data in this run (null: omitted or empty)
  struct Chunk {
    size_t piece, in_row, in_piece, bytes;
  };
  std::vector<Chunk> chunks_;  ///< few long rows: a row's pieces in chunks the threads share
};

std::optional<std::string> join_declines(const KernelQuery& q) {
  if (auto why = concrete_io(q)) return why;
  if (q.node.op == "Split" && q.inputs.size() > 1 && q.inputs[1].dtype != DType::undefined && !q.inputs[1].value)
    return "split sizes computed at run time";
  return std::nullopt;
}

// ReplaceSlices: Y is X with each update's chunk of a row copied over its place. The plan may
// put Y over X (overwrites_input) when X dies here: then only the updates move, the pieces of a
// Concat of a Split that passed through unchanged never copied at all.
class ReplaceKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    const std::vector<int64_t> x = q.inputs[0].shape.concrete();
    const size_t axis = axis_of(q.node, x.size()), es = dtype_size(q.inputs[0].dtype);
    const std::vector<int64_t> starts = q.node.attr_ints("starts");
    bytes_.clear();
    at_.clear();
    rows_ = product(x, 0, axis);
    const int64_t inner = product(x, axis + 1, x.size());
    row_ = static_cast<size_t>(x[axis] * inner) * es;
    for (size_t i = 1; i < q.inputs.size(); ++i) {
      bytes_.push_back(static_cast<size_t>(q.inputs[i].shape.concrete()[axis] * inner) * es);
      at_.push_back(static_cast<size_t>(starts[i - 1] * inner) * es);
    }
    pieces_.assign(bytes_.size(), nullptr);
    return {};
  }

  Status run(KernelContext& ctx) override {
    const auto* x = static_cast<const std::byte*>(ctx.input(0).raw());
    auto* y = static_cast<std::byte*>(ctx.output(0).raw());
    for (size_t i = 0; i < pieces_.size(); ++i) pieces_[i] = static_cast<const std::byte*>(ctx.input(i + 1).raw());
    const int64_t rows = rows_;
    const bool copy = x != y;
    const size_t moved = copy ? row_ : std::accumulate(bytes_.begin(), bytes_.end(), size_t{0});
#pragma omp parallel for schedule(static) if (rows * static_cast<int64_t>(moved) >= kParallelBytes)
    for (int64_t r = 0; r < rows; ++r) {
      std::byte* to = y + static_cast<size_t>(r) * row_;
      if (copy) move_bytes(to, x + static_cast<size_t>(r) * row_, row_);
      for (size_t i = 0; i < pieces_.size(); ++i) move_bytes(to + at_[i], pieces_[i] + static_cast<size_t>(r) * bytes_[i], bytes_[i]);
    }
    return {};
  }

  int overwrites_input() const override { return 0; }

 private:
  int64_t rows_ = 0;
  size_t row_ = 0;
  std::vector<size_t> bytes_, at_;  ///< per update: its chunk of a row, and where it goes in Y's
  std::vector<const std::byte*> pieces_;
};

// Transpose: dims that stay neighbours merge, then either whole rows move (the last dim stays
// last) or a batch of 2-D tiles transposes (the last dim moves).
class TransposeKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    const std::vector<int64_t> in = q.inputs[0].shape.concrete();
    std::vector<int64_t> perm = q.node.attr_ints("perm");
    if (!q.node.has_attr("perm"))
      for (int64_t i = static_cast<int64_t>(in.size()) - 1; i >= 0; --i) perm.push_back(i);
    es_ = dtype_size(q.inputs[0].dtype);
    empty_ = shape_numel(in) == 0;
    if (in.empty() || empty_) {  // a scalar is one element; an empty tensor moves nothing
      dims_ = in_stride_ = out_stride_ = {1};
      return {};
    }
    // Merge runs of output dims that are consecutive input dims.
    std::vector<std::vector<int64_t>> groups;
    for (int64_t p : perm) {
      if (!groups.empty() && groups.back().back() + 1 == p) groups.back().push_back(p);
      else groups.push_back({p});
    }
    // The merged input dims in input order, and the permutation of them.
    std::vector<size_t> order(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return groups[a][0] < groups[b][0]; });
    std::vector<int64_t> dims(groups.size()), in_stride(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      int64_t d = 1;
      for (int64_t p : groups[i]) d *= in[static_cast<size_t>(p)];
      dims[i] = d;
    }
    int64_t s = 1;
    for (size_t k = order.size(); k-- > 0;) {
      in_stride[order[k]] = s;
      s *= dims[order[k]];
    }
    // Output dim i (a merged group) has size dims[i] and input stride in_stride[i].
    dims_ = dims;
    in_stride_ = in_stride;
    out_stride_.assign(dims.size(), 1);
    for (size_t i = dims.size(); i-- > 1;) out_stride_[i - 1] = out_stride_[i] * dims[i];
    if (dims_.size() == 1 || in_stride_.back() == 1) walk_rows();
    // When the last dim moves: the output dim read with input stride 1 pairs with the output's
    // last in 2-D tiles; the others index the batch of tiles.
    const size_t r = dims_.size();
    if (r > 1 && in_stride_[r - 1] != 1) {
      while (in_stride_[tile_dim_] != 1) ++tile_dim_;
      for (size_t d = 0; d + 1 < r; ++d)
        if (d != tile_dim_) {
          batch_dims_.push_back(d);
          batches_ *= dims_[d];
        }
      // One to four planes of 1- or 4-byte elements into pixels (an image to channels-last, f32
      // or quantized).
      planes_ = (es_ == 4 || es_ == 1) && out_stride_[tile_dim_] == dims_[r - 1] && dims_[r - 1] <= 4;
      if (auto isa = best_isa(q.target.cpu); planes_ && isa) interleave_rows_ = &row_kernels(*isa);
    }
    return {};
  }

  Status run(KernelContext& ctx) override {
    if (empty_) return {};
    const std::byte* src = static_cast<const std::byte*>(ctx.input(0).raw());
    std::byte* dst = static_cast<std::byte*>(ctx.output(0).raw());
    const size_t r = dims_.size();
    if (r == 1 || in_stride_[r - 1] == 1) {  // whole rows of the last dim move
      rows(src, dst);
    } else if (planes_) {
      interleave(src, dst);
    } else {
      tiles(src, dst);
    }
    return {};
  }

 private:
  // Whole rows move: the order they are walked in. The output's (its rows one after another,
  // the input's read a dim's stride apart), but the input's where the output's would read its
  // innermost dim a few columns at a time and that dim has at most kWriteStreams rows: YOLO's
  // head, [40·40 pixels, 3 anchors, 85] into [3, 40·40, 85], read 85 of each pixel's 255 values
  // a row, its lines in three passes; walked in the input's order, it reads them once and writes
  // three streams: the head's three Transposes 0.81 of their time at one thread and 0.67 at two
  // (alternated profiles on a 2-core Xeon).
  static constexpr int64_t kWriteStreams = 8;
  void walk_rows() {
    const size_t outer = dims_.size() - 1;  // the dims over the rows
    walk_.resize(outer);
    for (size_t d = 0; d < outer; ++d) walk_[d] = d;
    // The walked dim read with the least input stride: the output's innermost, or the dim whose
    // rows the input's order writes to at once.
    const size_t inner = static_cast<size_t>(
        std::min_element(in_stride_.begin(), in_stride_.begin() + static_cast<ptrdiff_t>(outer)) - in_stride_.begin());
    in_order_ = outer >= 2 && inner != outer - 1 && dims_[inner] <= kWriteStreams;
    if (in_order_) std::sort(walk_.begin(), walk_.end(), [&](size_t a, size_t b) { return in_stride_[a] > in_stride_[b]; });
    walk_stride_.resize(outer);
    for (size_t k = 0; k < outer; ++k) walk_stride_[k] = in_order_ ? out_stride_[walk_[k]] : in_stride_[walk_[k]];
  }

  // Whole rows of the last dim in the walk's order (row i of the walked side at i · len): each
  // thread takes an even share of them and keeps the other side's offset as an odometer over the
  // walked dims, one stride added a row, instead of decomposing each row's index (a division and
  // a remainder a dim): YOLO's detection head's three (4,800, 1,200 and 300 rows of 85 floats)
  // took 0.94, 0.90 and 0.74 of their time at one thread (3 alternated profiles).
  void rows(const std::byte* src, std::byte* dst) const {
    const int64_t len = dims_.back();
    const int64_t count = out_stride_[0] * dims_[0] / len;
    const size_t bytes = static_cast<size_t>(len) * es_, w = walk_.size();
#pragma omp parallel if (count * static_cast<int64_t>(bytes) >= kParallelBytes)
    {
      const auto [i0, i1] = even_share(count, omp_get_num_threads(), omp_get_thread_num());
      if (i0 < i1) {
        int64_t idx[kMaxRank];  // merged dims are at most the rank
        int64_t off = 0, i = i0;
        for (size_t k = w; k-- > 0;) {  // i0's index over the walked dims, and the other side's offset
          idx[k] = i % dims_[walk_[k]];
          i /= dims_[walk_[k]];
          off += idx[k] * walk_stride_[k];
        }
        for (i = i0;;) {
          const size_t walked = static_cast<size_t>(i * len) * es_, other = static_cast<size_t>(off) * es_;
          move_bytes(dst + (in_order_ ? other : walked), src + (in_order_ ? walked : other), bytes);
          if (++i == i1) break;
          for (size_t k = w; k-- > 0;) {
            off += walk_stride_[k];
            if (++idx[k] < dims_[walk_[k]]) break;
            off -= dims_[walk_[k]] * walk_stride_[k];
            idx[k] = 0;
          }
        }
      }
    }
  }

  // The offsets of tile batch `bt` (an index over batch_dims_) in the input and output.
  void batch_offsets(int64_t bt, int64_t& in_off, int64_t& out_off) const {
    in_off = out_off = 0;
    for (size_t j = batch_dims_.size(); j-- > 0;) {
      const size_t d = batch_dims_[j];
      const int64_t i = bt % dims_[d];
      bt /= dims_[d];
      in_off += i * in_stride_[d];
      out_off += i * out_stride_[d];
    }
  }

  // The output's last dim (stride 1 out, in_stride_[r-1] in) against the output dim that is the
  // input's last (stride 1 in): 2-D tiles of those two, for every index of the others.
  void tiles(const std::byte* src, std::byte* dst) const {
    const size_t r = dims_.size(), k = tile_dim_;
    const int64_t a_len = dims_[k], b_len = dims_[r - 1];
    const int64_t a_out = out_stride_[k], b_in = in_stride_[r - 1];
    const int64_t batches = batches_;
    constexpr int64_t kTile = 16;
    const int64_t tiles_a = (a_len + kTile - 1) / kTile;
    const size_t es = es_;
#pragma omp parallel for collapse(2) schedule(static) if (batches * a_len * b_len * static_cast<int64_t>(es) >= kParallelBytes)
    for (int64_t bt = 0; bt < batches; ++bt)
      for (int64_t ta = 0; ta < tiles_a; ++ta) {
        int64_t in_off, out_off;
        batch_offsets(bt, in_off, out_off);
        const int64_t a0 = ta * kTile, a1 = std::min(a_len, a0 + kTile);
        for (int64_t b0 = 0; b0 < b_len; b0 += kTile) {
          const int64_t b1 = std::min(b_len, b0 + kTile);
          // Whole elements of 1, 2, 4 or 8 bytes as integers (bit-exact, and the loop a compiler
          // can keep in registers); other sizes byte by byte.
          auto tile = [&](auto tag) {
            using T = decltype(tag);
            const T* s = reinterpret_cast<const T*>(src) + in_off;
            T* t = reinterpret_cast<T*>(dst) + out_off;
            for (int64_t a = a0; a < a1; ++a)
              for (int64_t b = b0; b < b1; ++b) t[a * a_out + b] = s[b * b_in + a];
          };
          if (es == 4) {
            tile(uint32_t{});
          } else if (es == 1) {
            tile(uint8_t{});
          } else if (es == 2) {
            tile(uint16_t{});
          } else if (es == 8) {
            tile(uint64_t{});
          } else {
            for (int64_t a = a0; a < a1; ++a)
              for (int64_t b = b0; b < b1; ++b)
                std::memcpy(dst + static_cast<size_t>(out_off + a * a_out + b) * es, src + static_cast<size_t>(in_off + b * b_in + a) * es, es);
          }
        }
      }
  }

  // One to four planes of 1- or 4-byte elements interleaved (an NCHW image of three channels to
  // NHWC): the 16x16 tiles would move rows of b_len elements, so instead a loop over A with
  // the planes fixed writes the output in order, chunks of A shared among the threads. A
  // quantized ResNet-50's u8 image (3x224x224) took 140 µs through the tiles, 40 through this;
  // with the row kernels' interleave (a byte shuffle and a permute a vector), int8
  // MobileNetV2's took 4 µs against 29 (one thread, a Zen 5 core, 6 alternated profiles).
  void interleave(const std::byte* src, std::byte* dst) const {
    if (es_ == 4) interleave_planes<uint32_t>(src, dst);
    else interleave_planes<uint8_t>(src, dst);
  }
  template <typename T>
  void interleave_planes(const std::byte* src, std::byte* dst) const {
    const size_t r = dims_.size(), k = tile_dim_;
    const int64_t a_len = dims_[k], b_len = dims_[r - 1], b_in = in_stride_[r - 1];
    constexpr int64_t kChunk = 4096;
    const int64_t chunks = (a_len + kChunk - 1) / kChunk;
    const int64_t batches = batches_;
#pragma omp parallel for collapse(2) schedule(static) if (batches * a_len * b_len * static_cast<int64_t>(sizeof(T)) >= kParallelBytes)
    for (int64_t bt = 0; bt < batches; ++bt)
      for (int64_t c = 0; c < chunks; ++c) {
        int64_t in_off, out_off;
        batch_offsets(bt, in_off, out_off);
        const T* s = reinterpret_cast<const T*>(src) + in_off;
        T* t = reinterpret_cast<T*>(dst) + out_off;
        const int64_t a0 = c * kChunk, a1 = std::min(a_len, a0 + kChunk);
        if (interleave_rows_) {
          if constexpr (sizeof(T) == 4) interleave_rows_->interleave(s + a0, b_in, b_len, t + a0 * b_len, a1 - a0);
          else interleave_rows_->interleave_u8(s + a0, b_in, b_len, t + a0 * b_len, a1 - a0);
          continue;
        }
        auto planes = [&](auto width) {
          constexpr int64_t B = decltype(width)::value;
          for (int64_t a = a0; a < a1; ++a)
            for (int64_t b = 0; b < B; ++b) t[a * B + b] = s[b * b_in + a];
        };
        switch (b_len) {
          case 1: planes(std::integral_constant<int64_t, 1>{}); break;
          case 2: planes(std::integral_constant<int64_t, 2>{}); break;
          case 3: planes(std::integral_constant<int64_t, 3>{}); break;
          default: planes(std::integral_constant<int64_t, 4>{}); break;
        }
      }
  }

  size_t es_ = 4;
  bool empty_ = false;
  std::vector<int64_t> dims_, in_stride_, out_stride_;
  std::vector<size_t> walk_;          ///< whole rows: the dims over them, outermost first, in the walk's order
  std::vector<int64_t> walk_stride_;  ///< whole rows: those dims' strides on the side not walked in order
  bool in_order_ = false;             ///< whole rows: walked in the input's order (else the output's)
  size_t tile_dim_ = 0;            ///< tiles: the output dim read with input stride 1
  bool planes_ = false;            ///< the last dim moves and is 1-4 elements of 1 or 4 bytes: interleave
  const RowKernels* interleave_rows_ = nullptr;  ///< planes_: the CPU's vector interleave, if it has AVX2 or AVX-512
  std::vector<size_t> batch_dims_;  ///< tiles: the other dims but the last
  int64_t batches_ = 1;
};

// Nearest Resize by whole factors, as torch's Upsample(mode="nearest") exports it
// (coordinate_transformation_mode asymmetric, nearest_mode floor): out[.., y, ..] = in[.., y / f, ..].
// Rows of the last dim are copied whole when it is not resized (channels-last images).
class UpsampleKernel final : public Kernel {
 public:
  Status prepare(const KernelQuery& q, KernelNeeds&) override {
    const std::vector<int64_t> in = q.inputs[0].shape.concrete(), out = q.outputs[0].shape.concrete();
    const size_t r = out.size();
    es_ = dtype_size(q.inputs[0].dtype);
    row_ = static_cast<size_t>(out[r - 1]) * es_;
    whole_rows_ = in[r - 1] == out[r - 1];
    // Per output row, the byte offset of the input row it reads: each index divided by its factor.
    const int64_t rows = product(out, 0, r - 1);
    src_row_.resize(static_cast<size_t>(rows));
    for (int64_t o = 0; o < rows; ++o) {
      int64_t rest = o, in_row = 0, scale = 1;
      for (size_t d = r - 1; d-- > 0;) {
        const int64_t i = rest % out[d];
        rest /= out[d];
        in_row += (i / (out[d] / in[d])) * scale;
        scale *= in[d];
      }
      src_row_[static_cast<size_t>(o)] = static_cast<size_t>(in_row * in[r - 1]) * es_;
    }
    // Per output column, the input column's byte offset, when the last dim is resized too.
    if (!whole_rows_)
      for (int64_t j = 0; j < out[r - 1]; ++j) src_col_.push_back(static_cast<size_t>(j / (out[r - 1] / in[r - 1])) * es_);
    return {};
  }
  Status run(KernelContext& ctx) override {
    const std::byte* src = static_cast<const std::byte*>(ctx.input(0).raw());
    std::byte* dst = static_cast<std::byte*>(ctx.output(0).raw());
    const auto rows = static_cast<int64_t>(src_row_.size());
#pragma omp parallel for schedule(static) if (rows * static_cast<int64_t>(row_) >= kParallelBytes)
    for (int64_t o = 0; o < rows; ++o) {
      const std::byte* s = src + src_row_[static_cast<size_t>(o)];
      std::byte* t = dst + static_cast<size_t>(o) * row_;
      if (whole_rows_) {
        move_bytes(t, s, row_);
      } else {
        for (size_t j = 0; j < src_col_.size(); ++j) std::memcpy(t + j * es_, s + src_col_[j], es_);
      }
    }
    return {};
  }

 private:
  size_t es_ = 4, row_ = 0;
  bool whole_rows_ = true;
  std::vector<size_t> src_row_;  ///< per output row: its input row's byte offset
  std::vector<size_t> src_col_;  ///< per output column: its input column's byte offset (last dim resized)
};

std::optional<std::string> upsample_declines(const KernelQuery& q) {
  if (auto why = concrete_io(q)) return why;
  const Node& n = q.node;
  if (n.attr_string("mode", "nearest") != "nearest" || n.attr_string("coordinate_transformation_mode", "half_pixel") != "asymmetric" ||
      n.attr_string("nearest_mode", "round_prefer_floor") != "floor" || n.has_attr("axes") ||
      n.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch")
    return "not nearest / asymmetric / floor (torch's Upsample)";
  const std::vector<int64_t> in = q.inputs[0].shape.concrete(), out = q.outputs[0].shape.concrete();
  if (in.empty() || shape_numel(in) == 0) return "an empty or scalar input";
  // Whole factors only, and scales (when given) that say exactly those factors.
  std::vector<double> scales;
  if (q.inputs.size() > 2 && q.inputs[2].dtype != DType::undefined && q.inputs[2].value && q.inputs[2].value->numel() > 0) {
    const Tensor& s = *q.inputs[2].value;
    for (int64_t i = 0; i < s.numel(); ++i) scales.push_back(s.dtype() == DType::f32 ? s.data<float>()[i] : s.as_double(i));
  }
  for (size_t d = 0; d < in.size(); ++d) {
    if (out[d] % in[d] != 0) return "a factor that is not whole";
    if (!scales.empty() && scales[d] != static_cast<double>(out[d] / in[d])) return "scales that do not match the sizes";
  }
  return std::nullopt;
}

}  // namespace

void register_movement(KernelRegistry& r) {
  r.add("Concat", "cpu", KernelImpl{"kiln.concat", join_declines, [](const KernelQuery&) { return std::make_unique<JoinKernel>(false); }});
  r.add("Split", "cpu", KernelImpl{"kiln.split", join_declines, [](const KernelQuery&) { return std::make_unique<JoinKernel>(true); }});
  r.add("ReplaceSlices", "cpu", KernelImpl{"kiln.replace_slices", concrete_io, [](const KernelQuery&) { return std::make_unique<ReplaceKernel>(); }});
  r.add("Transpose", "cpu", KernelImpl{"kiln.transpose", concrete_io, [](const KernelQuery&) { return std::make_unique<TransposeKernel>(); }});
  r.add("Resize", "cpu", KernelImpl{"kiln.upsample_nearest", upsample_declines, [](const KernelQuery&) { return std::make_unique<UpsampleKernel>(); }});
}

}  // namespace kiln::cpu
