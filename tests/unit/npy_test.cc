// .npy / .npz reading and writing: files numpy wrote (tests/data/npy, made by
// tests/data/make_npy_fixtures.py), round trips of every dtype, byte-identical output to
// np.save, reproducible .npz output, streaming .npz members from a file, and the catalogue of
// malformed files and archives the reader must reject.
#include "formats/npy.h"

#include <gtest/gtest.h>

#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <string>

#include "formats/memory.h"
#include "tests/unit/proc_self_test_util.h"

namespace kiln {
namespace {

const std::string kDir = std::string(KILN_SOURCE_DIR) + "/tests/data/npy/";

std::vector<uint8_t> fixture_bytes(const std::string& name) {
  auto bytes = read_file_bytes(kDir + name);
  EXPECT_TRUE(bytes.ok()) << bytes.error().message();
  return bytes.ok() ? bytes.value() : std::vector<uint8_t>{};
}

Tensor fixture(const std::string& name) {
  auto t = read_npy_file(kDir + name);
  EXPECT_TRUE(t.ok()) << name << ": " << t.error().message();
  return t.ok() ? t.value() : Tensor();
}

// The values make_npy_fixtures.py writes for each dtype, as doubles (exact for all but the
// 64-bit integer extremes, which are checked separately).
std::vector<double> expected_values(DType t) {
  switch (t) {
    case DType::f32: case DType::f16: return {0, 1.5, -2.25, 3, -4.5, 0.125};
    case DType::f64: return {0, 1.5, -2.25, 3, -4.5, 1e300};
    case DType::i8: return {0, 1, -2, 3, -128, 127};
    case DType::u8: return {0, 1, 2, 3, 128, 255};
    case DType::i16: return {0, 1, -2, 3, -32768, 32767};
    case DType::u16: return {0, 1, 2, 3, 32768, 65535};
    case DType::i32: return {0, 1, -2, 3, -2147483648.0, 2147483647.0};
    case DType::u32: return {0, 1, 2, 3, 2147483648.0, 4294967295.0};
    case DType::boolean: return {1, 0, 1, 1, 0, 0};
    default: return {};
  }
}

// Fails the test (returning the error) unless `r` failed with a user error containing `text`.
template <class T>
Error expect_user_error(const Result<T>& r, const std::string& text) {
  EXPECT_FALSE(r.ok()) << "expected an error containing: " << text;
  if (r.ok()) return Error{};
  EXPECT_EQ(r.error().kind, ErrorKind::user);
  EXPECT_NE(r.error().message().find(text), std::string::npos) << r.error().message();
  return r.error();
}

std::vector<uint8_t> npy_with_header(const std::string& dict, size_t data_bytes, uint8_t major = 1) {
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', major, 0};
  std::string header = dict + "\n";
  out.push_back(static_cast<uint8_t>(header.size()));
  out.push_back(static_cast<uint8_t>(header.size() >> 8));
  if (major != 1) out.insert(out.end(), {0, 0});
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data_bytes, 0x01);
  return out;
}

TEST(NpyRead, EveryDtypeWrittenByNumpy) {
  for (const char* name : {"f32", "f16", "f64", "i8", "u8", "i16", "u16", "i32", "u32", "bool"}) {
    SCOPED_TRACE(name);
    Tensor t = fixture(std::string(name) + ".npy");
    ASSERT_EQ(t.dtype(), *dtype_from_name(name));
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
    std::vector<double> want = expected_values(t.dtype());
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(t.as_double(i), want[static_cast<size_t>(i)]) << "element " << i;
  }
  Tensor i64 = fixture("i64.npy");
  ASSERT_EQ(i64.dtype(), DType::i64);
  EXPECT_EQ(i64.data<int64_t>()[2], -2);
  EXPECT_EQ(i64.data<int64_t>()[4], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(i64.data<int64_t>()[5], std::numeric_limits<int64_t>::max());
  Tensor u64 = fixture("u64.npy");
  ASSERT_EQ(u64.dtype(), DType::u64);
  EXPECT_EQ(u64.data<uint64_t>()[4], uint64_t{1} << 63);
  EXPECT_EQ(u64.data<uint64_t>()[5], std::numeric_limits<uint64_t>::max());
}

TEST(NpyRead, BigEndianIsByteSwapped) {
  for (const char* name : {"f32", "f16", "f64", "i64", "u16", "i32"}) {
    SCOPED_TRACE(name);
    Tensor le = fixture(std::string(name) + ".npy");
    Tensor be = fixture(std::string("be_") + name + ".npy");
    ASSERT_EQ(be.dtype(), le.dtype());
    ASSERT_EQ(be.shape(), le.shape());
    EXPECT_EQ(std::memcmp(be.raw(), le.raw(), le.nbytes()), 0);
  }
}

TEST(NpyRead, FortranOrderBecomesRowMajor) {
  for (const char* name : {"fortran_f32.npy", "fortran_i16.npy", "fortran_be_i32.npy"}) {
    SCOPED_TRACE(name);
    Tensor t = fixture(name);
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{2, 3, 4}));
    int64_t idx = 0;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) EXPECT_EQ(t.as_double(idx++), 100 * i + 10 * j + k);
  }
}

