// .kiln save/load: round trip of every IR feature, byte-identical saves, 64-byte alignment of
// loaded weights, the sidecar weights file, atomic saves, and the text form.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "formats/atomic_file.h"
#include "formats/huge_pages.h"
#include "formats/layout.h"
#include "formats/memory.h"
#include "formats/serialize.h"
#include "formats/sha256.h"
#include "formats/text.h"
#include "formats/verify.h"
#include "tests/unit/proc_self_test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

/// A fresh empty directory for one test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("kiln_fmt_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A tensor of `dtype` filled with non-zero pseudo-random values.
Tensor random_tensor(DType dtype, std::vector<int64_t> shape, uint32_t seed) {
  Tensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.raw());
  if (dtype == DType::boolean) {
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng() & 1);
  } else if (dtype == DType::f32) {
    std::uniform_real_distribution<float> d(-2.f, 2.f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  } else {
    // Other types: random bytes, avoiding NaN patterns mattering (we compare bytes).
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng() | 1);
  }
  return t;
}

Shape sym_shape(std::initializer_list<Dim> dims) { return Shape(std::vector<Dim>(dims)); }

/// A model that uses every feature of the IR: every dtype, every attribute type, symbolic and
/// unknown dims, unknown rank, per-tensor and per-axis quant params, sources, kernel choices,
/// provenance, metadata, omitted inputs and nested subgraphs with their own constants.
Model rich_model() {
  Model m;
  m.stage = Stage::compiled;
  m.provenance = {{"kiln export", "0.1.0", "kiln export a.onnx -o a.kiln", "a.onnx", "0123abcd"},
                  {"kiln compile", "0.1.0", "kiln compile a.kiln -o a.c.kiln --mode \"max-autotune\"", "a.kiln", "ff"}};
  m.metadata = {{"domain", "ai.test"}, {"producer", "pytest\nv2"}};
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, sym_shape({Dim::sym("batch"), Dim::known(5)}));
  g.inputs = {x};
  ValueId b = g.add_constant("b", random_tensor(DType::f32, {5}, 1));
  ValueId s = g.add_value("s", DType::f32, sym_shape({Dim::sym("batch"), Dim::known(5)}));
  ValueId r = g.add_value("r", DType::f32, sym_shape({Dim::sym("batch"), Dim::unknown()}));
  g.value(r).quant = QuantParams{DType::u8, {0.05f}, {128}, -1};

  Node add;
  add.name = "add";
  add.op = "Add";
  add.inputs = {x, b};
  add.outputs = {s};
  add.sources = {"onnx_add", "onnx_bias"};
  add.kernel = KernelChoice{"kiln.add_f32", {{"vec", int64_t{8}}, {"threads", int64_t{2}}, {"alpha", 0.25}, {"layout", std::string("nChw16c")}}};
  g.add_node(add);
  Node relu;
  relu.name = "relu";
  relu.op = "Relu";
  relu.inputs = {s};
  relu.outputs = {r};
  g.add_node(relu);

  // One constant of every dtype, odd sizes.
  std::vector<ValueId> consts;
  uint32_t seed = 10;
#define KILN_ADD_CONST(e, v, n, T) consts.push_back(g.add_constant("c_" n, random_tensor(DType::e, {3, 7}, seed++)));
  KILN_DTYPES(KILN_ADD_CONST)
#undef KILN_ADD_CONST
  ValueId wq = g.add_constant("wq", random_tensor(DType::i8, {3, 4}, 99));
  g.value(wq).quant = QuantParams{DType::i8, {0.5f, 0.25f, 0.125f}, {0, 0, 0}, 0};
  ValueId empty = g.add_constant("empty", Tensor(DType::f32, {0, 4}));
  // A second value sharing the storage of `b`: written once, still two values.
  ValueId b_alias = g.add_constant("b_alias", g.value(b).constant);

  // A custom-domain op with every attribute type, an omitted input and an unknown-rank output.
  auto body = std::make_shared<Graph>();
  {
    ValueId outer = body->add_value("s", DType::f32, sym_shape({Dim::sym("batch"), Dim::known(5)}));
    ValueId k = body->add_constant("k", random_tensor(DType::f32, {5}, 7));
    ValueId t = body->add_value("t", DType::f32, sym_shape({Dim::sym("batch"), Dim::known(5)}));
    ValueId u = body->add_value("u", DType::f32, sym_shape({Dim::sym("batch"), Dim::known(5)}));
    Node inner_add;
    inner_add.name = "inner_add";
    inner_add.op = "Add";
    inner_add.inputs = {outer, k};
    inner_add.outputs = {t};
    body->add_node(inner_add);
    // A subgraph of the subgraph.
    auto leaf = std::make_shared<Graph>();
    ValueId lt = leaf->add_value("t", DType::f32, sym_shape({Dim::sym("batch"), Dim::known(5)}));
    ValueId lo = leaf->add_value("leaf_out", DType::f32, sym_shape({Dim::sym("batch"), Dim::known(5)}));
    Node leaf_relu;
    leaf_relu.name = "leaf_relu";
    leaf_relu.op = "Relu";
    leaf_relu.inputs = {lt};
    leaf_relu.outputs = {lo};
    leaf->add_node(leaf_relu);
    leaf->outputs = {lo};
    Node nest;
    nest.name = "nest";
    nest.domain = "test";
    nest.op = "Scope";
    nest.inputs = {t};
    nest.outputs = {u};
    nest.set_attr("leaf", leaf);
    body->add_node(nest);
    body->outputs = {u};
  }
  ValueId e = g.add_value("e", DType::f16, Shape::unknown_rank());
  ValueId e2 = g.add_value("e2", DType::i64, sym_shape({Dim::unknown()}));
  Node every;
  every.name = "every attr";  // a name that needs quoting in the text form
  every.domain = "test";
  every.op = "Everything";
  every.inputs = {r, kNoValue, consts[1], wq};
  every.outputs = {e, kNoValue, e2};
  every.set_attr("i", int64_t{-42});
  every.set_attr("f", 0.1);
  every.set_attr("f_whole", 3.0);
  every.set_attr("s", std::string("a \"quoted\" string"));
  every.set_attr("ints", std::vector<int64_t>{1, -2, 3});
  every.set_attr("floats", std::vector<double>{0.5, -1e-30});
  every.set_attr("strings", std::vector<std::string>{"p", "", "q"});
  every.set_attr("empty_ints", std::vector<int64_t>{});
  every.set_attr("empty_floats", std::vector<double>{});
  every.set_attr("empty_strings", std::vector<std::string>{});
  every.set_attr("tensor", random_tensor(DType::i32, {2, 3}, 5));
  every.set_attr("body", body);
  every.sources = {"fused_a", "fused_b", "fused_c"};
  every.kernel = KernelChoice{"kiln.everything", {}};
  g.add_node(every);
  g.outputs = {r, e, e2, empty, b_alias};
  // The body reads the outer "s" through its stand-in; the leaf reads the body's "t".
  if (!resolve_captures(g).ok()) std::abort();
  m.target = TargetRecord{"cpu", {"avx2", "fma", "avx512-vnni"}, 2};
  m.memory_plan = MemoryPlanRecord{{{3, 5}}, 4096, 64, {{s, 0, 64}, {r, 64, 128}}};
  return m;
}

void expect_tensor_eq(const Tensor& a, const Tensor& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.defined(), b.defined());
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  if (a.nbytes()) {
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  }
}

