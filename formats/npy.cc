// .npy reading and writing, and reading whole files. The .npy layout is numpy's own description
// (numpy/lib/format.py): magic "\x93NUMPY", major and minor version bytes, a little-endian
// header length (2 bytes in 1.0, 4 bytes in 2.0 and 3.0), then a Python dict literal with the
// keys 'descr', 'fortran_order' and 'shape', padded to 64 bytes, then the raw data. The reader
// takes the bytes from a stream whose size is known up front (a buffer, a file, a zip member:
// formats/npz.cc), checks every size in the header against it and then reads the data straight
// into the tensor.
#include "formats/npy.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <optional>

#include "formats/atomic_file.h"
#include "formats/memory.h"
#include "formats/npy_stream.h"

namespace kiln {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kHeaderAlign = 64;
constexpr size_t kGrowthAxisMaxDigits = 21;  // numpy's spare room for the first dim to grow

using npy_detail::file_error;

// ---- the header dict ------------------------------------------------------------------------

// A Python literal as numpy writes it in the header: str, bool, int, tuple or list.
struct PyValue {
  enum class Kind { str, boolean, integer, tuple, list } kind = Kind::str;
  std::string str;
  bool boolean = false;
  int64_t integer = 0;
  bool too_big = false;  // an integer beyond int64 (its digits are kept in `str`)
  std::vector<PyValue> items;
};

class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : t_(text) {}

  // Parses "{key: value, ...}" into (key, value) pairs.
  Result<std::vector<std::pair<std::string, PyValue>>> parse_dict() {
    std::vector<std::pair<std::string, PyValue>> out;
    skip_space();
    if (!eat('{')) return fail("expected '{'");
    for (;;) {
      skip_space();
      if (eat('}')) break;
      KILN_ASSIGN_OR_RETURN(PyValue key, parse_value());
      if (key.kind != PyValue::Kind::str) return fail("dict keys must be strings");
      skip_space();
      if (!eat(':')) return fail("expected ':' after key '" + key.str + "'");
      KILN_ASSIGN_OR_RETURN(PyValue value, parse_value());
      out.emplace_back(key.str, std::move(value));
      skip_space();
      if (eat('}')) break;
      if (!eat(',')) return fail("expected ',' or '}'");
    }
    skip_space();
    if (pos_ != t_.size()) return fail("unexpected text after the dict");
    return out;
  }

 private:
  Result<PyValue> parse_value() {
    skip_space();
    if (pos_ >= t_.size()) return fail("unexpected end of header");
    char c = t_[pos_];
    PyValue v;
    if (c == '\'' || c == '"') {
      ++pos_;
      while (pos_ < t_.size() && t_[pos_] != c) {
        if (t_[pos_] == '\\') return fail("escapes in strings are not supported");
        v.str += t_[pos_++];
      }
      if (!eat(c)) return fail("unterminated string");
      return v;
    }
    if (c == '(' || c == '[') {
      char close = c == '(' ? ')' : ']';
      v.kind = c == '(' ? PyValue::Kind::tuple : PyValue::Kind::list;
      ++pos_;
      for (;;) {
        skip_space();
        if (eat(close)) break;
        KILN_ASSIGN_OR_RETURN(PyValue item, parse_value());
        v.items.push_back(std::move(item));
        skip_space();
        if (eat(close)) break;
        if (!eat(',')) return fail(std::string("expected ',' or '") + close + "'");
      }
      return v;
    }
    if (t_.substr(pos_, 4) == "True" || t_.substr(pos_, 5) == "False") {
      v.kind = PyValue::Kind::boolean;
      v.boolean = c == 'T';
      pos_ += v.boolean ? 4 : 5;
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::Kind::integer;
      bool negative = eat('-');
      size_t start = pos_;
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
        int digit = t_[pos_] - '0';
        if (v.integer > (std::numeric_limits<int64_t>::max() - digit) / 10) v.too_big = true;
        if (!v.too_big) v.integer = v.integer * 10 + digit;
        ++pos_;
      }
      if (pos_ == start) return fail("expected digits");
      v.str = std::string(negative ? "-" : "") + std::string(t_.substr(start, pos_ - start));
      if (negative) v.integer = -v.integer;
      eat('L');  // Python 2 long literals in old files
      return v;
    }
    return fail(std::string("unexpected character '") + c + "'");
  }

  void skip_space() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Error fail(std::string what) const {
    return user_error("", "malformed .npy header: " + what + " at offset " + std::to_string(pos_) +
                              " of \"" + std::string(t_.substr(0, 120)) + (t_.size() > 120 ? "..." : "") + "\"");
  }

  std::string_view t_;
  size_t pos_ = 0;
};