TEST(NpyRead, ScalarEmptyAndVector) {
  Tensor s = fixture("scalar_f64.npy");
  EXPECT_EQ(s.dtype(), DType::f64);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.as_double(0), 2.5);
  Tensor e = fixture("empty_0x3_f32.npy");
  EXPECT_EQ(e.shape(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(e.numel(), 0);
  Tensor e2 = fixture("empty_3x0_i64.npy");
  EXPECT_EQ(e2.shape(), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(e2.dtype(), DType::i64);
  Tensor v = fixture("vector_i32.npy");
  EXPECT_EQ(v.to_int64_vector(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(NpyRead, FormatVersions2And3) {
  for (const char* name : {"v2_f32.npy", "v3_f32.npy"}) {
    Tensor t = fixture(name);
    ASSERT_EQ(t.shape(), (std::vector<int64_t>{3}));
    EXPECT_EQ(t.data<float>()[1], -2.0f);
    EXPECT_EQ(t.data<float>()[2], 3.5f);
  }
}

TEST(NpyRead, BoolBytesAreNormalised) {
  auto bytes = npy_with_header("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", 0);
  bytes.insert(bytes.end(), {0, 2, 255});
  auto t = read_npy(bytes, "b.npy");
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->to_int64_vector(), (std::vector<int64_t>{0, 1, 1}));
}

TEST(NpyWrite, MatchesNumpySaveByteForByte) {
  for (const char* name : {"f32.npy", "f16.npy", "f64.npy", "i8.npy", "u8.npy", "i16.npy", "u16.npy",
                           "i32.npy", "u32.npy", "i64.npy", "u64.npy", "bool.npy", "scalar_f64.npy",
                           "empty_0x3_f32.npy", "empty_3x0_i64.npy", "vector_i32.npy"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(write_npy(fixture(name)), fixture_bytes(name));
  }
}

TEST(NpyWrite, HeaderIsPaddedTo64Bytes) {
  for (int rank = 0; rank < 12; ++rank) {
    std::vector<int64_t> shape(static_cast<size_t>(rank), 1);
    std::vector<uint8_t> bytes = write_npy(Tensor(DType::f32, shape));
    size_t hlen = bytes[8] | (bytes[9] << 8);
    EXPECT_EQ((10 + hlen) % 64, 0u) << "rank " << rank;
    EXPECT_EQ(bytes[10 + hlen - 1], '\n');
    EXPECT_EQ(bytes.size(), 10 + hlen + 4);
  }
}

TEST(NpyWrite, RoundTripEveryDtype) {
  for (DType dt : {DType::f32, DType::f16, DType::f64, DType::i8, DType::u8, DType::i16, DType::u16,
                   DType::i32, DType::u32, DType::i64, DType::u64, DType::boolean}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor t(dt, {3, 1, 5});
    for (int64_t i = 0; i < t.numel(); ++i) {
      visit_dtype(dt, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, bool>) t.data<T>()[i] = (i * 7) % 3 == 0;
        else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) t.data<T>()[i] = T(static_cast<float>(i) * 0.5f - 3.0f);
        else t.data<T>()[i] = static_cast<T>(std::is_signed_v<T> ? i * 3 - 20 : i * 11);
      });
    }
    auto back = read_npy(write_npy(t), "rt.npy");
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(back->dtype(), dt);
    EXPECT_EQ(back->shape(), t.shape());
    EXPECT_EQ(std::memcmp(back->raw(), t.raw(), t.nbytes()), 0);
  }
}

TEST(NpyWrite, Bf16IsWrittenAsF32) {
  Tensor t(DType::bf16, {4});
  for (int i = 0; i < 4; ++i) t.data<bfloat16>()[i] = bfloat16(static_cast<float>(i) - 1.5f);
  auto back = read_npy(write_npy(t), "bf16.npy");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dtype(), DType::f32);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back->data<float>()[i], static_cast<float>(i) - 1.5f);
}

TEST(NpyWrite, FileRoundTrip) {
  std::string path = ::testing::TempDir() + "kiln_npy_test.npy";
  Tensor t = Tensor::from<int32_t>({3}, {4, -5, 6});
  ASSERT_TRUE(write_npy_file(path, t).ok());
  Tensor back = read_npy_file(path).value();
  EXPECT_EQ(back.to_int64_vector(), (std::vector<int64_t>{4, -5, 6}));
  auto named = read_tensors_file(path);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->at(0).first, "kiln_npy_test");
  std::remove(path.c_str());
}

