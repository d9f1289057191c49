// TensorProto conversion, including sanitised external data.
#include "export/onnx_tensor.h"

#include <onnx/onnx_pb.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "formats/memory.h"
#include "formats/npy.h"

namespace kiln {

namespace fs = std::filesystem;

std::optional<DType> dtype_from_onnx(int t) {
  using TP = onnx::TensorProto;
  switch (t) {
    case TP::FLOAT: return DType::f32;
    case TP::UINT8: return DType::u8;
    case TP::INT8: return DType::i8;
    case TP::UINT16: return DType::u16;
    case TP::INT16: return DType::i16;
    case TP::INT32: return DType::i32;
    case TP::INT64: return DType::i64;
    case TP::BOOL: return DType::boolean;
    case TP::FLOAT16: return DType::f16;
    case TP::DOUBLE: return DType::f64;
    case TP::UINT32: return DType::u32;
    case TP::UINT64: return DType::u64;
    case TP::BFLOAT16: return DType::bf16;
    default: return std::nullopt;
  }
}

std::optional<DType> value_dtype_from_onnx(int t) {
  if (t == kOnnxUint4) return DType::u4;
  if (t == kOnnxInt4) return DType::i4;
  return dtype_from_onnx(t);
}

std::string onnx_type_name(int t) {
  static const char* names[] = {"UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64",
                                "STRING", "BOOL", "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64",
                                "COMPLEX128", "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2"};
  if (t >= 0 && t < static_cast<int>(std::size(names))) return names[t];
  return "type " + std::to_string(t);
}

namespace {

std::string where_of(const onnx::TensorProto& t) { return "tensor '" + t.name() + "'"; }

// Reads the bytes an external-data tensor points to, refusing paths that leave model_dir.
Result<std::string> read_external(const onnx::TensorProto& t, const std::string& model_dir) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    try {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = std::stoll(kv.value());
      else if (kv.key() == "length") length = std::stoll(kv.value());
    } catch (const std::exception&) {
      return user_error(where_of(t), "external data " + kv.key() + " '" + kv.value() + "' is not a number");
    }
  }
  if (location.empty()) return user_error(where_of(t), "external data has no location");
  if (model_dir.empty()) return user_error(where_of(t), "external data is not allowed here");
  fs::path rel(location);
  if (rel.is_absolute() || location.find('\\') != std::string::npos)
    return user_error(where_of(t), "external data path '" + location + "' must be relative to the model's folder");
  for (const auto& part : rel)
    if (part == "..") return user_error(where_of(t), "external data path '" + location + "' escapes the model's folder");
  std::error_code ec;
  fs::path base = fs::weakly_canonical(fs::path(model_dir.empty() ? "." : model_dir), ec);
  fs::path full = fs::weakly_canonical(base / rel, ec);
  auto [b, f] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
  if (ec || b != base.end())
    return user_error(where_of(t), "external data path '" + location + "' resolves outside the model's folder");
  if (fs::exists(full, ec) && !fs::is_regular_file(full, ec))  // a folder or a device: no bytes at an offset
    return user_error(where_of(t), "external data path '" + location + "' is not a regular file");
  std::ifstream in(full, std::ios::binary);
  if (!in) return user_error(where_of(t), "cannot open external data file '" + location + "'");
  in.seekg(0, std::ios::end);
  int64_t size = static_cast<int64_t>(in.tellg());
  if (offset < 0 || offset > size)
    return user_error(where_of(t), "external data offset " + std::to_string(offset) + " is past the end of '" +
                                       location + "' (" + std::to_string(size) + " bytes)");
  if (length < 0) length = size - offset;
  if (length > size - offset)
    return user_error(where_of(t), "external data needs " + std::to_string(length) + " bytes at offset " +
                                       std::to_string(offset) + " but '" + location + "' has " +
                                       std::to_string(size) + " bytes");
  std::string data(static_cast<size_t>(length), '\0');
  in.seekg(offset);
  in.read(data.data(), length);
  if (!in) return user_error(where_of(t), "cannot read external data file '" + location + "'");
  return data;
}

template <class Field, class T>
void copy_typed(const Field& field, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      out[i].bits = static_cast<uint16_t>(field.Get(static_cast<int>(i)));
    } else {
      out[i] = static_cast<T>(field.Get(static_cast<int>(i)));
    }
  }
}

}  // namespace