void expect_graph_eq(const Graph& a, const Graph& b);

void expect_attr_eq(const Attribute& a, const Attribute& b) {
  SCOPED_TRACE("attribute " + a.name);
  EXPECT_EQ(a.name, b.name);
  ASSERT_EQ(a.value.index(), b.value.index());
  if (const auto* t = std::get_if<Tensor>(&a.value)) expect_tensor_eq(*t, std::get<Tensor>(b.value), "tensor");
  else if (const auto* g = std::get_if<std::shared_ptr<Graph>>(&a.value)) {
    const auto& other = std::get<std::shared_ptr<Graph>>(b.value);
    ASSERT_EQ(*g == nullptr, other == nullptr);
    if (*g) expect_graph_eq(**g, *other);
  } else if (const auto* i = std::get_if<int64_t>(&a.value)) {
    EXPECT_EQ(*i, std::get<int64_t>(b.value));
  } else if (const auto* f = std::get_if<double>(&a.value)) {
    EXPECT_EQ(*f, std::get<double>(b.value));
  } else if (const auto* s = std::get_if<std::string>(&a.value)) {
    EXPECT_EQ(*s, std::get<std::string>(b.value));
  } else if (const auto* is = std::get_if<std::vector<int64_t>>(&a.value)) {
    EXPECT_EQ(*is, std::get<std::vector<int64_t>>(b.value));
  } else if (const auto* fs = std::get_if<std::vector<double>>(&a.value)) {
    EXPECT_EQ(*fs, std::get<std::vector<double>>(b.value));
  } else {
    EXPECT_EQ(std::get<std::vector<std::string>>(a.value), std::get<std::vector<std::string>>(b.value));
  }
}

void expect_graph_eq(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    const Value& va = a.values[i];
    const Value& vb = b.values[i];
    SCOPED_TRACE("value " + va.name);
    EXPECT_EQ(va.name, vb.name);
    EXPECT_EQ(va.dtype, vb.dtype);
    EXPECT_EQ(va.shape, vb.shape);
    EXPECT_EQ(va.quant, vb.quant);
    expect_tensor_eq(va.constant, vb.constant, "constant");
  }
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& na = a.nodes[i];
    const Node& nb = b.nodes[i];
    SCOPED_TRACE(na.where());
    EXPECT_EQ(na.name, nb.name);
    EXPECT_EQ(na.domain, nb.domain);
    EXPECT_EQ(na.op, nb.op);
    EXPECT_EQ(na.inputs, nb.inputs);
    EXPECT_EQ(na.outputs, nb.outputs);
    EXPECT_EQ(na.captures, nb.captures);
    EXPECT_EQ(na.sources, nb.sources);
    EXPECT_EQ(na.kernel, nb.kernel);
    ASSERT_EQ(na.attrs.size(), nb.attrs.size());
    for (size_t k = 0; k < na.attrs.size(); ++k) expect_attr_eq(na.attrs[k], nb.attrs[k]);
  }
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.outputs, b.outputs);
  EXPECT_EQ(a.captures, b.captures);
}

void expect_model_eq(const Model& a, const Model& b) {
  EXPECT_EQ(a.stage, b.stage);
  EXPECT_EQ(a.provenance, b.provenance);
  EXPECT_EQ(a.metadata, b.metadata);
  EXPECT_EQ(a.target, b.target);
  EXPECT_EQ(a.memory_plan, b.memory_plan);
  expect_graph_eq(a.graph, b.graph);
  EXPECT_EQ(model_to_text(a), model_to_text(b));
}

/// Every tensor of the graph (constants and tensor attributes, subgraphs included).
void collect_tensors(const Graph& g, std::vector<const Tensor*>& out) {
  for (const Value& v : g.values)
    if (v.is_constant()) out.push_back(&v.constant);
  for (const Node& n : g.nodes)
    for (const Attribute& a : n.attrs) {
      if (const auto* t = std::get_if<Tensor>(&a.value)) out.push_back(t);
      if (const auto* sub = std::get_if<std::shared_ptr<Graph>>(&a.value)) collect_tensors(**sub, out);
    }
}

void expect_aligned(const Model& m) {
  std::vector<const Tensor*> tensors;
  collect_tensors(m.graph, tensors);
  EXPECT_GE(tensors.size(), 17u);
  for (const Tensor* t : tensors)
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw()) % kTensorAlignment, 0u) << dtype_name(t->dtype());
}

TEST(FormatsSerialize, RichModelIsValid) {
  Status s = verify_model(rich_model());
  EXPECT_TRUE(s.ok()) << s.error().message();
}

TEST(FormatsSerialize, RoundTripThroughFile) {
  TempDir dir;
  Model m = rich_model();
  std::string path = dir.file("m.kiln");
  Status s = save_model(m, path);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto loaded = load_model(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(m, *loaded);
  expect_aligned(*loaded);
  // Tensors that shared storage in memory share it again after loading.
  const Graph& g = loaded->graph;
  EXPECT_EQ(g.value(g.find_value("b")).constant.raw(), g.value(g.find_value("b_alias")).constant.raw());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.kiln"});
}

TEST(FormatsSerialize, RoundTripThroughBytes) {
  Model m = rich_model();
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message();
  auto loaded = load_model_from_bytes(*bytes, "<stdin>");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(m, *loaded);
  expect_aligned(*loaded);
}

TEST(FormatsSerialize, LoadedConstantsAreViewsIntoTheFileBuffer) {
  auto bytes = serialize_model(rich_model());
  ASSERT_TRUE(bytes.ok());
  auto loaded = load_model_from_bytes(*bytes, "m.kiln");
  ASSERT_TRUE(loaded.ok());
  // All constants point into one allocation no larger than the file: no per-tensor copies.
  std::vector<const Tensor*> tensors;
  collect_tensors(loaded->graph, tensors);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (const Tensor* t : tensors) {
    if (!t->nbytes()) continue;
    lo = std::min(lo, reinterpret_cast<uintptr_t>(t->raw()));
    hi = std::max(hi, reinterpret_cast<uintptr_t>(t->raw()) + t->nbytes());
  }
  EXPECT_LE(hi - lo, bytes->size());
}

TEST(FormatsSerialize, SavesAreByteIdentical) {
  TempDir dir;
  Model m = rich_model();
  ASSERT_TRUE(save_model(m, dir.file("a.kiln")).ok());
  ASSERT_TRUE(save_model(m, dir.file("b.kiln")).ok());
  auto a = read_bytes(dir.file("a.kiln"));
  EXPECT_EQ(a, read_bytes(dir.file("b.kiln")));
  // The stdout form is the same file.
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(a, *bytes);
  // Loading and saving again reproduces the file.
  auto loaded = load_model(dir.file("a.kiln"));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  ASSERT_TRUE(save_model(*loaded, dir.file("c.kiln")).ok());
  EXPECT_EQ(a, read_bytes(dir.file("c.kiln")));
}

TEST(FormatsSerialize, FileLayout) {
  auto bytes = serialize_model(rich_model());
  ASSERT_TRUE(bytes.ok());
  ASSERT_GT(bytes->size(), 64u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes->data()) + 8, 4), "KILN");
  uint32_t fb_size;
  std::memcpy(&fb_size, bytes->data(), 4);
  uint64_t blob_start = (4 + fb_size + 63) / 64 * 64;
  ASSERT_LT(blob_start, bytes->size());
  for (uint64_t i = 4 + fb_size; i < blob_start; ++i) EXPECT_EQ((*bytes)[i], 0) << "padding byte " << i;
}

