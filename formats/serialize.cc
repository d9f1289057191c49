// .kiln writing and reading: Model <-> FlatBuffer (kiln.fbs) plus the 64-aligned weight blob,
// atomic file replacement, and the structural checks that keep the loader memory safe on any
// input. Semantic checks (indices, names, cycles, shapes) are verify_model's (verify.cc).
#include "formats/serialize.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "formats/atomic_file.h"
#include "formats/memory.h"
#include "formats/sha256.h"
#include "formats/verify.h"
#include "kiln_generated.h"

namespace kiln {
namespace {

// The numeric values of the file's enums are the in-memory ones: a cast converts.
#define KILN_CHECK_DTYPE(e, v, n, T) \
  static_assert(static_cast<uint16_t>(fb::DType::e) == static_cast<uint16_t>(DType::e));
KILN_DTYPES(KILN_CHECK_DTYPE)
KILN_INT4_DTYPES(KILN_CHECK_DTYPE)
#undef KILN_CHECK_DTYPE
static_assert(static_cast<uint16_t>(fb::DType::undefined) == static_cast<uint16_t>(DType::undefined));
static_assert(static_cast<uint16_t>(fb::AttrType::int64) == static_cast<uint16_t>(AttrType::int64));
static_assert(static_cast<uint16_t>(fb::AttrType::float64) == static_cast<uint16_t>(AttrType::float64));
static_assert(static_cast<uint16_t>(fb::AttrType::str) == static_cast<uint16_t>(AttrType::string));
static_assert(static_cast<uint16_t>(fb::AttrType::ints) == static_cast<uint16_t>(AttrType::ints));
static_assert(static_cast<uint16_t>(fb::AttrType::floats) == static_cast<uint16_t>(AttrType::floats));
static_assert(static_cast<uint16_t>(fb::AttrType::strs) == static_cast<uint16_t>(AttrType::strings));
static_assert(static_cast<uint16_t>(fb::AttrType::tensor) == static_cast<uint16_t>(AttrType::tensor));
static_assert(static_cast<uint16_t>(fb::AttrType::graph) == static_cast<uint16_t>(AttrType::graph));
static_assert(static_cast<uint16_t>(fb::Stage::exported) == static_cast<uint16_t>(Stage::exported));
static_assert(static_cast<uint16_t>(fb::Stage::quantized) == static_cast<uint16_t>(Stage::quantized));
static_assert(static_cast<uint16_t>(fb::Stage::compiled) == static_cast<uint16_t>(Stage::compiled));
static_assert(std::variant_size_v<AttrValue> == 8, "a new attribute type needs a place in kiln.fbs");

constexpr uint64_t kAlign = kTensorAlignment;
// Bounds for flatbuffers::Verifier. Every subgraph level costs three tables (Graph, Node,
// Attribute), so 128 allows ~40 levels of nested control flow; no real model comes close.
constexpr uint32_t kMaxDepth = 128;

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// ---- writing -------------------------------------------------------------------------------

/// Builds the FlatBuffer and lays out the weight blob; tensors that share storage are placed
/// once. Tensors are placed in the order the model is walked, so the layout is deterministic.
class Writer {
 public:
  struct Item {
    const Tensor* tensor;
    uint64_t offset;
  };

  Writer() : fbb_(1 << 16) {}

  /// Builds everything. When the blob exceeds `threshold` it goes to a sidecar named after the
  /// model file and the blob's content (`m.kiln.<16 hex>.weights`), recorded in the model: a new
  /// blob never overwrites the file an older model refers to.
  Status build(const Model& model, uint64_t threshold, const std::string& model_file_name) {
    std::vector<flatbuffers::Offset<fb::Provenance>> prov;
    for (const Provenance& p : model.provenance)
      prov.push_back(fb::CreateProvenance(fbb_, fbb_.CreateString(p.tool), fbb_.CreateString(p.version),
                                          fbb_.CreateString(p.command), fbb_.CreateString(p.input_file),
                                          fbb_.CreateString(p.input_sha256)));
    auto prov_vec = fbb_.CreateVector(prov);
    std::vector<flatbuffers::Offset<fb::MetadataEntry>> meta;
    for (const auto& [k, v] : model.metadata)
      meta.push_back(fb::CreateMetadataEntry(fbb_, fbb_.CreateString(k), fbb_.CreateString(v)));
    auto meta_vec = fbb_.CreateVector(meta);
    KILN_ASSIGN_OR_RETURN(auto graph, write_graph(model.graph, ""));
    sidecar_ = blob_size_ > threshold;
    flatbuffers::Offset<flatbuffers::String> weights_file;
    if (sidecar_) {
      sidecar_name_ = model_file_name + "." + blob_fingerprint() + kSidecarSuffix;
      weights_file = fbb_.CreateString(sidecar_name_);
    }
    // The root's scalars are always written (even at their defaults), so that every file
    // carries its version explicitly and tools can patch them in place.
    fbb_.ForceDefaults(true);
    flatbuffers::Offset<fb::MemoryPlan> memory_plan;
    if (const MemoryPlanRecord* mp = model.memory_plan ? &*model.memory_plan : nullptr) {
      std::vector<flatbuffers::Offset<fb::InputShape>> shapes;
      for (const auto& dims : mp->input_shapes) shapes.push_back(fb::CreateInputShape(fbb_, fbb_.CreateVector(dims)));
      auto shapes_vec = fbb_.CreateVector(shapes);
      std::vector<flatbuffers::Offset<fb::PlannedValue>> placed;
      for (const auto& p : mp->values) placed.push_back(fb::CreatePlannedValue(fbb_, p.value, p.offset, p.bytes));
      auto placed_vec = fbb_.CreateVector(placed);
      memory_plan = fb::CreateMemoryPlan(fbb_, shapes_vec, mp->arena_bytes, mp->workspace_bytes, placed_vec);
    }
    flatbuffers::Offset<fb::TargetFingerprint> target;
    if (model.target) {
      auto device = fbb_.CreateString(model.target->device);
      auto isa = fbb_.CreateVectorOfStrings(model.target->isa);
      target = fb::CreateTargetFingerprint(fbb_, device, isa, model.target->threads);
    }
    auto root = fb::CreateModel(fbb_, kSchemaMajor, kSchemaMinor, static_cast<fb::Stage>(model.stage), prov_vec,
                                meta_vec, graph, blob_size_, weights_file, memory_plan, target);
    fb::FinishSizePrefixedModelBuffer(fbb_, root);
    return {};
  }

  std::span<const uint8_t> flatbuffer() const { return {fbb_.GetBufferPointer(), fbb_.GetSize()}; }
  const std::vector<Item>& items() const { return items_; }
  uint64_t blob_size() const { return blob_size_; }
  bool sidecar() const { return sidecar_; }
  /// The sidecar's file name (no folder) when sidecar().
  const std::string& sidecar_name() const { return sidecar_name_; }

