// The export driver: parses the ONNX protobuf, builds values for inputs, initializers and
// node outputs, runs each node's converter, infers types and shapes node by node, verifies.
#include "export/exporter.h"

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/onnx_pb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "export/converter.h"
#include "export/onnx_tensor.h"
#include "formats/infer.h"
#include "formats/memory.h"
#include "formats/sha256.h"
#include "formats/verify.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxDim = int64_t{1} << 40;

class Exporter {
 public:
  Exporter(const ExportOptions& options, std::string model_dir) : options_(options), model_dir_(std::move(model_dir)) {}

  /// Converts `proto`, emptying its top graph's initializers as their tensors are made.
  Result<Model> run(onnx::ModelProto& proto);

  static Result<std::shared_ptr<Graph>> convert_subgraph(const onnx::GraphProto& g, void* self) {
    return static_cast<Exporter*>(self)->convert_graph(g, /*top=*/false);
  }

 private:
  struct Scope {
    Graph* graph;
    std::vector<Tensor> known;  // data inferred so far, by ValueId
  };

  Result<std::shared_ptr<Graph>> convert_graph(const onnx::GraphProto& g, bool top);
  Result<ValueId> lookup(Scope& scope, const std::string& name);
  Result<Shape> shape_of(const onnx::TypeProto& type, const std::string& what, DType* dtype);
  Status convert_node(Scope& scope, const onnx::NodeProto& node, size_t index);

  const ExportOptions& options_;
  onnx::GraphProto* top_graph_ = nullptr;  // run()'s, whose initializers go once converted
  std::string model_dir_;
  std::map<std::string, int> opsets_;
  std::vector<Scope*> scopes_;  // enclosing graphs, innermost last
  std::set<std::string> node_names_;
  std::map<std::string, std::vector<std::string>> unsupported_;  // op → node names
};

Result<Shape> Exporter::shape_of(const onnx::TypeProto& type, const std::string& what, DType* dtype) {
  if (!type.has_tensor_type()) {
    std::string kind = type.has_sequence_type() ? "a sequence" : type.has_optional_type() ? "an optional"
                       : type.has_map_type() ? "a map" : type.has_sparse_tensor_type() ? "a sparse tensor" : "untyped";
    return user_error(what, "is " + kind + "; kiln supports tensors only");
  }
  const auto& tt = type.tensor_type();
  auto dt = value_dtype_from_onnx(tt.elem_type());
  if (!dt) return user_error(what, "element type " + onnx_type_name(tt.elem_type()) + " is not supported");
  *dtype = *dt;
  if (!tt.has_shape()) return Shape::unknown_rank();
  std::vector<Dim> dims;
  for (const auto& d : tt.shape().dim()) {
    if (d.has_dim_value()) {
      if (d.dim_value() < 0 || d.dim_value() > kMaxDim)
        return user_error(what, "has dim " + std::to_string(d.dim_value()) + ", which is out of range");
      dims.push_back(Dim::known(d.dim_value()));
    } else if (d.has_dim_param() && !d.dim_param().empty()) {
      dims.push_back(Dim::sym(d.dim_param()));
    } else {
      dims.push_back(Dim::unknown());
    }
  }
  return Shape(std::move(dims));
}

Result<ValueId> Exporter::lookup(Scope& scope, const std::string& name) {
  ValueId id = scope.graph->find_value(name);
  if (id != kNoValue) return id;
  // A subgraph may read a value of an enclosing graph: give it a local value of the same
  // name and type, which resolve_captures turns into an explicit capture.
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    if (*it == &scope) continue;
    ValueId outer = (*it)->graph->find_value(name);
    if (outer == kNoValue) continue;
    const Value& ov = (*it)->graph->value(outer);
    Value v;
    v.name = name;
    v.dtype = ov.dtype;
    v.shape = ov.shape;
    return scope.graph->add_value(std::move(v));
  }
  return user_error("value '" + name + "'", "is used but never defined");
}