TEST(FormatsSerialize, EmptyModelRoundTrips) {
  Model m;
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  auto loaded = load_model_from_bytes(*bytes, "empty.kiln");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(m, *loaded);
}

TEST(FormatsSerialize, LargeTensorsRoundTrip) {
  // Tensors larger than the writer's 1 MiB buffer go straight to the file.
  TempDir dir;
  Model m;
  m.graph.add_constant("small", random_tensor(DType::u8, {3}, 1));
  m.graph.add_constant("big", random_tensor(DType::f32, {777, 1001}, 2));
  m.graph.add_constant("tail", random_tensor(DType::i16, {5}, 3));
  std::string path = dir.file("big.kiln");
  ASSERT_TRUE(save_model(m, path).ok());
  auto loaded = load_model(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(m, *loaded);
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(read_bytes(path), *bytes);
}

// Weights' pages released after packing come back from the file on the next read; memory that
// is not a mapped model file (a heap tensor, a model read from a pipe) is never touched.
TEST(FormatsSerialize, ReleasedFilePagesReadTheSame) {
  TempDir dir;
  Model m;
  m.graph.add_constant("big", random_tensor(DType::f32, {1024, 1001}, 4));
  std::string path = dir.file("pages.kiln");
  ASSERT_TRUE(save_model(m, path).ok());
  auto loaded = load_model(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  const Tensor& mapped = loaded->graph.values[0].constant;
  const Tensor& original = m.graph.values[0].constant;
  release_file_pages(mapped);
  EXPECT_EQ(std::memcmp(mapped.raw(), original.raw(), original.nbytes()), 0);
  const Tensor heap = original.clone();
  release_file_pages(heap);
  EXPECT_EQ(std::memcmp(heap.raw(), original.raw(), original.nbytes()), 0);
  release_file_pages(Tensor());
}

TEST(FormatsSerialize, HugePagesFollowTheKernelsMode) {
  EXPECT_TRUE(huge_pages_enabled("always [madvise] never"));
  EXPECT_TRUE(huge_pages_enabled("[always] madvise never"));
  EXPECT_FALSE(huge_pages_enabled("always madvise [never]"));
  EXPECT_FALSE(huge_pages_enabled(""));
}

// Every write starts on a chunk's boundary and all but the last are whole chunks, whatever the
// pieces appended; the bytes arrive as appended, in order.
TEST(FormatsAtomicFile, WritesWholeChunksAtTheirOffsets) {
  constexpr size_t kChunk = 64;
  std::vector<uint8_t> file;
  std::vector<std::pair<size_t, size_t>> writes;  // offset, size
  ChunkedWriter out(kChunk, [&](const uint8_t* p, size_t n) {
    writes.emplace_back(file.size(), n);
    file.insert(file.end(), p, p + n);
    return Status{};
  });
  std::vector<uint8_t> appended;
  uint8_t next = 0;
  for (size_t size : {1, 0, 63, 64, 65, 1000, 3, 128, 200, 64, 7}) {
    std::vector<uint8_t> piece(size);
    for (uint8_t& b : piece) b = next++;
    ASSERT_TRUE(out.append(piece.data(), piece.size()).ok());
    appended.insert(appended.end(), piece.begin(), piece.end());
    EXPECT_EQ(file.size() % kChunk, 0u);
    EXPECT_EQ(file.size(), appended.size() / kChunk * kChunk);  // only the partial chunk is held
  }
  ASSERT_TRUE(out.finish().ok());
  ASSERT_TRUE(out.finish().ok());  // nothing left: no write
  EXPECT_EQ(file, appended);
  ASSERT_GE(writes.size(), 3u);
  for (size_t i = 0; i < writes.size(); ++i) {
    EXPECT_EQ(writes[i].first % kChunk, 0u) << "write " << i;
    EXPECT_GT(writes[i].second, 0u) << "write " << i;
    if (i + 1 < writes.size()) {
      EXPECT_EQ(writes[i].second % kChunk, 0u) << "write " << i;
    }
  }
  EXPECT_NE(writes.back().second % kChunk, 0u);  // 1595 bytes: the last chunk is partial
  // A write that fails is reported.
  ChunkedWriter failing(kChunk, [](const uint8_t*, size_t) { return internal_error("", "disk full"); });
  const std::vector<uint8_t> big(3 * kChunk);
  EXPECT_FALSE(failing.append(big.data(), big.size()).ok());
}

// A compiled model's packed int8 weight moves out of the mapped file onto memory that asks for
// huge pages, the same bytes in the same layout; a packed f32 weight, a convolution's, a plain
// tensor and a model under 2 MiB of such weights stay where they are, and so does everything
// when the kernel's huge pages are off.
TEST(FormatsSerialize, LowPrecisionWeightsMoveOntoHugePages) {
  TempDir dir;
  const PackedLayout layout{{2048, 1536}, {2048, 1536}, {1, 2048}, {}, {}, "test"};  // column-major
  auto packed = [&](DType t, uint32_t seed) {
    const Tensor plain = random_tensor(t, {2048, 1536}, seed);
    return pack(plain, layout);
  };
  Model m;
  const ValueId linear = m.graph.add_constant("linear", packed(DType::i8, 1));
  const ValueId conv = m.graph.add_constant("conv", packed(DType::i8, 2));
  const ValueId wide = m.graph.add_constant("wide", packed(DType::f32, 3));
  const ValueId plain = m.graph.add_constant("plain", random_tensor(DType::i8, {2048, 1536}, 4));
  const ValueId x = m.graph.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{1, 1, 8, 8}));
  m.graph.inputs.push_back(x);
  Node node;
  node.name = node.op = "Conv";
  node.inputs = {x, conv};
  node.outputs = {m.graph.add_value("y", DType::f32)};
  m.graph.add_node(std::move(node));
  const std::string path = dir.file("weights.kiln");
  ASSERT_TRUE(save_model(m, path).ok());
  auto loaded = load_model(path, LoadOptions{.verify = false});
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  EXPECT_EQ(weights_on_huge_pages(loaded->graph, "always madvise [never]").graph, nullptr);
  const auto quick = [](uint8_t*) { return 0.0; };  // the pages came quickly (see below for slow ones)
  const HugePageWeights placed = weights_on_huge_pages(loaded->graph, "always [madvise] never", quick);
  ASSERT_NE(placed.graph, nullptr);
  EXPECT_EQ(placed.moved_bytes, 2048u * 1536);
  EXPECT_EQ(placed.eligible_bytes, 2048u * 1536);
  const Graph& g = *placed.graph;
  const Tensor& moved = g.values[linear].constant;
  EXPECT_NE(moved.raw(), loaded->graph.values[linear].constant.raw());
  ASSERT_TRUE(moved.is_packed());
  EXPECT_TRUE(moved.layout()->same_placement(layout));
  EXPECT_EQ(moved.shape(), (std::vector<int64_t>{2048, 1536}));
  EXPECT_EQ(std::memcmp(moved.raw(), m.graph.values[linear].constant.raw(), moved.nbytes()), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(moved.raw()) % (2 << 20), 0u);
  if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {  // a kernel with huge pages marks the region
    EXPECT_NE(vm_flags(moved.raw()).find(" hg"), std::string::npos) << vm_flags(moved.raw());
  }
  for (ValueId stays : {conv, wide, plain}) EXPECT_EQ(g.values[stays].constant.raw(), loaded->graph.values[stays].constant.raw());
  // Less than 2 MiB to move: nothing is.
  Model small;
  const PackedLayout square{{1000, 1000}, {1000, 1000}, {1, 1000}, {}, {}, "test"};
  small.graph.add_constant("linear", pack(random_tensor(DType::i8, {1000, 1000}, 5), square));
  ASSERT_TRUE(save_model(small, dir.file("small.kiln")).ok());
  auto small_loaded = load_model(dir.file("small.kiln"));
  ASSERT_TRUE(small_loaded.ok());
  EXPECT_EQ(weights_on_huge_pages(small_loaded->graph, "[always] madvise never", quick).graph, nullptr);
}