// ---- rejections ------------------------------------------------------------------------------

TEST(NpyReject, UnsupportedDtypesWrittenByNumpy) {
  Error e = expect_user_error(read_npy_file(kDir + "object.npy"), "dtype '|O' is not supported: object arrays hold pickled python objects");
  EXPECT_EQ(e.file, kDir + "object.npy");
  expect_user_error(read_npy_file(kDir + "unicode.npy"), "dtype '<U2' is not supported: string arrays");
  expect_user_error(read_npy_file(kDir + "structured.npy"), "structured dtypes (a list of fields in 'descr') are not supported");
}

TEST(NpyReject, Catalogue) {
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  ASSERT_TRUE(read_npy(npy_with_header(ok_dict, 8), "x.npy").ok());
  struct Case {
    const char* name;
    std::vector<uint8_t> bytes;
    const char* message;
  };
  std::vector<uint8_t> bad_magic = npy_with_header(ok_dict, 8);
  bad_magic[1] = 'X';
  std::vector<uint8_t> short_header = npy_with_header(ok_dict, 0);
  short_header.resize(40);
  const Case cases[] = {
      {"empty file", {}, "not a .npy file: it does not start with the magic bytes"},
      {"bad magic", bad_magic, "not a .npy file"},
      {"version 4.0", npy_with_header(ok_dict, 8, 4), "unsupported .npy format version 4.0 (kiln reads 1.0, 2.0 and 3.0)"},
      {"header past end", short_header, "the .npy header length 58 runs past the end of the 40-byte file"},
      {"not a dict", npy_with_header("['descr']", 8), "malformed .npy header: expected '{' at offset 0"},
      {"missing shape", npy_with_header("{'descr': '<f4', 'fortran_order': False}", 8), "missing key 'shape'"},
      {"missing colon", npy_with_header("{'descr' '<f4'}", 8), "expected ':' after key 'descr'"},
      {"unterminated", npy_with_header("{'descr': '<f4", 8), "unterminated string"},
      {"extra key", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8), "unexpected key 'x'"},
      {"shape not tuple", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': 2}", 8), "'shape' is not a tuple"},
      {"shape of strings", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': ('a',)}", 8), "'shape' holds something other than integers"},
      {"negative dim", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", 8), "shape dimension -2 is out of range"},
      {"huge dim", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 8), "shape dimension 99999999999999999999 is out of range"},
      {"numel overflow", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)}", 8), "shape (4294967296x4294967296x4294967296) has too many elements"},
      {"bytes overflow", npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,)}", 8), "has too many elements"},
      {"fortran not bool", npy_with_header("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", 8), "'fortran_order' is not True or False"},
      {"complex", npy_with_header("{'descr': '<c8', 'fortran_order': False, 'shape': (2,)}", 16), "dtype '<c8' is not supported: complex numbers"},
      {"datetime", npy_with_header("{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (2,)}", 16), "dtype '<M8[ns]' is not supported: datetimes"},
      {"long double", npy_with_header("{'descr': '<f16', 'fortran_order': False, 'shape': (2,)}", 32), "dtype '<f16' is not supported: no kiln dtype matches it"},
      {"bytes string", npy_with_header("{'descr': '|S3', 'fortran_order': False, 'shape': (2,)}", 6), "dtype '|S3' is not supported: string arrays"},
      {"void", npy_with_header("{'descr': '|V8', 'fortran_order': False, 'shape': (2,)}", 16), "dtype '|V8' is not supported"},
      {"truncated data", npy_with_header(ok_dict, 7), "the data is truncated: shape 2 of f32 needs 8 bytes, the file has 7 after the header"},
      {"trailing data", npy_with_header(ok_dict, 9), "unexpected 1 bytes after the data of shape 2 of f32"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Error e = expect_user_error(read_npy(c.bytes, "bad.npy"), c.message);
    EXPECT_EQ(e.file, "bad.npy");
  }
}

TEST(NpyReject, MissingFile) {
  Error e = expect_user_error(read_npy_file(kDir + "no_such_file.npy"), "cannot open: No such file or directory");
  EXPECT_EQ(e.file, kDir + "no_such_file.npy");
}

// ---- .npz ------------------------------------------------------------------------------------