Status Exporter::convert_node(Scope& scope, const onnx::NodeProto& node, size_t index) {
  Graph& g = *scope.graph;
  std::string domain = node.domain() == "ai.onnx" ? "" : node.domain();
  std::string name = node.name().empty() ? node.op_type() + "_" + std::to_string(index) : node.name();
  if (!node_names_.insert(name).second) {
    for (int i = 1;; ++i)
      if (node_names_.insert(name + "_" + std::to_string(i)).second) { name += "_" + std::to_string(i); break; }
  }
  auto opset_it = opsets_.find(domain);
  int version = opset_it == opsets_.end() ? 0 : resolve_op_version(domain, node.op_type(), opset_it->second);
  const ConverterEntry* conv = version ? onnx_converters().find(domain, node.op_type(), version) : nullptr;
  std::string qualified = domain.empty() ? node.op_type() : domain + "::" + node.op_type();
  if (!conv) {
    unsupported_[qualified].push_back(name + (version ? " (version " + std::to_string(version) + ")" : ""));
    // Still define the outputs so later nodes convert and every unsupported op is reported.
    for (const std::string& out : node.output())
      if (!out.empty() && g.find_value(out) == kNoValue) g.add_value(out, DType::undefined);
    return {};
  }
  if (std::optional<OnnxArity> arity = onnx_op_arity(domain, node.op_type(), version))
    KILN_RETURN_IF_ERROR(check_onnx_arity(node, *arity, version, "node '" + name + "'"));
  std::vector<ValueId> ins, outs;
  for (const std::string& in : node.input()) {
    if (in.empty()) { ins.push_back(kNoValue); continue; }
    KILN_ASSIGN_OR_RETURN(ValueId id, lookup(scope, in));
    ins.push_back(id);
  }
  for (const std::string& out : node.output()) {
    if (out.empty()) { outs.push_back(kNoValue); continue; }
    ValueId id = g.find_value(out);
    if (id == kNoValue) id = g.add_value(out, DType::undefined);
    else if (g.value(id).is_constant() || std::find(g.inputs.begin(), g.inputs.end(), id) != g.inputs.end())
      return user_error("node '" + name + "'", "output '" + out + "' is already defined");
    outs.push_back(id);
  }
  if (!unsupported_.empty()) return {};  // keep scanning for unsupported ops only
  size_t first_new = g.nodes.size();
  ConvertContext ctx(node, name, version, g, ins, outs, &Exporter::convert_subgraph, this);
  KILN_RETURN_IF_ERROR(conv->fn(ctx));
  for (size_t n = first_new; n < g.nodes.size(); ++n) KILN_RETURN_IF_ERROR(infer_node_into(g, n, scope.known));
  return {};
}