 private:
  /// The first 16 hex digits of a SHA-256 tree hash of the blob's bytes (the sidecar's
  /// content): SHA-256 of the concatenated hex SHA-256 digests of its 1 MiB pieces, hashed on
  /// up to 8 threads. A collision-resistant hash, so two blobs that get the same sidecar name
  /// have the same bytes, and a new sidecar never replaces a different one an older model uses.
  std::string blob_fingerprint() const {
    constexpr uint64_t kPiece = uint64_t{1} << 20;
    const size_t pieces = static_cast<size_t>((blob_size_ + kPiece - 1) / kPiece);
    std::vector<std::string> digests(pieces);
    std::atomic<size_t> next{0};
    auto work = [&](std::vector<uint8_t>& scratch) {
      for (size_t i; (i = next.fetch_add(1)) < pieces;) {
        uint64_t begin = i * kPiece, size = std::min(kPiece, blob_size_ - begin);
        digests[i] = sha256_hex({blob_range(begin, size, scratch), static_cast<size_t>(size)});
      }
    };
    // Scratch buffers (for pieces that span tensors and padding) are made here, so that a
    // memory-budget failure is an exception in this thread, not in a worker.
    const size_t threads = std::min<size_t>({pieces, 8, std::max(1u, std::thread::hardware_concurrency())});
    std::vector<std::vector<uint8_t>> scratch(std::max<size_t>(threads, 1),
                                              std::vector<uint8_t>(static_cast<size_t>(std::min(kPiece, blob_size_))));
    std::vector<std::thread> workers;
    for (size_t t = 1; t < threads; ++t) {
      try {
        workers.emplace_back(work, std::ref(scratch[t]));
      } catch (const std::system_error&) {
        break;  // no more threads: this one does the rest
      }
    }
    work(scratch[0]);
    for (std::thread& t : workers) t.join();
    std::string all;
    all.reserve(pieces * 64);
    for (const std::string& d : digests) all += d;
    return sha256_hex({reinterpret_cast<const uint8_t*>(all.data()), all.size()}).substr(0, 16);
  }

  /// The blob's bytes [begin, begin + size): a pointer into the tensor when one holds them all,
  /// else `scratch` filled with the tensors' bytes and the zeros between them.
  const uint8_t* blob_range(uint64_t begin, uint64_t size, std::vector<uint8_t>& scratch) const {
    // items_ are in increasing offset order: the first that ends after `begin`.
    auto it = std::partition_point(items_.begin(), items_.end(), [begin](const Item& item) {
      return item.offset + item.tensor->nbytes() <= begin;
    });
    if (it != items_.end() && it->offset <= begin && begin + size <= it->offset + it->tensor->nbytes())
      return static_cast<const uint8_t*>(it->tensor->raw()) + (begin - it->offset);
    std::memset(scratch.data(), 0, static_cast<size_t>(size));
    for (; it != items_.end() && it->offset < begin + size; ++it) {
      uint64_t from = std::max(begin, it->offset), to = std::min(begin + size, it->offset + it->tensor->nbytes());
      std::memcpy(scratch.data() + (from - begin), static_cast<const uint8_t*>(it->tensor->raw()) + (from - it->offset),
                  static_cast<size_t>(to - from));
    }
    return scratch.data();
  }

  Result<flatbuffers::Offset<fb::TensorData>> write_tensor(const Tensor& t, const std::string& where) {
    uint64_t size = t.nbytes();
    if (size > 0 && t.raw() == nullptr) return internal_error(where, "tensor has no data");
    uint64_t offset = 0;
    if (size > 0) {
      auto [it, inserted] = placed_.try_emplace({t.raw(), size}, 0);
      if (inserted) {
        it->second = align_up(blob_size_);
        items_.push_back({&t, it->second});
        blob_size_ = it->second + size;
      }
      offset = it->second;
    }
    auto shape = fbb_.CreateVector(t.shape());
    flatbuffers::Offset<fb::PackedLayout> layout;
    if (const PackedLayout* l = t.layout())
      layout = fb::CreatePackedLayout(fbb_, fbb_.CreateVector(l->dims), fbb_.CreateVector(l->padded_dims), fbb_.CreateVector(l->strides),
                                      fbb_.CreateVector(l->inner_blocks), fbb_.CreateVector(l->inner_dims),
                                      fbb_.CreateString(l->packed_for));
    return fb::CreateTensorData(fbb_, static_cast<fb::DType>(t.dtype()), shape, offset, size, layout);
  }

  flatbuffers::Offset<fb::Shape> write_shape(const Shape& s) {
    std::vector<int64_t> dims;
    bool symbolic = false;
    for (const Dim& d : s.dims) {
      dims.push_back(d.is_known() ? d.value : -1);
      symbolic |= !d.symbol.empty();
    }
    auto dims_vec = fbb_.CreateVector(dims);
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> symbols;
    if (symbolic) {
      std::vector<std::string> names;
      for (const Dim& d : s.dims) names.push_back(d.symbol);
      symbols = fbb_.CreateVectorOfStrings(names);
    }
    return fb::CreateShape(fbb_, s.rank_known, dims_vec, symbols);
  }

  Result<flatbuffers::Offset<fb::Attribute>> write_attr(const Attribute& a, const std::string& where) {
    auto name = fbb_.CreateString(a.name);
    int64_t i = 0;
    double f = 0;
    flatbuffers::Offset<flatbuffers::String> s;
    flatbuffers::Offset<flatbuffers::Vector<int64_t>> ints;
    flatbuffers::Offset<flatbuffers::Vector<double>> floats;
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> strings;
    flatbuffers::Offset<fb::TensorData> tensor;
    flatbuffers::Offset<fb::Graph> graph;
    std::string attr_where = where + ": attribute '" + a.name + "'";
    if (const auto* v = std::get_if<int64_t>(&a.value)) i = *v;
    else if (const auto* v = std::get_if<double>(&a.value)) f = *v;
    else if (const auto* v = std::get_if<std::string>(&a.value)) s = fbb_.CreateString(*v);
    else if (const auto* v = std::get_if<std::vector<int64_t>>(&a.value)) ints = fbb_.CreateVector(*v);
    else if (const auto* v = std::get_if<std::vector<double>>(&a.value)) floats = fbb_.CreateVector(*v);
    else if (const auto* v = std::get_if<std::vector<std::string>>(&a.value)) strings = fbb_.CreateVectorOfStrings(*v);
    else if (const auto* v = std::get_if<Tensor>(&a.value)) {
      // An undefined tensor is written as an absent field; verify_model reports it on load.
      if (v->defined()) {
        KILN_ASSIGN_OR_RETURN(tensor, write_tensor(*v, attr_where));
      }
    } else if (const auto* v = std::get_if<std::shared_ptr<Graph>>(&a.value)) {
      if (*v) {
        KILN_ASSIGN_OR_RETURN(graph, write_graph(**v, attr_where + ": "));
      }
    }
    return fb::CreateAttribute(fbb_, name, static_cast<fb::AttrType>(attr_type(a.value)), i, f, s, ints, floats,
                               strings, tensor, graph);
  }

