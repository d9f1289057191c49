// The corrupt-.kiln catalogue (in the manner of llama.cpp's test-gguf): one named case per way
// a file can be broken. Every case must be rejected with a user error that names the file and
// says what is wrong; none may crash. Broken files are made by serializing a good model and
// patching its bytes, by serializing an inconsistent in-memory model (save does not verify),
// or by building a FlatBuffer directly with the generated API.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "formats/serialize.h"
#include "formats/verify.h"
#include "kiln_generated.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

constexpr char kName[] = "bad.kiln";

Shape shape(std::vector<int64_t> dims) { return Shape::of(dims); }

Node make_node(std::string name, std::string op, std::vector<ValueId> in, std::vector<ValueId> out,
               std::string domain = "") {
  Node n;
  n.name = std::move(name);
  n.domain = std::move(domain);
  n.op = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

Tensor filled(std::vector<int64_t> dims, float start) {
  Tensor t(DType::f32, std::move(dims));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + 0.5f * static_cast<float>(i);
  return t;
}

/// x -> Add(w) -> s -> Add(w2) -> y -> Relu -> z, plus a custom op with an attribute.
/// Values: 0 x, 1 w, 2 w2, 3 s, 4 y, 5 z, 6 c.
Model good_model() {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, shape({2, 3}));
  ValueId w = g.add_constant("w", filled({2, 3}, 1));
  ValueId w2 = g.add_constant("w2", filled({2, 3}, -3));
  ValueId s = g.add_value("s", DType::f32, shape({2, 3}));
  ValueId y = g.add_value("y", DType::f32, shape({2, 3}));
  ValueId z = g.add_value("z", DType::f32, shape({2, 3}));
  ValueId c = g.add_value("c", DType::f32, Shape::unknown_rank());
  g.inputs = {x};
  g.add_node(make_node("add", "Add", {x, w}, {s}));
  g.add_node(make_node("add2", "Add", {s, w2}, {y}));
  g.add_node(make_node("relu", "Relu", {y}, {z}));
  Node custom = make_node("custom", "Thing", {z}, {c}, "test");
  custom.set_attr("mode", int64_t{3});
  g.add_node(custom);
  g.outputs = {z, c};
  return m;
}

Bytes serialize(const Model& m) {
  auto r = serialize_model(m);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return r.ok() ? *r : Bytes{};
}

const fb::Model* root(Bytes& b) { return fb::GetSizePrefixedModel(b.data()); }

template <class T>
T* mut(const T* p) {
  return const_cast<T*>(p);
}

/// The generated tables inherit flatbuffers::Table privately; this reaches SetField.
template <class T>
flatbuffers::Table* table(const T* p) {
  return reinterpret_cast<flatbuffers::Table*>(const_cast<T*>(p));
}

const fb::Value* find_value(Bytes& b, const std::string& name) {
  for (const fb::Value* v : *root(b)->graph()->values())
    if (v->name()->str() == name) return v;
  ADD_FAILURE() << "no value " << name;
  return nullptr;
}

