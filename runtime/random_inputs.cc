// Deterministic random inputs whose integer ranges follow the graph (see random_inputs.h).
#include "runtime/random_inputs.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "formats/op_schema.h"

namespace kiln {
namespace {

constexpr int64_t kDefaultIntHi = 10;
constexpr int64_t kMaskHi = 2;

// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and the same on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform on {-1, -1 + 2^(1-bits), ..., 1 - 2^(1-bits)}: `bits` random bits, exact in any
  /// float type with at least bits - 1 mantissa bits.
  double symmetric(int bits) {
    double u = static_cast<double>(next() >> (64 - bits)) / static_cast<double>(uint64_t{1} << bits);
    return 2.0 * u - 1.0;
  }
  /// Uniform on [0, n) for n > 0 (Lemire's multiply-shift; the tiny bias is irrelevant here).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

// Whether input `slot` of `n` reaches its output 0 unchanged, so bounds on the output's
// values hold for it.
bool is_pass_through(const OpSchema* schema, size_t slot) {
  if (!schema) return false;
  switch (schema->traits.pass_through) {
    case OpTraits::PassThrough::all: return true;
    case OpTraits::PassThrough::first: return slot == 0;
    case OpTraits::PassThrough::none: return false;
  }
  return false;
}

// Narrows `r` by the bound one use implies; returns whether the use said anything.
bool apply_use(const Graph& g, const Node& n, const OpSchema* schema, size_t slot, bool direct,
               std::span<const int64_t> shape, RandomRange& r) {
  if (!schema || !schema->traits.index_bound) return false;
  std::optional<IndexBound> b = schema->traits.index_bound(g, n, slot, direct, shape);
  if (!b) return false;
  if (!b->hi_per_last_axis.empty()) {
    std::vector<int64_t>& per = b->hi_per_last_axis;
    if (!r.hi_per_last_axis.empty())
      for (size_t k = 0; k < per.size() && k < r.hi_per_last_axis.size(); ++k) per[k] = std::min(per[k], r.hi_per_last_axis[k]);
    r.hi_per_last_axis = std::move(per);
    if (r.reason.empty()) r.reason = std::move(b->reason);
    return true;
  }
  if (b->hi < r.hi) {
    r.hi = b->hi;
    r.reason = std::move(b->reason);
  }
  return true;
}

int64_t dtype_max(DType t) {
  switch (t) {
    case DType::i8: return std::numeric_limits<int8_t>::max();
    case DType::u8: return std::numeric_limits<uint8_t>::max();
    case DType::i16: return std::numeric_limits<int16_t>::max();
    case DType::u16: return std::numeric_limits<uint16_t>::max();
    case DType::i32: return std::numeric_limits<int32_t>::max();
    case DType::u32: return std::numeric_limits<uint32_t>::max();
    default: return std::numeric_limits<int64_t>::max();
  }
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

}  // namespace

RandomRange random_input_range(const Graph& g, ValueId input, std::span<const int64_t> shape) {
  RandomRange r;
  const Value& v = g.value(input);
  if (is_float(v.dtype)) {
    r.kind = RandomRange::Kind::uniform_float;
    r.reason = "floats are uniform in [-1, 1)";
    return r;
  }
  if (v.dtype == DType::boolean) {
    r.kind = RandomRange::Kind::boolean;
    r.hi = 2;
    r.reason = "bools are 0 or 1";
    return r;
  }
  r.kind = RandomRange::Kind::integer;
  r.hi = std::numeric_limits<int64_t>::max();  // narrowed by each use that bounds it
  // Walk the uses, following value-preserving ops; `direct` is false once the values moved.
  std::vector<std::pair<ValueId, bool>> work = {{input, true}};
  std::set<ValueId> seen = {input};
  bool found = false;
  while (!work.empty()) {
    auto [value, direct] = work.back();
    work.pop_back();
    for (const Node& n : g.nodes) {
      const OpSchema* schema = core_ops().find(n.domain, n.op);
      for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
        if (n.inputs[slot] != value) continue;
        found = apply_use(g, n, schema, slot, direct, shape, r) || found;
        if (is_pass_through(schema, slot) && !n.outputs.empty() && n.outputs[0] != kNoValue &&
            seen.insert(n.outputs[0]).second)
          work.emplace_back(n.outputs[0], false);
      }
    }
  }
  if (!found) {
    bool mask = v.name.find("mask") != std::string::npos;
    r.hi = mask ? kMaskHi : kDefaultIntHi;
    r.reason = mask ? "an integer mask (by its name): 0 or 1" : "no use bounds it: small values in [0, 10)";
  }
  const int64_t max = dtype_max(v.dtype);
  if (max < std::numeric_limits<int64_t>::max()) r.hi = std::min(r.hi, max + 1);
  for (int64_t& h : r.hi_per_last_axis) h = std::min(h, r.hi);
  // With only per-position bounds, report the widest of them as the overall bound.
  if (!r.hi_per_last_axis.empty())
    r.hi = *std::max_element(r.hi_per_last_axis.begin(), r.hi_per_last_axis.end());
  return r;
}

Tensor random_input(const Graph& g, ValueId input, std::vector<int64_t> shape, uint64_t seed) {
  const DType dtype = g.value(input).dtype;
  RandomRange range = random_input_range(g, input, shape);
  Tensor t(dtype, std::move(shape));
  SplitMix64 rng(seed);
  const int64_t n = t.numel();
  const size_t per = range.hi_per_last_axis.size();
  if (is_int4(dtype)) {  // any of the 16 codes
    for (int64_t i = 0; i < n; ++i) set_int4(t.raw(), i, static_cast<int>(rng.below(16)));
    return t;
  }
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, float>) p[i] = static_cast<float>(rng.symmetric(24));
      else if constexpr (std::is_same_v<T, double>) p[i] = rng.symmetric(53);
      else if constexpr (std::is_same_v<T, half>) p[i] = T(static_cast<float>(rng.symmetric(11)));
      else if constexpr (std::is_same_v<T, bfloat16>) p[i] = T(static_cast<float>(rng.symmetric(8)));
      else if constexpr (std::is_same_v<T, bool>) p[i] = (rng.next() >> 63) != 0;
      else {
        int64_t hi = per ? range.hi_per_last_axis[static_cast<size_t>(i) % per] : range.hi;
        // An empty data dim leaves no valid index; 0 is the least surprising value.
        p[i] = hi > 0 ? static_cast<T>(rng.below(static_cast<uint64_t>(hi))) : T{};
      }
    }
  });
  return t;
}

uint64_t input_seed(uint64_t seed, std::string_view input_name) {
  SplitMix64 mix(seed ^ fnv1a(input_name));
  return mix.next();
}

std::vector<Tensor> random_inputs(const Graph& g, const std::vector<std::vector<int64_t>>& shapes, uint64_t seed) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < g.inputs.size() && k < shapes.size(); ++k) {
    ValueId id = g.inputs[k];
    out.push_back(random_input(g, id, shapes[k], input_seed(seed, g.value(id).name)));
  }
  return out;
}

}  // namespace kiln