Result<std::shared_ptr<Graph>> Exporter::convert_graph(const onnx::GraphProto& gp, bool top) {
  auto graph = std::make_shared<Graph>();
  Scope scope{graph.get(), {}};
  scopes_.push_back(&scope);
  struct Pop { std::vector<Scope*>& s; ~Pop() { s.pop_back(); } } pop{scopes_};

  std::set<std::string> initializer_names;
  for (int i = 0; i < gp.initializer_size(); ++i) {
    const onnx::TensorProto& init = gp.initializer(i);
    if (!initializer_names.insert(init.name()).second)
      return user_error("initializer '" + init.name() + "'", "is defined twice");
    KILN_ASSIGN_OR_RETURN(Tensor t, tensor_from_onnx(init, model_dir_));
    graph->add_constant(init.name(), std::move(t));
    // Its bytes go now (into a temporary that frees them; clearing keeps a string's capacity):
    // the export holds each weight once, where the parsed model and the graph held two copies.
    if (top && top_graph_) onnx::TensorProto().Swap(top_graph_->mutable_initializer(i));
  }
  if (gp.sparse_initializer_size() > 0) return user_error("", "sparse initializers are not supported");
  for (const auto& in : gp.input()) {
    if (initializer_names.count(in.name())) continue;  // an input with a default: a constant
    DType dt = DType::undefined;
    KILN_ASSIGN_OR_RETURN(Shape shape, shape_of(in.type(), "input '" + in.name() + "'", &dt));
    if (top) {
      if (auto it = options_.input_shapes.find(in.name()); it != options_.input_shapes.end()) shape = it->second;
    }
    if (graph->find_value(in.name()) != kNoValue) return user_error("input '" + in.name() + "'", "is declared twice");
    graph->inputs.push_back(graph->add_value(in.name(), dt, std::move(shape)));
  }
  if (top)
    for (const auto& entry : options_.input_shapes) {
      // Not a structured binding: clang 14 cannot capture those in lambdas.
      const std::string& name = entry.first;
      bool found = std::any_of(gp.input().begin(), gp.input().end(), [&](const auto& i) { return i.name() == name; });
      if (!found) return user_error("input '" + name + "'", "--input-shape names an input the model does not have");
    }
  // Declared intermediate and output types seed inference (and catch contradictions).
  auto declare = [&](const onnx::ValueInfoProto& vi) -> Status {
    if (graph->find_value(vi.name()) != kNoValue || !vi.has_type() || !vi.type().has_tensor_type()) return {};
    DType dt = DType::undefined;
    auto shape = shape_of(vi.type(), "value '" + vi.name() + "'", &dt);
    if (!shape.ok()) return {};  // a declaration kiln cannot read is not needed
    graph->add_value(vi.name(), dt, std::move(shape).value());
    return {};
  };
  for (const auto& vi : gp.value_info()) KILN_RETURN_IF_ERROR(declare(vi));
  for (const auto& vi : gp.output()) {
    if (top && vi.has_type() && !vi.type().has_tensor_type()) {
      DType dt;
      KILN_RETURN_IF_ERROR(shape_of(vi.type(), "output '" + vi.name() + "'", &dt).status());
    }
    KILN_RETURN_IF_ERROR(declare(vi));
  }

  for (int i = 0; i < gp.node_size(); ++i) KILN_RETURN_IF_ERROR(convert_node(scope, gp.node(i), static_cast<size_t>(i)));
  if (!unsupported_.empty()) return graph;

  for (const auto& out : gp.output()) {
    KILN_ASSIGN_OR_RETURN(ValueId id, lookup(scope, out.name()));
    graph->outputs.push_back(id);
  }
  return graph;
}

Result<Model> Exporter::run(onnx::ModelProto& proto) {
  for (const auto& op : proto.opset_import()) {
    std::string domain = op.domain() == "ai.onnx" ? "" : op.domain();
    opsets_[domain] = static_cast<int>(op.version());
  }
  if (proto.ir_version() < 3 && opsets_.empty()) opsets_[""] = 1;
  if (!opsets_.count("")) opsets_[""] = 1;
  if (opsets_[""] > 27)
    return user_error("", "the model imports ONNX opset " + std::to_string(opsets_[""]) + "; kiln supports up to 27");
  if (!proto.has_graph()) return user_error("", "the model has no graph");

  top_graph_ = proto.mutable_graph();
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Graph> graph, convert_graph(proto.graph(), true));
  if (!unsupported_.empty()) {
    std::string what = "unsupported ops: ";
    bool first = true;
    for (const auto& [op, nodes] : unsupported_) {
      what += (first ? "" : ", ") + op + " (" + std::to_string(nodes.size()) + ")";
      if (options_.verbose) {
        what += " [";
        for (size_t i = 0; i < nodes.size(); ++i) what += (i ? ", " : "") + nodes[i];
        what += "]";
      }
        first = false;
    }
    return user_error("", what);
  }
  Model model;
  model.graph = std::move(*graph);
  KILN_RETURN_IF_ERROR(resolve_captures(model.graph));
  KILN_RETURN_IF_ERROR(model.graph.topo_sort());
  model.stage = Stage::exported;
  if (!proto.producer_name().empty()) model.metadata.emplace_back("onnx.producer", proto.producer_name() + (proto.producer_version().empty() ? "" : " " + proto.producer_version()));
  model.metadata.emplace_back("onnx.ir_version", std::to_string(proto.ir_version()));
  for (const auto& [domain, v] : opsets_) model.metadata.emplace_back("onnx.opset." + (domain.empty() ? std::string("ai.onnx") : domain), std::to_string(v));
  if (!proto.graph().name().empty()) model.metadata.emplace_back("onnx.graph_name", proto.graph().name());
  std::sort(model.metadata.begin(), model.metadata.end());
  return model;
}