/// The file bytes of a model table built by `fill` with the generated API (no weight blob).
template <class F>
Bytes build_raw(F&& fill) {
  flatbuffers::FlatBufferBuilder fbb;
  auto graph = fb::CreateGraph(fbb);
  auto root = fill(fbb, graph);
  fb::FinishSizePrefixedModelBuffer(fbb, root);
  return Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

Bytes raw_with_sidecar(const std::string& weights_file) {
  return build_raw([&](flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<fb::Graph> graph) {
    return fb::CreateModel(fbb, kSchemaMajor, kSchemaMinor, fb::Stage::exported, 0, 0, graph, 64,
                           fbb.CreateString(weights_file));
  });
}

Result<Model> load(const Bytes& b) { return load_model_from_bytes(b, kName); }

/// Expects a user error about kName whose message contains `needle`.
void expect_rejected(const Result<Model>& r, const std::string& needle, const std::string& file = kName) {
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(r.error().kind, ErrorKind::user) << r.error().message();
  EXPECT_EQ(r.error().file, file);
  EXPECT_NE(r.error().message().find(needle), std::string::npos)
      << "message: " << r.error().message() << "\nexpected to contain: " << needle;
}

void expect_rejected(const Model& m, const std::string& needle) { expect_rejected(load(serialize(m)), needle); }

TEST(CorruptKiln, GoodModelLoads) {
  auto r = load(serialize(good_model()));
  ASSERT_TRUE(r.ok()) << r.error().message();
}

// ---- container ------------------------------------------------------------------------------

TEST(CorruptKiln, EmptyFile) { expect_rejected(load({}), "bad.kiln: file is empty"); }

TEST(CorruptKiln, TooShortForAHeader) {
  expect_rejected(load({0x10, 0, 0, 0, 'K'}), "file has 5 bytes, too few for a kiln file");
}

TEST(CorruptKiln, BadIdentifier) {
  Bytes b = serialize(good_model());
  std::memcpy(b.data() + 8, "ONNX", 4);
  expect_rejected(load(b), "not a kiln file: expected identifier 'KILN' at byte 8 but found 'ONNX'");
}

TEST(CorruptKiln, NotAKilnFileAtAll) {
  std::string text = "ir_version: 8\nproducer_name: \"pytorch\"\n";
  expect_rejected(load(Bytes(text.begin(), text.end())), "not a kiln file");
}

TEST(CorruptKiln, BinaryIdentifierIsEscaped) {
  Bytes b = serialize(good_model());
  b[8] = 0;
  b[9] = 0xff;
  expect_rejected(load(b), "found '\\x00\\xffLN'");
}

TEST(CorruptKiln, TruncatedInsideTheFlatbuffer) {
  Bytes good = serialize(good_model());
  uint32_t fb_size;
  std::memcpy(&fb_size, good.data(), 4);
  for (size_t cut : {size_t{12}, size_t{16}, size_t{40}, size_t{fb_size / 2}, size_t{fb_size + 3}}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    expect_rejected(load(Bytes(good.begin(), good.begin() + static_cast<long>(cut))),
                    "file is truncated: it has " + std::to_string(cut) + " bytes but its flatbuffer needs " +
                        std::to_string(fb_size + 4));
  }
}

TEST(CorruptKiln, TruncatedInsideTheWeights) {
  Bytes good = serialize(good_model());
  uint32_t fb_size;
  std::memcpy(&fb_size, good.data(), 4);
  for (size_t cut : {size_t{fb_size} + 4, (size_t{fb_size} + 4 + 63) / 64 * 64 + 8, good.size() - 1}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    expect_rejected(load(Bytes(good.begin(), good.begin() + static_cast<long>(cut))),
                    "file is truncated: it has " + std::to_string(cut) + " bytes but should have " +
                        std::to_string(good.size()));
  }
}

TEST(CorruptKiln, TruncatedAtEveryLength) {
  Bytes good = serialize(good_model());
  for (size_t cut = 0; cut < good.size(); ++cut) {
    auto r = load(Bytes(good.begin(), good.begin() + static_cast<long>(cut)));
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_EQ(r.error().kind, ErrorKind::user) << r.error().message();
  }
}

TEST(CorruptKiln, TrailingBytes) {
  Bytes b = serialize(good_model());
  size_t size = b.size();
  b.insert(b.end(), {1, 2, 3});
  expect_rejected(load(b), "file has 3 unexpected bytes after its end at byte " + std::to_string(size));
}

TEST(CorruptKiln, FlatbufferSizeTooLarge) {
  Bytes b = serialize(good_model());
  uint32_t huge = 0xfffffff0u;
  std::memcpy(b.data(), &huge, 4);
  expect_rejected(load(b), "flatbuffer size 4294967280 is too large");
}

TEST(CorruptKiln, RootOffsetOutOfBounds) {
  Bytes b = serialize(good_model());
  uint32_t off = 0x00ffff00u;
  std::memcpy(b.data() + 4, &off, 4);
  expect_rejected(load(b), "file is corrupt: its root table is malformed");
}

TEST(CorruptKiln, VectorLengthOutOfBounds) {
  Bytes b = serialize(good_model());
  auto* len = reinterpret_cast<uint8_t*>(mut(root(b)->graph()->values()));
  uint32_t huge = 0x0fffffffu;
  std::memcpy(len, &huge, 4);
  expect_rejected(load(b), "file is corrupt: its flatbuffer fails verification");
}

TEST(CorruptKiln, RandomByteChangesNeverCrash) {
  Bytes good = serialize(good_model());
  std::mt19937 rng(1234);
  for (size_t i = 0; i < good.size(); ++i) {
    for (int variant = 0; variant < 3; ++variant) {
      Bytes b = good;
      b[i] = variant == 0 ? static_cast<uint8_t>(~b[i]) : variant == 1 ? 0 : static_cast<uint8_t>(rng());
      auto r = load(b);
      if (!r.ok()) {
        EXPECT_EQ(r.error().kind, ErrorKind::user) << "byte " << i << ": " << r.error().message();
        EXPECT_EQ(r.error().file, kName);
      } else {
        // Whatever loads must be a verified model.
        Status s = verify_model(*r);
        EXPECT_TRUE(s.ok()) << "byte " << i;
      }
    }
  }
}

/// A model whose graph holds `depth` graphs nested through a custom op's attribute.
Model nested_model(int depth) {
  std::shared_ptr<Graph> inner;
  for (int d = 0; d < depth; ++d) {
    auto g = std::make_shared<Graph>();
    ValueId k = g->add_constant("k", filled({1}, 1));
    g->outputs = {k};
    if (inner) {
      Node n = make_node("scope", "Scope", {}, {}, "test");
      n.set_attr("body", inner);
      g->add_node(n);
    }
    inner = g;
  }
  Model m;
  m.graph = *inner;
  return m;
}

TEST(CorruptKiln, NestingWithinTheLimitLoads) {
  auto r = load(serialize(nested_model(40)));
  EXPECT_TRUE(r.ok()) << r.error().message();
}

TEST(CorruptKiln, NestingTooDeep) {
  expect_rejected(load(serialize(nested_model(60))), "the model nests subgraphs deeper than this kiln reads");
}

// ---- versions -------------------------------------------------------------------------------

TEST(CorruptKiln, NewerMajorVersion) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(root(b))->SetField<uint16_t>(fb::Model::VT_SCHEMA_MAJOR, 2, 0));
  ASSERT_TRUE(table(root(b))->SetField<uint16_t>(fb::Model::VT_SCHEMA_MINOR, 3, 0));
  expect_rejected(load(b), "file has schema version 2.3 but this kiln reads 1.x");
}