struct NpyHeader {
  DType dtype = DType::undefined;
  bool swap = false;     // big-endian data
  bool fortran = false;
  std::vector<int64_t> shape;
};

// Maps a numpy type string such as '<f4' to a kiln dtype and byte order.
Status parse_descr(const std::string& descr, NpyHeader& h) {
  auto unsupported = [&](std::string why) {
    return user_error("", "dtype '" + descr + "' is not supported: " + why);
  };
  if (descr.empty()) return user_error("", "malformed .npy header: empty 'descr'");
  size_t i = 0;
  char order = '=';
  if (std::strchr("<>|=", descr[0])) order = descr[i++];
  if (i >= descr.size()) return user_error("", "malformed .npy header: descr '" + descr + "' has no type");
  char kind = descr[i++];
  std::string size_text = descr.substr(i);
  switch (kind) {
    case 'O': return unsupported("object arrays hold pickled python objects");
    case 'U': case 'S': case 'a': return unsupported("string arrays cannot be tensors");
    case 'V': return unsupported("structured and void dtypes cannot be tensors");
    case 'c': return unsupported("complex numbers have no kiln dtype");
    case 'M': case 'm': return unsupported("datetimes have no kiln dtype");
    default: break;
  }
  struct Entry { char kind; const char* size; DType dtype; };
  static constexpr Entry kTable[] = {
      {'f', "2", DType::f16}, {'f', "4", DType::f32}, {'f', "8", DType::f64},
      {'i', "1", DType::i8},  {'i', "2", DType::i16}, {'i', "4", DType::i32}, {'i', "8", DType::i64},
      {'u', "1", DType::u8},  {'u', "2", DType::u16}, {'u', "4", DType::u32}, {'u', "8", DType::u64},
      {'b', "1", DType::boolean},
  };
  for (const Entry& e : kTable) {
    if (e.kind == kind && size_text == e.size) {
      h.dtype = e.dtype;
      h.swap = order == '>' && dtype_size(e.dtype) > 1;
      return Status();
    }
  }
  return unsupported("no kiln dtype matches it");
}

Result<NpyHeader> parse_header(std::string_view text) {
  KILN_ASSIGN_OR_RETURN(auto dict, HeaderParser(text).parse_dict());
  NpyHeader h;
  bool have_descr = false, have_order = false, have_shape = false;
  for (auto& [key, v] : dict) {
    if (key == "descr") {
      if (v.kind == PyValue::Kind::list)
        return user_error("", "structured dtypes (a list of fields in 'descr') are not supported");
      if (v.kind != PyValue::Kind::str) return user_error("", "malformed .npy header: 'descr' is not a string");
      KILN_RETURN_IF_ERROR(parse_descr(v.str, h));
      have_descr = true;
    } else if (key == "fortran_order") {
      if (v.kind != PyValue::Kind::boolean)
        return user_error("", "malformed .npy header: 'fortran_order' is not True or False");
      h.fortran = v.boolean;
      have_order = true;
    } else if (key == "shape") {
      if (v.kind != PyValue::Kind::tuple) return user_error("", "malformed .npy header: 'shape' is not a tuple");
      for (const PyValue& d : v.items) {
        if (d.kind != PyValue::Kind::integer)
          return user_error("", "malformed .npy header: 'shape' holds something other than integers");
        if (d.too_big || d.integer < 0)
          return user_error("", "shape dimension " + d.str + " is out of range");
        h.shape.push_back(d.integer);
      }
      have_shape = true;
    } else {
      return user_error("", "malformed .npy header: unexpected key '" + key + "'");
    }
  }
  if (!have_descr || !have_order || !have_shape)
    return user_error("", std::string("malformed .npy header: missing key '") +
                              (!have_descr ? "descr" : !have_order ? "fortran_order" : "shape") + "'");
  return h;
}

// ---- data layout ------------------------------------------------------------------------------