Result<Tensor> tensor_from_onnx(const onnx::TensorProto& t, const std::string& model_dir) {
  auto dtype = value_dtype_from_onnx(t.data_type());
  if (!dtype) return user_error(where_of(t), "data type " + onnx_type_name(t.data_type()) + " is not supported");
  std::vector<int64_t> shape(t.dims().begin(), t.dims().end());
  for (int64_t d : shape)
    if (d < 0) return user_error(where_of(t), "has negative dim " + std::to_string(d));
  int64_t numel = shape_numel(shape);
  const std::optional<size_t> bytes = storage_bytes(*dtype, numel);
  if (!bytes || *bytes > (uint64_t{1} << 40)) return user_error(where_of(t), "shape " + shape_str(shape) + " is too large");
  const size_t nbytes = *bytes;

  const std::string* raw = nullptr;
  std::string external;
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    KILN_ASSIGN_OR_RETURN(external, read_external(t, model_dir));
    raw = &external;
  } else if (t.has_raw_data()) {
    raw = &t.raw_data();
  }
  // The tensor is allocated only once its data is known to fill it (a few bytes can declare a
  // shape of hundreds of GiB), and an allocation past the memory budget names the tensor.
  Tensor out;
  auto allocate = [&]() -> Status {
    try {
      out = Tensor(*dtype, shape);
    } catch (const MemoryLimitExceeded& e) {
      return user_error(where_of(t), e.what());
    }
    return {};
  };
  if (raw) {
    if (raw->size() != nbytes)
      return user_error(where_of(t), "has " + std::to_string(raw->size()) + " bytes of data but " +
                                         std::string(dtype_name(*dtype)) + " " + shape_str(shape) + " needs " +
                                         std::to_string(nbytes));
    KILN_RETURN_IF_ERROR(allocate());
    if (nbytes) std::memcpy(out.raw(), raw->data(), nbytes);
    if (*dtype == DType::boolean)
      for (int64_t i = 0; i < numel; ++i) out.data<uint8_t>()[i] = out.data<uint8_t>()[i] ? 1 : 0;
    return out;
  }
  auto check = [&](int64_t have) -> Status {
    if (have != numel)
      return user_error(where_of(t), "has " + std::to_string(have) + " values but shape " + shape_str(shape) +
                                         " needs " + std::to_string(numel));
    return allocate();
  };
  if (is_int4(*dtype)) {  // int32_data holds the packed bytes, one per element
    if (static_cast<size_t>(t.int32_data_size()) != nbytes)
      return user_error(where_of(t), "has " + std::to_string(t.int32_data_size()) + " packed bytes but shape " +
                                         shape_str(shape) + " needs " + std::to_string(nbytes));
    KILN_RETURN_IF_ERROR(allocate());
    for (size_t i = 0; i < nbytes; ++i) out.data<uint8_t>()[i] = static_cast<uint8_t>(t.int32_data(static_cast<int>(i)));
    return out;
  }
  Status st = visit_dtype(*dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      KILN_RETURN_IF_ERROR(check(t.float_data_size()));
      copy_typed(t.float_data(), out.data<T>(), numel);
    } else if constexpr (std::is_same_v<T, double>) {
      KILN_RETURN_IF_ERROR(check(t.double_data_size()));
      copy_typed(t.double_data(), out.data<T>(), numel);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      KILN_RETURN_IF_ERROR(check(t.int64_data_size()));
      copy_typed(t.int64_data(), out.data<T>(), numel);
    } else if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>) {
      KILN_RETURN_IF_ERROR(check(t.uint64_data_size()));
      copy_typed(t.uint64_data(), out.data<T>(), numel);
    } else if constexpr (std::is_same_v<T, bool>) {
      KILN_RETURN_IF_ERROR(check(t.int32_data_size()));
      T* p = out.data<T>();
      for (int64_t i = 0; i < numel; ++i) p[i] = t.int32_data(static_cast<int>(i)) != 0;
    } else {
      KILN_RETURN_IF_ERROR(check(t.int32_data_size()));
      copy_typed(t.int32_data(), out.data<T>(), numel);
    }
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

Result<std::pair<std::string, Tensor>> read_onnx_tensor_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, read_file_string(path));
  onnx::TensorProto t;
  if (!t.ParseFromString(bytes)) return Error{ErrorKind::user, path, "", "not a serialized ONNX TensorProto"};
  auto r = tensor_from_onnx(t, fs::path(path).parent_path().string());
  if (!r.ok()) {
    r.error().file = path;
    return r.error();
  }
  return std::make_pair(t.name(), std::move(r).value());
}

}  // namespace kiln
