// Hostile sizes: .kiln files whose dims, pads or attributes make size arithmetic overflow,
// declared shapes past the memory budget, and runs that would exhaust memory. Each case is a
// finding of coverage-guided fuzzing kept as a regression test: a user error naming the node
// or value, never undefined behaviour or an allocation sized by the file.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "export/onnx_tensor.h"
#include "formats/checked.h"
#include "formats/memory.h"
#include "formats/serialize.h"
#include "formats/summary.h"
#include "runtime/session.h"
#include "tests/unit/op_test_util.h"

namespace kiln {
namespace {

constexpr int64_t kHuge = int64_t{1} << 62;

using testing::node;

Shape sym_dims(std::vector<Dim> d) { return Shape(std::move(d)); }

/// Saves and loads the model (load verifies it); expects a user error containing `needle`.
void expect_load_rejected(const Model& m, const std::string& needle) {
  auto bytes = serialize_model(m);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message();
  auto r = load_model_from_bytes(*bytes, "hostile.kiln");
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(r.error().kind, ErrorKind::user) << r.error().message();
  EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
}

/// One node `op` from input x (shape `in`) and optional constant inputs to output y.
Model one_node(const std::string& op, Shape in, std::vector<Tensor> constants = {}, DType dt = DType::f32) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", dt, std::move(in));
  g.inputs = {x};
  std::vector<ValueId> ins = {x};
  for (size_t i = 0; i < constants.size(); ++i) ins.push_back(g.add_constant("c" + std::to_string(i), constants[i]));
  ValueId y = g.add_value("y", dt, Shape::unknown_rank());
  g.add_node(node("n", op, ins, {y}));
  g.outputs = {y};
  return m;
}

TEST(CheckedInt, ReportsOverflowInsteadOfWrapping) {
  EXPECT_EQ(checked_mul(kHuge, 2), std::nullopt);
  EXPECT_EQ(checked_add(std::numeric_limits<int64_t>::max(), 1), std::nullopt);
  EXPECT_EQ(checked_sub(std::numeric_limits<int64_t>::min(), 1), std::nullopt);
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20), int64_t{1} << 40);
  CheckedInt p = 1;
  for (int i = 0; i < 4; ++i) p *= int64_t{1} << 20;
  EXPECT_FALSE(p.ok());
  EXPECT_FALSE((CheckedInt(5) / 0).ok());
  std::vector<int64_t> shape{kHuge, 4};
  EXPECT_EQ(checked_product(shape), std::nullopt);
}

// fuzz_run finding: an integer Range whose steps are near 2^63 overflowed in start + i * delta,
// and its count, rounded in double, could take the last element past limit.
TEST(HostileSizes, RangeOfHugeSteps) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(range_count(0, kMax, 72339069014638592), 128u);
  EXPECT_EQ(range_count(kMin, kMax, kMax), 3u);
  EXPECT_EQ(range_count(kMax, kMin, kMin), 2u);
  EXPECT_EQ(range_count(5, 5, 1), 0u);
  EXPECT_EQ(range_count(5, 0, -2), 3u);
  EXPECT_EQ(range_element(kMin, kMax, 2), kMax - 1);
  EXPECT_EQ(range_element(kMax, kMin, 1), -1);

  Model m;
  Graph& g = m.graph;
  ValueId start = g.add_value("start", DType::i64, Shape::of(std::vector<int64_t>{}));
  ValueId limit = g.add_value("limit", DType::i64, Shape::of(std::vector<int64_t>{}));
  ValueId delta = g.add_value("delta", DType::i64, Shape::of(std::vector<int64_t>{}));
  ValueId y = g.add_value("y", DType::i64, Shape::unknown_rank());
  g.inputs = {start, limit, delta};
  g.add_node(node("range", "Range", {start, limit, delta}, {y}));
  g.outputs = {y};
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto scalar = [](int64_t v) { return Tensor::from<int64_t>({}, {v}); };
  auto r = (*s)->run(std::vector<Tensor>{scalar(-kHuge), scalar(kMax), scalar(kMax / 2)});
  ASSERT_TRUE(r.ok()) << r.error().message();
  // -2^62, -1, 2^62 - 2, 2^63 - 3: the last one's 3 * delta alone is past int64.
  ASSERT_EQ((*r)[0].numel(), 4);
  EXPECT_EQ((*r)[0].data<int64_t>()[3], kMax - 2);
}

