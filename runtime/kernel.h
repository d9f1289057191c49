// Kernels and the kernel registry: per (op, device), an ordered list of implementations, most
// specialised first and the reference kernel last. An implementation may decline a node and
// say why (dtype, layout, ISA); the first that accepts runs it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>
#include <vector>

#include "formats/ir.h"

namespace kiln {

/// Where a kernel runs.
struct Target {
  std::string device = "cpu";
};

/// What a kernel sees while it runs: its node, its inputs, its outputs.
class KernelContext {
 public:
  virtual ~KernelContext() = default;
  virtual const Node& node() const = 0;
  virtual size_t num_inputs() const = 0;
  virtual bool has_input(size_t i) const = 0;
  virtual const Tensor& input(size_t i) const = 0;
  virtual size_t num_outputs() const = 0;
  /// The output buffer, allocated by the executor when the op's inference gave its shape.
  /// Kernels write into it and never replace it with a view of an input: inputs' memory is
  /// reused by the memory plan once their last reader has run. An omitted optional output is
  /// an undefined Tensor. Asking for a requested output the executor could not size (its shape
  /// depends on the data: NonZero, Unique) throws OutputNotAllocated, which the executor
  /// reports as an error about the node: such kernels check output_allocated and use
  /// allocate_output.
  virtual Tensor& output(size_t i) = 0;
  /// Whether the executor allocated output i.
  virtual bool output_allocated(size_t i) const = 0;
  /// Allocates (or replaces) output i with this dtype and shape and returns it.
  virtual Tensor& allocate_output(size_t i, DType dtype, std::vector<int64_t> shape) = 0;
  /// Runs a subgraph (If/Loop/Scan bodies) with these inputs; names it does not define resolve
  /// in the enclosing graphs.
  virtual Result<std::vector<Tensor>> run_subgraph(const Graph& g, std::vector<Tensor> inputs) = 0;

  /// A user error about this node: "node 'x': <what>".
  Error error(std::string what) const { return user_error(node().where(), std::move(what)); }
};

/// Thrown by KernelContext::output for an output the executor could not size ahead; never
/// escapes the executor. A safety net: no kernel ever writes through a null output.
class OutputNotAllocated : public std::runtime_error {
 public:
  explicit OutputNotAllocated(size_t index)
      : std::runtime_error("output " + std::to_string(index) + " was not allocated"), index_(index) {}
  size_t index() const { return index_; }

 private:
  size_t index_;
};

/// A prepared kernel for one node: created once, run many times.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual Status run(KernelContext& ctx) = 0;
};

/// A kernel that is a plain function (the reference kernels).
using KernelFn = Status (*)(KernelContext&);

class FunctionKernel final : public Kernel {
 public:
  explicit FunctionKernel(KernelFn fn) : fn_(fn) {}
  Status run(KernelContext& ctx) override { return fn_(ctx); }

 private:
  KernelFn fn_;
};

/// One implementation of an op on a device.
struct KernelImpl {
  std::string name;  ///< "ref", "onednn.conv", "kiln.gemm_f32_avx512_8x48"
  /// nullopt if it can run the node; otherwise the reason it declines.
  std::function<std::optional<std::string>(const Node&, const Graph&, const Target&)> declines;
  std::function<std::unique_ptr<Kernel>(const Node&, const Graph&, const Target&)> create;
};

class KernelRegistry {
 public:
  /// Appends an implementation: earlier ones are preferred.
  void add(std::string op, std::string device, KernelImpl impl);
  /// Registers a plain-function reference kernel for a core op on the CPU.
  void add_reference(std::string op, KernelFn fn);
  std::span<const KernelImpl> find(std::string_view op, std::string_view device) const;

  /// A kernel for the node: the first implementation that does not decline. The error lists
  /// every implementation tried and its reason.
  Result<std::unique_ptr<Kernel>> select(const Node& node, const Graph& graph, const Target& target,
                                         std::string* chosen_name = nullptr) const;
  /// Every (op, device) that has at least one implementation.
  std::vector<std::pair<std::string, std::string>> keys() const;

 private:
  std::map<std::pair<std::string, std::string>, std::vector<KernelImpl>, std::less<>> impls_;
};

/// The registry with every kernel kiln was built with.
const KernelRegistry& default_kernels();

// Reference kernels, one registration function per op family (runtime/ref/*.cc).
void register_ref_elementwise(KernelRegistry& r);
void register_ref_reduce(KernelRegistry& r);
void register_ref_shape(KernelRegistry& r);
void register_ref_nn(KernelRegistry& r);
void register_ref_quant(KernelRegistry& r);
void register_ref_misc(KernelRegistry& r);
void register_ref_control(KernelRegistry& r);
void register_ref_attention(KernelRegistry& r);
void register_ref_loss(KernelRegistry& r);

}  // namespace kiln