  Result<flatbuffers::Offset<fb::Graph>> write_graph(const Graph& g, const std::string& prefix) {
    std::vector<flatbuffers::Offset<fb::Value>> values;
    values.reserve(g.values.size());
    for (const Value& v : g.values) {
      auto name = fbb_.CreateString(v.name);
      auto shape = write_shape(v.shape);
      flatbuffers::Offset<fb::TensorData> constant;
      if (v.is_constant()) {
        KILN_ASSIGN_OR_RETURN(constant, write_tensor(v.constant, prefix + "value '" + v.name + "'"));
      }
      flatbuffers::Offset<fb::QuantParams> quant;
      if (v.quant) {
        auto scales = fbb_.CreateVector(v.quant->scales);
        auto zps = fbb_.CreateVector(v.quant->zero_points);
        quant = fb::CreateQuantParams(fbb_, static_cast<fb::DType>(v.quant->storage), scales, zps, v.quant->axis);
      }
      values.push_back(fb::CreateValue(fbb_, name, static_cast<fb::DType>(v.dtype), shape, constant, quant));
    }
    auto values_vec = fbb_.CreateVector(values);
    std::vector<flatbuffers::Offset<fb::Node>> nodes;
    nodes.reserve(g.nodes.size());
    for (const Node& n : g.nodes) {
      auto name = fbb_.CreateString(n.name);
      auto domain = fbb_.CreateString(n.domain);
      auto op = fbb_.CreateString(n.op);
      auto inputs = fbb_.CreateVector(n.inputs);
      auto outputs = fbb_.CreateVector(n.outputs);
      std::vector<flatbuffers::Offset<fb::Attribute>> attrs;
      for (const Attribute& a : n.attrs) {
        KILN_ASSIGN_OR_RETURN(auto attr, write_attr(a, prefix + n.where()));
        attrs.push_back(attr);
      }
      auto attrs_vec = fbb_.CreateVector(attrs);
      auto sources = fbb_.CreateVectorOfStrings(n.sources);
      flatbuffers::Offset<fb::KernelChoice> kernel;
      if (!n.kernel.empty() || !n.kernel.params.empty()) {
        std::vector<flatbuffers::Offset<fb::KernelParam>> params;
        for (const auto& [k, v] : n.kernel.params) {
          auto pname = fbb_.CreateString(k);
          if (const auto* i = std::get_if<int64_t>(&v)) {
            params.push_back(fb::CreateKernelParam(fbb_, pname, *i));
          } else if (const auto* f = std::get_if<double>(&v)) {
            params.push_back(fb::CreateKernelParam(fbb_, pname, 0, fb::KernelParamType::float64, *f));
          } else {
            auto text = fbb_.CreateString(std::get<std::string>(v));
            params.push_back(fb::CreateKernelParam(fbb_, pname, 0, fb::KernelParamType::str, 0, text));
          }
        }
        auto kname = fbb_.CreateString(n.kernel.name);
        kernel = fb::CreateKernelChoice(fbb_, kname, fbb_.CreateVector(params));
      }
      flatbuffers::Offset<flatbuffers::Vector<int32_t>> captures;
      if (!n.captures.empty()) captures = fbb_.CreateVector(n.captures);
      nodes.push_back(fb::CreateNode(fbb_, name, domain, op, inputs, outputs, attrs_vec, sources, kernel, captures));
    }
    auto nodes_vec = fbb_.CreateVector(nodes);
    auto inputs = fbb_.CreateVector(g.inputs);
    auto outputs = fbb_.CreateVector(g.outputs);
    flatbuffers::Offset<flatbuffers::Vector<int32_t>> captures;
    if (!g.captures.empty()) captures = fbb_.CreateVector(g.captures);
    return fb::CreateGraph(fbb_, values_vec, nodes_vec, inputs, outputs, captures);
  }

  flatbuffers::FlatBufferBuilder fbb_;
  std::vector<Item> items_;
  std::map<std::pair<const void*, uint64_t>, uint64_t> placed_;
  uint64_t blob_size_ = 0;
  bool sidecar_ = false;
  std::string sidecar_name_;
};

/// Where bytes go: a vector (stdout) or a file descriptor (buffered).
class Sink {
 public:
  virtual ~Sink() = default;
  virtual Status write(const void* data, size_t size) = 0;
  Status zeros(uint64_t n) {
    static const uint8_t kZeros[kAlign] = {};
    while (n > 0) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(n, kAlign));
      KILN_RETURN_IF_ERROR(write(kZeros, k));
      n -= k;
    }
    return {};
  }
};

class VectorSink : public Sink {
 public:
  explicit VectorSink(std::vector<uint8_t>& out) : out_(out) {}
  Status write(const void* data, size_t size) override {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + size);
    return {};
  }

 private:
  std::vector<uint8_t>& out_;
};

/// A Sink over an AtomicFile: the output is either the old file or the complete new one.
class TempFile : public Sink {
 public:
  Status open(const std::string& final_path) { return file_.open(final_path); }
  Status write(const void* data, size_t size) override { return file_.write(data, size); }
  Status sync() { return file_.sync(); }
  Status commit() { return file_.commit(); }

 private:
  AtomicFile file_;
};

/// Writes the weight blob: each tensor at its offset, zeros between.
Status write_blob(Sink& sink, const Writer& w) {
  uint64_t pos = 0;
  for (const Writer::Item& item : w.items()) {
    KILN_RETURN_IF_ERROR(sink.zeros(item.offset - pos));
    KILN_RETURN_IF_ERROR(sink.write(item.tensor->raw(), item.tensor->nbytes()));
    pos = item.offset + item.tensor->nbytes();
  }
  return {};
}

/// Writes the model file: the flatbuffer and, unless the blob is in a sidecar, padding and blob.
Status write_model_file(Sink& sink, const Writer& w) {
  auto fb = w.flatbuffer();
  KILN_RETURN_IF_ERROR(sink.write(fb.data(), fb.size()));
  if (w.sidecar() || w.blob_size() == 0) return {};
  KILN_RETURN_IF_ERROR(sink.zeros(align_up(fb.size()) - fb.size()));
  return write_blob(sink, w);
}

// ---- reading -------------------------------------------------------------------------------

/// A whole file in one 64-byte-aligned allocation.
struct Buffer {
  std::shared_ptr<uint8_t> data;
  uint64_t size = 0;
};

/// `size` bytes, zero-filled. Where they are on huge pages, `fault` (null: a touch) faults in
/// each 2 MiB page that came quickly, in order from the start, and may fill it (HugePageFault).
Result<Buffer> alloc_buffer(uint64_t size, const HugePageFault& fault = nullptr) {
  uint64_t rounded = align_up(std::max<uint64_t>(size, 1));
  const bool fits = rounded <= std::numeric_limits<size_t>::max();
  // The constants are read where they lie in the buffer (a model from stdin: its weights,
  // streamed on every run), so from 2 MiB on it is on 2 MiB pages where the machine gives them
  // quickly, as a model file kiln wrote is in the page cache (ChunkedWriter).
  if (fits) {
    if (std::shared_ptr<HugePages> region = huge_pages_if_quick(static_cast<size_t>(rounded), fault))
      return Buffer{std::shared_ptr<uint8_t>(region, region->data()), size};
  }
  if (!fits || !try_charge_memory(rounded))
    return user_error("", "reading it needs " + format_bytes(size) + ", past the memory limit of " +
                              format_bytes(memory_limit()) + " (--max-memory)");
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) {
    release_memory(rounded);
    return user_error("", "cannot allocate " + format_bytes(size) + " to read the file");
  }
  // The tail past `size` is zeroed so that nothing reads uninitialised memory.
  std::memset(static_cast<uint8_t*>(p) + size, 0, rounded - size);
  return Buffer{std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [rounded](uint8_t* q) {
                  std::free(q);
                  release_memory(rounded);
                }),
                size};
}

