// A handful of small valid models run on fuzzed input tensors: the bytes choose the model, each
// input's shape (rank <= 4, dims <= 64) and its raw values, so NaN, infinities, negative and
// huge indices, sizes and trip counts all occur. The models are the ops whose output sizes or
// memory come from data (shape operands, Loop trip counts, windows, crops, indices, resampling).
// Runs under a 32 MiB memory budget with a subgraph limit, so a run never hangs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "formats/op_schema.h"
#include "formats/verify.h"
#include "runtime/session.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

using namespace kiln;

struct Spec {
  const char* op;
  std::vector<DType> inputs;  // declared with unknown rank: any shape binds
  int outputs = 1;
  std::vector<Attribute> attrs = {};
};

std::shared_ptr<Graph> loop_body() {
  auto b = std::make_shared<Graph>();
  Shape scalar(std::vector<Dim>{});
  ValueId i = b->add_value("i", DType::i64, scalar);
  ValueId c = b->add_value("c", DType::boolean, scalar);
  ValueId v = b->add_value("v", DType::f32, Shape::unknown_rank());
  ValueId co = b->add_value("co", DType::boolean, scalar);
  ValueId vo = b->add_value("vo", DType::f32, Shape::unknown_rank());
  ValueId so = b->add_value("so", DType::f32, Shape::unknown_rank());
  b->inputs = {i, c, v};
  b->add_node(Node{.name = "cond", .op = "Identity", .inputs = {c}, .outputs = {co}});
  b->add_node(Node{.name = "add", .op = "Add", .inputs = {v, v}, .outputs = {vo}});
  b->add_node(Node{.name = "scan", .op = "Identity", .inputs = {vo}, .outputs = {so}});
  b->outputs = {co, vo, so};
  return b;
}

std::vector<Model> make_models() {
  const DType f = DType::f32, i = DType::i64;
  std::vector<Spec> specs = {
      {"Reshape", {f, i}},
      {"Expand", {f, i}},
      {"Slice", {f, i, i, i, i}},
      {"Pad", {f, i}, 1, {{"mode", std::string("edge")}}},
      {"Pad", {f, i}, 1, {{"mode", std::string("reflect")}}},
      {"Pad", {f, i, f}, 1, {{"mode", std::string("constant")}}},
      {"Tile", {f, i}},
      {"Range", {f, f, f}},
      {"Range", {i, i, i}},
      {"GridSample", {f, f}},
      {"GridSample", {f, f}, 1, {{"mode", std::string("cubic")}, {"padding_mode", std::string("reflection")}}},
      {"Resize", {f, f, f}, 1, {{"mode", std::string("linear")}}},
      {"BlackmanWindow", {i}},
      {"HammingWindow", {i}},
      {"CenterCropPad", {f, i}},
      {"MaxUnpool", {f, i, i}, 1, {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}}},
      {"Gather", {f, i}},
      {"ScatterElements", {f, i, f}},
      {"NonZero", {f}},
      {"TopK", {f, i}, 2},
      {"OneHot", {i, i, f}},
      {"ConstantOfShape", {i}},
      {"Unique", {f}, 4},
      {"Transpose", {f}},
      {"Loop", {i, DType::boolean, f}, 2, {{"body", loop_body()}}},
  };
  std::vector<Model> models;
  for (const Spec& s : specs) {
    Model m;
    Graph& g = m.graph;
    Node n{.name = "n", .op = s.op};
    for (size_t k = 0; k < s.inputs.size(); ++k) {
      ValueId v = g.add_value("in" + std::to_string(k), s.inputs[k], Shape::unknown_rank());
      g.inputs.push_back(v);
      n.inputs.push_back(v);
    }
    for (int k = 0; k < s.outputs; ++k) {
      ValueId v = g.add_value("out" + std::to_string(k), DType::undefined, Shape::unknown_rank());
      n.outputs.push_back(v);
      g.outputs.push_back(v);
    }
    for (const Attribute& a : s.attrs) n.set_attr(a.name, a.value);
    g.add_node(std::move(n));
    // Output dtypes from the op's own inference.
    auto outs = infer_node(g.nodes[0], g);
    if (!outs.ok()) std::abort();
    for (size_t k = 0; k < outs->size(); ++k) g.value(g.nodes[0].outputs[k]).dtype = (*outs)[k].dtype;
    Status ok = verify_model(m);
    if (!ok.ok()) {
      std::fprintf(stderr, "fuzz_run: model %s does not verify: %s\n", s.op, ok.error().message().c_str());
      std::abort();
    }
    models.push_back(std::move(m));
  }
  return models;
}

std::vector<Model>& models() {
  static std::vector<Model> m = make_models();
  return m;
}

/// Reads the fuzz input front to back; past the end it yields zeros.
struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (!n) return 0;
    --n;
    return *p++;
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::init();
  // Smaller than the loaders' budget: outputs up to the limit are zero-filled on every
  // execution, and 256 MiB memsets under ASan would cut the executions per second tenfold.
  kiln::set_memory_limit(size_t{32} << 20);
  (void)models();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::guarded([&] {
    Reader r{data, size};
    const Model& m = models()[r.byte() % models().size()];
    std::vector<Tensor> inputs;
    for (ValueId id : m.graph.inputs) {
      DType dt = m.graph.value(id).dtype;
      std::vector<int64_t> shape(r.byte() % 5);
      for (int64_t& d : shape) d = r.byte() % 65;
      // Index-like inputs are mostly short vectors, as real shape operands are.
      if (dt == DType::i64 && shape.size() > 1 && r.byte() % 2) shape = {static_cast<int64_t>(shape[0] % 9)};
      if (shape_numel(shape) > 4096) shape = {shape_numel(shape) % 4096};
      Tensor t(dt, shape);
      auto* bytes = static_cast<uint8_t*>(t.raw());
      for (size_t b = 0; b < t.nbytes(); ++b) bytes[b] = r.byte();
      // Small values are where the interesting sizes are; mix them in.
      if (dt == DType::i64 && r.byte() % 2)
        for (int64_t e = 0; e < t.numel(); ++e) t.data<int64_t>()[e] = static_cast<int8_t>(bytes[e * 8]);
      if (dt == DType::boolean)
        for (int64_t e = 0; e < t.numel(); ++e) t.data<bool>()[e] = bytes[e] & 1;
      inputs.push_back(std::move(t));
    }
    SessionOptions options;
    options.max_subgraph_runs = 1000;
    auto s = Session::create(m, options);
    kiln::fuzz::check(s);
    if (!s.ok()) return;
    kiln::fuzz::check((*s)->run(inputs));
  });
  return 0;
}
