// The prepack_weights pass (compile/passes/prepack_weights.cc): the weights the chosen kernels
// pack, stored packed in the model (a golden text test, the outputs before and after, the file
// read in place), and on symbolic input shapes, the weights every planned shape's kernels pack
// alike.
#include <gtest/gtest.h>

#include <cstring>

#include "compile/pass.h"
#include "compile/pipeline.h"
#include "formats/serialize.h"
#include "formats/text.h"
#include "runtime/cpu/rows.h"
#include "runtime/session.h"
#include "tests/unit/compile_passes_test_util.h"

namespace kiln {
namespace {

using namespace passes_test;

// A Conv on oneDNN and a MatMul on kiln's GEMM, and a Gather that reads the MatMul's weight too
// (a tied embedding). select_kernels has chosen the kernels.
Model prepack_model() {
  Builder b;
  ValueId x = b.input("x", {1, 3, 6, 8});
  ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({4, 3, 3, 3}, 41))}, "y",
                   {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  ValueId e = b.constant("e", uniform_f32({8, 600}, 42));
  b.output(b.op("mm", "MatMul", {y, e}, "z"));
  b.output(b.op("gather", "Gather", {e, b.constant("ids", Tensor::from<int64_t>({2}, {1, 7}))}, "rows"));
  Model m = b.done();
  run_pass("select_kernels", m);
  return m;
}

TEST(CompilePrepackWeights, Golden) {
  Model m = prepack_model();
  const Tensor plain_w = m.graph.value(m.graph.find_value("w")).constant;
  PassResult r = run_pass("prepack_weights", m);
  EXPECT_TRUE(r.changed);
  EXPECT_EQ(r.summary.rfind("stored 2 weights packed (", 0), 0u) << r.summary;
  EXPECT_NE(r.summary.find(" bytes, 432 bytes of plain weights dropped); 1 weight keeps a plain copy for other readers"), std::string::npos)
      << r.summary;
  // The Conv's weight is packed where it was; the MatMul reads a packed copy of the embedding,
  // which the Gather still reads plain. Value indices do not move.
  const std::string gemm = std::string("kiln.gemm_f32_") + cpu::isa_name(*cpu::best_isa(CpuFeatures::host()));
  EXPECT_EQ(compact(m.graph),
            "graph\n"
            "  input x: f32[1,3,6,8]\n"
            "  const w: f32[4,3,3,3]\n"
            "  value y: f32[1,4,6,8]\n"
            "  const e: f32[8,600]\n"
            "  value z: f32[1,4,6,600]\n"
            "  const ids: i64[2]\n"
            "  value rows: f32[2,600]\n"
            "  const e.packed: f32[8,600]\n"
            "  node conv: Conv(x, w) -> (y) pads=ints[1, 1, 1, 1] sources=[\"conv\"] kernel=onednn.conv{...}\n"
            "  node mm: MatMul(y, e.packed) -> (z) sources=[\"mm\"] kernel=" + gemm + "{...}\n"
            "  node gather: Gather(e, ids) -> (rows) sources=[\"gather\"] kernel=ref{}\n"
            "  output z\n"
            "  output rows\n");
  const Graph& g = m.graph;
  const Tensor& w = g.value(g.find_value("w")).constant;
  ASSERT_TRUE(w.is_packed());
  EXPECT_EQ(w.layout()->packed_for.rfind("onednn 2.", 0), 0u) << w.layout()->packed_for;
  EXPECT_EQ(std::memcmp(unpack(w).raw(), plain_w.raw(), plain_w.nbytes()), 0);
  EXPECT_FALSE(g.value(g.find_value("e")).constant.is_packed());
  ASSERT_TRUE(g.value(g.find_value("e.packed")).constant.is_packed());
  EXPECT_EQ(g.value(g.find_value("e.packed")).constant.layout()->packed_for.rfind("kiln gemm_f32 nr", 0), 0u);
  EXPECT_NE(graph_to_text(g).find(" packed=["), std::string::npos);
}

TEST(CompilePrepackWeights, SameOutputsAndTheFileUsesThemInPlace) {
  Model before = prepack_model(), after = before;
  run_pass("prepack_weights", after);
  const std::vector<Tensor> in = {uniform_f32({1, 3, 6, 8}, 43)};
  // Unpacked for the reference kernels: bit-equal.
  expect_same_outputs(before, after, in, 0);
  // Saved and loaded, on the recorded kernels: the same as before packing.
  auto bytes = serialize_model(after);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message();
  auto loaded = load_model_from_bytes(*bytes, "packed.kiln");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message();
  ASSERT_TRUE(loaded->graph.value(loaded->graph.find_value("w")).constant.is_packed());
  auto s = Session::create(*loaded), s0 = Session::create(before);
  ASSERT_TRUE(s.ok() && s0.ok());
  auto got = (*s)->run(in), want = (*s0)->run(in);
  ASSERT_TRUE(got.ok() && want.ok());
  for (size_t i = 0; i < want->size(); ++i) EXPECT_EQ(std::memcmp((*got)[i].raw(), (*want)[i].raw(), (*want)[i].nbytes()), 0) << i;
  // Both read where they are stored: no form made while planning (oneDNN's weight, used where
  // it lies, is no form of the session's own either).
  EXPECT_EQ((*s)->packed_weight_forms(), 0u);
  // Compiled again: the packed weights come back plain for the passes, and are packed again.
  Model again = *loaded;
  CompileOptions options;
  auto report = compile_model(again, options);
  ASSERT_TRUE(report.ok()) << report.error().message();
  expect_same_outputs(before, again, in, 1e-6);
}

// A batch-symbolic model records no kernels; a weight is stored packed where the kernels
// planned with the batch at 1, 8 and 32 pack it alike, and those shapes' sessions then read it
// where it is stored (nothing packed or unpacked while planning); any batch gives the outputs
// of the model before. Of 3,200 columns, the tile that pads N least (6x64) would take one row
// but one 8x48 tile holds it, so every batch takes 8x48, as a language model's head does.
TEST(CompilePrepackWeights, SymbolicShapesStoreWhatEveryPlannedShapeReads) {
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{256, 192}, {64, 3200}}) {
    SCOPED_TRACE("weight " + std::to_string(k) + "x" + std::to_string(n));
    Builder b;
    ValueId x = b.input("x", Shape({Dim::sym("batch"), Dim::known(k)}));
    b.output(b.op("relu", "Relu", {b.op("mm", "MatMul", {x, b.constant("w", uniform_f32({k, n}, 44))}, "y")}, "out"));
    Model before = b.done(), after = before;
    PassResult r = run_pass("prepack_weights", after);
    const Tensor& w = after.graph.value(after.graph.find_value("w")).constant;
    if (CpuFeatures::host().avx512f) {  // kiln's f32 GEMM at every batch, on 8x48 tiles
      EXPECT_TRUE(r.changed) << r.summary;
      EXPECT_TRUE(w.is_packed()) << r.summary;
      const std::string note = ") for the kernels of every input shape (packed the same way with its symbolic dims at 1, 8 and 32)";
      EXPECT_NE(r.summary.find(note), std::string::npos) << r.summary;
    }
    for (int64_t batch : {1, 3, 8, 32, 50}) {
      SCOPED_TRACE("batch " + std::to_string(batch));
      const std::vector<Tensor> in = {uniform_f32({batch, k}, static_cast<uint32_t>(45 + batch))};
      auto s = Session::create(after), s0 = Session::create(before);
      ASSERT_TRUE(s.ok() && s0.ok());
      auto got = (*s)->run(in), want = (*s0)->run(in);
      ASSERT_TRUE(got.ok() && want.ok()) << (got.ok() ? want.error().message() : got.error().message());
      EXPECT_EQ(std::memcmp((*got)[0].raw(), (*want)[0].raw(), (*want)[0].nbytes()), 0);
      if (w.is_packed() && (batch == 1 || batch == 8 || batch == 32)) {
        EXPECT_EQ((*s)->packed_weight_forms(), 0u);
      }
    }
  }
}