TEST(CorruptKiln, NewerMajorVersionWithForeignLayout) {
  // A future major may lay everything else out differently: the version must still be read.
  Bytes b = build_raw([](flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<fb::Graph>) {
    fb::ModelBuilder mb(fbb);
    mb.add_schema_major(7);
    mb.add_schema_minor(1);
    fbb.AddElement<uint64_t>(fb::Model::VT_GRAPH, 0xdeadbeef, 0);  // not an offset any more
    return mb.Finish();
  });
  expect_rejected(load(b), "file has schema version 7.1 but this kiln reads 1.x");
}

TEST(CorruptKiln, OlderMajorVersion) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(root(b))->SetField<uint16_t>(fb::Model::VT_SCHEMA_MAJOR, 0, 0));
  expect_rejected(load(b), "file has schema version 0." + std::to_string(kSchemaMinor) + " but this kiln reads 1.x");
}

TEST(CorruptKiln, NewerMinorVersionLoads) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(root(b))->SetField<uint16_t>(fb::Model::VT_SCHEMA_MINOR, kSchemaMinor + 9, 0));
  auto r = load(b);
  EXPECT_TRUE(r.ok()) << r.error().message();
}

TEST(CorruptKiln, UnknownFieldsOfANewerMinorAreIgnored) {
  Bytes b = build_raw([](flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<fb::Graph> graph) {
    auto future = fbb.CreateString("a field kiln 1.0 does not know");
    fb::ModelBuilder mb(fbb);
    mb.add_schema_major(kSchemaMajor);
    mb.add_schema_minor(kSchemaMinor + 1);
    mb.add_stage(fb::Stage::exported);
    mb.add_graph(graph);
    constexpr flatbuffers::voffset_t kFutureField = fb::Model::VT_TARGET + 2;  // past the last field this kiln knows
    fbb.AddOffset(kFutureField, future);
    fbb.AddElement<uint64_t>(kFutureField + 2, 42, 0);
    return mb.Finish();
  });
  auto r = load(b);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->stage, Stage::exported);
}

TEST(CorruptKiln, UnknownStage) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(root(b))->SetField<uint16_t>(fb::Model::VT_STAGE, 9, 0));
  expect_rejected(load(b), "unknown model stage 9");
}

// ---- tensor data ----------------------------------------------------------------------------

TEST(CorruptKiln, UnknownDtypeOfAValue) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(find_value(b, "y"))->SetField<uint16_t>(fb::Value::VT_DTYPE, 99, 0));
  expect_rejected(load(b), "value 'y': unknown dtype 99");
}