void check_npz_arrays(const NamedTensors& got) {
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].first, "x");
  EXPECT_EQ(got[0].second.dtype(), DType::f32);
  EXPECT_EQ(got[0].second.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(got[0].second.data<float>()[3], 4.0f);
  EXPECT_EQ(got[1].first, "ids");
  EXPECT_EQ(got[1].second.to_int64_vector(), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(got[2].first, "mask");
  EXPECT_EQ(got[2].second.dtype(), DType::boolean);
  EXPECT_EQ(got[2].second.to_int64_vector(), (std::vector<int64_t>{1, 0}));
}

TEST(NpzRead, WrittenByNumpy) {
  for (const char* name : {"stored.npz", "compressed.npz", "zip64.npz"}) {
    SCOPED_TRACE(name);
    auto got = read_npz_file(kDir + name);  // streamed from the file
    ASSERT_TRUE(got.ok()) << got.error().message();
    check_npz_arrays(got.value());
    auto in_memory = read_npz(fixture_bytes(name), name);
    ASSERT_TRUE(in_memory.ok()) << in_memory.error().message();
    check_npz_arrays(in_memory.value());
  }
  auto pos = read_npz_file(kDir + "positional.npz");
  ASSERT_TRUE(pos.ok()) << pos.error().message();
  ASSERT_EQ(pos->size(), 2u);
  EXPECT_EQ(pos->at(0).first, "arr_0");
  EXPECT_EQ(pos->at(0).second.dtype(), DType::u8);
  EXPECT_EQ(pos->at(1).first, "arr_1");
  EXPECT_EQ(pos->at(1).second.rank(), 0);
  EXPECT_EQ(pos->at(1).second.as_double(0), 1.5);
}

TEST(NpzRead, ReadTensorsTellsFormatsApart) {
  auto npz = read_tensors(fixture_bytes("compressed.npz"), "c.npz", "unused");
  ASSERT_TRUE(npz.ok()) << npz.error().message();
  check_npz_arrays(npz.value());
  auto npz_file = read_tensors_file(kDir + "compressed.npz");
  ASSERT_TRUE(npz_file.ok()) << npz_file.error().message();
  check_npz_arrays(npz_file.value());
  auto npy = read_tensors(fixture_bytes("f32.npy"), "f32.npy", "input:0");
  ASSERT_TRUE(npy.ok());
  EXPECT_EQ(npy->at(0).first, "input:0");
  expect_user_error(read_tensors(std::vector<uint8_t>{'a', 'b', 'c', 'd'}, "x.txt", "x"), "not a .npy or .npz file");
}

// A minimal zip writer for archives that libzip refuses to write (duplicate names, members
// that are not .npy data, directory entries): stored members, no extra fields.
std::vector<uint8_t> raw_zip(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& members) {
  auto put16 = [](std::vector<uint8_t>& o, uint32_t v) {
    o.push_back(static_cast<uint8_t>(v));
    o.push_back(static_cast<uint8_t>(v >> 8));
  };
  auto put32 = [&](std::vector<uint8_t>& o, uint32_t v) {
    put16(o, v & 0xFFFF);
    put16(o, v >> 16);
  };
  std::vector<uint8_t> out, central;
  for (const auto& [name, data] : members) {
    const uint32_t crc = static_cast<uint32_t>(crc32(0, data.data(), static_cast<uInt>(data.size())));
    const uint32_t offset = static_cast<uint32_t>(out.size());
    for (std::vector<uint8_t>* o : {&out, &central}) {
      const bool local = o == &out;
      put32(*o, local ? 0x04034b50 : 0x02014b50);
      if (!local) put16(*o, 20);  // made by
      put16(*o, 20);              // version needed
      put16(*o, 0);               // flags
      put16(*o, 0);               // stored
      put16(*o, 0);               // 00:00
      put16(*o, 0x21);            // 1980-01-01
      put32(*o, crc);
      put32(*o, static_cast<uint32_t>(data.size()));
      put32(*o, static_cast<uint32_t>(data.size()));
      put16(*o, static_cast<uint32_t>(name.size()));
      put16(*o, 0);  // extra
      if (!local) {
        put16(*o, 0);  // comment
        put16(*o, 0);  // disk
        put16(*o, 0);  // internal attributes
        put32(*o, 0);  // external attributes
        put32(*o, offset);
      }
      o->insert(o->end(), name.begin(), name.end());
      if (local) o->insert(o->end(), data.begin(), data.end());
    }
  }
  const uint32_t cd_offset = static_cast<uint32_t>(out.size());
  out.insert(out.end(), central.begin(), central.end());
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint32_t>(members.size()));
  put16(out, static_cast<uint32_t>(members.size()));
  put32(out, static_cast<uint32_t>(central.size()));
  put32(out, cd_offset);
  put16(out, 0);
  return out;
}

TEST(NpzRead, MemberNamesAndDirectories) {
  std::vector<uint8_t> npy = write_npy(Tensor::from<int32_t>({2}, {5, 6}));
  auto got = read_npz(raw_zip({{"d/", {}}, {"d/x.npy", npy}, {"plain", npy}}), "m.npz");
  ASSERT_TRUE(got.ok()) << got.error().message();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ(got->at(0).first, "d/x");
  EXPECT_EQ(got->at(1).first, "plain");
  EXPECT_EQ(got->at(1).second.to_int64_vector(), (std::vector<int64_t>{5, 6}));
}

