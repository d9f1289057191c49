// Text form of models (see text.h for the format). Numbers are printed with std::to_chars's
// shortest round-trip form, so the output is the same on every machine and run.
#include "formats/text.h"

#include <zlib.h>

#include <array>
#include <charconv>
#include <cstdio>

namespace kiln {
namespace {

constexpr int64_t kShownElements = 8;

std::string fmt_double(double v) {
  std::array<char, 64> buf{};
  auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}

std::string fmt_float(float v) {
  std::array<char, 64> buf{};
  auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}

std::string quote(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += "\\x";
          out += kHex[u >> 4];
          out += kHex[u & 15];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

/// A name bare when it cannot be confused with the surrounding syntax, else quoted.
std::string name(std::string_view s) {
  if (s.empty()) return "\"\"";
  for (char c : s) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                 c == '.' || c == ':' || c == '/' || c == '-';
    if (!plain) return quote(s);
  }
  return std::string(s);
}

std::string dims_text(const Shape& s) {
  if (!s.rank_known) return "[*]";
  std::string out = "[";
  for (size_t i = 0; i < s.dims.size(); ++i) {
    if (i) out += ",";
    const Dim& d = s.dims[i];
    if (d.is_known()) out += std::to_string(d.value);
    else if (d.is_symbolic()) out += name(d.symbol);
    else out += "?";
  }
  return out + "]";
}

std::string dtype_text(DType t) {
  return dtype_valid(static_cast<uint16_t>(t)) ? std::string(dtype_name(t))
                                               : "dtype" + std::to_string(static_cast<uint16_t>(t));
}

/// dtype, shape, CRC-32 and the first elements of a tensor.
std::string tensor_text(const Tensor& t) {
  if (!t.defined()) return "<no tensor>";
  std::string out = dtype_text(t.dtype()) + dims_text(Shape::of(t.shape()));
  if (!dtype_valid(static_cast<uint16_t>(t.dtype())) || (t.nbytes() > 0 && !t.raw())) return out + " <no data>";
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(t.raw());
  for (size_t done = 0; done < t.nbytes();) {
    // zlib takes 32-bit lengths.
    auto k = static_cast<uInt>(std::min<size_t>(t.nbytes() - done, size_t{1} << 30));
    crc = crc32(crc, p + done, k);
    done += k;
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc));
  out += " crc32=";
  out += hex;
  // Packed storage is not in element order: its placement instead of its first elements.
  if (const PackedLayout* l = t.layout()) return out + " packed=[" + l->str() + "; " + l->packed_for + "]";
  out += " data=[";
  int64_t shown = std::min(t.numel(), kShownElements);
  for (int64_t i = 0; i < shown; ++i) {
    if (i) out += ", ";
    if (t.dtype() == DType::f64) out += fmt_double(t.as_double(i));
    else if (is_float(t.dtype())) out += fmt_float(static_cast<float>(t.as_double(i)));  // shortest f32 form
    else if (t.dtype() == DType::u64) out += std::to_string(t.data<uint64_t>()[i]);
    else if (t.dtype() == DType::boolean) out += std::to_string(t.data<uint8_t>()[i]);  // raw byte: never UB
    else out += std::to_string(t.as_int64(i));
  }
  if (t.numel() > shown) out += ", ...";
  return out + "]";
}

template <class T, class F>
std::string list(const std::vector<T>& v, F&& f) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += f(v[i]);
  }
  return out + "]";
}

std::string attr_value_text(const AttrValue& v) {
  if (const auto* x = std::get_if<int64_t>(&v)) return std::to_string(*x);
  if (const auto* x = std::get_if<double>(&v)) {
    // A float attribute keeps a decimal point or exponent so it never reads as an int.
    std::string s = fmt_double(*x);
    if (s.find_first_of(".en") == std::string::npos) s += ".0";
    return s;
  }
  if (const auto* x = std::get_if<std::string>(&v)) return quote(*x);
  if (const auto* x = std::get_if<std::vector<int64_t>>(&v))
    return "ints" + list(*x, [](int64_t i) { return std::to_string(i); });
  if (const auto* x = std::get_if<std::vector<double>>(&v)) return "floats" + list(*x, fmt_double);
  if (const auto* x = std::get_if<std::vector<std::string>>(&v)) return "strings" + list(*x, quote);
  if (const auto* x = std::get_if<Tensor>(&v)) return "tensor(" + tensor_text(*x) + ")";
  return std::get<std::shared_ptr<Graph>>(v) ? "<graph>" : "<no graph>";
}

class Printer {
 public:
  std::string out;