TEST(CorruptKiln, UnknownDtypeOfConstantData) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(find_value(b, "w")->constant())->SetField<uint16_t>(fb::TensorData::VT_DTYPE, 300, 0));
  expect_rejected(load(b), "value 'w': data has unknown dtype 300");
}

TEST(CorruptKiln, DataSizeDisagreesWithShape) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(find_value(b, "w")->constant())->SetField<uint64_t>(fb::TensorData::VT_SIZE, 12, 0));
  expect_rejected(load(b), "value 'w': data has 12 bytes but f32 2x3 needs 24");
}

TEST(CorruptKiln, SizeOverflow) {
  Bytes b = serialize(good_model());
  auto* dims = mut(find_value(b, "w")->constant()->shape());
  dims->Mutate(0, int64_t{1} << 40);
  dims->Mutate(1, int64_t{1} << 40);
  expect_rejected(load(b), "value 'w': data shape 1099511627776x1099511627776 has more elements than fit in memory");
}

TEST(CorruptKiln, ByteSizeOverflow) {
  // The element count fits in int64 but times sizeof(f32) it does not.
  Bytes b = serialize(good_model());
  auto* dims = mut(find_value(b, "w")->constant()->shape());
  dims->Mutate(0, int64_t{1} << 31);
  dims->Mutate(1, int64_t{1} << 31);
  expect_rejected(load(b), "value 'w': data shape 2147483648x2147483648 has more elements than fit in memory");
}

TEST(CorruptKiln, NegativeDataDim) {
  Bytes b = serialize(good_model());
  mut(find_value(b, "w")->constant()->shape())->Mutate(1, int64_t{-3});
  expect_rejected(load(b), "value 'w': data shape has negative dim -3");
}

TEST(CorruptKiln, DataOffsetOutsideTheBlob) {
  Bytes b = serialize(good_model());
  const fb::TensorData* td = find_value(b, "w2")->constant();
  ASSERT_EQ(td->offset(), 64u);  // w is at 0, w2 at the next 64-byte boundary
  ASSERT_TRUE(table(td)->SetField<uint64_t>(fb::TensorData::VT_OFFSET, 1u << 20, 0));
  expect_rejected(load(b), "value 'w2': data at offset 1048576 with 24 bytes lies outside the 88-byte weight blob");
}

TEST(CorruptKiln, DataOffsetOverflowsPastTheBlob) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(find_value(b, "w2")->constant())
                  ->SetField<uint64_t>(fb::TensorData::VT_OFFSET, UINT64_MAX - 63, 0));
  expect_rejected(load(b), "value 'w2': data at offset 18446744073709551552 with 24 bytes lies outside");
}

TEST(CorruptKiln, DataOffsetMisaligned) {
  Bytes b = serialize(good_model());
  ASSERT_TRUE(table(find_value(b, "w2")->constant())->SetField<uint64_t>(fb::TensorData::VT_OFFSET, 72, 0));
  expect_rejected(load(b), "value 'w2': data offset 72 is not a multiple of 64");
}

TEST(CorruptKiln, MisalignedArray) {
  // Moving the shape vector's offset by 4 keeps a valid length word (the low half of dim 0)
  // but puts its 8-byte elements at an offset that is 4 mod 8.
  Bytes b = serialize(good_model());
  const fb::TensorData* td = find_value(b, "w")->constant();
  uint8_t* field = table(td)->GetAddressOf(fb::TensorData::VT_SHAPE);
  ASSERT_NE(field, nullptr);
  uint32_t off;
  std::memcpy(&off, field, 4);
  off += 4;
  std::memcpy(field, &off, 4);
  expect_rejected(load(b), "value 'w': file is corrupt: an array of 8-byte numbers is at a misaligned offset");
}

TEST(CorruptKiln, BoolDataOtherThanZeroOrOne) {
  Model m = good_model();
  m.graph.add_constant("flags", Tensor::from<bool>({3}, {true, false, true}));
  Bytes b = serialize(m);
  const fb::TensorData* td = find_value(b, "flags")->constant();
  uint32_t fb_size;
  std::memcpy(&fb_size, b.data(), 4);
  b[(fb_size + 4 + 63) / 64 * 64 + td->offset() + 1] = 139;
  expect_rejected(load(b), "value 'flags': bool data has byte 139 at element 1; bools must be 0 or 1");
}

// ---- packed weights ---------------------------------------------------------------------------