// Copies Fortran-order (column-major) elements of `elem` bytes into row-major order.
template <size_t N>
void fortran_to_c(const uint8_t* src, uint8_t* dst, const std::vector<int64_t>& shape, int64_t numel) {
  const size_t rank = shape.size();
  std::vector<int64_t> fstride(rank), index(rank, 0);
  int64_t s = 1;
  for (size_t k = 0; k < rank; ++k) {
    fstride[k] = s;
    s *= shape[k];
  }
  int64_t src_off = 0;
  for (int64_t i = 0; i < numel; ++i) {
    std::memcpy(dst + i * N, src + src_off * N, N);
    // Advance the row-major multi-index (last dim fastest), keeping src_off in step.
    for (size_t k = rank; k-- > 0;) {
      if (++index[k] < shape[k]) {
        src_off += fstride[k];
        break;
      }
      src_off -= fstride[k] * (shape[k] - 1);
      index[k] = 0;
    }
  }
}

void byte_swap(uint8_t* p, int64_t numel, size_t elem) {
  for (int64_t i = 0; i < numel; ++i, p += elem) std::reverse(p, p + elem);
}

std::string descr_of(DType t) {
  switch (t) {
    case DType::f32: case DType::bf16: return "<f4";
    case DType::f16: return "<f2";
    case DType::f64: return "<f8";
    case DType::i8: return "|i1";
    case DType::u8: return "|u1";
    case DType::i16: return "<i2";
    case DType::u16: return "<u2";
    case DType::i32: return "<i4";
    case DType::u32: return "<u4";
    case DType::i64: return "<i8";
    case DType::u64: return "<u8";
    case DType::boolean: return "|b1";
    default: return "";
  }
}

std::string base_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The bytes a container declared, read in order; notices a source that ends early or runs on.
class DeclaredReader {
 public:
  DeclaredReader(npy_detail::ByteSource& source, uint64_t size, std::string_view container)
      : source_(source), size_(size), container_(container) {}

  // Reads exactly `n` of the declared bytes.
  Status read(void* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      KILN_ASSIGN_OR_RETURN(size_t k, source_.read(static_cast<uint8_t*>(dst) + got, n - got));
      if (k == 0)
        return user_error("", "the " + container_ + " ends after " + std::to_string(pos_ + got) +
                                  " bytes but declares " + std::to_string(size_));
      got += k;
    }
    pos_ += n;
    return Status();
  }

  // Checks that nothing follows the declared bytes (and lets a zip member check its CRC-32).
  Status expect_end() {
    uint8_t extra;
    KILN_ASSIGN_OR_RETURN(size_t k, source_.read(&extra, 1));
    if (k != 0)
      return user_error("", "the " + container_ + " holds more than the " + std::to_string(size_) +
                                " bytes it declares");
    return Status();
  }

 private:
  npy_detail::ByteSource& source_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string container_;
};

// An allocation for `what` (`bytes` long) that failed: over the memory budget or refused by
// the machine.
Error allocation_error(const std::string& what, size_t bytes, const std::bad_alloc& e) {
  if (const auto* limit = dynamic_cast<const MemoryLimitExceeded*>(&e))
    return user_error("", what + " (" + format_bytes(bytes) + ") does not fit: " + limit->what());
  return user_error("", what + " needs " + format_bytes(bytes) + ": " + kMachineOutOfMemory);
}