// The weights move in order while the machine gives huge pages quickly: once slow pages have
// cost kSlowHugePagesBudgetMs, the rest stay in the mapped file; a slow page now and then
// does not stop it, and a slow first page moves nothing.
TEST(FormatsSerialize, HugePagesStopWhereTheyComeSlowly) {
  TempDir dir;
  const PackedLayout layout{{2048, 1536}, {2048, 1536}, {1, 2048}, {}, {}, "test"};
  Model m;
  std::vector<ValueId> weights;
  for (uint32_t seed = 1; seed <= 3; ++seed)  // 3 MiB each: 9 MiB in five 2 MiB pages
    weights.push_back(m.graph.add_constant("w" + std::to_string(seed), pack(random_tensor(DType::i8, {2048, 1536}, seed), layout)));
  ASSERT_TRUE(save_model(m, dir.file("w.kiln")).ok());
  auto loaded = load_model(dir.file("w.kiln"), LoadOptions{.verify = false});
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  const size_t each = 2048 * 1536;
  // Page k (in 2 MiB steps from the region's start) faults in in times[k] ms.
  auto place = [&](std::vector<double> times, size_t& calls) {
    calls = 0;
    uint8_t* first = nullptr;
    return weights_on_huge_pages(loaded->graph, "always [madvise] never", [&, times](uint8_t* page) {
      if (!first) first = page;
      EXPECT_EQ(page, first + calls * (2 << 20));
      return times.at(calls++);
    });
  };
  auto moved = [&](const HugePageWeights& p, ValueId v) { return p.graph->values[v].constant.raw() != loaded->graph.values[v].constant.raw(); };
  size_t calls = 0;
  // Quick pages: all three move.
  HugePageWeights all = place({0.3, 0.3, 0.3, 0.3, 0.3}, calls);
  EXPECT_EQ(calls, 5u);
  ASSERT_NE(all.graph, nullptr);
  EXPECT_EQ(all.moved_bytes, 3 * each);
  EXPECT_EQ(all.eligible_bytes, 3 * each);
  for (ValueId w : weights) EXPECT_TRUE(moved(all, w));
  // One slow page within the budget: the same.
  all = place({0.3, kSlowHugePagesBudgetMs / 2, 0.3, 0.3, 0.3}, calls);
  EXPECT_EQ(all.moved_bytes, 3 * each);
  // Slow from the second page on: the budget is spent there, and only the first weight, which
  // lies in the first two pages, moves; the others stay where the file is mapped.
  const HugePageWeights some = place({0.3, kSlowHugePagesBudgetMs, 20, 20, 20}, calls);
  EXPECT_EQ(calls, 2u);
  ASSERT_NE(some.graph, nullptr);
  EXPECT_EQ(some.moved_bytes, each);
  EXPECT_EQ(some.eligible_bytes, 3 * each);
  EXPECT_TRUE(moved(some, weights[0]));
  EXPECT_FALSE(moved(some, weights[1]));
  EXPECT_FALSE(moved(some, weights[2]));
  EXPECT_EQ(std::memcmp(some.graph->values[weights[0]].constant.raw(), m.graph.values[weights[0]].constant.raw(), each), 0);
  EXPECT_EQ(std::memcmp(some.graph->values[weights[1]].constant.raw(), m.graph.values[weights[1]].constant.raw(), each), 0);
  // A slow first page: nothing moves.
  const HugePageWeights none = place({2 * kSlowHugePagesBudgetMs, 0.3, 0.3, 0.3, 0.3}, calls);
  EXPECT_EQ(calls, 1u);
  EXPECT_EQ(none.graph, nullptr);
  EXPECT_EQ(none.moved_bytes, 0u);
  EXPECT_EQ(none.eligible_bytes, 3 * each);
}

// Storage for a weight packed while planning: on huge pages from 2 MiB on where the kernel
// offers them, 2 MiB-aligned and zero-filled, its whole pages faulted in first and the part
// past them on ordinary pages; under 2 MiB, with huge pages off or the slow-page budget spent,
// an ordinary tensor. Where the pages come slowly, those after the budget ran out are ordinary.
TEST(FormatsHugePages, PackedWeightStorageAsksForHugePages) {
  const bool marked = std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled");  // smaps shows hg / nh
  constexpr size_t kMiB = size_t{1} << 20;
  std::vector<uint8_t*> pages;
  std::vector<double> times;
  const HugePageFault fault = [&](uint8_t* page) {
    pages.push_back(page);
    return pages.size() <= times.size() ? times[pages.size() - 1] : 0.1;
  };
  auto zeros = [](const Tensor& t) {
    const auto* b = static_cast<const uint8_t*>(t.raw());
    return std::all_of(b, b + t.nbytes(), [](uint8_t v) { return v == 0; });
  };
  double budget = kSlowHugePagesBudgetMs;
  // Huge pages off, or less than one: an ordinary tensor, nothing faulted.
  for (auto [mode, floats] : {std::pair{"always madvise [never]", int64_t{5} << 18}, std::pair{"always [madvise] never", int64_t{1} << 18}}) {
    const Tensor t = huge_page_tensor(DType::f32, {floats}, mode, fault, budget);
    EXPECT_EQ(t.numel(), floats);
    EXPECT_TRUE(zeros(t));
    if (marked) {
      EXPECT_EQ(vm_flags(t.raw()).find(" hg"), std::string::npos) << vm_flags(t.raw());
    }
  }
  EXPECT_TRUE(pages.empty());
  // 5 MiB: two huge pages faulted in, the last MiB on ordinary pages; the charge goes with it.
  const size_t in_use = memory_in_use();
  {
    Tensor t = huge_page_tensor(DType::f32, {5, int64_t{1} << 18}, "always [madvise] never", fault, budget);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{5, 1 << 18}));
    auto* const data = static_cast<uint8_t*>(t.raw());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % kHugePageBytes, 0u);
    EXPECT_EQ(pages, (std::vector<uint8_t*>{data, data + kHugePageBytes}));
    EXPECT_TRUE(zeros(t));
    EXPECT_GE(memory_in_use(), in_use + 5 * kMiB);
    std::memset(data, 7, t.nbytes());
    if (marked) {
      EXPECT_NE(vm_flags(data).find(" hg"), std::string::npos) << vm_flags(data);
      EXPECT_EQ(vm_flags(data + 4 * kMiB).find(" hg"), std::string::npos) << vm_flags(data + 4 * kMiB);
    }
  }
  EXPECT_EQ(memory_in_use(), in_use);
  EXPECT_EQ(budget, kSlowHugePagesBudgetMs);
  // Pages slow from the second on: the budget is spent there and the rest are ordinary pages;
  // the next weight gets an ordinary tensor.
  pages.clear();
  times = {0.3, kSlowHugePagesBudgetMs, 20, 20};
  const Tensor slow = huge_page_tensor(DType::u16, {int64_t{4} << 20}, "[always] madvise never", fault, budget);
  EXPECT_EQ(pages.size(), 2u);
  EXPECT_LE(budget, 0);
  EXPECT_TRUE(zeros(slow));
  if (marked) {
    const auto* const data = static_cast<const uint8_t*>(slow.raw());
    EXPECT_NE(vm_flags(data).find(" hg"), std::string::npos) << vm_flags(data);
    EXPECT_NE(vm_flags(data + 4 * kMiB).find(" nh"), std::string::npos) << vm_flags(data + 4 * kMiB);
  }
  pages.clear();
  const Tensor after = huge_page_tensor(DType::u16, {int64_t{4} << 20}, "[always] madvise never", fault, budget);
  EXPECT_TRUE(pages.empty());
  EXPECT_TRUE(zeros(after));
}