// good_model with w stored packed: rows padded from 3 to 4 elements.
Model packed_model() {
  Model m = good_model();
  Tensor& w = m.graph.value(1).constant;
  w = pack(w, PackedLayout{{2, 3}, {2, 4}, {4, 1}, {}, {}, "test"});
  return m;
}

TEST(CorruptKiln, PackedWeightsRoundTrip) {
  auto r = load(serialize(packed_model()));
  ASSERT_TRUE(r.ok()) << r.error().message();
  const Tensor& w = r->graph.value(1).constant;
  ASSERT_TRUE(w.is_packed());
  EXPECT_TRUE(w.layout()->same_placement(*packed_model().graph.value(1).constant.layout()));
  EXPECT_EQ(w.layout()->packed_for, "test");
  EXPECT_EQ(w.nbytes(), 32u);
  EXPECT_EQ(std::memcmp(unpack(w).raw(), good_model().graph.value(1).constant.raw(), 24), 0);
}

TEST(CorruptKiln, PackedLayoutWithANegativeStride) {
  Bytes b = serialize(packed_model());
  mut(find_value(b, "w")->constant()->layout()->strides())->Mutate(0, -4);
  expect_rejected(load(b), "value 'w': packed layout dim 0 has stride -4");
}

TEST(CorruptKiln, PackedLayoutPastItsData) {
  Bytes b = serialize(packed_model());
  mut(find_value(b, "w")->constant()->layout()->strides())->Mutate(0, 1000);
  expect_rejected(load(b), "value 'w': packed layout 2x3 padded to 2x4, strides 1000x1 addresses 4016 bytes but the data has 32");
}

TEST(CorruptKiln, PackedLayoutOfTheWrongElementCount) {
  Bytes b = serialize(packed_model());
  mut(find_value(b, "w")->constant()->layout()->dims())->Mutate(1, 2);
  expect_rejected(load(b), "value 'w': packed layout dims 2x2 do not hold the tensor's 6 elements");
}

TEST(CorruptKiln, PackedDataSizeTooSmall) {
  Bytes b = serialize(packed_model());
  ASSERT_TRUE(table(find_value(b, "w")->constant())->SetField<uint64_t>(fb::TensorData::VT_SIZE, 28, 0));
  expect_rejected(load(b), "value 'w': packed layout 2x3 padded to 2x4, strides 4x1 addresses 32 bytes but the data has 28");
}

TEST(CorruptKiln, PackedBools) {
  Model m = good_model();
  m.graph.add_constant("flags", pack(Tensor::from<bool>({3}, {true, false, true}), PackedLayout{{3}, {3}, {1}, {}, {}, ""}));
  expect_rejected(m, "value 'flags': bool data cannot be packed");
}

TEST(CorruptKiln, PackedConstantInASubgraph) {
  Model m = good_model();
  auto body = std::make_shared<Graph>();
  ValueId k = body->add_constant("k", pack(filled({2}, 1), PackedLayout{{2}, {2}, {1}, {}, {}, ""}));
  body->outputs = {k};
  m.graph.nodes[3].set_attr("body", body);
  expect_rejected(m, "value 'k': packed data is only allowed for the constants of the top-level graph");
}

TEST(CorruptKiln, UnknownAttributeType) {
  Bytes b = serialize(good_model());
  const fb::Node* custom = root(b)->graph()->nodes()->Get(3);
  ASSERT_EQ(custom->name()->str(), "custom");
  ASSERT_TRUE(table(custom->attrs()->Get(0))->SetField<uint16_t>(fb::Attribute::VT_TYPE, 77, 0));
  expect_rejected(load(b), "node 'custom': attribute 'mode': unknown attribute type 77");
}

TEST(CorruptKiln, SymbolCountDisagreesWithDims) {
  Model m = good_model();
  m.graph.value(0).shape = Shape({Dim::sym("batch"), Dim::known(3)});
  Bytes b = serialize(m);
  auto* dims_len = reinterpret_cast<uint8_t*>(mut(find_value(b, "x")->shape()->dims()));
  uint32_t one = 1;  // shrinking a vector keeps the buffer valid
  std::memcpy(dims_len, &one, 4);
  expect_rejected(load(b), "value 'x': shape has 1 dims but 2 symbols");
}

// ---- sidecar --------------------------------------------------------------------------------