/// The model files kiln has memory-mapped and not yet unmapped: begin -> end address.
struct MappedFiles {
  std::mutex mu;
  std::map<uintptr_t, uintptr_t> ranges;
};
MappedFiles& mapped_files() {
  static MappedFiles* m = new MappedFiles;  // never destroyed: unmapping may run at exit
  return *m;
}

/// Reads what `fd` holds from its current offset to its end: a regular file read from its start
/// is memory-mapped, anything else (a pipe, a device, a file read from part-way through) read
/// into an aligned buffer. `what` names the file in messages ("file" for the model file itself, whose
/// path the caller puts in Error::file).
Result<Buffer> read_fd(int fd, const std::string& what) {
  std::string label = " " + what;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return user_error("", "cannot read" + label + ": " + errno_text(errno));
  if (S_ISDIR(st.st_mode)) return user_error("", "cannot read" + label + ": " + errno_text(EISDIR));
  auto read_some = [&](uint8_t* p, size_t n) -> ssize_t {
    for (;;) {
      ssize_t r = ::read(fd, p, n);
      if (r < 0 && errno == EINTR) continue;
      return r;
    }
  };
  const bool from_start = S_ISREG(st.st_mode) && ::lseek(fd, 0, SEEK_CUR) == 0;
  if (from_start && st.st_size > 0) {
    // Mapped, not copied: weights are views into the page cache, loading costs no copy and
    // the pages of weights a run never touches are never read. Private and writable, so that
    // nothing written through a view (there should be nothing) could reach the file.
    const auto size = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      const auto begin = reinterpret_cast<uintptr_t>(p);
      {
        std::lock_guard lock(mapped_files().mu);
        mapped_files().ranges[begin] = begin + size;
      }
      return Buffer{std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p),
                                             [size](uint8_t* q) {
                                               {
                                                 std::lock_guard lock(mapped_files().mu);
                                                 mapped_files().ranges.erase(reinterpret_cast<uintptr_t>(q));
                                               }
                                               ::munmap(q, size);
                                             }),
                    static_cast<uint64_t>(size)};
    }
  }
  if (from_start) {
    KILN_ASSIGN_OR_RETURN(Buffer buf, alloc_buffer(static_cast<uint64_t>(st.st_size)));
    uint64_t got = 0;
    while (got < buf.size) {
      ssize_t r = read_some(buf.data.get() + got, static_cast<size_t>(std::min<uint64_t>(buf.size - got, 1u << 30)));
      if (r < 0) return user_error("", "cannot read" + label + ": " + errno_text(errno));
      if (r == 0) return user_error("", "cannot read" + label + ": the file shrank while it was read");
      got += static_cast<uint64_t>(r);
    }
    return buf;
  }
  // Size unknown: read to the end in pieces of huge pages' size, each its own mapping (charged
  // to --max-memory), then each copied into the buffer and unmapped, so that the peak is the
  // file and one piece. Gathered in a growing vector and copied whole into a buffer on huge
  // pages faulted in first, a 438 MB model from a pipe peaked at twice its size.
  struct Piece {
    uint8_t* data = nullptr;
    size_t size = 0;
    bool charged = true;
    explicit Piece(uint8_t* d) : data(d) {}
    Piece(Piece&& o) noexcept : data(std::exchange(o.data, nullptr)), size(o.size), charged(o.charged) {}
    Piece(const Piece&) = delete;
    ~Piece() { drop(); }
    void drop() noexcept {
      if (!data) return;
      ::munmap(std::exchange(data, nullptr), kHugePageBytes);
      if (std::exchange(charged, false)) release_memory(kHugePageBytes);
    }
  };
  std::vector<Piece> pieces;
  uint64_t total = 0;
  for (bool end = false; !end;) {
    if (!try_charge_memory(kHugePageBytes))
      return user_error("", "reading it needs at least " + format_bytes(static_cast<size_t>(total) + kHugePageBytes) +
                                ", past the memory limit of " + format_bytes(memory_limit()) + " (--max-memory)");
    void* p = ::mmap(nullptr, kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      release_memory(kHugePageBytes);
      return user_error("", "cannot allocate memory to read" + label);
    }
    Piece& piece = pieces.emplace_back(static_cast<uint8_t*>(p));
    while (piece.size < kHugePageBytes) {
      ssize_t r = read_some(piece.data + piece.size, kHugePageBytes - piece.size);
      if (r < 0) return user_error("", "cannot read" + label + ": " + errno_text(errno));
      if (r == 0) {
        end = true;
        break;
      }
      piece.size += static_cast<size_t>(r);
    }
    total += piece.size;
  }
  // Every piece but the last is whole, so piece k fills the buffer's 2 MiB page k: on huge pages
  // each page that comes quickly is faulted in by its piece's copy.
  size_t copied = 0;
  auto copy_next = [&](uint8_t* to) {
    std::memcpy(to, pieces[copied].data, pieces[copied].size);
    pieces[copied++].drop();
  };
  const HugePageFault copy_in = [&](uint8_t* page) {
    const auto t0 = std::chrono::steady_clock::now();
    *reinterpret_cast<volatile uint8_t*>(page) = 0;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    copy_next(page);
    return ms;
  };
  for (Piece& piece : pieces) {  // the buffer's charge covers them while they are copied in
    release_memory(kHugePageBytes);
    piece.charged = false;
  }
  KILN_ASSIGN_OR_RETURN(Buffer buf, alloc_buffer(total, copy_in));
  while (copied < pieces.size()) copy_next(buf.data.get() + copied * kHugePageBytes);
  return buf;
}

/// Reads `path` whole (read_fd).
Result<Buffer> read_file(const std::string& path, const std::string& what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return user_error("", "cannot open " + what + ": " + errno_text(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  return read_fd(fd, what);
}

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

/// Copies a vector of scalars out of the buffer. FlatBuffers 2.0.8's verifier checks only the
/// 4-byte alignment of a vector's length, so 8-byte elements are checked here: a crafted file
/// must not make the loader read misaligned memory. (The buffer is 64-aligned, so an address
/// check is an offset check.)
template <class T>
Result<std::vector<T>> read_vector(const flatbuffers::Vector<T>* v, const std::string& where) {
  std::vector<T> out;
  if (!v || v->size() == 0) return out;  // FlatBuffers does not align empty vectors
  if (reinterpret_cast<uintptr_t>(v->data()) % alignof(T) != 0)
    return user_error(where, "file is corrupt: an array of " + std::to_string(sizeof(T)) +
                                 "-byte numbers is at a misaligned offset");
  out.assign(v->begin(), v->end());
  return out;
}

std::string quoted_bytes(const uint8_t* p, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\'' && p[i] != '\\') {
      out += static_cast<char>(p[i]);
    } else {
      out += "\\x";
      out += kHex[p[i] >> 4];
      out += kHex[p[i] & 15];
    }
  }
  return out;
}

/// Converts a verified FlatBuffer into the IR, checking what the IR cannot represent (tensor
/// data that does not fit its dtype and shape or lies outside the blob, unknown enum values).
class Reader {
 public:
  Reader(const uint8_t* blob, uint64_t blob_size, std::shared_ptr<void> owner, void* empty)
      : blob_(blob), blob_size_(blob_size), owner_(std::move(owner)), empty_(empty) {}