// page_use counts a mapping's resident and 2 MiB pages where it lies in the ranges, in
// proportion where it lies partly in them, and nothing for lines it cannot read.
TEST(FormatsHugePages, PageUseReadsSmaps) {
  const std::string smaps =
      "00400000-00800000 r--p 00000000 fe:01 42    /models/a b.kiln\n"  // 4 MiB, inside
      "Size:               4096 kB\n"
      "Rss:                3072 kB\n"
      "AnonHugePages:         0 kB\n"
      "FilePmdMapped:      2048 kB\n"
      "THPeligible:    1\n"
      "Rss: 12 MB\n"
      "Rss:                 -4 kB\n"
      "Rss:                  4 kB extra\n"
      "VmFlags: rd mr mw me\n"
      "00800000-00c00000 rw-p 00000000 00:00 0 \n"  // 4 MiB, half inside
      "Rss:                4096 kB\n"
      "AnonHugePages:      4096 kB\n"
      "01000000-01200000 rw-p 00000000 00:00 0 \n"  // outside
      "Rss:                2048 kB\n"
      "AnonHugePages:      2048 kB\n"
      "zzzz-01200000 rw-p 00000000 00:00 0\n"
      "Rss:                1024 kB\n"
      "01300000-01200000 rw-p 00000000 00:00 0\n"  // ends before it starts
      "Rss:                1024 kB\n"
      "01400000-01600000 rw-p 00000000 00:00 0 [heap]\n"
      "ShmemPmdMapped:     2048 kB\n"
      "Rss:                2048 kB";  // no newline at the end
  const AddressRanges ranges{{0x400000, 0xa00000}, {0x1400000, 0x1600000}};
  const PageUse use = page_use(smaps, ranges);
  constexpr uint64_t kKiB = 1024;
  EXPECT_EQ(use.resident_bytes, (3072 + 2048 + 2048) * kKiB);
  EXPECT_EQ(use.huge_page_bytes, (2048 + 2048 + 2048) * kKiB);
  EXPECT_EQ(page_use(smaps, {}).resident_bytes, 0u);
  EXPECT_EQ(page_use("", ranges).resident_bytes, 0u);
  EXPECT_EQ(page_use("Rss: 4 kB\n00400000-00800000\nRss: 4 kB\n-\n:", ranges).resident_bytes, 0u);
}

// The HugePages regions are listed while they are mapped, at their size; this process's smaps
// then counts what was touched of them as resident. Whole 2 MiB pages: the region's mapping
// merges with no ordinary one, whose untouched pages would thin its share.
TEST(FormatsHugePages, RegionsListedWhileMapped) {
  constexpr size_t kMiB = size_t{1} << 20;
  auto listed = [](const uint8_t* data) -> size_t {
    for (const auto& [first, last] : huge_page_regions())
      if (first == reinterpret_cast<uintptr_t>(data)) return last - first;
    return 0;
  };
  std::shared_ptr<HugePages> region = HugePages::map(4 * kMiB);
  ASSERT_NE(region, nullptr);
  uint8_t* const data = region->data();
  EXPECT_EQ(listed(data), 4 * kMiB);
  std::memset(data, 1, 4 * kMiB);
  if (const std::string smaps = self_smaps(); !smaps.empty()) {
    const PageUse use = page_use(smaps, huge_page_regions());
    EXPECT_GE(use.resident_bytes, 4 * kMiB);
    EXPECT_LE(use.huge_page_bytes, use.resident_bytes);
  }
  region->shrink(kMiB);
  EXPECT_EQ(listed(data), 2 * kMiB);
  region.reset();
  EXPECT_EQ(listed(data), 0u);
}

TEST(FormatsSerialize, LoadFromAPipe) {
  TempDir dir;
  std::string fifo = dir.file("pipe.kiln");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Model m = rich_model();
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary).write(reinterpret_cast<const char*>(bytes->data()),
                                                                      static_cast<std::streamsize>(bytes->size())); });
  auto loaded = load_model(fifo);
  writer.join();
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(m, *loaded);
  expect_aligned(*loaded);
}

// A model from a pipe is held once while it is read: its bytes in 2 MiB pieces, each released as
// it is copied into the model's buffer (gathered whole first and then copied, the peak was twice
// the model). The pieces are charged to the memory budget.
TEST(FormatsSerialize, LoadFromAPipeHoldsTheModelOnce) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.kiln");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Model m;
  const ValueId w = m.graph.add_constant("w", random_tensor(DType::f32, {3 << 20, 4}, 11));  // 48 MiB
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  const size_t size = bytes->size();
  const size_t in_use = memory_in_use();
  reset_memory_peak();
  const bool rss_known = reset_peak_rss();
  const size_t rss_before_kb = proc_status_kb("VmRSS:");
  std::thread writer([&] {
    std::ofstream(fifo, std::ios::binary).write(reinterpret_cast<const char*>(bytes->data()),
                                                static_cast<std::streamsize>(size));
  });
  auto loaded = load_model(fifo);
  writer.join();
  const size_t peak_rss_kb = proc_status_kb("VmHWM:");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  const Tensor& weight = loaded->graph.values[w].constant;
  EXPECT_EQ(std::memcmp(weight.raw(), m.graph.values[w].constant.raw(), weight.nbytes()), 0);
  EXPECT_GE(memory_peak() - in_use, size);
  EXPECT_LE(memory_peak() - in_use, size + (size_t{2} << 20) + (size_t{4} << 20));
  if (rss_known && peak_rss_kb > rss_before_kb) {
    EXPECT_LT((peak_rss_kb - rss_before_kb) * 1024, size + size / 4) << "peak RSS grew past the model";
  }
}