// A .npy image already in memory.
class SpanSource final : public npy_detail::ByteSource {
 public:
  explicit SpanSource(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  Result<size_t> read(void* dst, size_t n) override {
    n = std::min(n, bytes_.size() - pos_);
    if (n) std::memcpy(dst, bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

// An open file, read from its current position.
class FileSource final : public npy_detail::ByteSource {
 public:
  explicit FileSource(std::FILE* f) : f_(f) {}
  Result<size_t> read(void* dst, size_t n) override {
    size_t got = std::fread(dst, 1, n, f_);
    if (got < n && std::ferror(f_)) return user_error("", std::string("cannot read: ") + std::strerror(errno));
    return got;
  }

 private:
  std::FILE* f_;
};

// Reads a .npy file opened at its start: streamed into the tensor when it is a regular file,
// read whole first otherwise (a pipe has no size to check the header against).
Result<Tensor> read_npy_opened(std::FILE* f, const std::string& path) {
  std::optional<uint64_t> size = npy_detail::regular_file_size(f);
  if (!size) {
    std::vector<uint8_t> bytes;
    KILN_RETURN_IF_ERROR(npy_detail::read_rest(f, path, bytes));
    return read_npy(bytes, path);
  }
  FileSource source(f);
  auto t = npy_detail::read_npy_stream(source, *size, "file");
  if (!t.ok()) return with_file(t.status(), path);
  return t;
}

}  // namespace

namespace npy_detail {

Error file_error(std::string_view file, std::string where, std::string what) {
  Error e = user_error(std::move(where), std::move(what));
  e.file = std::string(file);
  return e;
}

Result<Tensor> read_npy_stream(ByteSource& source, uint64_t n, std::string_view container) {
  DeclaredReader in(source, n, container);
  const std::string noun(container);
  uint8_t pre[kMagicLen + 2 + 4];
  KILN_RETURN_IF_ERROR(in.read(pre, static_cast<size_t>(std::min<uint64_t>(n, kMagicLen + 4))));
  if (n < kMagicLen || std::memcmp(pre, kMagic, kMagicLen) != 0)
    return user_error("", "not a .npy file: it does not start with the magic bytes \"\\x93NUMPY\"");
  if (n < kMagicLen + 4) return user_error("", "the .npy header is truncated");
  const uint8_t major = pre[6], minor = pre[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    return user_error("", "unsupported .npy format version " + std::to_string(major) + "." +
                              std::to_string(minor) + " (kiln reads 1.0, 2.0 and 3.0)");
  const size_t len_bytes = major == 1 ? 2 : 4;
  const size_t data_off_min = kMagicLen + 2 + len_bytes;
  if (n < data_off_min) return user_error("", "the .npy header is truncated");
  if (len_bytes == 4) KILN_RETURN_IF_ERROR(in.read(pre + kMagicLen + 4, 2));
  uint64_t hlen = 0;
  for (size_t i = 0; i < len_bytes; ++i) hlen |= static_cast<uint64_t>(pre[8 + i]) << (8 * i);
  if (hlen > n - data_off_min)
    return user_error("", "the .npy header length " + std::to_string(hlen) + " runs past the end of the " +
                              std::to_string(n) + "-byte " + noun);

  NpyHeader h;
  {
    // The header length is bounded by the declared size; a hostile member may still declare
    // megabytes of header, which operator new charges against the memory budget.
    std::string text;
    try {
      text.resize(static_cast<size_t>(hlen));
    } catch (const std::bad_alloc& e) {
      return allocation_error("the .npy header", static_cast<size_t>(hlen), e);
    }
    KILN_RETURN_IF_ERROR(in.read(text.data(), text.size()));
    KILN_ASSIGN_OR_RETURN(h, parse_header(text));
  }

  const size_t elem = dtype_size(h.dtype);
  const int64_t numel = shape_numel(h.shape);
  const std::optional<size_t> need = checked_bytes(numel, elem);
  if (!need) return user_error("", "shape (" + shape_str(h.shape) + ") has too many elements");
  const uint64_t have = n - data_off_min - hlen;
  const std::string what = "shape " + shape_str(h.shape) + " of " + std::string(dtype_name(h.dtype));
  if (have < *need)
    return user_error("", "the data is truncated: " + what + " needs " + std::to_string(*need) + " bytes, the " +
                              noun + " has " + std::to_string(have) + " after the header");
  if (have > *need)
    return user_error("", "unexpected " + std::to_string(have - *need) + " bytes after the data of " + what);

  // Only now, with the size known to match the container's, is the tensor allocated.
  const bool transpose = h.fortran && h.shape.size() > 1 && numel > 0;
  Tensor t, fortran;
  try {
    t = Tensor(h.dtype, h.shape);
    if (transpose) fortran = Tensor(h.dtype, h.shape);
  } catch (const std::bad_alloc& e) {
    return allocation_error("the array of " + what, *need, e);
  }
  uint8_t* dst = t.data<uint8_t>();
  KILN_RETURN_IF_ERROR(in.read(transpose ? fortran.data<uint8_t>() : dst, *need));
  KILN_RETURN_IF_ERROR(in.expect_end());
  if (transpose) {
    const uint8_t* src = fortran.data<uint8_t>();
    switch (elem) {
      case 1: fortran_to_c<1>(src, dst, h.shape, numel); break;
      case 2: fortran_to_c<2>(src, dst, h.shape, numel); break;
      case 4: fortran_to_c<4>(src, dst, h.shape, numel); break;
      default: fortran_to_c<8>(src, dst, h.shape, numel); break;
    }
  }
  if (h.swap) byte_swap(dst, numel, elem);
  if (h.dtype == DType::boolean)
    for (int64_t i = 0; i < numel; ++i) dst[i] = dst[i] != 0;
  return t;
}

// numpy's header: the sorted dict, growth padding, spaces and '\n' to a multiple of 64.
std::vector<uint8_t> npy_header(DType dtype, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '" + descr_of(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) dict += ", ";
    dict += std::to_string(shape[i]);
  }
  if (shape.size() == 1) dict += ',';
  dict += "), }";
  if (!shape.empty()) dict.append(kGrowthAxisMaxDigits - std::to_string(shape[0]).size(), ' ');
  size_t hlen = dict.size() + 1;  // with the final '\n'
  uint8_t major = 1;
  size_t len_bytes = 2;
  size_t pad = kHeaderAlign - (kMagicLen + 2 + len_bytes + hlen) % kHeaderAlign;
  if (hlen + pad > 0xFFFF) {
    major = 2;
    len_bytes = 4;
    pad = kHeaderAlign - (kMagicLen + 2 + len_bytes + hlen) % kHeaderAlign;
  }
  uint64_t total = hlen + pad;
  std::vector<uint8_t> out(kMagic, kMagic + kMagicLen);
  out.push_back(major);
  out.push_back(0);
  for (size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<uint8_t>(total >> (8 * i)));
  out.insert(out.end(), dict.begin(), dict.end());
  out.insert(out.end(), pad, ' ');
  out.push_back('\n');
  return out;
}

Tensor npy_storable(const Tensor& t) {
  if (is_int4(t.dtype())) {  // numpy has no 4-bit type: one byte each, as onnx's reference gives them
    Tensor b(t.dtype() == DType::i4 ? DType::i8 : DType::u8, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) b.data<uint8_t>()[i] = static_cast<uint8_t>(int4_at(t.dtype(), t.raw(), i));
    return b;
  }
  if (t.dtype() != DType::bf16) return t;
  Tensor f(DType::f32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) f.data<float>()[i] = static_cast<float>(t.data<bfloat16>()[i]);
  return f;
}

Result<FilePtr> open_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return file_error(path, "", std::string("cannot open: ") + std::strerror(errno));
  return FilePtr(f);
}

std::optional<uint64_t> regular_file_size(std::FILE* f) {
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<uint64_t>(st.st_size);
}

Status read_rest(std::FILE* f, const std::string& path, std::vector<uint8_t>& out) {
  if (std::optional<uint64_t> size = regular_file_size(f)) out.reserve(out.size() + static_cast<size_t>(*size));
  uint8_t buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + got);
  if (std::ferror(f)) return file_error(path, "", std::string("cannot read: ") + std::strerror(errno));
  return Status();
}

}  // namespace npy_detail

Result<Tensor> read_npy(std::span<const uint8_t> bytes, std::string_view file) {
  SpanSource source(bytes);
  auto t = npy_detail::read_npy_stream(source, bytes.size(), "file");
  if (!t.ok()) return with_file(t.status(), std::string(file));
  return t;
}

Result<Tensor> read_npy_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(npy_detail::FilePtr f, npy_detail::open_file(path));
  return read_npy_opened(f.get(), path);
}