NamedTensors sample_tensors() {
  NamedTensors t;
  t.emplace_back("x", Tensor::from<float>({2, 2}, {1, 2, 3, 4}));
  t.emplace_back("ids", Tensor::from<int64_t>({3}, {7, 8, 9}));
  t.emplace_back("mask", Tensor::from<bool>({2}, {true, false}));
  return t;
}

TEST(NpzWrite, RoundTripStoredAndCompressed) {
  for (bool compress : {false, true}) {
    SCOPED_TRACE(compress ? "compressed" : "stored");
    auto bytes = write_npz(sample_tensors(), {compress});
    ASSERT_TRUE(bytes.ok());
    auto got = read_npz(bytes.value(), "rt.npz");
    ASSERT_TRUE(got.ok()) << got.error().message();
    check_npz_arrays(got.value());
    // Reproducible: the same tensors give the same bytes.
    EXPECT_EQ(write_npz(sample_tensors(), {compress}).value(), bytes.value());
  }
}

uint16_t get16(const std::vector<uint8_t>& b, size_t at) { return static_cast<uint16_t>(b[at] | (b[at + 1] << 8)); }
uint32_t get32(const std::vector<uint8_t>& b, size_t at) {
  return get16(b, at) | (static_cast<uint32_t>(get16(b, at + 2)) << 16);
}
void put32_at(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// Offsets of every local header and every central directory entry of an archive kiln wrote.
std::pair<std::vector<size_t>, std::vector<size_t>> headers_of(const std::vector<uint8_t>& b) {
  std::vector<size_t> local, central;
  size_t p = 0;
  while (get32(b, p) == 0x04034b50) {
    local.push_back(p);
    p += 30 + get16(b, p + 26) + get16(b, p + 28) + get32(b, p + 18);
  }
  while (get32(b, p) == 0x02014b50) {
    central.push_back(p);
    p += 46 + get16(b, p + 28) + get16(b, p + 30) + get16(b, p + 32);
  }
  EXPECT_EQ(get32(b, p), 0x06054b50u);
  return {local, central};
}

// Reproducible output: fixed DOS time and date whatever the clock or time zone, no extra fields
// (libzip can add extended timestamps), the requested method.
TEST(NpzWrite, FixedTimestampsAndNoExtraFields) {
  NamedTensors tensors = sample_tensors();
  tensors.emplace_back("zeros", Tensor(DType::f32, {256}));  // compressible: really deflated
  for (bool compress : {false, true}) {
    SCOPED_TRACE(compress ? "compressed" : "stored");
    const std::vector<uint8_t> bytes = write_npz(tensors, {compress}).value();
    auto [local, central] = headers_of(bytes);
    ASSERT_EQ(local.size(), 4u);
    ASSERT_EQ(central.size(), 4u);
    for (size_t at : local) {
      EXPECT_EQ(get16(bytes, at + 10), 0);     // time
      EXPECT_EQ(get16(bytes, at + 12), 0x21);  // date
      EXPECT_EQ(get16(bytes, at + 28), 0);     // extra field length
    }
    for (size_t at : central) {
      EXPECT_EQ(get16(bytes, at + 12), 0);
      EXPECT_EQ(get16(bytes, at + 14), 0x21);
      EXPECT_EQ(get16(bytes, at + 30), 0);
    }
    EXPECT_EQ(get16(bytes, central[3] + 10), compress ? 8 : 0);
    // libzip turns DOS times into local time and back: another time zone must not change them.
    const char* old_tz = std::getenv("TZ");
    const std::string saved = old_tz ? old_tz : "";
    for (const char* tz : {"KLN-13", "KLN+11", "UTC0"}) {
      setenv("TZ", tz, 1);
      tzset();
      EXPECT_EQ(write_npz(tensors, {compress}).value(), bytes) << "TZ=" << tz;
    }
    if (old_tz) setenv("TZ", saved.c_str(), 1); else unsetenv("TZ");
    tzset();
  }
}

TEST(NpzWrite, RejectsBadNames) {
  NamedTensors dup = sample_tensors();
  dup.emplace_back("x", Tensor::from<float>({1}, {0}));
  expect_user_error(write_npz(dup), "duplicate .npz array name 'x'");
  NamedTensors empty;
  empty.emplace_back("", Tensor::from<float>({1}, {0}));
  expect_user_error(write_npz(empty), "an .npz array name cannot be empty");
  NamedTensors nul;
  nul.emplace_back(std::string("a\0b", 3), Tensor::from<float>({1}, {0}));
  expect_user_error(write_npz(nul), "holds a NUL byte");
}

TEST(NpzWrite, EmptyArchive) {
  auto bytes = write_npz({});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 22u);  // an end of central directory record alone, as numpy writes
  auto got = read_npz(bytes.value(), "e.npz");
  ASSERT_TRUE(got.ok()) << got.error().message();
  EXPECT_TRUE(got->empty());
}

