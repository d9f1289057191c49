// Kernel registry.
#include "runtime/kernel.h"

namespace kiln {

void KernelRegistry::add(std::string op, std::string device, KernelImpl impl) {
  impls_[{std::move(op), std::move(device)}].push_back(std::move(impl));
}

void KernelRegistry::add_reference(std::string op, KernelFn fn) {
  add(std::move(op), "cpu",
      KernelImpl{"ref", [](const Node&, const Graph&, const Target&) { return std::optional<std::string>(); },
                 [fn](const Node&, const Graph&, const Target&) -> std::unique_ptr<Kernel> {
                   return std::make_unique<FunctionKernel>(fn);
                 }});
}

std::span<const KernelImpl> KernelRegistry::find(std::string_view op, std::string_view device) const {
  auto it = impls_.find(std::pair<std::string, std::string>(op, device));
  if (it == impls_.end()) return {};
  return it->second;
}

Result<std::unique_ptr<Kernel>> KernelRegistry::select(const Node& node, const Graph& graph,
                                                       const Target& target, std::string* chosen_name) const {
  std::span<const KernelImpl> impls = find(node.qualified_op(), target.device);
  if (impls.empty())
    return user_error(node.where(), "no kernel for op '" + node.qualified_op() + "' on " + target.device);
  std::string reasons;
  for (const KernelImpl& impl : impls) {
    if (auto why = impl.declines(node, graph, target)) {
      reasons += (reasons.empty() ? "" : "; ") + impl.name + ": " + *why;
      continue;
    }
    if (chosen_name) *chosen_name = impl.name;
    return impl.create(node, graph, target);
  }
  return user_error(node.where(), "every kernel for '" + node.qualified_op() + "' declined: " + reasons);
}

std::vector<std::pair<std::string, std::string>> KernelRegistry::keys() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [k, v] : impls_) out.push_back(k);
  return out;
}

const KernelRegistry& default_kernels() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    register_ref_elementwise(r);
    register_ref_reduce(r);
    register_ref_shape(r);
    register_ref_nn(r);
    register_ref_quant(r);
    register_ref_misc(r);
    register_ref_control(r);
    register_ref_attention(r);
    register_ref_loss(r);
    return r;
  }();
  return registry;
}

}  // namespace kiln