std::string base_name(const std::string& path) { return fs::path(path).filename().string(); }

}  // namespace

Result<Shape> parse_shape(const std::string& text) {
  std::vector<Dim> dims;
  if (text == "scalar" || text.empty()) return Shape(std::move(dims));
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, 'x')) {
    if (part.empty()) return user_error("", "bad shape '" + text + "': empty dim");
    if (part == "?") { dims.push_back(Dim::unknown()); continue; }
    if (std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      if (part.size() > 12) return user_error("", "bad shape '" + text + "': dim " + part + " is too large");
      dims.push_back(Dim::known(std::stoll(part)));
    } else if (std::isalpha(static_cast<unsigned char>(part[0])) || part[0] == '_') {
      dims.push_back(Dim::sym(part));
    } else {
      return user_error("", "bad shape '" + text + "': dim '" + part + "' is neither a size nor a name");
    }
  }
  if (!text.empty() && text.back() == 'x') return user_error("", "bad shape '" + text + "': empty dim");
  return Shape(std::move(dims));
}

namespace {

// Bytes for the protobuf parser, hashed as they go by: a chunk is hashed when the parser asks for
// the next (less what it backed up, which the next chunk returns again), so a file is read once
// and never held whole.
class HashingInput final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit HashingInput(google::protobuf::io::ZeroCopyInputStream& in) : in_(in) {}
  bool Next(const void** data, int* size) override {
    sha_.update(taken_);
    taken_ = {};
    if (!in_.Next(data, size)) return false;
    taken_ = {static_cast<const uint8_t*>(*data), static_cast<size_t>(*size)};
    return true;
  }
  void BackUp(int count) override {
    in_.BackUp(count);
    taken_ = taken_.first(taken_.size() - static_cast<size_t>(count));
  }
  bool Skip(int count) override {
    const void* data = nullptr;
    for (int size = 0; count > 0; count -= size) {
      if (!Next(&data, &size)) return false;
      if (size > count) BackUp(size - count);
      size = std::min(size, count);
    }
    return true;
  }
  int64_t ByteCount() const override { return in_.ByteCount(); }
  /// The digest of all the bytes: what the parser left is read and hashed too.
  std::string hex() {
    const void* data = nullptr;
    int size = 0;
    while (Next(&data, &size)) {
    }
    sha_.update(taken_);
    taken_ = {};
    return sha_.hex();
  }

 private:
  google::protobuf::io::ZeroCopyInputStream& in_;
  Sha256 sha_;
  std::span<const uint8_t> taken_;
};

constexpr char kOver2GB[] = "the model is over 2 GB; keep its weights in ONNX external data";

// Parses the ONNX model `in` holds (of `file`, which an error names) into `proto`, and its bytes'
// SHA-256 into `sha256`. `read_errno` (null: none) tells of a read that failed.
Status parse_onnx(google::protobuf::io::ZeroCopyInputStream& in, const std::string& file, onnx::ModelProto& proto,
                  std::string& sha256, const std::function<int()>& read_errno = nullptr) {
  auto fail = [&](const std::string& what) -> Status { return Error{ErrorKind::user, file, "", what}; };
  HashingInput input(in);
  bool parsed = false;
  try {
    google::protobuf::io::CodedInputStream stream(&input);
    stream.SetTotalBytesLimit(INT32_MAX);
    parsed = proto.ParseFromCodedStream(&stream) && stream.ConsumedEntireMessage();
  } catch (const MemoryLimitExceeded& e) {
    return fail(std::string("reading it ") + e.what());
  }
  if (read_errno && read_errno() != 0) return fail("cannot read file: " + std::string(std::strerror(read_errno())));
  if (!parsed && input.ByteCount() >= INT32_MAX) return fail(kOver2GB);
  if (!parsed || input.ByteCount() == 0) return fail("not a valid ONNX model (the protobuf does not parse)");
  sha256 = input.hex();
  return {};
}

