// The in-memory IR: Model → Graph → Node / Value. Values and nodes are referred to by index;
// graphs are kept in topological order once verified. Every field here has a place in
// formats/kiln.fbs, so what later stages add (quantization parameters, fused nodes and their
// sources, kernel choices) survives a save and load.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "formats/dtype.h"
#include "formats/status.h"
#include "formats/tensor.h"

namespace kiln {

struct Graph;

/// The highest rank kiln accepts for any value: real models stay far below it, and a bound
/// keeps a hostile file from declaring shapes of millions of dims.
inline constexpr int64_t kMaxRank = 64;

/// One dimension: a known size, a named symbol ("batch"), or unknown (neither).
struct Dim {
  int64_t value = -1;  ///< >= 0 when known
  std::string symbol;  ///< set when symbolic; empty with value < 0 means unknown

  static Dim known(int64_t v) { return Dim{v, {}}; }
  static Dim sym(std::string s) { return Dim{-1, std::move(s)}; }
  static Dim unknown() { return Dim{}; }
  bool is_known() const { return value >= 0; }
  bool is_symbolic() const { return value < 0 && !symbol.empty(); }
  bool operator==(const Dim&) const = default;
};

/// A shape whose rank may be unknown and whose dims may be symbolic.
struct Shape {
  bool rank_known = false;
  std::vector<Dim> dims;

  Shape() = default;
  explicit Shape(std::vector<Dim> d) : rank_known(true), dims(std::move(d)) {}
  static Shape of(std::span<const int64_t> concrete);
  static Shape unknown_rank() { return Shape(); }

  int64_t rank() const { return rank_known ? static_cast<int64_t>(dims.size()) : -1; }
  /// All dims known (rank 0 included).
  bool is_concrete() const;
  /// The concrete dims; only valid when is_concrete().
  std::vector<int64_t> concrete() const;
  /// "1x3x?x224", "batchx128", "scalar", "*" for unknown rank.
  std::string str() const;
  bool operator==(const Shape&) const = default;
};

/// Quantization parameters of a value: per tensor (axis < 0) or per axis.
struct QuantParams {
  DType storage = DType::undefined;  ///< the quantized type, e.g. u8 or i8
  std::vector<float> scales;         ///< one per tensor, or one per channel along `axis`
  std::vector<int64_t> zero_points;  ///< same count as scales
  int32_t axis = -1;
  bool operator==(const QuantParams&) const = default;
};

/// A typed attribute value. Lists keep their element type even when empty.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<std::string>, Tensor,
                               std::shared_ptr<Graph>>;

enum class AttrType : uint16_t {
  int64 = 1, float64 = 2, string = 3, ints = 4, floats = 5, strings = 6, tensor = 7, graph = 8
};
AttrType attr_type(const AttrValue& v);
std::string_view attr_type_name(AttrType t);

struct Attribute {
  std::string name;
  AttrValue value;
};

/// A kernel parameter: a tile size, a blocking factor, a layout tag, a tuned threshold.
using KernelParam = std::variant<int64_t, double, std::string>;

/// The kernel a compile chose for a node, with its tuning parameters (empty until compile).
struct KernelChoice {
  std::string name;  ///< e.g. "onednn.conv", "kiln.gemm_f32_avx512"
  std::vector<std::pair<std::string, KernelParam>> params;
  bool empty() const { return name.empty(); }
  /// The parameter `key` when it is recorded with type T, else null.
  template <class T>
  const T* param(std::string_view key) const {
    for (const auto& [k, v] : params)
      if (k == key) return std::get_if<T>(&v);
    return nullptr;
  }
  bool operator==(const KernelChoice&) const = default;
};

/// A tensor-valued edge of the graph: a graph input, a node output, or a constant (weight).
struct Value {
  std::string name;
  DType dtype = DType::undefined;
  Shape shape;
  Tensor constant;                   ///< defined() for weights and folded constants
  std::optional<QuantParams> quant;  ///< set once quantization has chosen parameters