  void graph(const Graph& g, int indent) {
    line(indent, "graph");
    const int in = indent + 1;
    auto ref = [&](ValueId id) -> std::string {
      if (id == kNoValue) return "_";
      if (id < 0 || static_cast<size_t>(id) >= g.values.size()) return "%" + std::to_string(id) + "?";
      return name(g.value(id).name);
    };
    std::vector<uint8_t> is_input(g.values.size(), 0), is_capture(g.values.size(), 0);
    for (ValueId id : g.inputs)
      if (id >= 0 && static_cast<size_t>(id) < g.values.size()) is_input[static_cast<size_t>(id)] = 1;
    for (ValueId id : g.captures)
      if (id >= 0 && static_cast<size_t>(id) < g.values.size()) is_capture[static_cast<size_t>(id)] = 1;
    // Graph inputs first, in their declared order, then the other values in graph order.
    for (ValueId id : g.inputs) {
      if (id < 0 || static_cast<size_t>(id) >= g.values.size()) line(in, "input " + ref(id));
      else value(g.value(id), "input", in);
    }
    for (size_t i = 0; i < g.values.size(); ++i)
      if (!is_input[i])
        value(g.values[i], g.values[i].is_constant() ? "const" : is_capture[i] ? "capture" : "value", in);
    for (const Node& n : g.nodes) {
      std::string s = "node " + name(n.name) + ": " + (n.domain.empty() ? "" : name(n.domain) + "::") + name(n.op) + "(";
      for (size_t i = 0; i < n.inputs.size(); ++i) s += (i ? ", " : "") + ref(n.inputs[i]);
      s += ") -> (";
      for (size_t i = 0; i < n.outputs.size(); ++i) s += (i ? ", " : "") + ref(n.outputs[i]);
      s += ")";
      for (const Attribute& a : n.attrs) s += " " + name(a.name) + "=" + attr_value_text(a.value);
      if (!n.captures.empty()) s += " captures=" + list(n.captures, ref);
      if (!n.sources.empty()) s += " sources=" + list(n.sources, quote);
      if (!n.kernel.empty() || !n.kernel.params.empty()) s += " kernel=" + kernel_choice_text(n.kernel);
      line(in, s);
      for (const Attribute& a : n.attrs)
        if (const auto* sub = std::get_if<std::shared_ptr<Graph>>(&a.value); sub && *sub) {
          line(in + 1, "attr " + name(a.name) + ":");
          graph(**sub, in + 2);
        }
    }
    for (ValueId id : g.outputs) line(in, "output " + ref(id));
  }

  void line(int indent, const std::string& s) {
    out.append(static_cast<size_t>(indent) * 2, ' ');
    out += s;
    out += '\n';
  }

 private:
  void value(const Value& v, const char* kind, int indent) {
    std::string s = std::string(kind) + " " + name(v.name) + ": " + dtype_text(v.dtype) + dims_text(v.shape);
    if (v.is_constant()) {
      // The shape is already printed; only the data's own dtype/shape if it differs.
      std::string t = tensor_text(v.constant);
      std::string head = dtype_text(v.dtype) + dims_text(v.shape);
      if (t.compare(0, head.size(), head) == 0) t = t.substr(head.size() + 1);
      else t = "tensor=" + t;
      s += " " + t;
    }
    if (v.quant) {
      const QuantParams& q = *v.quant;
      s += " quant=" + dtype_text(q.storage) + " scales=" + list(q.scales, fmt_float) +
           " zero_points=" + list(q.zero_points, [](int64_t z) { return std::to_string(z); });
      if (q.axis >= 0) s += " axis=" + std::to_string(q.axis);
    }
    line(indent, s);
  }
};

}  // namespace

std::string graph_to_text(const Graph& graph, int indent) {
  Printer p;
  p.graph(graph, indent);
  return std::move(p.out);
}

std::string model_to_text(const Model& model) {
  Printer p;
  p.line(0, "model stage=" + std::string(stage_name(model.stage)));
  for (const Provenance& pr : model.provenance)
    p.line(0, "provenance tool=" + quote(pr.tool) + " version=" + quote(pr.version) + " input=" +
                  quote(pr.input_file) + " sha256=" + quote(pr.input_sha256) + " command=" + quote(pr.command));
  for (const auto& [k, v] : model.metadata) p.line(0, "metadata " + quote(k) + " = " + quote(v));
  if (const TargetRecord* t = model.target ? &*model.target : nullptr)
    p.line(0, "target device=" + quote(t->device) + " isa=" + list(t->isa, quote) + " threads=" + std::to_string(t->threads));
  if (const MemoryPlanRecord* mp = model.memory_plan ? &*model.memory_plan : nullptr) {
    std::string shapes;
    for (const auto& dims : mp->input_shapes) shapes += (shapes.empty() ? "" : ", ") + shape_str(dims);
    p.line(0, "memory_plan inputs=[" + shapes + "] arena=" + std::to_string(mp->arena_bytes) +
                  " workspace=" + std::to_string(mp->workspace_bytes) + " values=" + std::to_string(mp->values.size()));
  }
  p.graph(model.graph, 0);
  return std::move(p.out);
}

std::string attribute_text(const AttrValue& value) { return attr_value_text(value); }

std::string kernel_choice_text(const KernelChoice& k) {
  std::string s;
  s += name(k.name) + "{";
  for (size_t i = 0; i < k.params.size(); ++i) {
    const KernelParam& v = k.params[i].second;
    s += (i ? ", " : "") + name(k.params[i].first) + "=";
    if (const auto* n = std::get_if<int64_t>(&v)) s += std::to_string(*n);
    else if (const auto* f = std::get_if<double>(&v)) s += attr_value_text(*f);
    else s += quote(std::get<std::string>(v));
  }
  s += "}";
  return s;
}

}  // namespace kiln