// The kiln model of a parsed ONNX model, verified, with its provenance (`sha256`: its file's).
Result<Model> export_proto(onnx::ModelProto& proto, std::string sha256, const std::string& display_name,
                           const std::string& model_dir, const ExportOptions& options) {
  auto fail = [&](Error e) -> Result<Model> {
    if (e.file.empty()) e.file = display_name;
    return e;
  };
  Exporter exporter(options, model_dir);
  // An allocation past the memory budget that no converter named (an initializer names itself)
  // is still a user error about this file, never an exception out of the exporter.
  Result<Model> model = [&]() -> Result<Model> {
    try {
      return exporter.run(proto);
    } catch (const MemoryLimitExceeded& e) {
      return user_error("", e.what());
    }
  }();
  if (!model.ok()) return fail(model.error());
  Status v = verify_model(*model);
  if (!v.ok()) return fail(v.error());
  Provenance p;
  p.tool = "kiln export";
  p.version = std::string(kiln_version());
  p.command = options.command_line;
  p.input_file = base_name(display_name);
  p.input_sha256 = std::move(sha256);
  model->provenance.push_back(std::move(p));
  return model;
}

}  // namespace

Result<Model> export_onnx_bytes(const std::string& bytes, const std::string& display_name,
                                const std::string& model_dir, const ExportOptions& options) {
  if (bytes.size() >= INT32_MAX) return Error{ErrorKind::user, display_name, "", kOver2GB};
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  onnx::ModelProto proto;
  std::string sha256;
  KILN_RETURN_IF_ERROR(parse_onnx(in, display_name, proto, sha256));
  return export_proto(proto, std::move(sha256), display_name, model_dir, options);
}

Result<Model> export_onnx_fd(int fd, const std::string& display_name, const std::string& model_dir,
                             const ExportOptions& options) {
  auto fail = [&](const std::string& what) -> Status { return Error{ErrorKind::user, display_name, "", what}; };
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail("cannot read file: " + std::string(std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) return fail("is a directory, expected a file");
  if (S_ISREG(st.st_mode) && st.st_size >= INT32_MAX) return fail(kOver2GB);
  // Parsed as it is read, never held whole: BERT-base's 438 MB export peaked at twice that
  // reading the file into memory first, from a pipe at three times.
  google::protobuf::io::FileInputStream in(fd, 1 << 20);
  onnx::ModelProto proto;
  std::string sha256;
  KILN_RETURN_IF_ERROR(parse_onnx(in, display_name, proto, sha256, [&] { return in.GetErrno(); }));
  return export_proto(proto, std::move(sha256), display_name, model_dir, options);
}

Result<Model> export_onnx(const std::string& path, const ExportOptions& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error{ErrorKind::user, path, "", "cannot open file"};
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::string dir = fs::path(path).parent_path().string();
  return export_onnx_fd(fd, path, dir.empty() ? "." : dir, options);
}

std::vector<std::string> supported_onnx_ops() {
  std::vector<std::string> out;
  for (const ConverterEntry& e : onnx_converters().entries()) {
    std::string name = e.domain.empty() ? e.op : e.domain + "::" + e.op;
    std::span<const int> versions = onnx_op_versions(e.domain, e.op);
    int hi = e.max_version;
    if (!versions.empty()) hi = std::min(hi, versions.back());
    std::string range = e.min_version == hi ? std::to_string(hi) : std::to_string(e.min_version) + "-" + std::to_string(hi);
    if (!out.empty() && out.back().rfind(name + " ", 0) == 0) out.back() += ", " + range;
    else out.push_back(name + " " + range);
  }
  return out;
}

}  // namespace kiln