TEST(NpzWrite, FileRoundTripAndFailedWrite) {
  const std::string path = ::testing::TempDir() + "kiln_npz_test.npz";
  NamedTensors t = sample_tensors();
  t.emplace_back("bf16", Tensor::from<bfloat16>({2}, {bfloat16(1.5f), bfloat16(-2.0f)}));
  ASSERT_TRUE(write_npz_file(path, t, {.compress = true}).ok());
  auto got = read_npz_file(path);
  ASSERT_TRUE(got.ok()) << got.error().message();
  EXPECT_EQ(got->at(3).second.dtype(), DType::f32);  // numpy has no bfloat16
  EXPECT_EQ(got->at(3).second.data<float>()[1], -2.0f);
  got->pop_back();
  check_npz_arrays(got.value());
  std::remove(path.c_str());
  const std::string bad = ::testing::TempDir() + "no_such_dir/x.npz";
  Status s = write_npz_file(bad, t);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().file, bad);
}

// A calibration-sized archive read from its path: every value arrives, and the reader holds the
// tensors and little else, never the archive's bytes.
TEST(NpzRead, StreamsMembersFromTheFile) {
  constexpr int kMembers = 6;
  constexpr int64_t kElems = 2 << 20;  // 8 MiB of f32 per member
  const std::string path = ::testing::TempDir() + "kiln_npz_stream_test.npz";
  size_t total = 0;
  {
    NamedTensors t;
    for (int m = 0; m < kMembers; ++m) {
      Tensor x(DType::f32, {kElems});
      for (int64_t i = 0; i < kElems; ++i) x.data<float>()[i] = static_cast<float>((i * 7919 + m) % 10007);
      total += x.nbytes();
      t.emplace_back(std::string(1, static_cast<char>('a' + m)), std::move(x));
    }
    ASSERT_TRUE(write_npz_file(path, t).ok());
  }
  const size_t in_use = memory_in_use();
  reset_memory_peak();
  const bool rss_known = reset_peak_rss();
  const size_t rss_before_kb = proc_status_kb("VmRSS:");
  auto got = read_npz_file(path);
  const size_t peak_rss_kb = proc_status_kb("VmHWM:");
  ASSERT_TRUE(got.ok()) << got.error().message();
  ASSERT_EQ(got->size(), static_cast<size_t>(kMembers));
  for (int m = 0; m < kMembers; ++m) {
    const Tensor& x = got->at(m).second;
    ASSERT_EQ(got->at(m).first, std::string(1, static_cast<char>('a' + m)));
    ASSERT_EQ(x.numel(), kElems);
    for (int64_t i = 0; i < kElems; i += 4099) ASSERT_EQ(x.data<float>()[i], static_cast<float>((i * 7919 + m) % 10007));
    ASSERT_EQ(x.data<float>()[kElems - 1], static_cast<float>(((kElems - 1) * 7919 + m) % 10007));
  }
  // The budget saw the tensors and nothing as large as a member besides (Tensor charges it).
  EXPECT_LE(memory_peak() - in_use, total + kMembers * 4096 + (64 << 10));
  // Reading the archive whole first would add its 48 MiB to the peak RSS.
  // (The high-water mark can read below the RSS sampled before when pages were released in
  // between: then nothing grew.)
  if (rss_known && peak_rss_kb > rss_before_kb) {
    EXPECT_LT((peak_rss_kb - rss_before_kb) * 1024, total + total / 2) << "peak RSS grew past the tensors";
  }
  got = NamedTensors{};
  std::remove(path.c_str());
}