TEST(HostileSizes, FlattenOfHugeDims) {
  expect_load_rejected(one_node("Flatten", sym_dims({Dim::sym("n"), Dim::known(kHuge), Dim::known(4)})), "overflow int64");
}

TEST(HostileSizes, ReshapeMinusOneOfHugeDims) {
  Model m = one_node("Reshape", sym_dims({Dim::sym("n"), Dim::known(kHuge), Dim::known(4)}),
                     {Tensor::from<int64_t>({2}, {0, -1})});
  expect_load_rejected(m, "multiply past the int64 range");
}

TEST(HostileSizes, TileOfHugeRepeats) {
  Model m = one_node("Tile", sym_dims({Dim::sym("n"), Dim::known(4)}), {Tensor::from<int64_t>({2}, {1, kHuge})});
  expect_load_rejected(m, "overflow int64");
}

TEST(HostileSizes, PadsThatOverflow) {
  Model m = one_node("Pad", sym_dims({Dim::sym("n"), Dim::known(4)}), {Tensor::from<int64_t>({4}, {0, kHuge, 0, kHuge})});
  expect_load_rejected(m, "overflow int64");
}

/// One node `op` reading graph inputs of these dtypes and shapes, with attributes; output y.
Model inputs_node(const std::string& op, std::vector<std::pair<DType, Shape>> in, std::vector<Attribute> attrs,
                  DType out) {
  Model m;
  Graph& g = m.graph;
  Node n = node("n", op, {}, {});
  for (size_t i = 0; i < in.size(); ++i) {
    g.inputs.push_back(g.add_value("in" + std::to_string(i), in[i].first, std::move(in[i].second)));
    n.inputs.push_back(g.inputs.back());
  }
  n.outputs = {g.add_value("y", out, Shape::unknown_rank())};
  for (Attribute& a : attrs) n.set_attr(a.name, std::move(a.value));
  g.outputs = n.outputs;
  g.add_node(std::move(n));
  return m;
}

TEST(HostileSizes, ConvIntegerPadsThatOverflow) {
  Model m = inputs_node("ConvInteger",
                        {{DType::u8, sym_dims({Dim::sym("n"), Dim::known(1), Dim::known(4), Dim::known(4)})},
                         {DType::u8, Shape::of(std::vector<int64_t>{1, 1, 2, 2})}},
                        {{"pads", std::vector<int64_t>{kHuge, kHuge, kHuge, kHuge}}}, DType::i32);
  expect_load_rejected(m, "overflows int64");
}

// fuzz_kiln_load: W's declared channels times group overflow when checked against X's.
TEST(HostileSizes, ConvChannelsTimesGroupOverflow) {
  Model m = inputs_node(
      "Conv",
      {{DType::f32, sym_dims({Dim::sym("n"), Dim::known(3), Dim::known(4), Dim::known(4)})},
       {DType::f32, sym_dims({Dim::known(3), Dim::known(8462108011559649285), Dim::sym("k"), Dim::sym("k")})}},
      {{"group", int64_t{3}}}, DType::f32);
  expect_load_rejected(m, "channels but W expects 8462108011559649285 x group 3");
}

TEST(HostileSizes, RecurrentHiddenSizeThatOverflows) {
  Model m = inputs_node("GRU",
                        {{DType::f32, Shape::of(std::vector<int64_t>{2, 1, 3})},
                         {DType::f32, Shape::of(std::vector<int64_t>{1, 6, 3})},
                         {DType::f32, Shape::of(std::vector<int64_t>{1, 6, 2})}},
                        {{"hidden_size", kHuge}}, DType::f32);
  expect_load_rejected(m, "W has 6 rows; expected 3 x hidden_size 4611686018427387904");
}

TEST(HostileSizes, RankPastTheLimit) {
  Model m = one_node("Relu", Shape(std::vector<Dim>(kMaxRank + 1, Dim::known(1))));
  expect_load_rejected(m, "value 'x': shape has rank 65; kiln supports ranks up to 64");
}

TEST(HostileSizes, ShapeInputDeclaredWithMillionsOfEntries) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId s = g.add_value("s", DType::i64, Shape::of(std::vector<int64_t>{100'000'000}));
  ValueId y = g.add_value("y", DType::f32, Shape::unknown_rank());
  g.inputs = {x, s};
  g.add_node(node("expand", "Expand", {x, s}, {y}));
  g.outputs = {y};
  expect_load_rejected(m, "the shape input has 100000000 entries; kiln supports ranks up to 64");
}