/// The one sidecar `<base>.<16 hex>.weights` next to the model at `path`.
std::string sidecar_of(const std::string& path) {
  fs::path p(path);
  std::string found;
  for (const auto& e : fs::directory_iterator(p.parent_path())) {
    std::string n = e.path().filename().string();
    if (n.rfind(p.filename().string() + ".", 0) == 0 && n.size() == p.filename().string().size() + 25 &&
        n.ends_with(".weights")) {
      EXPECT_TRUE(found.empty()) << "two sidecars: " << found << " and " << n;
      found = e.path().string();
    }
  }
  return found;
}

class CorruptSidecar : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_corrupt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "m.kiln").string();
    ASSERT_TRUE(save_model(good_model(), path_, SaveOptions{.sidecar_threshold = 16}).ok());
    ASSERT_FALSE(sidecar_of(path_).empty());
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::string path_;
};

TEST_F(CorruptSidecar, MissingSidecar) {
  std::string side = sidecar_of(path_);
  fs::remove(side);
  expect_rejected(load_model(path_), "cannot open sidecar weights file '" + side + "': No such file or directory", path_);
}

TEST_F(CorruptSidecar, TruncatedSidecar) {
  fs::resize_file(sidecar_of(path_), 30);
  expect_rejected(load_model(path_), ".weights' has 30 bytes but the model needs 88", path_);
}

TEST_F(CorruptSidecar, ModelFileWithTrailingBytes) {
  std::ofstream(path_, std::ios::app | std::ios::binary) << "junk";
  expect_rejected(load_model(path_), "(its weights are in '" + fs::path(sidecar_of(path_)).filename().string() + "')", path_);
}

TEST(CorruptKiln, SidecarNameEscapingItsFolder) {
  for (std::string name : {"../m.kiln.weights", "sub/m.weights", "/etc/passwd", "a\\b.weights", "..", "."}) {
    SCOPED_TRACE(name);
    expect_rejected(load(raw_with_sidecar(name)), "sidecar weights file name '" + name.substr(0, 2));
    expect_rejected(load(raw_with_sidecar(name)), "' is not a plain file name");
  }
}

TEST(CorruptKiln, EmptySidecarName) {
  expect_rejected(load(raw_with_sidecar("")), "sidecar weights file name '' is not a plain file name");
}

// ---- graph structure ------------------------------------------------------------------------

TEST(CorruptKiln, NodeInputIndexOutOfRange) {
  Model m = good_model();
  m.graph.nodes[1].inputs[1] = 912;
  expect_rejected(m, "bad.kiln: node 'add2': input 1 refers to value 912 but the graph has 7 values");
}

TEST(CorruptKiln, NodeInputNegativeIndex) {
  Model m = good_model();
  m.graph.nodes[0].inputs[0] = -2;
  expect_rejected(m, "node 'add': input 0 refers to value -2 but the graph has 7 values");
}

TEST(CorruptKiln, NodeOutputIndexOutOfRange) {
  Model m = good_model();
  m.graph.nodes[2].outputs[0] = 7;
  expect_rejected(m, "node 'relu': output 0 refers to value 7 but the graph has 7 values");
}

TEST(CorruptKiln, GraphInputIndexOutOfRange) {
  Model m = good_model();
  m.graph.inputs.push_back(40);
  expect_rejected(m, "bad.kiln: graph input 1 refers to value 40 but the graph has 7 values");
}

TEST(CorruptKiln, GraphOutputIndexOutOfRange) {
  Model m = good_model();
  m.graph.outputs[0] = -1;
  expect_rejected(m, "graph output 0 refers to value -1 but the graph has 7 values");
}

TEST(CorruptKiln, IndexOutOfRangeInASubgraph) {
  Model m = good_model();
  auto body = std::make_shared<Graph>();
  ValueId z = body->add_value("z", DType::f32, shape({2, 3}));
  ValueId out = body->add_value("inner_out", DType::f32, shape({2, 3}));
  body->add_node(make_node("inner", "Relu", {5}, {out}));
  body->outputs = {out};
  (void)z;
  m.graph.nodes[3].set_attr("body", body);
  expect_rejected(m, "node 'custom': attribute 'body': node 'inner': input 0 refers to value 5 but the graph has 2 values");
}

TEST(CorruptKiln, DuplicateValueNames) {
  Model m = good_model();
  m.graph.rename_value(6, "w");
  expect_rejected(m, "value 'w': the name is used by both value 1 and value 6");
}