TEST(NpzReject, CorruptArchives) {
  const std::vector<uint8_t> good = write_npz(sample_tensors()).value();
  const std::vector<uint8_t> deflated = write_npz({{"x", Tensor(DType::f32, {2, 2})}}, {.compress = true}).value();
  const auto [local, central] = headers_of(good);
  const auto [dlocal, dcentral] = headers_of(deflated);
  ASSERT_EQ(get16(deflated, dcentral[0] + 10), 8);  // really deflated
  struct Case {
    const char* name;
    std::vector<uint8_t> bytes;
    const char* where;
    const char* message;
  };
  const char* kNoDirectory = "corrupt .npz archive: no valid zip central directory: the archive is truncated, damaged or not a zip file";
  const char* kDisagrees = "corrupt .npz archive: the central directory disagrees with the archive";
  // Sets a 32-bit field of the first member in both its local header and its directory entry.
  auto both = [](std::vector<uint8_t> b, size_t local_at, size_t central_at, uint32_t v) {
    put32_at(b, local_at, v);
    put32_at(b, central_at, v);
    return b;
  };
  std::vector<Case> cases;
  cases.push_back({"too short", {'P', 'K', 3, 4}, "", "corrupt .npz archive: not a zip archive: 4 bytes is too short"});
  cases.push_back({"truncated", {good.begin(), good.begin() + static_cast<long>(good.size() / 2)}, "", kNoDirectory});
  cases.push_back({"truncated end record", {good.begin(), good.end() - 1}, "", kNoDirectory});
  {
    std::vector<uint8_t> b = good;
    b.push_back(0);
    cases.push_back({"trailing byte", b, "", kDisagrees});
  }
  {
    std::vector<uint8_t> b = good;
    b[central[0]] = 'X';
    cases.push_back({"bad central signature", b, "", kNoDirectory});
  }
  {
    std::vector<uint8_t> b = good;
    b[1] = 'X';
    cases.push_back({"bad local signature", b, "", kNoDirectory});
  }
  {
    std::vector<uint8_t> b = good;
    b[good.size() - 3] = 0x7F;  // high byte of the central directory offset in the end record
    cases.push_back({"cd offset", b, "", "corrupt .npz archive: "});
  }
  {
    std::vector<uint8_t> b = good;
    b[local[1] - 1] ^= 0x01;  // last data byte of x.npy (its 4.0f), just before the second member
    cases.push_back({"crc mismatch", b, "member 'x.npy'", "crc-32 mismatch: the data does not match the directory's 0x"});
  }
  {
    std::vector<uint8_t> b = good;
    b[central[0] + 10] = 12;  // bzip2, in the directory only
    cases.push_back({"method differs from local header", b, "", kDisagrees});
    b[local[0] + 8] = 12;
    cases.push_back({"bzip2", b, "member 'x.npy'", "unsupported compression method 12 (only stored and deflate are supported)"});
  }
  {
    std::vector<uint8_t> b = good;
    b[central[0] + 8] |= 1;
    cases.push_back({"encrypted", b, "member 'x.npy'", "encrypted zip members are not supported"});
  }
  cases.push_back({"size past end", both(good, local[0] + 18, central[0] + 20, 0xFFFFFF), "", kNoDirectory});
  {
    std::vector<uint8_t> b = good;
    put32_at(b, central[0] + 20, get32(b, central[0] + 20) + 1);  // compressed size, directory only
    cases.push_back({"sizes differ from local header", b, "", kDisagrees});
  }
  {
    const uint32_t size = get32(good, central[0] + 24);
    cases.push_back({"stored sizes differ", both(good, local[0] + 22, central[0] + 24, size + 4), "member 'x.npy'",
                     "stored member has size 148 but 144 stored bytes"});
  }
  {
    std::vector<uint8_t> b = deflated;
    const size_t data = dlocal[0] + 30 + 5;  // after the local header and "x.npy"
    for (size_t i = 0; i < 8; ++i) b[data + i] = 0xFF;
    cases.push_back({"bad deflate", b, "member 'x.npy'", "deflate data is corrupt"});
  }
  {
    // The member's declared (uncompressed) size disagrees with its .npy header: checked before
    // the tensor is allocated, whichever way it is off.
    const uint32_t size = get32(deflated, dcentral[0] + 24);
    cases.push_back({"declared size larger than the .npy", both(deflated, dlocal[0] + 22, dcentral[0] + 24, size + 16),
                     "member 'x.npy'", "unexpected 16 bytes after the data of shape 2x2 of f32"});
    cases.push_back({"declared size smaller than the .npy", both(deflated, dlocal[0] + 22, dcentral[0] + 24, size - 4),
                     "member 'x.npy'", "the data is truncated: shape 2x2 of f32 needs 16 bytes, the member has 12 after the header"});
    cases.push_back({"declared size impossible", both(deflated, dlocal[0] + 22, dcentral[0] + 24, 0xFFFFFFF0u),
                     "member 'x.npy'", "declared size of 4294967280 bytes is impossible for"});
  }
  {
    // A hostile .npy header: a 4 TiB shape in a member of a few bytes.
    std::vector<uint8_t> npy = npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }", 8);
    cases.push_back({"huge shape", raw_zip({{"big.npy", npy}}), "member 'big.npy'",
                     "the data is truncated: shape 1099511627776 of f32 needs 4398046511104 bytes, the member has 8 after the header"});
  }
  {
    std::vector<uint8_t> npy = write_npy(Tensor::from<float>({1}, {1}));
    cases.push_back({"duplicate", raw_zip({{"a.npy", npy}, {"a.npy", npy}}), "member 'a.npy'", "duplicate array name 'a'"});
    cases.push_back({"duplicate tensor", raw_zip({{"a", npy}, {"a.npy", npy}}), "member 'a.npy'", "duplicate array name 'a'"});
    npy.pop_back();
    cases.push_back({"bad member", raw_zip({{"short.npy", npy}}), "member 'short.npy'", "the data is truncated"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Error e = expect_user_error(read_npz(c.bytes, "bad.npz"), c.message);
    EXPECT_EQ(e.file, "bad.npz");
    EXPECT_EQ(e.where, c.where);
  }
}

// From a file, the same errors name the file; a CRC mismatch is found while streaming.
TEST(NpzReject, CorruptFilesAreNamed) {
  const std::string path = ::testing::TempDir() + "kiln_npz_corrupt_test.npz";
  std::vector<uint8_t> good = write_npz(sample_tensors()).value();
  std::vector<uint8_t> crc = good;
  crc[headers_of(good).first[1] - 1] ^= 0x01;
  std::vector<uint8_t> truncated(good.begin(), good.end() - 10);
  for (const auto& [bytes, message] : {std::pair{crc, "crc-32 mismatch"}, std::pair{truncated, "corrupt .npz archive"}}) {
    ASSERT_TRUE(write_file_bytes(path, bytes).ok());
    Error e = expect_user_error(read_npz_file(path), message);
    EXPECT_EQ(e.file, path);
    e = expect_user_error(read_tensors_file(path), message);
    EXPECT_EQ(e.file, path);
  }
  std::remove(path.c_str());
  expect_user_error(read_npz_file(kDir + "no_such_file.npz"), "cannot open: No such file or directory");
}

// A member that does not fit the memory budget is a user error naming it and its size, and the
// budget is charged before the member is read.
TEST(NpzReject, MemberOverTheMemoryBudget) {
  NamedTensors t;
  t.emplace_back("small", Tensor::from<float>({2}, {1, 2}));
  t.emplace_back("big", Tensor(DType::f32, {2 << 20}));
  const std::vector<uint8_t> bytes = write_npz(t, {.compress = true}).value();
  t.clear();
  struct RestoreLimit {
    ~RestoreLimit() { set_memory_limit(0); }
  } restore;
  set_memory_limit(memory_in_use() + (size_t{4} << 20));
  Error e = expect_user_error(read_npz(bytes, "big.npz"),
                              "the array of shape 2097152 of f32 (8.0 MiB) does not fit: needs 8.0 MiB");
  EXPECT_EQ(e.where, "member 'big.npy'");
  EXPECT_NE(e.what.find("(--max-memory)"), std::string::npos) << e.what;
}

// Flipped bytes and truncations anywhere must give a clean result or a user error, never a
// crash or an out-of-bounds read (the sanitizer build checks the latter).
TEST(NpzReject, RandomCorruptionNeverCrashes) {
  const std::vector<std::vector<uint8_t>> originals = {
      fixture_bytes("stored.npz"), fixture_bytes("compressed.npz"), fixture_bytes("zip64.npz"),
      fixture_bytes("fortran_be_i32.npy"), write_npz(sample_tensors(), {.compress = true}).value()};
  uint64_t state = 12345;
  auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull; };
  int rejected = 0;
  for (const auto& original : originals) {
    for (int round = 0; round < 400; ++round) {
      std::vector<uint8_t> b = original;
      if (round % 4 == 3) {
        b.resize((next() >> 33) % b.size());
      } else {
        for (int k = 0; k <= round % 3; ++k) b[(next() >> 33) % b.size()] ^= static_cast<uint8_t>(1 + (next() >> 56) % 255);
      }
      auto r = read_tensors(b, "fuzz", "t");
      if (!r.ok()) {
        ++rejected;
        EXPECT_EQ(r.error().kind, ErrorKind::user) << r.error().message();
        EXPECT_EQ(r.error().file, "fuzz");
        EXPECT_FALSE(r.error().what.empty());
      }
    }
  }
  EXPECT_GT(rejected, 1000);  // most damage is detected (CRCs, signatures, header checks)
}