TEST(HostileSizes, DeclaredShapePastTheMemoryLimit) {
  Model m = one_node("Relu", Shape::of(std::vector<int64_t>{1 << 20, 1 << 20}));
  set_memory_limit(size_t{256} << 20);
  expect_load_rejected(m, "value 'x': shape 1048576x1048576 (f32) needs 4.0 TiB, past the memory limit of 256 MiB");
  set_memory_limit(0);
}

TEST(HostileSizes, SummaryOfAnOmittedOptionalInput) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{1, 8, 1}));
  ValueId y = g.add_value("y", DType::f32, Shape::unknown_rank());
  g.inputs = {x};
  g.add_node(node("dft", "DFT", {x, kNoValue}, {y}));
  g.outputs = {y};
  EXPECT_EQ(node_flops(g.nodes[0], g), 0);
  EXPECT_EQ(summarize(m).flops, 0);
}

// Names come from files: quotes, control characters and bytes that are not UTF-8 still give
// valid JSON, with the bad bytes replaced.
TEST(HostileSizes, InspectJsonOfHostileNames) {
  Model m;
  Graph& g = m.graph;
  const std::string name = std::string("a\"b\\c\n\x01") + "\xff\xc3";
  ValueId x = g.add_value(name, DType::f32, sym_dims({Dim::sym("n\t"), Dim::known(2), Dim::unknown()}));
  g.inputs = {x};
  g.outputs = {x};
  m.metadata.emplace_back("k\x02", "v\xfe");
  std::string text = summary_json(m, summarize(m));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text;
  EXPECT_EQ(j["schema"], "kiln.inspect");
  EXPECT_EQ(j["inputs"][0]["name"], "a\"b\\c\n\x01\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(j["inputs"][0]["shape"], nlohmann::json::parse(R"(["n\t", 2, null])"));
  EXPECT_EQ(j["metadata"]["k\x02"], "v\xef\xbf\xbd");
}

// An ONNX initializer is allocated only once its data is known to fill its shape (fuzz_onnx_export
// found five float values declaring 272 GiB, whose allocation threw out of the exporter), and one
// whose data is real but past the memory budget is a user error naming it.
TEST(HostileSizes, InitializerShapeItsDataCannotFill) {
  onnx::TensorProto few;
  few.set_name("w");
  few.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {118, 97, 108, 117, 101, 5}) few.add_dims(d);
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f}) few.add_float_data(v);
  onnx::TensorProto big;
  big.set_name("big");
  big.set_data_type(onnx::TensorProto::FLOAT);
  big.add_dims(1024);
  big.add_dims(1024);
  big.set_raw_data(std::string(size_t{4} << 20, '\0'));
  set_memory_limit(size_t{2} << 20);
  Result<Tensor> r = tensor_from_onnx(few, "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_EQ(r.error().where, "tensor 'w'");
  EXPECT_EQ(r.error().what, "has 5 values but shape 118x97x108x117x101x5 needs 73038986280");
  r = tensor_from_onnx(big, "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_EQ(r.error().where, "tensor 'big'");
  EXPECT_NE(r.error().what.find("needs 4.0 MiB"), std::string::npos) << r.error().what;
  EXPECT_NE(r.error().what.find("past the memory limit of 2.0 MiB"), std::string::npos) << r.error().what;
  set_memory_limit(0);
}

TEST(MemoryBudget, ChargesTensorsAndRefusesPastTheLimit) {
  set_memory_limit(size_t{64} << 20);
  size_t before = memory_in_use();
  {
    Tensor t(DType::f32, {1024, 1024});
    EXPECT_GE(memory_in_use(), before + (size_t{4} << 20));
    EXPECT_THROW(Tensor(DType::f32, {1 << 14, 1 << 14}), MemoryLimitExceeded);
    EXPECT_THROW(Tensor(DType::f32, {kHuge, kHuge}), MemoryLimitExceeded);
  }
  EXPECT_EQ(memory_in_use(), before);
  {  // storage left unwritten for its caller to fill: charged and refused alike
    Tensor t = Tensor::for_overwrite(DType::u16, {1024, 1024});
    EXPECT_EQ(t.dtype(), DType::u16);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{1024, 1024}));
    EXPECT_EQ(t.nbytes(), size_t{2} << 20);
    EXPECT_GE(memory_in_use(), before + (size_t{2} << 20));
    EXPECT_THROW(Tensor::for_overwrite(DType::f32, {1 << 14, 1 << 14}), MemoryLimitExceeded);
    EXPECT_THROW(Tensor::for_overwrite(DType::f32, {kHuge, kHuge}), MemoryLimitExceeded);
    EXPECT_THROW(Tensor::for_overwrite(DType::f32, {-1, 4}), MemoryLimitExceeded);
  }
  EXPECT_EQ(memory_in_use(), before);
  set_memory_limit(0);
}