// A descriptor is read from where it stands: a regular file from its start is mapped, as
// load_model maps it; from further on, what follows is read.
TEST(FormatsSerialize, LoadFromADescriptor) {
  TempDir dir;
  Model m = rich_model();
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  const std::string path = dir.file("m.kiln");
  {
    std::ofstream out(path, std::ios::binary);
    out << "junk";
    out.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
  }
  auto mapped = [](const Model& model) {
    for (const Value& v : model.graph.values) {
      if (!v.constant.defined() || v.constant.nbytes() == 0) continue;
      const auto at = reinterpret_cast<uintptr_t>(v.constant.raw());
      for (const auto& [first, last] : mapped_model_files())
        if (first <= at && at < last) return true;
    }
    return false;
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::lseek(fd, 4, SEEK_SET), 4);
  std::string sha;
  auto after_junk = load_model_from_fd(fd, "<stdin>", LoadOptions{.sha256 = &sha});
  ::close(fd);
  ASSERT_TRUE(after_junk.ok()) << after_junk.error().message();
  expect_model_eq(m, *after_junk);
  expect_aligned(*after_junk);
  EXPECT_FALSE(mapped(*after_junk));
  EXPECT_EQ(sha, sha256_hex(*bytes));

  ASSERT_TRUE(save_model(m, path).ok());
  const int whole = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(whole, 0);
  auto from_start = load_model_from_fd(whole, "<stdin>");
  ::close(whole);
  ASSERT_TRUE(from_start.ok()) << from_start.error().message();
  expect_model_eq(m, *from_start);
  EXPECT_TRUE(mapped(*from_start));

  const int bad = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(bad, 0);
  ASSERT_EQ(::lseek(bad, 1, SEEK_SET), 1);
  auto shifted = load_model_from_fd(bad, "<stdin>");
  ::close(bad);
  ASSERT_FALSE(shifted.ok());
  EXPECT_EQ(shifted.error().file, "<stdin>");
}

// A model read from a pipe or from bytes in memory (stdin) lies, from 2 MiB on, in a HugePages
// region where the machine gives huge pages quickly, its weights read there as they were
// written; a small one on the heap.
TEST(FormatsSerialize, ModelReadIntoMemoryIsOnHugePages) {
  Model m;
  const ValueId w = m.graph.add_constant("w", random_tensor(DType::f32, {1024, 768}, 7));  // 3 MiB
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  const bool quick = huge_pages_enabled(transparent_huge_pages()) && huge_pages_quick_so_far();
  auto in_region = [](const Tensor& t) {
    const auto at = reinterpret_cast<uintptr_t>(t.raw());
    for (const auto& [first, last] : huge_page_regions()) {
      if (first <= at && at + t.nbytes() <= last) return true;
    }
    return false;
  };
  auto loaded = load_model_from_bytes(*bytes, "<stdin>");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  const Tensor& weight = loaded->graph.values[w].constant;
  EXPECT_EQ(std::memcmp(weight.raw(), m.graph.values[w].constant.raw(), weight.nbytes()), 0);
  EXPECT_EQ(in_region(weight), quick);
  if (quick) {
    EXPECT_NE(vm_flags(weight.raw()).find(" hg"), std::string::npos) << vm_flags(weight.raw());
  }
  auto small = load_model_from_bytes(*serialize_model(rich_model()), "<stdin>");
  ASSERT_TRUE(small.ok()) << small.error().message();
  for (const Value& v : small->graph.values) {
    if (v.constant.defined() && v.constant.nbytes() > 0) {
      EXPECT_FALSE(in_region(v.constant)) << v.name;
    }
  }
}

TEST(FormatsSerialize, SidecarAboveThreshold) {
  TempDir dir;
  Model m = rich_model();
  std::string path = dir.file("m.kiln");
  ASSERT_TRUE(save_model(m, path, SaveOptions{.sidecar_threshold = 64}).ok());
  std::vector<std::string> entries = dir.entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0], "m.kiln");
  const std::string side_name = entries[1];
  EXPECT_TRUE(side_name.starts_with("m.kiln.") && side_name.ends_with(".weights") && side_name.size() == 6 + 1 + 16 + 8)
      << side_name;
  auto inline_bytes = serialize_model(m);
  ASSERT_TRUE(inline_bytes.ok());
  auto model_bytes = read_bytes(path);
  auto side_bytes = read_bytes(dir.file(side_name));
  EXPECT_LT(model_bytes.size(), inline_bytes->size());
  EXPECT_GT(side_bytes.size(), 64u);
  // The model file records the sidecar by its file name only.
  std::string as_text(model_bytes.begin(), model_bytes.end());
  EXPECT_NE(as_text.find(side_name), std::string::npos);
  EXPECT_EQ(as_text.find(dir.file("")), std::string::npos);

  auto loaded = load_model(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(m, *loaded);
  expect_aligned(*loaded);

  // Saving again is byte-identical, for both files.
  ASSERT_TRUE(save_model(m, dir.file("n.kiln"), SaveOptions{.sidecar_threshold = 64}).ok());
  EXPECT_EQ(side_bytes, read_bytes(dir.file("n" + side_name.substr(1))));
  auto n_bytes = read_bytes(dir.file("n.kiln"));
  EXPECT_EQ(model_bytes.size(), n_bytes.size());
}

TEST(FormatsSerialize, SidecarIsFoundRelativeToTheModelFile) {
  TempDir dir;
  Model m = rich_model();
  std::string path = dir.file("m.kiln");
  ASSERT_TRUE(save_model(m, path, SaveOptions{.sidecar_threshold = 1}).ok());
  // From bytes (stdin), the sidecar is looked up in the directory given.
  auto bytes = read_bytes(path);
  auto loaded = load_model_from_bytes(bytes, "<stdin>", {}, fs::path(path).parent_path().string());
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(m, *loaded);
}

TEST(FormatsSerialize, NoSidecarAtOrBelowThreshold) {
  TempDir dir;
  Model m = rich_model();
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  // The blob is smaller than the whole file, so a threshold of the file size keeps it inline.
  ASSERT_TRUE(save_model(m, dir.file("m.kiln"), SaveOptions{.sidecar_threshold = bytes->size()}).ok());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.kiln"});
  EXPECT_EQ(read_bytes(dir.file("m.kiln")), *bytes);
}

TEST(FormatsSerialize, SaveReplacesAnExistingFile) {
  TempDir dir;
  std::string path = dir.file("m.kiln");
  std::ofstream(path) << "old contents";
  ASSERT_TRUE(save_model(rich_model(), path).ok());
  auto loaded = load_model(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.kiln"});
}

TEST(FormatsSerialize, FailedSaveLeavesNoTempFileAndKeepsTheTarget) {
  TempDir dir;
  // The target is a non-empty directory: the final rename fails after the data was written.
  std::string path = dir.file("m.kiln");
  fs::create_directories(path + "/keep");
  Status s = save_model(rich_model(), path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::user);
  EXPECT_EQ(s.error().file, path);
  EXPECT_NE(s.error().message().find("cannot replace"), std::string::npos) << s.error().message();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.kiln"});
  EXPECT_TRUE(fs::is_directory(path + "/keep"));
}

TEST(FormatsSerialize, FailedSidecarSaveDoesNotClobberTheModel) {
  TempDir dir;
  // The sidecar's name is the model's plus a hash of the weights: learn the hash from a probe.
  ASSERT_TRUE(save_model(rich_model(), dir.file("p.kiln"), SaveOptions{.sidecar_threshold = 1}).ok());
  std::string side_name = "m" + dir.entries().at(1).substr(1);
  fs::remove(dir.file("p.kiln"));
  fs::remove(dir.file("p" + side_name.substr(1)));
  std::string path = dir.file("m.kiln");
  std::ofstream(path) << "old contents";
  // The sidecar's place is taken by a non-empty directory, so renaming the sidecar fails.
  fs::create_directories(dir.file(side_name) + "/keep");
  Status s = save_model(rich_model(), path, SaveOptions{.sidecar_threshold = 1});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::user);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"m.kiln", side_name}));
  auto kept = read_bytes(path);
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "old contents");
}

