// The fusion passes as table entries: the exporter patterns to whole ops (patterns.h) and the
// conv / matmul epilogues (fuse_epilogues.h), each reporting what it made.
#include "compile/graph_util.h"
#include "compile/pass.h"
#include "compile/passes/fuse_epilogues.h"
#include "compile/passes/patterns.h"

namespace kiln {

namespace {

Result<PassResult> made(Result<size_t> count, const char* singular, const char* plural) {
  KILN_RETURN_IF_ERROR(count.status());
  if (*count == 0) return PassResult{};
  return PassResult{true, "made " + count_of(*count, singular, plural)};
}

}  // namespace

Result<PassResult> fuse_layer_norm_pass(Model& m, PassContext&) {
  return made(fuse_layer_norm(m.graph), "LayerNormalization", "LayerNormalizations");
}
Result<PassResult> fuse_rms_norm_pass(Model& m, PassContext&) {
  return made(fuse_rms_norm(m.graph), "RMSNormalization", "RMSNormalizations");
}
Result<PassResult> fuse_gelu_pass(Model& m, PassContext&) { return made(fuse_gelu(m.graph), "Gelu", "Gelus"); }
Result<PassResult> fuse_rotary_pass(Model& m, PassContext&) {
  return made(fuse_rotary(m.graph), "RotaryEmbedding", "RotaryEmbeddings");
}
Result<PassResult> fuse_attention_pass(Model& m, PassContext&) {
  return made(fuse_attention(m.graph), "Attention", "Attentions");
}
Result<PassResult> fuse_epilogues_pass(Model& m, PassContext&) {
  KILN_ASSIGN_OR_RETURN(EpilogueFusions f, fuse_epilogues(m.graph));
  if (f.fused == 0) return PassResult{};
  return PassResult{true, "made " + count_of(f.fused, "fused conv/matmul", "fused convs/matmuls") + " absorbing " +
                              count_of(f.absorbed, "node", "nodes")};
}

}  // namespace kiln