  Result<Graph> read_graph(const fb::Graph* fg, const std::string& prefix) {
    Graph g;
    if (!fg) return g;
    if (const auto* values = fg->values()) {
      g.values.reserve(values->size());
      for (const fb::Value* fv : *values) {
        Value v;
        v.name = str(fv->name());
        v.dtype = static_cast<DType>(fv->dtype());  // verify_model checks it is a known dtype
        std::string where = prefix + "value '" + v.name + "'";
        KILN_ASSIGN_OR_RETURN(v.shape, read_shape(fv->shape(), where));
        if (fv->constant()) {
          // Packed weights are a compiled model's: its top-level constants, which the execution
          // plan unpacks for any kernel that does not read the layout (subgraph bodies are
          // prepared unplanned, so they never see one).
          KILN_ASSIGN_OR_RETURN(v.constant, read_tensor(fv->constant(), where, /*packed_ok=*/prefix.empty()));
        }
        if (const fb::QuantParams* q = fv->quant()) {
          QuantParams qp;
          qp.storage = static_cast<DType>(q->storage());
          KILN_ASSIGN_OR_RETURN(qp.scales, read_vector(q->scales(), where));
          KILN_ASSIGN_OR_RETURN(qp.zero_points, read_vector(q->zero_points(), where));
          qp.axis = q->axis();
          v.quant = std::move(qp);
        }
        g.values.push_back(std::move(v));
      }
    }
    if (const auto* nodes = fg->nodes()) {
      g.nodes.reserve(nodes->size());
      for (const fb::Node* fn : *nodes) {
        Node n;
        n.name = str(fn->name());
        n.domain = str(fn->domain());
        n.op = str(fn->op());
        KILN_ASSIGN_OR_RETURN(n.inputs, read_vector(fn->inputs(), prefix + n.where()));
        KILN_ASSIGN_OR_RETURN(n.outputs, read_vector(fn->outputs(), prefix + n.where()));
        KILN_ASSIGN_OR_RETURN(n.captures, read_vector(fn->captures(), prefix + n.where()));
        if (fn->sources())
          for (const flatbuffers::String* s : *fn->sources()) n.sources.push_back(str(s));
        if (const fb::KernelChoice* k = fn->kernel()) {
          n.kernel.name = str(k->name());
          if (k->params())
            for (const fb::KernelParam* p : *k->params()) {
              KernelParam v = p->value();
              if (p->type() == fb::KernelParamType::float64) v = p->f();
              else if (p->type() == fb::KernelParamType::str) v = str(p->s());
              else if (p->type() != fb::KernelParamType::int64)
                return user_error(prefix + n.where(), "kernel parameter '" + str(p->name()) + "' has unknown type " +
                                                          std::to_string(static_cast<uint16_t>(p->type())));
              n.kernel.params.emplace_back(str(p->name()), std::move(v));
            }
        }
        if (fn->attrs()) {
          for (const fb::Attribute* fa : *fn->attrs()) {
            KILN_ASSIGN_OR_RETURN(Attribute a, read_attr(fa, prefix + n.where()));
            n.attrs.push_back(std::move(a));  // stored order, so a save reproduces the file
          }
        }
        g.nodes.push_back(std::move(n));
      }
    }
    KILN_ASSIGN_OR_RETURN(g.inputs, read_vector(fg->inputs(), prefix));
    KILN_ASSIGN_OR_RETURN(g.outputs, read_vector(fg->outputs(), prefix));
    KILN_ASSIGN_OR_RETURN(g.captures, read_vector(fg->captures(), prefix));
    return g;
  }

 private:
  Result<Shape> read_shape(const fb::Shape* fs, const std::string& where) {
    Shape s;
    if (!fs) return s;
    s.rank_known = fs->rank_known();
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, read_vector(fs->dims(), where));
    size_t rank = dims.size();
    const auto* symbols = fs->symbols();
    if (symbols && symbols->size() != rank)
      return user_error(where, "shape has " + std::to_string(rank) + " dims but " + std::to_string(symbols->size()) +
                                   " symbols");
    for (size_t i = 0; i < rank; ++i) {
      Dim d;
      int64_t v = dims[i];
      d.value = v >= 0 ? v : -1;
      if (symbols) d.symbol = str(symbols->Get(static_cast<flatbuffers::uoffset_t>(i)));
      s.dims.push_back(std::move(d));
    }
    return s;
  }

  Result<Tensor> read_tensor(const fb::TensorData* td, const std::string& where, bool packed_ok = false) {
    auto raw_dtype = static_cast<uint16_t>(td->dtype());
    if (!dtype_valid(raw_dtype)) return user_error(where, "data has unknown dtype " + std::to_string(raw_dtype));
    auto dtype = static_cast<DType>(raw_dtype);
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, read_vector(td->shape(), where));
    for (int64_t d : shape)
      if (d < 0) return user_error(where, "data shape has negative dim " + std::to_string(d));
    int64_t numel = shape_numel(shape);
    const std::optional<size_t> bytes = storage_bytes(dtype, numel);
    if (!bytes || *bytes > static_cast<size_t>(std::numeric_limits<int64_t>::max()))
      return user_error(where, "data shape " + shape_str(shape) + " has more elements than fit in memory");
    auto need = static_cast<uint64_t>(*bytes);
    std::string desc = std::string(dtype_name(dtype)) + " " + shape_str(shape);
    std::optional<PackedLayout> layout;
    if (const fb::PackedLayout* fl = td->layout()) {
      if (!packed_ok) return user_error(where, "packed data is only allowed for the constants of the top-level graph");
      PackedLayout& l = layout.emplace();
      KILN_ASSIGN_OR_RETURN(l.dims, read_vector(fl->dims(), where));
      KILN_ASSIGN_OR_RETURN(l.padded_dims, read_vector(fl->padded_dims(), where));
      KILN_ASSIGN_OR_RETURN(l.strides, read_vector(fl->strides(), where));
      KILN_ASSIGN_OR_RETURN(l.inner_blocks, read_vector(fl->inner_blocks(), where));
      KILN_ASSIGN_OR_RETURN(l.inner_dims, read_vector(fl->inner_dims(), where));
      l.packed_for = str(fl->packed_for());
      if (dtype == DType::boolean || is_int4(dtype)) return user_error(where, std::string(dtype_name(dtype)) + " data cannot be packed");
      if (auto why = check_layout(l, numel, td->size(), dtype_size(dtype))) return user_error(where, *why);
      need = td->size();
    }
    if (td->size() != need)
      return user_error(where, "data has " + std::to_string(td->size()) + " bytes but " + desc + " needs " +
                                   std::to_string(need));
    void* ptr = empty_;
    if (need > 0) {
      uint64_t off = td->offset();
      if (off % kAlign != 0)
        return user_error(where, "data offset " + std::to_string(off) + " is not a multiple of " +
                                     std::to_string(kAlign));
      if (off > blob_size_ || need > blob_size_ - off)
        return user_error(where, "data at offset " + std::to_string(off) + " with " + std::to_string(need) +
                                     " bytes lies outside the " + std::to_string(blob_size_) + "-byte weight blob");
      ptr = const_cast<uint8_t*>(blob_ + off);
      // Any other byte in a bool is undefined behaviour when read as a C++ bool.
      if (dtype == DType::boolean)
        for (uint64_t i = 0; i < need; ++i)
          if (blob_[off + i] > 1)
            return user_error(where, "bool data has byte " + std::to_string(blob_[off + i]) + " at element " +
                                         std::to_string(i) + "; bools must be 0 or 1");
    }
    if (layout) return Tensor::packed(dtype, std::move(shape), std::move(*layout), need, ptr, owner_);
    return Tensor::view(dtype, std::move(shape), ptr, owner_);
  }

  Result<Attribute> read_attr(const fb::Attribute* fa, const std::string& node_where) {
    Attribute a;
    a.name = str(fa->name());
    std::string where = node_where + ": attribute '" + a.name + "'";
    auto raw = static_cast<uint16_t>(fa->type());
    switch (static_cast<AttrType>(raw)) {
      case AttrType::int64: a.value = fa->i(); break;
      case AttrType::float64: a.value = fa->f(); break;
      case AttrType::string: a.value = str(fa->s()); break;
      case AttrType::ints: {
        KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, read_vector(fa->ints(), where));
        a.value = std::move(v);
        break;
      }
      case AttrType::floats: {
        KILN_ASSIGN_OR_RETURN(std::vector<double> v, read_vector(fa->floats(), where));
        a.value = std::move(v);
        break;
      }
      case AttrType::strings: {
        std::vector<std::string> v;
        if (fa->strings())
          for (const flatbuffers::String* s : *fa->strings()) v.push_back(str(s));
        a.value = std::move(v);
        break;
      }
      case AttrType::tensor: {
        Tensor t;
        if (fa->tensor()) {
          KILN_ASSIGN_OR_RETURN(t, read_tensor(fa->tensor(), where));
        }
        a.value = std::move(t);
        break;
      }
      case AttrType::graph: {
        std::shared_ptr<Graph> g;
        if (fa->graph()) {
          KILN_ASSIGN_OR_RETURN(Graph sub, read_graph(fa->graph(), where + ": "));
          g = std::make_shared<Graph>(std::move(sub));
        }
        a.value = std::move(g);
        break;
      }
      default: return user_error(where, "unknown attribute type " + std::to_string(raw));
    }
    return a;
  }

  const uint8_t* blob_;
  uint64_t blob_size_;
  std::shared_ptr<void> owner_;
  void* empty_;
};