// Replacing a model writes its new sidecar under a new name and removes the old one only after
// the model itself was renamed: an interrupted save leaves a consistent old pair.
TEST(FormatsSerialize, ReplacingAModelSwitchesSidecarsAtTheModelRename) {
  TempDir dir;
  std::string path = dir.file("m.kiln");
  Model a = rich_model(), b = rich_model();
  Tensor w = b.graph.values[b.graph.find_value("b")].constant.clone();
  w.data<float>()[0] += 1;
  b.graph.values[b.graph.find_value("b")].constant = w;
  ASSERT_TRUE(save_model(a, path, SaveOptions{.sidecar_threshold = 1}).ok());
  std::string side_a = dir.entries().at(1);
  ASSERT_TRUE(save_model(b, path, SaveOptions{.sidecar_threshold = 1}).ok());
  std::vector<std::string> entries = dir.entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_NE(entries[1], side_a);
  auto loaded = load_model(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(b, *loaded);
  // Saving inline removes the sidecar the previous version used.
  ASSERT_TRUE(save_model(a, path).ok());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.kiln"});
}

/// The pid of a process that has exited (and been reaped).
pid_t dead_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  EXPECT_GT(pid, 0);
  waitpid(pid, nullptr, 0);
  return pid;
}

TEST(FormatsSerialize, TemporariesOfKilledWritersAreRemovedByTheNextWrite) {
  TempDir dir;
  std::string d = std::to_string(dead_pid()), self = std::to_string(getpid()), parent = std::to_string(getppid());
  for (const std::string& name : {".m.kiln.tmp." + d + ".0", ".m.kiln.0123456789abcdef.weights.tmp." + d + ".3",
                                  ".m.kiln.tmp." + self + ".7", ".m.kiln.tmp." + parent + ".2",
                                  ".other.kiln.tmp." + d + ".1", ".m.kiln.tmp." + d + ".notes"})
    std::ofstream(dir.file(name)) << "partial";
  ASSERT_TRUE(save_model(rich_model(), dir.file("m.kiln")).ok());
  // Kept: live writers (this process, its parent), another output's temporary, a name that is
  // not a temporary's.
  std::vector<std::string> kept = {".m.kiln.tmp." + self + ".7", ".m.kiln.tmp." + parent + ".2",
                                   ".other.kiln.tmp." + d + ".1", ".m.kiln.tmp." + d + ".notes", "m.kiln"};
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(dir.entries(), kept);
}

// A writer whose pid means nothing here (another pid namespace sharing the folder) still holds
// the lock it takes on its temporary: that temporary is kept until the lock goes.
TEST(FormatsSerialize, LockedTemporaryOfADeadPidIsKept) {
  TempDir dir;
  std::string temp = dir.file(".m.npy.tmp." + std::to_string(dead_pid()) + ".0");
  std::ofstream(temp) << "partial";
  int fd = ::open(temp.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  remove_stale_temporaries(dir.file("m.npy"));
  EXPECT_TRUE(fs::exists(temp));
  ::close(fd);
  remove_stale_temporaries(dir.file("m.npy"));
  EXPECT_FALSE(fs::exists(temp));
}

// The sidecar's name is `<model>.<16 hex>.weights`, the hex digits the start of the SHA-256 of
// the concatenated hex SHA-256 digests of the sidecar's 1 MiB pieces: a function of its bytes
// alone that anyone can recompute. The pieces here cut through tensors and padding.
TEST(FormatsSerialize, SidecarIsNamedAfterTheHashOfItsBytes) {
  TempDir dir;
  Model m = rich_model();
  m.graph.add_constant("big", random_tensor(DType::f32, {393219}, 41));  // 1.5 MiB + 12 bytes
  m.graph.add_constant("mid", random_tensor(DType::u8, {1000}, 42));
  m.graph.add_constant("huge", random_tensor(DType::i16, {1048579}, 43));  // 2 MiB + 6 bytes
  ASSERT_TRUE(save_model(m, dir.file("m.kiln"), SaveOptions{.sidecar_threshold = 0}).ok());
  std::vector<std::string> entries = dir.entries();
  ASSERT_EQ(entries.size(), 2u);
  const std::string side = entries[1];
  auto bytes = read_bytes(dir.file(side));
  ASSERT_GT(bytes.size(), size_t{3} << 20);
  std::string digests;
  for (size_t at = 0; at < bytes.size(); at += size_t{1} << 20)
    digests += sha256_hex({bytes.data() + at, std::min(bytes.size() - at, size_t{1} << 20)});
  std::string hash = sha256_hex({reinterpret_cast<const uint8_t*>(digests.data()), digests.size()});
  EXPECT_EQ(side, "m.kiln." + hash.substr(0, 16) + ".weights");
  auto loaded = load_model(dir.file("m.kiln"));
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  expect_model_eq(m, *loaded);

  // The same weights give the same name (another model file gives its own prefix); one
  // changed byte gives another.
  ASSERT_TRUE(save_model(m, dir.file("n.kiln"), SaveOptions{.sidecar_threshold = 0}).ok());
  EXPECT_TRUE(fs::exists(dir.file("n.kiln." + hash.substr(0, 16) + ".weights")));
  Tensor t = m.graph.value(m.graph.find_value("huge")).constant.clone();
  t.data<int16_t>()[1048578] ^= 1;
  m.graph.value(m.graph.find_value("huge")).constant = t;
  ASSERT_TRUE(save_model(m, dir.file("m.kiln"), SaveOptions{.sidecar_threshold = 0}).ok());
  entries = dir.entries();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_NE(entries[1], side);
  EXPECT_TRUE(entries[1].starts_with("m.kiln.")) << entries[1];
}

// Sidecars no model refers to any more (a writer killed between its two renames, or the
// `<model>.weights` of older kiln versions) go with the next save of that model; other models'
// sidecars and other files stay.
TEST(FormatsSerialize, OrphanSidecarsAreRemovedByTheNextSave) {
  TempDir dir;
  for (std::string name : {"m.kiln.0123456789abcdef.weights", "m.kiln.weights", "o.kiln.0123456789abcdef.weights",
                                  "m.kiln.notes.weights", "m.kiln.0123456789ABCDEF.weights"})
    std::ofstream(dir.file(name)) << "orphan";
  ASSERT_TRUE(save_model(rich_model(), dir.file("m.kiln"), SaveOptions{.sidecar_threshold = 1}).ok());
  std::vector<std::string> entries = dir.entries();
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[0], "m.kiln");
  EXPECT_EQ(entries[1], "m.kiln.0123456789ABCDEF.weights");
  EXPECT_TRUE(entries[2].size() == 31 && entries[2].starts_with("m.kiln.") && entries[2] != "m.kiln.0123456789abcdef.weights")
      << entries[2];
  EXPECT_EQ(entries[3], "m.kiln.notes.weights");
  EXPECT_EQ(entries[4], "o.kiln.0123456789abcdef.weights");
}

// A save whose model rename fails leaves neither its temporaries nor its new sidecar.
TEST(FormatsSerialize, FailedModelRenameLeavesNoSidecar) {
  TempDir dir;
  std::string path = dir.file("m.kiln");
  fs::create_directories(path + "/keep");
  Status s = save_model(rich_model(), path, SaveOptions{.sidecar_threshold = 1});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("cannot replace"), std::string::npos) << s.error().message();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.kiln"});
}