std::vector<uint8_t> write_npy(const Tensor& t) {
  Tensor s = npy_detail::npy_storable(t);
  std::vector<uint8_t> out = npy_detail::npy_header(s.dtype(), s.shape());
  auto data = s.bytes();
  const uint8_t* p = reinterpret_cast<const uint8_t*>(data.data());
  out.insert(out.end(), p, p + data.size());
  return out;
}

Status write_npy_file(const std::string& path, const Tensor& t) {
  return write_file_bytes(path, write_npy(t));
}

Result<NamedTensors> read_tensors(std::span<const uint8_t> bytes, std::string_view file,
                                  std::string_view npy_name) {
  if (bytes.size() >= kMagicLen && std::memcmp(bytes.data(), kMagic, kMagicLen) == 0) {
    KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(bytes, file));
    NamedTensors out;
    out.emplace_back(std::string(npy_name), std::move(t));
    return out;
  }
  if (bytes.size() >= 4 && bytes[0] == 'P' && bytes[1] == 'K') return read_npz(bytes, file);
  return file_error(file, "", "not a .npy or .npz file (it starts with neither \"\\x93NUMPY\" nor \"PK\")");
}

Result<NamedTensors> read_tensors_file(const std::string& path) {
  std::string name = base_name(path);
  if (name.ends_with(".npy")) name.resize(name.size() - 4);
  if (auto decoded = percent_decode_file_name(name)) name = *decoded;
  KILN_ASSIGN_OR_RETURN(npy_detail::FilePtr f, npy_detail::open_file(path));
  if (!npy_detail::regular_file_size(f.get())) {  // a pipe: only its bytes can tell
    std::vector<uint8_t> bytes;
    KILN_RETURN_IF_ERROR(npy_detail::read_rest(f.get(), path, bytes));
    return read_tensors(bytes, path, name);
  }
  // A regular file is streamed: the .npy into its tensor, an .npz member by member.
  uint8_t head[kMagicLen] = {};
  const size_t got = std::fread(head, 1, kMagicLen, f.get());
  if (got == kMagicLen && std::memcmp(head, kMagic, kMagicLen) == 0) {
    std::rewind(f.get());
    KILN_ASSIGN_OR_RETURN(Tensor t, read_npy_opened(f.get(), path));
    NamedTensors out;
    out.emplace_back(std::move(name), std::move(t));
    return out;
  }
  if (got >= 4 && head[0] == 'P' && head[1] == 'K') {
    f.reset();
    return read_npz_file(path);
  }
  if (std::ferror(f.get())) return file_error(path, "", std::string("cannot read: ") + std::strerror(errno));
  return file_error(path, "", "not a .npy or .npz file (it starts with neither \"\\x93NUMPY\" nor \"PK\")");
}

