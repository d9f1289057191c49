// Bytes → `kiln quant --config`'s reader, then the quantizer it configures on a small conv
// graph: whatever the reader accepts must annotate without an error. A reader error must be
// the user's.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "quant/config.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

// x -> Conv(w) -> Relu -> MaxPool -> Gemm(w2): names and op types a config can select.
kiln::Graph small_graph() {
  using namespace kiln;
  Graph g;
  const ValueId x = g.add_value("x", DType::f32, Shape::of(std::vector<int64_t>{1, 2, 4, 4}));
  g.inputs.push_back(x);
  const ValueId w = g.add_constant("w", Tensor(DType::f32, {3, 2, 1, 1}));
  const ValueId c = g.add_value("c", DType::f32), r = g.add_value("r", DType::f32), p = g.add_value("p", DType::f32);
  const ValueId f = g.add_value("f", DType::f32), y = g.add_value("y", DType::f32);
  const ValueId w2 = g.add_constant("w2", Tensor(DType::f32, {12, 5}));
  auto node = [&](const char* name, const char* op, std::vector<ValueId> in, ValueId out) {
    Node n;
    n.name = name;
    n.op = op;
    n.inputs = std::move(in);
    n.outputs = {out};
    return n;
  };
  g.add_node(node("conv", "Conv", {x, w}, c));
  g.add_node(node("relu", "Relu", {c}, r));
  Node pool = node("pool", "MaxPool", {r}, p);
  pool.set_attr("kernel_shape", std::vector<int64_t>{2, 2});
  pool.set_attr("strides", std::vector<int64_t>{2, 2});
  g.add_node(std::move(pool));
  g.add_node(node("flatten", "Flatten", {p}, f));
  g.add_node(node("fc", "Gemm", {f, w2}, y));
  g.outputs.push_back(y);
  return g;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::Graph graph = small_graph();
  kiln::fuzz::guarded([&] {
    auto config = kiln::quant::parse_quantizer_config(std::string_view(reinterpret_cast<const char*>(data), size), "quant.json");
    kiln::fuzz::check(config);
    if (!config.ok()) return;
    for (const kiln::quant::MaybeSetting& fallback :
         {kiln::quant::MaybeSetting{}, kiln::quant::MaybeSetting{kiln::quant::QuantizerSetting{"x86", false}}}) {
      auto quantizer = kiln::quant::configured_quantizer(graph, *config, fallback);
      kiln::quant::Annotations annotations;
      if (!quantizer->annotate(graph, annotations).ok()) std::abort();  // an accepted config always annotates
    }
  });
  return 0;
}