TEST(CorruptKiln, ValueWithoutAName) {
  Model m = good_model();
  m.graph.value(4).name.clear();
  expect_rejected(m, "value 4: the value has no name");
}

TEST(CorruptKiln, ValueProducedTwice) {
  Model m = good_model();
  m.graph.nodes[2].outputs[0] = 4;  // relu writes y, which add2 already produces
  expect_rejected(m, "node 'relu': output 0 'y' is also produced by node 'add2'");
}

TEST(CorruptKiln, GraphInputProducedByANode) {
  Model m = good_model();
  m.graph.inputs.push_back(3);
  expect_rejected(m, "node 'add': output 0 's' is a graph input");
}

TEST(CorruptKiln, GraphInputIsAConstant) {
  Model m = good_model();
  m.graph.inputs.push_back(1);
  expect_rejected(m, "value 'w': the value is both a graph input and a constant");
}

TEST(CorruptKiln, ConstantProducedByANode) {
  Model m = good_model();
  m.graph.nodes[2].outputs[0] = 2;
  expect_rejected(m, "node 'relu': output 0 'w2' is a constant");
}

TEST(CorruptKiln, ValueWithoutASource) {
  Model m = good_model();
  m.graph.inputs.clear();
  expect_rejected(m, "node 'add': input 0 'x' has no source: no node produces it and it is not a graph input or a "
                     "constant");
}

TEST(CorruptKiln, Cycle) {
  Model m = good_model();
  m.graph.nodes[0].inputs[0] = 5;  // add reads z, which depends on add
  m.graph.inputs.clear();
  expect_rejected(m, "the graph has a cycle through value");
}

TEST(CorruptKiln, SelfLoop) {
  Model m = good_model();
  m.graph.nodes[2].inputs[0] = 5;  // relu reads its own output
  expect_rejected(m, "node 'relu': the graph has a cycle through value 'z'");
}

TEST(CorruptKiln, CycleInASubgraph) {
  Model m = good_model();
  auto body = std::make_shared<Graph>();
  ValueId a = body->add_value("a", DType::f32, shape({2}));
  ValueId b = body->add_value("b", DType::f32, shape({2}));
  body->add_node(make_node("r1", "Relu", {b}, {a}));
  body->add_node(make_node("r2", "Relu", {a}, {b}));
  body->outputs = {a};
  m.graph.nodes[3].set_attr("body", body);
  expect_rejected(m, "node 'custom': attribute 'body': node 'r");
  expect_rejected(m, ": the graph has a cycle through value");
}

TEST(CorruptKiln, UnknownValueDtype) {
  Model m = good_model();
  m.graph.value(6).dtype = DType::undefined;
  expect_rejected(m, "value 'c': the value has no dtype");
}

TEST(CorruptKiln, ConstantDtypeDisagreesWithItsValue) {
  Model m = good_model();
  m.graph.value(1).dtype = DType::f16;
  expect_rejected(m, "value 'w': dtype is f16 but its data is f32");
}

TEST(CorruptKiln, ConstantShapeDisagreesWithItsValue) {
  Model m = good_model();
  m.graph.value(1).shape = shape({3, 2});
  expect_rejected(m, "value 'w': shape is 3x2 but its data is 2x3");
}

TEST(CorruptKiln, UnknownRankWithDims) {
  Model m = good_model();
  m.graph.value(6).shape.dims = {Dim::known(2)};
  expect_rejected(m, "value 'c': shape has unknown rank but lists 1 dims");
}

TEST(CorruptKiln, EmptyTensorAttribute) {
  Model m = good_model();
  m.graph.nodes[3].set_attr("t", Tensor());
  expect_rejected(m, "node 'custom': attribute 't': the attribute holds no tensor");
}

TEST(CorruptKiln, EmptyGraphAttribute) {
  Model m = good_model();
  m.graph.nodes[3].set_attr("g", std::shared_ptr<Graph>());
  expect_rejected(m, "node 'custom': attribute 'g': the attribute holds no graph");
}

// ---- quantization parameters ----------------------------------------------------------------

TEST(CorruptKiln, QuantScaleNotPositive) {
  Model m = good_model();
  m.graph.value(4).quant = QuantParams{DType::u8, {0.0f}, {0}, -1};
  expect_rejected(m, "value 'y': quant scale 0 is 0.000000; scales must be positive and finite");
}

TEST(CorruptKiln, QuantZeroPointCountDisagrees) {
  Model m = good_model();
  m.graph.value(4).quant = QuantParams{DType::i8, {0.1f, 0.2f}, {0}, 0};
  expect_rejected(m, "value 'y': quant params have 2 scales but 1 zero points");
}