  bool is_constant() const { return constant.defined(); }
};

/// Index of a Value in Graph::values; kNoValue marks an omitted optional input.
using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

/// One operation. `domain` is empty for kiln's core op set (docs/ops.md).
struct Node {
  std::string name;
  std::string domain;
  std::string op;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<Attribute> attrs;      ///< kept sorted by name (set_attr does this)
  std::vector<std::string> sources;  ///< names of the source-model nodes this node came from
  KernelChoice kernel;
  /// The values of the enclosing graph that this node's subgraphs read (If/Loop/Scan bodies).
  /// Each subgraph binds them position by position: its `captures[i]` is its stand-in for
  /// `captures[i]` here. Reads are explicit, so renaming a value never breaks a body. (A value
  /// may appear twice after replace_all_uses; each position binds separately.)
  std::vector<ValueId> captures;

  const Attribute* find_attr(std::string_view attr_name) const;
  bool has_attr(std::string_view n) const { return find_attr(n) != nullptr; }
  /// Inserts or replaces, keeping attrs sorted.
  void set_attr(std::string attr_name, AttrValue v);
  void erase_attr(std::string_view attr_name);

  // Typed getters with defaults. A present attribute of another type yields the default;
  // the op's verify step reports wrong types.
  int64_t attr_int(std::string_view n, int64_t def) const;
  double attr_float(std::string_view n, double def) const;
  std::string attr_string(std::string_view n, std::string def) const;
  std::vector<int64_t> attr_ints(std::string_view n, std::vector<int64_t> def = {}) const;
  std::vector<double> attr_floats(std::string_view n, std::vector<double> def = {}) const;
  std::vector<std::string> attr_strings(std::string_view n) const;
  const Tensor* attr_tensor(std::string_view n) const;
  const Graph* attr_graph(std::string_view n) const;

  /// Number of inputs actually given (trailing omitted ones excluded).
  size_t num_inputs() const;
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != kNoValue; }
  /// "node 'conv_3'" for messages.
  std::string where() const;
  /// "Conv" or "custom.domain::Op".
  std::string qualified_op() const;
};

/// Where a value is read: input `slot` of node `node`, or (slot kCaptured) by one of the node's
/// subgraphs through Node::captures.
struct Use {
  static constexpr size_t kCaptured = static_cast<size_t>(-1);
  size_t node;
  size_t slot;
  bool operator==(const Use&) const = default;
};

/// A dataflow graph. Subgraphs (If/Loop/Scan bodies) are Graphs held by attributes; they read
/// values of the enclosing graph through stand-ins listed in `captures` (see Node::captures),
/// never by name.
///
/// Names: find_value is a hash lookup. Values are added with add_value (or appended to
/// `values` directly, which the index picks up on the next lookup) and renamed with
/// rename_value; assigning a Value's name directly can leave the index stale.
struct Graph {
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<ValueId> inputs;   ///< graph inputs (never constants)
  std::vector<ValueId> outputs;
  /// In a subgraph: per entry of the owning node's `captures`, the value of this graph that
  /// stands for it (kNoValue where this body does not read it). A stand-in is neither an
  /// input, a constant nor a node output. Empty in a top-level graph.
  std::vector<ValueId> captures;

  ValueId add_value(Value v);
  /// Adds a value named `name` (made unique if taken) with a dtype and shape.
  ValueId add_value(std::string name, DType dtype, Shape shape = Shape());
  ValueId add_constant(std::string name, Tensor t);
  size_t add_node(Node n);
  /// Index of the first value with this name, or kNoValue.
  ValueId find_value(std::string_view name) const;
  /// A name not used by any value, built from `base`: base itself, or base_1, base_2, ...
  std::string unique_value_name(std::string_view base) const;
  /// Renames a value (the name must be free, or the value's own).
  void rename_value(ValueId id, std::string name);
  /// Index of the node that produces each value (-1 for inputs, constants, unused).
  std::vector<int32_t> producers() const;
  /// Per value, every place it is read, in node order; reads by subgraphs appear once per
  /// owning node, as Use{node, Use::kCaptured}. Graph outputs are not uses.
  std::vector<std::vector<Use>> uses() const;
  /// Makes every reader of `from` read `to` instead: node inputs, node captures (so subgraphs
  /// read `to` through the same stand-ins) and graph outputs.
  void replace_all_uses(ValueId from, ValueId to);
  /// Sorts nodes topologically, keeping the existing order where it is already valid.
  /// Fails (naming a node on the cycle) if the graph has a cycle.
  Status topo_sort();
  /// Drops nodes whose outputs are not needed for the graph outputs, and unreferenced values.
  /// (Subgraph stand-ins are kept: they are referenced by `captures`.)
  void remove_dead();