std::string percent_encode_file_name(std::string_view name) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    bool safe = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                c == '-' || (c == '.' && i > 0);
    if (safe) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::optional<std::string> percent_decode_file_name(std::string_view encoded) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] != '%') {
      out += encoded[i];
      continue;
    }
    if (i + 2 >= encoded.size()) return std::nullopt;
    int hi = hex(encoded[i + 1]), lo = hex(encoded[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

Result<std::vector<uint8_t>> read_file_bytes(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(npy_detail::FilePtr f, npy_detail::open_file(path));
  std::vector<uint8_t> out;
  KILN_RETURN_IF_ERROR(npy_detail::read_rest(f.get(), path, out));
  return out;
}

Result<std::string> read_file_string(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return file_error(path, "", "is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return file_error(path, "", "cannot open file");
  std::string bytes;
  try {
    // A regular file is read into place at its size: a byte at a time through istreambuf_iterator,
    // the string doubling as it went, BERT-base's 438 MB ONNX file took 0.47 s of its export.
    std::error_code size_ec;
    const uintmax_t size =
        std::filesystem::is_regular_file(path, size_ec) ? std::filesystem::file_size(path, size_ec) : 0;
    if (!size_ec && size > 0) {
      bytes.resize(static_cast<size_t>(size));
      in.read(bytes.data(), static_cast<std::streamsize>(size));
      bytes.resize(static_cast<size_t>(in.gcount()));
      if (in.bad()) return file_error(path, "", "cannot read file: " + std::string(std::strerror(errno ? errno : EIO)));
    }
    // Then the rest: a pipe's bytes, or what the file gained since its size was read.
    if (in) bytes.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const MemoryLimitExceeded& e) {
    return file_error(path, "", std::string("reading it ") + e.what());
  } catch (const std::ios_base::failure& e) {  // a read error (EIO) mid-file
    return file_error(path, "", "cannot read file: " + e.code().message());
  }
  return bytes;
}

Status write_file_bytes(const std::string& path, std::span<const uint8_t> bytes) {
  return write_file_atomic(path, bytes);
}

}  // namespace kiln