bool valid_sidecar_name(const std::string& name) {
  return !name.empty() && name != "." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find("..") == std::string::npos &&
         name.find('\0') == std::string::npos;
}

void topo_sort_all(Graph& g) {
  // verify_model has ruled out cycles, so this only reorders (and is a no-op on sorted graphs).
  (void)g.topo_sort();
  for (Node& n : g.nodes)
    for (Attribute& a : n.attrs)
      if (auto* sub = std::get_if<std::shared_ptr<Graph>>(&a.value); sub && *sub) topo_sort_all(**sub);
}

/// Decodes a whole .kiln file held in `buf`. Errors have no file name yet.
Result<Model> decode(const Buffer& buf, const std::string& sidecar_dir, const LoadOptions& options) {
  const uint8_t* p = buf.data.get();
  const uint64_t size = buf.size;
  if (size == 0) return user_error("", "file is empty");
  constexpr uint64_t kHeader = 12;  // size prefix, root offset, identifier
  if (size < kHeader)
    return user_error("", "file has " + std::to_string(size) + " bytes, too few for a kiln file");
  if (std::memcmp(p + 8, kKilnFileIdentifier, 4) != 0)
    return user_error("", "not a kiln file: expected identifier 'KILN' at byte 8 but found '" + quoted_bytes(p + 8, 4) +
                              "'");
  uint64_t fb_size = flatbuffers::ReadScalar<uint32_t>(p);
  if (fb_size >= FLATBUFFERS_MAX_BUFFER_SIZE - 8)
    return user_error("", "file is corrupt: flatbuffer size " + std::to_string(fb_size) + " is too large");
  uint64_t fb_end = 4 + fb_size;
  if (fb_end > size)
    return user_error("", "file is truncated: it has " + std::to_string(size) + " bytes but its flatbuffer needs " +
                              std::to_string(fb_end));

  flatbuffers::Verifier::Options vopts;
  vopts.max_depth = kMaxDepth;
  // A table takes at least 4 bytes, so a well-formed buffer has fewer than size/4 of them; the
  // bound stops a crafted file from making verification revisit shared tables endlessly.
  vopts.max_tables = static_cast<flatbuffers::uoffset_t>(fb_end / 4 + 16);

  // The version is read after checking only the root table, so that a file of another major
  // version gets a version message even when the rest of its layout is foreign.
  {
    flatbuffers::Verifier v(p, static_cast<size_t>(fb_end), vopts);
    uint32_t root = v.VerifyOffset(4);
    // fb::Model inherits flatbuffers::Table privately; the root is a Table all the same.
    const auto* m = root ? reinterpret_cast<const flatbuffers::Table*>(p + 4 + root) : nullptr;
    if (!m || !m->VerifyTableStart(v) || !m->VerifyField<uint16_t>(v, fb::Model::VT_SCHEMA_MAJOR, 2) ||
        !m->VerifyField<uint16_t>(v, fb::Model::VT_SCHEMA_MINOR, 2))
      return user_error("", "file is corrupt: its root table is malformed");
    uint16_t major = m->GetField<uint16_t>(fb::Model::VT_SCHEMA_MAJOR, 0);
    uint16_t minor = m->GetField<uint16_t>(fb::Model::VT_SCHEMA_MINOR, 0);
    if (major != kSchemaMajor) {
      std::string file_v = std::to_string(major) + "." + std::to_string(minor);
      std::string ours = std::to_string(kSchemaMajor) + ".x";
      if (major > kSchemaMajor)
        return user_error("", "file has schema version " + file_v + " but this kiln reads " + ours +
                                  "; upgrade kiln to read it");
      return user_error("", "file has schema version " + file_v + " but this kiln reads " + ours +
                                "; re-export the model");
    }
  }
  {
    flatbuffers::Verifier v(p, static_cast<size_t>(fb_end), vopts);
    if (!v.VerifySizePrefixedBuffer<fb::Model>(kKilnFileIdentifier)) {
      // Tell a model that is merely nested too deeply from a corrupt one. The second bound
      // still keeps the verifier's recursion shallow enough for any stack.
      flatbuffers::Verifier::Options deep = vopts;
      deep.max_depth = 4096;
      flatbuffers::Verifier v2(p, static_cast<size_t>(fb_end), deep);
      if (v2.VerifySizePrefixedBuffer<fb::Model>(kKilnFileIdentifier))
        return user_error("", "the model nests subgraphs deeper than this kiln reads (" + std::to_string(kMaxDepth) +
                                  " levels of tables, about " + std::to_string(kMaxDepth / 3) + " subgraphs)");
      return user_error("", "file is corrupt: its flatbuffer fails verification");
    }
  }
  const fb::Model* fm = fb::GetSizePrefixedModel(p);

  // Locate the weight blob.
  uint64_t blob_size = fm->weights_size();
  const uint8_t* blob = nullptr;
  std::shared_ptr<void> owner = buf.data;
  void* empty = buf.data.get();  // where zero-byte tensors point: aligned and owned
  if (fm->weights_file()) {
    std::string name = str(fm->weights_file());
    if (!valid_sidecar_name(name))
      return user_error("", "sidecar weights file name '" + quoted_bytes(reinterpret_cast<const uint8_t*>(name.data()),
                                                                         name.size()) +
                                "' is not a plain file name");
    if (size != fb_end)
      return user_error("", "file has " + std::to_string(size) + " bytes but should have " + std::to_string(fb_end) +
                                " (its weights are in '" + name + "')");
    std::string path = sidecar_dir.empty() ? name : (std::filesystem::path(sidecar_dir) / name).string();
    auto side = read_file(path, "sidecar weights file '" + path + "'");
    if (!side.ok()) return side.error();
    if (side->size != blob_size)
      return user_error("", "sidecar weights file '" + path + "' has " + std::to_string(side->size) +
                                " bytes but the model needs " + std::to_string(blob_size));
    blob = side->data.get();
    owner = side->data;
    empty = side->data.get();
  } else {
    uint64_t blob_start = blob_size == 0 ? fb_end : align_up(fb_end);
    if (blob_size > std::numeric_limits<uint64_t>::max() - blob_start)
      return user_error("", "file is corrupt: weight blob size " + std::to_string(blob_size) + " is too large");
    uint64_t expected = blob_start + blob_size;
    if (size < expected)
      return user_error("", "file is truncated: it has " + std::to_string(size) + " bytes but should have " +
                                std::to_string(expected));
    if (size > expected)
      return user_error("", "file has " + std::to_string(size - expected) + " unexpected bytes after its end at byte " +
                                std::to_string(expected));
    blob = p + blob_start;
  }

  Model model;
  auto raw_stage = static_cast<uint16_t>(fm->stage());
  if (raw_stage < static_cast<uint16_t>(Stage::exported) || raw_stage > static_cast<uint16_t>(Stage::compiled))
    return user_error("", "unknown model stage " + std::to_string(raw_stage));
  model.stage = static_cast<Stage>(raw_stage);
  if (fm->provenance())
    for (const fb::Provenance* pr : *fm->provenance())
      model.provenance.push_back(Provenance{str(pr->tool()), str(pr->version()), str(pr->command()),
                                            str(pr->input_file()), str(pr->input_sha256())});
  if (fm->metadata())
    for (const fb::MetadataEntry* e : *fm->metadata()) model.metadata.emplace_back(str(e->key()), str(e->value()));
  Reader reader(blob, blob_size, owner, empty);
  KILN_ASSIGN_OR_RETURN(model.graph, reader.read_graph(fm->graph(), ""));
  if (const fb::MemoryPlan* mp = fm->memory_plan()) {
    MemoryPlanRecord rec;
    if (mp->input_shapes())
      for (const fb::InputShape* is : *mp->input_shapes()) {
        KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, read_vector(is->dims(), std::string("memory plan")));
        rec.input_shapes.push_back(std::move(dims));
      }
    rec.arena_bytes = mp->arena_bytes();
    rec.workspace_bytes = mp->workspace_bytes();
    if (mp->values())
      for (const fb::PlannedValue* pv : *mp->values()) rec.values.push_back({pv->value(), pv->offset(), pv->size()});
    model.memory_plan = std::move(rec);
  }
  if (const fb::TargetFingerprint* t = fm->target()) {
    TargetRecord rec;
    rec.device = str(t->device());
    if (t->isa())
      for (const flatbuffers::String* f : *t->isa()) rec.isa.push_back(str(f));
    rec.threads = t->threads();
    model.target = std::move(rec);
  }
  // Schema 1.0 had no captures: its subgraphs read enclosing values by name.
  if (fm->schema_minor() < 1) KILN_RETURN_IF_ERROR(resolve_captures(model.graph));
  if (options.verify) {
    KILN_RETURN_IF_ERROR(verify_model(model));
    topo_sort_all(model.graph);
  }
  return model;
}

}  // namespace