  const Value& value(ValueId id) const { return values[static_cast<size_t>(id)]; }
  Value& value(ValueId id) { return values[static_cast<size_t>(id)]; }

 private:
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  /// find_value's index: the first value of each name among values[0, indexed_).
  mutable std::unordered_map<std::string, ValueId, NameHash, std::equal_to<>> by_name_;
  mutable size_t indexed_ = 0;
  void reindex() const;
};

/// Turns reads by name into explicit captures, for graphs built the way ONNX writes them
/// (export, .kiln files of schema 1.0, hand-built tests): in every subgraph, a value that is
/// read but not defined there (no input, constant or producing node) stands for the enclosing
/// value of the same name. Sets Node::captures and each body's `captures`, adding stand-ins to
/// intermediate bodies so that nested bodies read through them. Replaces captures already set.
/// Fails naming the value when no enclosing graph defines a name a body reads.
Status resolve_captures(Graph& graph);

/// How far down the pipeline a model is.
enum class Stage : uint16_t { exported = 1, quantized = 2, compiled = 3 };
std::string_view stage_name(Stage s);

/// One transform that produced this model (export, quant, compile): appended, never rewritten.
struct Provenance {
  std::string tool;          ///< "kiln export"
  std::string version;       ///< kiln version
  std::string command;       ///< the command line, arguments joined by spaces
  std::string input_file;    ///< file name (no directories) of the input
  std::string input_sha256;  ///< hex SHA-256 of the input file
  bool operator==(const Provenance&) const = default;
};

/// The most threads kiln's kernels run on, or a model is compiled for: more cores than a CPU
/// kiln runs on has, and few enough that the thread pool can be created (GNU OpenMP crashed
/// the process at 100,000 where the system's thread limit was 96,363).
inline constexpr int32_t kMaxThreads = 1024;

/// The machine a compiled model's kernels were chosen for. Running the model needs every ISA
/// feature listed (the runtime refuses a CPU that lacks one, naming it).
struct TargetRecord {
  std::string device = "cpu";
  std::vector<std::string> isa;  ///< feature names as runtime/target.h spells them ("avx2", "avx512-vnni")
  int32_t threads = 1;           ///< the thread count kernels were chosen and tuned for
  bool operator==(const TargetRecord&) const = default;
};

/// The memory plan compile made for the input shapes it specialised the model to: the arena
/// and each intermediate's place in it, as the runtime lays them out (runtime/plan.h).
struct MemoryPlanRecord {
  struct Placement {
    ValueId value;
    uint64_t offset;  ///< bytes from the arena's start
    uint64_t bytes;
    bool operator==(const Placement&) const = default;
  };
  std::vector<std::vector<int64_t>> input_shapes;  ///< in graph.inputs order
  uint64_t arena_bytes = 0;
  uint64_t workspace_bytes = 0;
  std::vector<Placement> values;
  bool operator==(const MemoryPlanRecord&) const = default;
};

struct Model {
  Stage stage = Stage::exported;
  std::vector<Provenance> provenance;
  std::vector<std::pair<std::string, std::string>> metadata;  ///< sorted key/value strings
  Graph graph;
  std::optional<TargetRecord> target;            ///< compiled models
  std::optional<MemoryPlanRecord> memory_plan;   ///< compiled models with concrete input shapes
};

/// The running kiln version ("0.1.0").
std::string_view kiln_version();

}  // namespace kiln