TEST(MemoryBudget, EmptyShapesMustStillHaveStridesThatFit) {
  EXPECT_EQ(shape_numel(std::vector<int64_t>{0, 5}), 0);
  EXPECT_EQ(shape_numel(std::vector<int64_t>{0, kHuge, 4}), -1);
  EXPECT_THROW(Tensor(DType::f32, {0, kHuge, 4}), MemoryLimitExceeded);
  EXPECT_EQ(Tensor(DType::f32, {0, kHuge}).numel(), 0);
}

TEST(MemoryBudget, ChargesLargeHeapBuffers) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "sanitizer builds keep the sanitizer's operator new";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "sanitizer builds keep the sanitizer's operator new";
#endif
#endif
  set_memory_limit(size_t{4} << 20);
  size_t before = memory_in_use();
  {
    std::vector<char> fits(size_t{1} << 20);
    EXPECT_GE(memory_in_use(), before + (size_t{1} << 20));
    EXPECT_THROW(std::vector<double>(size_t{1} << 20), MemoryLimitExceeded);
  }
  EXPECT_EQ(memory_in_use(), before);
  set_memory_limit(0);
}

TEST(MemoryBudget, ParsesSizes) {
  EXPECT_EQ(parse_byte_size("256MiB"), size_t{256} << 20);
  EXPECT_EQ(parse_byte_size("256M"), size_t{256} << 20);
  EXPECT_EQ(parse_byte_size("300MB"), size_t{300'000'000});
  EXPECT_EQ(parse_byte_size("1.5GiB"), size_t{3} << 29);
  EXPECT_EQ(parse_byte_size("4096"), size_t{4096});
  EXPECT_EQ(parse_byte_size("2 KiB"), size_t{2048});
  for (const char* bad : {"", "MiB", "-1G", "1.2.3G", "12Q", "0", "1e30"}) EXPECT_EQ(parse_byte_size(bad), std::nullopt) << bad;
  EXPECT_EQ(format_bytes(812), "812 bytes");
  EXPECT_EQ(format_bytes(size_t{256} << 20), "256 MiB");
  EXPECT_EQ(format_bytes(size_t{3} << 29), "1.5 GiB");
}