// Processes saving two versions of one model at once: the folder lock keeps each save's
// switch (sidecar rename, model rename, removal of the other sidecars) whole, so whichever
// save is last, the model in place finds its sidecar and no orphan is left.
TEST(FormatsSerialize, ConcurrentSavesOfOneModelLeaveAConsistentPair) {
  TempDir dir;
  std::string path = dir.file("m.kiln");
  Model versions[2] = {rich_model(), rich_model()};
  Tensor w = versions[1].graph.value(versions[1].graph.find_value("b")).constant.clone();
  w.data<float>()[0] += 1;
  versions[1].graph.value(versions[1].graph.find_value("b")).constant = w;
  std::vector<pid_t> children;
  for (int c = 0; c < 4; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      bool ok = true;
      for (int i = 0; i < 10; ++i) ok = ok && save_model(versions[(c + i) % 2], path, SaveOptions{.sidecar_threshold = 1}).ok();
      _exit(ok ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto loaded = load_model(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  std::vector<std::string> entries = dir.entries();
  ASSERT_EQ(entries.size(), 2u) << ::testing::PrintToString(entries);
  EXPECT_EQ(entries[0], "m.kiln");
}

TEST(FormatsSerialize, SaveIntoMissingDirectoryFails) {
  TempDir dir;
  std::string path = dir.file("no/such/dir/m.kiln");
  Status s = save_model(rich_model(), path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::user);
  EXPECT_EQ(s.error().file, path);
  EXPECT_NE(s.error().message().find("No such file or directory"), std::string::npos) << s.error().message();
  EXPECT_TRUE(dir.entries().empty());
}

TEST(FormatsSerialize, LoadMissingFileNamesIt) {
  auto r = load_model("/nonexistent/dir/m.kiln");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_EQ(r.error().message(), "/nonexistent/dir/m.kiln: cannot open file: No such file or directory");
}

TEST(FormatsSerialize, LoadWithoutVerifyShowsAnInconsistentGraph) {
  Model m;
  ValueId x = m.graph.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{2}));
  m.graph.inputs = {x};
  m.graph.outputs = {7};  // out of range
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok());
  EXPECT_FALSE(load_model_from_bytes(*bytes, "m.kiln").ok());
  auto r = load_model_from_bytes(*bytes, "m.kiln", LoadOptions{.verify = false});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_NE(model_to_text(*r).find("output %7?"), std::string::npos) << model_to_text(*r);
}

TEST(FormatsText, IsDeterministicAndReadable) {
  Model m = rich_model();
  std::string text = model_to_text(m);
  EXPECT_EQ(text, model_to_text(rich_model()));
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing line: " << line << "\nin:\n" << text;
  };
  has("model stage=compiled\n");
  has("provenance tool=\"kiln export\" version=\"0.1.0\" input=\"a.onnx\" sha256=\"0123abcd\" "
      "command=\"kiln export a.onnx -o a.kiln\"\n");
  has("command=\"kiln compile a.kiln -o a.c.kiln --mode \\\"max-autotune\\\"\"\n");
  has("metadata \"producer\" = \"pytest\\nv2\"\n");
  has("graph\n  input x: f32[batch,5]\n");
  has("\n  value r: f32[batch,?] quant=u8 scales=[0.05] zero_points=[128]\n");
  has("\n  const wq: i8[3,4] crc32=");
  has(" quant=i8 scales=[0.5, 0.25, 0.125] zero_points=[0, 0, 0] axis=0\n");
  has("\n  const empty: f32[0,4] crc32=00000000 data=[]\n");
  has("\n  value e: f16[*]\n");
  has("\n  node add: Add(x, b) -> (s) sources=[\"onnx_add\", \"onnx_bias\"] kernel=kiln.add_f32{vec=8, threads=2, "
      "alpha=0.25, layout=\"nChw16c\"}\n");
  has("\ntarget device=\"cpu\" isa=[\"avx2\", \"fma\", \"avx512-vnni\"] threads=2\n");
  has("\nmemory_plan inputs=[3x5] arena=4096 workspace=64 values=2\n");
  has("\n  node \"every attr\": test::Everything(r, _, c_f16, wq) -> (e, _, e2) body=<graph> empty_floats=floats[] "
      "empty_ints=ints[] empty_strings=strings[] f=0.1 f_whole=3.0 floats=floats[0.5, -1e-30] i=-42 "
      "ints=ints[1, -2, 3] s=\"a \\\"quoted\\\" string\" strings=strings[\"p\", \"\", \"q\"] tensor=tensor(i32[2,3] "
      "crc32=");
  has(" captures=[s] sources=[\"fused_a\", \"fused_b\", \"fused_c\"] kernel=kiln.everything{}\n");
  has("\n    attr body:\n      graph\n        capture s: f32[batch,5]\n");
  has("\n        node nest: test::Scope(t) -> (u) leaf=<graph> captures=[t]\n");
  has("\n              capture t: f32[batch,5]\n");
  has("\n        node inner_add: Add(s, k) -> (t)\n");
  has("\n          attr leaf:\n            graph\n");
  has("\n              node leaf_relu: Relu(t) -> (leaf_out)\n              output leaf_out\n");
  has("\n  output r\n  output e\n  output e2\n  output empty\n  output b_alias\n");
  // One line per value, node and graph output at the top level.
  size_t top_level = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("  ", 0) == 0 && line.rfind("   ", 0) != 0) ++top_level;
  EXPECT_EQ(top_level, m.graph.values.size() + m.graph.nodes.size() + m.graph.outputs.size());
}

TEST(FormatsText, ConstantDataIsSummarised) {
  Model m;
  m.graph.add_constant("w", Tensor::from<float>({10}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  m.graph.add_constant("flag", Tensor::from<bool>({2}, {true, false}));
  std::string text = model_to_text(m);
  EXPECT_NE(text.find("const w: f32[10] crc32="), std::string::npos) << text;
  EXPECT_NE(text.find(" data=[1, 2, 3, 4, 5, 6, 7, 8, ...]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("const flag: bool[2] crc32="), std::string::npos) << text;
  EXPECT_NE(text.find(" data=[1, 0]\n"), std::string::npos) << text;
  // Another value of the data changes the checksum.
  Model m2 = m;
  m2.graph.values[0].constant = m.graph.values[0].constant.clone();
  m2.graph.values[0].constant.data<float>()[9] = 11;
  EXPECT_NE(model_to_text(m2), text);
}

TEST(FormatsVerify, TargetAndMemoryPlanOfCompiledModels) {
  auto expect_bad = [](const Model& m, const std::string& message) {
    Status s = verify_model(m);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_EQ(s.error().message(), message);
  };
  Model m = rich_model();
  ASSERT_TRUE(verify_model(m).ok());
  m.target->threads = 0;
  expect_bad(m, "target: the target's thread count 0 is not from 1 to 1024");
  m.target->threads = kMaxThreads + 1;
  expect_bad(m, "target: the target's thread count 1025 is not from 1 to 1024");
  m = rich_model();
  m.memory_plan->input_shapes.clear();
  expect_bad(m, "memory plan: it lists 0 input shapes but the graph has 1 inputs");
  m = rich_model();
  m.memory_plan->values.push_back({999, 0, 64});
  expect_bad(m, "memory plan: it places value 999 but the graph has " + std::to_string(m.graph.values.size()) + " values");
  m = rich_model();
  m.memory_plan->values[1].offset = 4090;
  expect_bad(m, "memory plan: value 'r' at offset 4090 (128 bytes) lies outside the arena of 4096 bytes");
}

}  // namespace
}  // namespace kiln