namespace {

/// Removes the sidecars earlier saves of the model `base` in `dir` wrote (`base.weights` of
/// older kiln versions and `base.<16 hex>.weights`), except `keep`; returns how many.
int remove_stale_sidecars(const std::filesystem::path& dir, const std::string& base, const std::string& keep) {
  int removed = 0;
  std::error_code ec;
  std::filesystem::path d = dir.empty() ? std::filesystem::path(".") : dir;
  const std::string suffix = kSidecarSuffix;
  for (const auto& entry : std::filesystem::directory_iterator(d, ec)) {
    std::string name = entry.path().filename().string();
    if (name == keep || name.compare(0, base.size() + 1, base + ".") != 0 || name.size() < base.size() + suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    std::string middle = name.substr(base.size() + 1, name.size() - base.size() - 1 - suffix.size());
    bool versioned = middle.size() == 16 && middle.find_first_not_of("0123456789abcdef") == std::string::npos;
    if ((versioned || name == base + suffix) && std::filesystem::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

}  // namespace

Result<std::vector<uint8_t>> serialize_model(const Model& model) {
  Writer w;
  KILN_RETURN_IF_ERROR(w.build(model, std::numeric_limits<uint64_t>::max(), ""));
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(align_up(w.flatbuffer().size()) + w.blob_size()));
  VectorSink sink(out);
  KILN_RETURN_IF_ERROR(write_model_file(sink, w));
  return out;
}

Status save_model(const Model& model, const std::string& path, const SaveOptions& options) {
  std::filesystem::path p(path);
  const std::string base = p.filename().string();
  const std::filesystem::path dir = p.parent_path();
  Writer w;
  KILN_RETURN_IF_ERROR(with_file(w.build(model, options.sidecar_threshold, base), path));
  // The sidecar is named after its content, so it never replaces the sidecar the old model
  // uses, and the model's rename is the one step that switches from the old pair (model,
  // sidecar) to the new one: a kill at any point leaves the old model with its old sidecar, or
  // the new model with its new one. Both files are complete on disk before either is renamed.
  TempFile side_tmp;
  if (w.sidecar()) {
    KILN_RETURN_IF_ERROR(with_file(side_tmp.open((dir / w.sidecar_name()).string()), path));
    KILN_RETURN_IF_ERROR(with_file(write_blob(side_tmp, w), path));
  }
  TempFile model_tmp;
  KILN_RETURN_IF_ERROR(with_file(model_tmp.open(path), path));
  KILN_RETURN_IF_ERROR(with_file(write_model_file(model_tmp, w), path));
  if (w.sidecar()) KILN_RETURN_IF_ERROR(with_file(side_tmp.sync(), path));
  KILN_RETURN_IF_ERROR(with_file(model_tmp.sync(), path));
  // The renames and the clean-up happen under the folder's lock, so that a concurrent save of
  // a model here never takes this save's renamed sidecar for an orphan before its model is
  // renamed too.
  FolderLock lock(dir.string());
  const std::string side_path = w.sidecar() ? (dir / w.sidecar_name()).string() : "";
  std::error_code ec;
  const bool side_existed = w.sidecar() && std::filesystem::exists(side_path, ec);
  // Each commit syncs the folder: the sidecar's name is durable before the model names it.
  if (w.sidecar()) KILN_RETURN_IF_ERROR(with_file(side_tmp.commit(), path));
  if (Status s = model_tmp.commit(); !s.ok()) {
    // The old model stays; a sidecar it may use (same content, same name) stays too.
    if (w.sidecar() && !side_existed) std::filesystem::remove(side_path, ec);
    return with_file(s, path);
  }
  // The previous versions' sidecars, and those of writers killed between their two renames,
  // are garbage now that the model refers to its own.
  if (remove_stale_sidecars(dir, base, w.sidecar() ? w.sidecar_name() : "") > 0) sync_folder(dir.string());
  return {};
}

namespace {

// Whether [begin, end) lies in one model file load_model mapped (mapped_files().mu held).
bool inside_mapped_file(uintptr_t begin, uintptr_t end) {
  auto it = mapped_files().ranges.upper_bound(begin);
  if (it == mapped_files().ranges.begin()) return false;
  --it;
  return end <= it->second;
}

}  // namespace

void release_file_pages(const Tensor& t) {
  if (t.defined()) release_file_pages(t.raw(), t.nbytes());
}

void release_file_pages(const void* data, size_t bytes) {
  if (!data || bytes == 0) return;
  const auto begin = reinterpret_cast<uintptr_t>(data), end = begin + bytes;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;  // whole pages only
  if (first >= last) return;
  std::lock_guard lock(mapped_files().mu);
  if (!inside_mapped_file(begin, end)) return;
  // Clean pages of a private file mapping: dropped from this process, faulted back in from the
  // page cache (the file's bytes) on the next read.
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

namespace {

// Whether all of `t`'s bytes lie in one model file load_model mapped.
bool in_mapped_file(const Tensor& t) {
  const auto begin = reinterpret_cast<uintptr_t>(t.raw());
  std::lock_guard lock(mapped_files().mu);
  return inside_mapped_file(begin, begin + t.nbytes());
}

}  // namespace

AddressRanges mapped_model_files() {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  std::lock_guard lock(mapped_files().mu);
  AddressRanges ranges;
  for (const auto& [begin, end] : mapped_files().ranges)
    ranges.emplace_back(begin, (end + page - 1) / page * page);  // the mapping's whole pages
  return ranges;
}

ModelPageUse model_page_use() {
  ModelPageUse use;
  const AddressRanges files = mapped_model_files(), buffers = huge_page_regions();
  if (files.empty() && buffers.empty()) return use;
  const std::string smaps = self_smaps();
  if (smaps.empty()) return use;
  if (!files.empty()) use.model_files = page_use(smaps, files);
  if (!buffers.empty()) use.huge_page_buffers = page_use(smaps, buffers);
  return use;
}

HugePageWeights weights_on_huge_pages(const Graph& g, std::string_view thp_mode, const HugePageFault& fault) {
  if (!huge_pages_enabled(thp_mode)) return {};
  // A convolution's weight stays: ResNet-50's int8 convolutions ran 2-4 % slower from huge
  // pages (kiln profile, alternated), where the linear layers of int8 BERT-base ran 0.91x.
  std::vector<char> conv_weight(g.values.size(), 0);
  for (const Node& node : g.nodes)
    if (node.op.find("Conv") != std::string::npos)
      for (ValueId in : node.inputs)
        if (in >= 0) conv_weight[static_cast<size_t>(in)] = 1;
  std::vector<size_t> moving;
  size_t total = 0;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Tensor& t = g.values[v].constant;
    if (t.is_packed() && t.dtype() != DType::f32 && t.nbytes() > 0 && !conv_weight[v] && in_mapped_file(t)) {
      moving.push_back(v);
      total += static_cast<size_t>(align_up(t.nbytes()));
    }
  }
  if (total < kHugePageBytes) return {};
  HugePageWeights placed{nullptr, 0, total};
  std::shared_ptr<HugePages> region = HugePages::map((total + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes);
  if (!region) return placed;
  // Faulted in one page at a time until slow ones have cost the budget: on a virtual machine
  // whose host backs fresh memory on demand, the whole copy of BERT-base's bf16 weights took
  // 0.06 to 1.4 s.
  double slow_budget_ms = kSlowHugePagesBudgetMs;
  const size_t faulted = region->fault_in(fault, slow_budget_ms);
  size_t used = 0, moved = 0;
  while (moved < moving.size() && used + g.values[moving[moved]].constant.nbytes() <= faulted)
    used += static_cast<size_t>(align_up(g.values[moving[moved++]].constant.nbytes()));
  if (moved == 0) return placed;
  region->shrink(used);  // the pages no weight reached go back, with their share of the charge
  auto out = std::make_shared<Graph>(g);
  placed.moved_bytes = used;
  uint8_t* at = region->data();
  for (size_t k = 0; k < moved; ++k) {
    Tensor& t = out->values[moving[k]].constant;
    std::memcpy(at, t.raw(), t.nbytes());
    release_file_pages(t);
    t = Tensor::packed(t.dtype(), t.shape(), *t.layout(), t.nbytes(), at, region);
    at += align_up(t.nbytes());
  }
  placed.graph = std::move(out);
  return placed;
}

namespace {

// The hex SHA-256 of `buf`'s bytes. Hashing reads every page; where they are a model file's
// mapping they go back to the page cache after (the pages a run or a pass reads fault in again).
std::string hash_buffer(const Buffer& buf) {
  std::string hex = sha256_hex({buf.data.get(), static_cast<size_t>(buf.size)});
  const auto begin = reinterpret_cast<uintptr_t>(buf.data.get());
  std::lock_guard lock(mapped_files().mu);
  if (buf.size > 0 && inside_mapped_file(begin, begin + buf.size)) ::madvise(buf.data.get(), buf.size, MADV_DONTNEED);
  return hex;
}

}  // namespace

Result<Model> load_model(const std::string& path, const LoadOptions& options) {
  auto buf = read_file(path, "file");
  if (!buf.ok()) return with_file(buf.status(), path);
  if (options.sha256) *options.sha256 = hash_buffer(*buf);
  std::string dir = std::filesystem::path(path).parent_path().string();
  auto model = decode(*buf, dir, options);
  if (!model.ok()) return with_file(model.status(), path);
  return model;
}

Result<Model> load_model_from_fd(int fd, const std::string& name, const LoadOptions& options,
                                 const std::string& sidecar_dir) {
  auto buf = read_fd(fd, "file");
  if (!buf.ok()) return with_file(buf.status(), name);
  if (options.sha256) *options.sha256 = hash_buffer(*buf);
  auto model = decode(*buf, sidecar_dir, options);
  if (!model.ok()) return with_file(model.status(), name);
  return model;
}

Result<Model> load_model_from_bytes(std::span<const uint8_t> bytes, const std::string& name,
                                    const LoadOptions& options, const std::string& sidecar_dir) {
  if (options.sha256) *options.sha256 = sha256_hex(bytes);
  auto buf = alloc_buffer(bytes.size());
  if (!buf.ok()) return with_file(buf.status(), name);
  if (!bytes.empty()) std::memcpy(buf->data.get(), bytes.data(), bytes.size());
  auto model = decode(*buf, sidecar_dir, options);
  if (!model.ok()) return with_file(model.status(), name);
  return model;
}

}  // namespace kiln