// A Loop whose trip count comes from data runs until the caller's subgraph limit.
TEST(HostileSizes, SubgraphRunLimit) {
  auto body = std::make_shared<Graph>();
  ValueId i = body->add_value("i", DType::i64, Shape::of(std::vector<int64_t>{}));
  ValueId c = body->add_value("c", DType::boolean, Shape::of(std::vector<int64_t>{}));
  ValueId co = body->add_value("co", DType::boolean, Shape::of(std::vector<int64_t>{}));
  body->inputs = {i, c};
  body->add_node(node("id", "Identity", {c}, {co}));
  body->outputs = {co};
  Model m;
  Graph& g = m.graph;
  ValueId n = g.add_value("n", DType::i64, Shape::of(std::vector<int64_t>{}));
  ValueId cond = g.add_constant("cond", Tensor::from<bool>({}, {true}));
  g.inputs = {n};
  Node loop = node("loop", "Loop", {n, cond}, {});
  loop.set_attr("body", body);
  ValueId out = g.add_value("out", DType::i64, Shape::unknown_rank());
  g.add_node(node("id", "Identity", {n}, {out}));
  g.add_node(loop);
  g.outputs = {out};
  SessionOptions options;
  options.max_subgraph_runs = 100;
  auto s = Session::create(m, options);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto r = (*s)->run(std::vector<Tensor>{Tensor::from<int64_t>({}, {180'000'000'000})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("more than 100 subgraph executions"), std::string::npos) << r.error().message();
  auto fine = (*s)->run(std::vector<Tensor>{Tensor::from<int64_t>({}, {50})});
  EXPECT_TRUE(fine.ok()) << fine.error().message();
}

// fuzz_run finding: a GridSample whose grid has another batch than X read past X's rows.
// The batches must agree when both are known, and at run time when they are not; an X with an
// empty spatial dim has nothing to sample from.
TEST(HostileSizes, GridSampleBatchesAndEmptyImages) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, sym_dims({Dim::known(1), Dim::known(1), Dim::known(2), Dim::known(2)}));
  ValueId grid = g.add_value("grid", DType::f32, sym_dims({Dim::known(3), Dim::known(2), Dim::known(2), Dim::known(2)}));
  ValueId y = g.add_value("y", DType::f32, Shape::unknown_rank());
  g.inputs = {x, grid};
  g.add_node(node("gs", "GridSample", {x, grid}, {y}));
  g.outputs = {y};
  expect_load_rejected(m, "grid has batch 3 but X has 1");

  g.value(x).shape = sym_dims({Dim::sym("n"), Dim::known(1), Dim::sym("h"), Dim::sym("w")});
  g.value(grid).shape = sym_dims({Dim::sym("m"), Dim::known(2), Dim::known(2), Dim::known(2)});
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  std::vector<float> grid_values(3 * 2 * 2 * 2, 0.5f);
  auto r = (*s)->run(std::vector<Tensor>{Tensor::from<float>({1, 1, 2, 2}, {1, 2, 3, 4}),
                                         Tensor::from<float>({3, 2, 2, 2}, grid_values)});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::user) << r.error().message();
  auto empty = (*s)->run(std::vector<Tensor>{Tensor::from<float>({1, 1, 0, 2}, {}),
                                             Tensor::from<float>({1, 2, 2, 2}, std::vector<float>(8, 0.5f))});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message().find("has an empty spatial dim"), std::string::npos) << empty.error().message();
  auto fine = (*s)->run(std::vector<Tensor>{Tensor::from<float>({1, 1, 2, 2}, {1, 2, 3, 4}),
                                            Tensor::from<float>({1, 2, 2, 2}, std::vector<float>(8, 0.5f))});
  EXPECT_TRUE(fine.ok()) << fine.error().message();
}

// fuzz_run finding: a Slice step near 2^63 on an axis it takes one element of overflowed in
// the input stride times the step, a stride never used.
TEST(HostileSizes, SliceStepOfOneElementNearInt64) {
  Model m;
  Graph& g = m.graph;
  ValueId x = g.add_value("x", DType::f32, sym_dims({Dim::sym("n"), Dim::sym("c")}));
  ValueId starts = g.add_value("starts", DType::i64, sym_dims({Dim::known(2)}));
  ValueId ends = g.add_value("ends", DType::i64, sym_dims({Dim::known(2)}));
  ValueId axes = g.add_constant("axes", Tensor::from<int64_t>({2}, {0, 1}));
  ValueId steps = g.add_value("steps", DType::i64, sym_dims({Dim::known(2)}));
  ValueId y = g.add_value("y", DType::f32, Shape::unknown_rank());
  g.inputs = {x, starts, ends, steps};
  g.add_node(node("slice", "Slice", {x, starts, ends, axes, steps}, {y}));
  g.outputs = {y};
  auto s = Session::create(m);
  ASSERT_TRUE(s.ok()) << s.error().message();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto r = (*s)->run(std::vector<Tensor>{Tensor::from<float>({3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}),
                                         Tensor::from<int64_t>({2}, {1, 3}), Tensor::from<int64_t>({2}, {kMax, -kMax}),
                                         Tensor::from<int64_t>({2}, {kMax - 7, -(kMax - 7)})});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)[0].shape(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ((*r)[0].data<float>()[0], 7.f);
}

TEST(Errors, MessagesStayOneShortLine) {
  Error e = user_error("node '" + std::string(100'000, 'n') + "'", "bad\nvalue");
  std::string msg = e.message();
  EXPECT_LT(msg.size(), 1000u);
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_NE(msg.find("bad\\x0avalue"), std::string::npos) << msg;
  EXPECT_NE(msg.find("characters ...]"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kiln