// ---- file names ------------------------------------------------------------------------------

TEST(FileNames, PercentEncoding) {
  EXPECT_EQ(percent_encode_file_name("logits"), "logits");
  EXPECT_EQ(percent_encode_file_name("input:0"), "input%3A0");
  EXPECT_EQ(percent_encode_file_name("a/b c"), "a%2Fb%20c");
  EXPECT_EQ(percent_encode_file_name(".hidden.x"), "%2Ehidden.x");
  EXPECT_EQ(percent_encode_file_name("../up"), "%2E.%2Fup");
  EXPECT_EQ(percent_encode_file_name("100%"), "100%25");
  EXPECT_EQ(percent_encode_file_name("A-z_9"), "A-z_9");
  EXPECT_EQ(percent_encode_file_name("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(percent_encode_file_name(""), "");
  for (const char* name : {"input:0", "a/b c", ".hidden", "100%", "\xc3\xa9t\xc3\xa9", "x"})
    EXPECT_EQ(percent_decode_file_name(percent_encode_file_name(name)), std::string(name));
  EXPECT_EQ(percent_decode_file_name("a%3a"), std::string("a:"));
  EXPECT_EQ(percent_decode_file_name("bad%4"), std::nullopt);
  EXPECT_EQ(percent_decode_file_name("bad%zz"), std::nullopt);
}

}  // namespace
}  // namespace kiln
