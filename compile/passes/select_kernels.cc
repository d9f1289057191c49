// select_kernels: plans the compiled graph for the target as the runtime will (build_plan, on
// the concrete input shapes specialize_shapes gave) and records the outcome in the model:
// each node's kernel (the runtime then runs that implementation or refuses the model), the
// target with the ISA features the chosen kernels need, and the memory plan. Without concrete
// input shapes there is nothing to choose on: the pass says so and changes nothing.
#include "compile/graph_util.h"
#include "compile/pass.h"
#include "runtime/plan.h"

namespace kiln {

Result<PassResult> select_kernels(Model& model, PassContext& ctx) {
  Graph& g = model.graph;
  std::vector<std::vector<int64_t>> shapes;
  if (auto symbolic = concrete_input_shapes(g, shapes)) return PassResult{false, *symbolic + ": give --input-shape to choose kernels"};
  KILN_ASSIGN_OR_RETURN(ExecutionPlan plan, build_plan(g, shapes, PlanOptions{ctx.target, default_kernels()}));
  CpuFeatures required;
  auto add = [&](const CpuFeatures& f) {
    required.avx2 |= f.avx2;
    required.fma |= f.fma;
    required.avx512f |= f.avx512f;
    required.avx512bw |= f.avx512bw;
    required.avx512vl |= f.avx512vl;
    required.avx512_vnni |= f.avx512_vnni;
    required.avx512_bf16 |= f.avx512_bf16;
    required.avx512_fp16 |= f.avx512_fp16;
    required.amx |= f.amx;
  };
  size_t library = 0;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const PlannedKernel& k = plan.kernels[n];
    g.nodes[n].kernel = KernelChoice{k.name, k.kernel ? k.kernel->params() : std::vector<std::pair<std::string, KernelParam>>{}};
    add(k.needs_isa);
    library += k.name != kReferenceKernel;
  }
  model.target = TargetRecord{ctx.target.device, required.names(), ctx.target.threads};
  MemoryPlanRecord mp;
  mp.input_shapes = shapes;
  mp.arena_bytes = plan.memory.arena_bytes;
  mp.workspace_bytes = plan.workspace_bytes;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (plan.memory.offset[v] >= 0)
      mp.values.push_back({static_cast<ValueId>(v), static_cast<uint64_t>(plan.memory.offset[v]), plan.memory.bytes[v]});
  model.memory_plan = std::move(mp);
  return PassResult{true, count_of(library, "node", "nodes") + " on library or kiln kernels, " +
                              count_of(g.nodes.size() - library, "node", "nodes") + " on reference kernels; arena " +
                              std::to_string(plan.memory.arena_bytes) + " bytes"};
}

}  // namespace kiln
