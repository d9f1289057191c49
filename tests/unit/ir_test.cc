// IR basics: shapes, attributes, topological order, dead-node removal, dtype conversions.
#include <gtest/gtest.h>

#include "formats/infer.h"
#include "formats/ir.h"
#include "formats/sha256.h"

namespace kiln {
namespace {

TEST(Shape, PrintsKnownSymbolicAndUnknownDims) {
  Shape s({Dim::sym("batch"), Dim::known(3), Dim::unknown()});
  EXPECT_EQ(s.str(), "batchx3x?");
  EXPECT_FALSE(s.is_concrete());
  EXPECT_EQ(Shape().str(), "*");
  EXPECT_EQ(Shape::of(std::vector<int64_t>{}).str(), "scalar");
}

TEST(Node, AttributesStaySortedAndTyped) {
  Node n;
  n.set_attr("z", int64_t{1});
  n.set_attr("a", std::vector<int64_t>{1, 2});
  n.set_attr("m", 0.5);
  ASSERT_EQ(n.attrs.size(), 3u);
  EXPECT_EQ(n.attrs[0].name, "a");
  EXPECT_EQ(n.attrs[2].name, "z");
  EXPECT_EQ(n.attr_int("z", 7), 1);
  EXPECT_EQ(n.attr_int("m", 7), 7);  // wrong type gives the default
  EXPECT_DOUBLE_EQ(n.attr_float("m", 0), 0.5);
  n.set_attr("z", int64_t{5});
  EXPECT_EQ(n.attr_int("z", 0), 5);
  EXPECT_EQ(n.attrs.size(), 3u);
}

Graph chain_out_of_order() {
  // y = Relu(Relu(x)), nodes stored in reverse order.
  Graph g;
  ValueId x = g.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{2}));
  ValueId t = g.add_value("t", DType::f32);
  ValueId y = g.add_value("y", DType::f32);
  g.inputs = {x};
  g.outputs = {y};
  Node second{.name = "second", .op = "Relu", .inputs = {t}, .outputs = {y}};
  Node first{.name = "first", .op = "Relu", .inputs = {x}, .outputs = {t}};
  g.add_node(second);
  g.add_node(first);
  return g;
}

TEST(Graph, TopoSortOrdersProducersFirst) {
  Graph g = chain_out_of_order();
  ASSERT_TRUE(g.topo_sort().ok());
  EXPECT_EQ(g.nodes[0].name, "first");
  EXPECT_EQ(g.nodes[1].name, "second");
}

TEST(Graph, TopoSortReportsCycles) {
  Graph g = chain_out_of_order();
  g.nodes[1].inputs = {g.find_value("y")};  // first reads second's output: a cycle
  Status s = g.topo_sort();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().what.find("cycle"), std::string::npos);
}

TEST(Graph, RemoveDeadDropsUnusedNodes) {
  Graph g = chain_out_of_order();
  ValueId x = g.find_value("x");
  ValueId dead = g.add_value("dead", DType::f32);
  g.add_node(Node{.name = "unused", .op = "Relu", .inputs = {x}, .outputs = {dead}});
  g.remove_dead();
  EXPECT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.find_value("dead"), kNoValue);
}

TEST(Infer, PropagatesShapesThroughTheGraph) {
  Graph g = chain_out_of_order();
  ASSERT_TRUE(g.topo_sort().ok());
  auto r = infer_graph(g);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(g.value(g.find_value("y")).shape.str(), "2");
}

TEST(DType, HalfAndBfloatRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 3.140625f}) {
    EXPECT_NEAR(static_cast<float>(half(f)), f, std::abs(f) * 1e-3f + 1e-7f) << f;
    EXPECT_NEAR(static_cast<float>(bfloat16(f)), f, std::abs(f) * 1e-2f + 1e-30f) << f;
  }
  EXPECT_EQ(half(1.0f).bits, 0x3c00);
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
}

TEST(Sha256, KnownVectors) {
  // FIPS 180-4's examples (empty, "abc", the two-block message, a million a's), on the SHA
  // extensions where this CPU has them and in the portable code.
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", million(1000000, 'a');
  const std::pair<std::string, std::string> cases[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {two_blocks, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {million, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"}};
  for (const auto& [text, digest] : cases) {
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    EXPECT_EQ(sha256_hex(bytes), digest) << text.size() << " bytes";
    EXPECT_EQ(sha256_hex_portable(bytes), digest) << text.size() << " bytes";
  }
}

TEST(Sha256, BothPathsAgree) {
  // Every length around the 64-byte blocks and the padding's second block, over bytes of every
  // value. (On a CPU without the SHA extensions both are the portable code.)
  std::vector<uint8_t> bytes(4099);
  uint32_t x = 12345;
  for (uint8_t& b : bytes) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  for (size_t n = 0; n < bytes.size(); n += n < 300 ? 1 : 97) {
    const std::span<const uint8_t> some(bytes.data(), n);
    ASSERT_EQ(sha256_hex(some), sha256_hex_portable(some)) << n << " bytes";
  }
}

TEST(Sha256, PiecesHashAsTheirWhole) {
  // Bytes given in pieces of every size around a block, empty ones among them, digest as one.
  std::vector<uint8_t> bytes(20000);
  uint32_t x = 777;
  for (uint8_t& b : bytes) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{63}, size_t{64}, size_t{65}, size_t{128}, size_t{1000}}) {
    for (size_t n : {size_t{0}, size_t{55}, size_t{64}, size_t{119}, size_t{4097}, bytes.size()}) {
      Sha256 sha;
      for (size_t at = 0; at < n; at += piece) {
        sha.update({bytes.data() + at, std::min(piece, n - at)});
        sha.update({});
      }
      ASSERT_EQ(sha.hex(), sha256_hex({bytes.data(), n})) << n << " bytes in pieces of " << piece;
    }
  }
  Sha256 million;
  const std::string a(997, 'a');
  for (size_t at = 0; at < 1000000; at += a.size())
    million.update({reinterpret_cast<const uint8_t*>(a.data()), std::min(a.size(), 1000000 - at)});
  EXPECT_EQ(million.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace kiln