TEST(CorruptKiln, QuantPerAxisCountDisagreesWithDim) {
  Model m = good_model();
  m.graph.value(4).quant = QuantParams{DType::i8, {0.1f, 0.2f, 0.3f}, {0, 0, 0}, 0};
  expect_rejected(m, "value 'y': quant params have 3 scales but dim 0 of shape 2x3 has 2");
}

TEST(CorruptKiln, QuantZeroPointOutOfRange) {
  Model m = good_model();
  m.graph.value(4).quant = QuantParams{DType::u8, {0.1f}, {256}, -1};
  expect_rejected(m, "value 'y': quant zero point 0 is 256, outside the range of u8");
}

TEST(CorruptKiln, QuantStorageNotInteger) {
  Model m = good_model();
  m.graph.value(4).quant = QuantParams{DType::f16, {0.1f}, {0}, -1};
  expect_rejected(m, "value 'y': quant storage dtype f16 is not an integer type");
}

// ---- ops and shapes -------------------------------------------------------------------------

TEST(CorruptKiln, UnknownCoreOp) {
  Model m = good_model();
  m.graph.nodes[2].op = "Frobnicate";
  expect_rejected(m, "node 'relu': unknown op 'Frobnicate'");
}

TEST(CorruptKiln, CoreOpWithWrongArity) {
  Model m = good_model();
  m.graph.nodes[2].inputs.push_back(3);
  expect_rejected(m, "node 'relu': Relu takes 1 inputs, got 2");
}

TEST(CorruptKiln, CoreOpWithUnknownAttribute) {
  Model m = good_model();
  m.graph.nodes[2].set_attr("alpha", 0.5);
  expect_rejected(m, "node 'relu': unknown attribute 'alpha' for Relu");
}

TEST(CorruptKiln, OutputDtypeDisagreesWithInference) {
  Model m = good_model();
  m.graph.value(3).dtype = DType::f16;
  expect_rejected(m, "node 'add': output 0 's' has dtype f16 but Add gives f32");
}

TEST(CorruptKiln, OutputShapeDisagreesWithInference) {
  Model m = good_model();
  m.graph.value(5).shape = shape({2, 4});
  expect_rejected(m, "node 'relu': output 0 'z' has shape 2x4 but Relu gives 2x3");
}

TEST(CorruptKiln, OutputRankDisagreesWithInference) {
  Model m = good_model();
  m.graph.value(3).shape = shape({6});
  expect_rejected(m, "node 'add': output 0 's' has shape 6 but Add gives 2x3");
}

TEST(CorruptKiln, InputsThatInferenceRejects) {
  Model m = good_model();
  m.graph.value(1).dtype = DType::i64;
  m.graph.value(1).constant = Tensor(DType::i64, {2, 3});
  auto r = load(serialize(m));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_EQ(r.error().where, "node 'add'") << r.error().message();
}

TEST(CorruptKiln, SymbolicAndUnknownDimsAreCompatible) {
  Model m = good_model();
  m.graph.value(0).shape = Shape({Dim::sym("batch"), Dim::known(3)});
  m.graph.value(3).shape = Shape({Dim::unknown(), Dim::known(3)});
  m.graph.value(4).shape = Shape::unknown_rank();
  auto r = load(serialize(m));
  EXPECT_TRUE(r.ok()) << r.error().message();
}

TEST(CorruptKiln, CustomDomainOpsAreNotInferred) {
  Model m = good_model();
  // Any arity, attributes and output types are fine outside the core domain.
  m.graph.nodes[3].inputs = {0, kNoValue, 5, 1};
  m.graph.nodes[3].set_attr("anything", std::vector<std::string>{"goes"});
  m.graph.value(6).dtype = DType::i64;
  auto r = load(serialize(m));
  EXPECT_TRUE(r.ok()) << r.error().message();
}

TEST(CorruptKiln, LoadingANonexistentFile) {
  expect_rejected(load_model("/nonexistent/bad.kiln"), "cannot open file: No such file or directory",
                  "/nonexistent/bad.kiln");
}

TEST(CorruptKiln, LoadingADirectory) {
  std::string dir = fs::temp_directory_path().string();
  expect_rejected(load_model(dir), "cannot read file: Is a directory", dir);
}

}  // namespace
}  // namespace kiln