// A compile reads its input where it is mapped; hashing it for the provenance touched every page,
// and a pass that replaces a weight (BatchNorm folded into it) read the old one. Both give those
// pages back to the page cache, so the process holds the new weight alone.
TEST(CompilePipeline, GivesBackTheFilePagesOfReplacedWeights) {
  Builder b;
  ValueId x = b.input("x", {1, 512, 4, 4});
  ValueId y = b.op("conv", "Conv", {x, b.constant("w", uniform_f32({512, 512, 3, 3}, 61))}, "y",
                   {attr("pads", std::vector<int64_t>{1, 1, 1, 1})});
  std::vector<ValueId> bn{y, b.constant("gamma", uniform_f32({512}, 62)), b.constant("beta", uniform_f32({512}, 63)),
                          b.constant("mean", uniform_f32({512}, 64)), b.constant("var", uniform_f32({512}, 65, 0.5f, 1.5f))};
  ValueId z = b.op("bn", "BatchNormalization", bn, "z", {attr("epsilon", 1e-3)});
  // A constant that stays keeps the file mapped.
  b.output(b.op("add", "Add", {z, b.constant("shift", uniform_f32({512, 1, 1}, 66))}, "out"));
  const Model m = b.done();
  const std::string path = ::testing::TempDir() + "kiln_pipeline_pages.kiln";
  ASSERT_TRUE(save_model(m, path).ok());
  auto resident = [] {
    const ModelPageUse use = model_page_use();
    return use.model_files ? use.model_files->resident_bytes : uint64_t{0};
  };
  const uint64_t baseline = resident();  // other models' mapped files, if any are
  // 9.4 MB; reading the graph's metadata maps the file's first 2 MiB page, which holds some of it.
  const size_t weight = 512 * 512 * 9 * sizeof(float);
  {
    std::string sha;
    auto loaded = load_model(path, LoadOptions{.sha256 = &sha});
    ASSERT_TRUE(loaded.ok()) << loaded.error().message();
    if (!model_page_use().model_files) GTEST_SKIP() << "no /proc/self/smaps";
    EXPECT_EQ(sha.size(), 64u);
    EXPECT_LT(resident(), baseline + weight / 2) << "the hashed file's pages stayed";
    const Tensor& w = loaded->graph.value(loaded->graph.find_value("w")).constant;
    volatile float sum = 0;
    for (int64_t i = 0; i < w.numel(); i += 1024) sum = sum + w.data<float>()[i];
    EXPECT_GE(resident(), baseline + weight * 3 / 4) << "reading the weight faults it in";
    CompileOptions options;
    options.passes = {"fold_batchnorm"};
    auto report = compile_model(*loaded, options);
    ASSERT_TRUE(report.ok()) << report.error().message();
    EXPECT_EQ(loaded->graph.find_value("w"), kNoValue);
    ASSERT_TRUE(model_page_use().model_files) << "the file is still mapped";
    EXPECT_LT(resident(), baseline + weight / 2) << "the replaced weight's pages stayed";
  }
  std::remove(path.c_str());
}

TEST(CompilePrepackWeights, NothingToPack) {
  Builder b;
  ValueId x = b.input("x", Shape({Dim::sym("batch"), Dim::known(4)}));
  b.output(b.op("relu", "Relu", {x}, "out"));
  Model m = b.done();
  PassResult r = run_pass("prepack_weights", m);
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(r.summary, "input 'x' has shape batchx4: no kernel packs a constant weight");
  Builder c;
  x = c.input("x", {2, 4});
  c.output(c.op("relu", "Relu", {x}, "out"));
  Model m2 = c.done();
  run_pass("select_kernels", m2);
  r = run_pass("prepack_weights", m2);
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(r.summary, "no kernel packs a constant weight");
}

}  // namespace
}  // namespace kiln
