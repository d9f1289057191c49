// Reading an ONNX model to export it: a file or a pipe is parsed as it is read and hashed as it
// goes by (never held whole), and each initializer's bytes go once its tensor is made, so an
// export holds each weight about once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "export/exporter.h"
#include "export/onnx_writer.h"
#include "formats/sha256.h"
#include "tests/unit/compile_test_util.h"
#include "tests/unit/proc_self_test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

/// A folder of its own for one test, removed afterwards.
struct ExportScratch {
  fs::path dir;
  ExportScratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = fs::temp_directory_path() / ("kiln_export_read_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~ExportScratch() { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

/// The ONNX bytes of x + w0 + w1 + ... over `weights` constants of `elems` f32 each.
std::string onnx_with_weights(int weights, int64_t elems) {
  testing::GraphBuilder b;
  ValueId y = b.input("x", {elems});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (int k = 0; k < weights; ++k) {
    Tensor w(DType::f32, {elems});
    for (int64_t i = 0; i < elems; ++i) w.data<float>()[i] = d(rng);
    y = b.op("y" + std::to_string(k), "Add", {y, b.constant("w" + std::to_string(k), std::move(w))});
  }
  Model m = b.done({y});
  m.stage = Stage::exported;
  auto bytes = write_onnx(m);
  EXPECT_TRUE(bytes.ok()) << bytes.error().message();
  return bytes.ok() ? *bytes : std::string();
}

void write_text(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The constants of two exports of one model are the same bytes.
void expect_same_constants(const Model& a, const Model& b) {
  for (const Value& v : a.graph.values) {
    if (!v.constant.defined()) continue;
    const ValueId other = b.graph.find_value(v.name);
    ASSERT_NE(other, kNoValue) << v.name;
    const Tensor& t = b.graph.values[other].constant;
    ASSERT_EQ(t.nbytes(), v.constant.nbytes()) << v.name;
    EXPECT_EQ(std::memcmp(t.raw(), v.constant.raw(), t.nbytes()), 0) << v.name;
  }
}

// From a path, a pipe and bytes in memory: the same model, and the file's digest as provenance.
TEST(ExportRead, FilePipeAndBytesGiveOneModel) {
  ExportScratch scratch;
  const std::string bytes = onnx_with_weights(3, 100000);
  ASSERT_FALSE(bytes.empty());
  const std::string path = scratch.file("m.onnx");
  write_text(path, bytes);
  const std::string digest = sha256_hex({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});

  auto from_file = export_onnx(path);
  ASSERT_TRUE(from_file.ok()) << from_file.error().message();
  ASSERT_EQ(from_file->provenance.size(), 1u);
  EXPECT_EQ(from_file->provenance[0].input_sha256, digest);

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::thread writer([&] {
    for (size_t at = 0; at < bytes.size();) {  // in odd pieces, as a pipe delivers them
      const ssize_t n = ::write(fds[1], bytes.data() + at, std::min<size_t>(bytes.size() - at, 77777));
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    ::close(fds[1]);
  });
  auto from_pipe = export_onnx_fd(fds[0], "<stdin>", scratch.dir.string());
  writer.join();
  ::close(fds[0]);
  ASSERT_TRUE(from_pipe.ok()) << from_pipe.error().message();
  EXPECT_EQ(from_pipe->provenance[0].input_sha256, digest);
  EXPECT_EQ(from_pipe->provenance[0].input_file, "<stdin>");

  auto from_bytes = export_onnx_bytes(bytes, "<stdin>", scratch.dir.string());
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.error().message();
  EXPECT_EQ(from_bytes->provenance[0].input_sha256, digest);
  EXPECT_EQ(from_file->graph.nodes.size(), 3u);
  expect_same_constants(*from_file, *from_pipe);
  expect_same_constants(*from_file, *from_bytes);
}

// Neither the file's bytes nor a second copy of the weights are held: the parsed initializers
// go as their tensors are made. (Reading the file whole first and converting with the parsed
// model kept, the peak was twice the weights.)
TEST(ExportRead, HoldsEachWeightAboutOnce) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed blocks resident in its quarantine";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "AddressSanitizer keeps freed blocks resident in its quarantine";
#endif
#endif
  ExportScratch scratch;
  constexpr int kWeights = 8;
  constexpr int64_t kElems = int64_t{1} << 20;  // 4 MiB each, 32 MiB in all
  const std::string path = scratch.file("m.onnx");
  write_text(path, onnx_with_weights(kWeights, kElems));
  const size_t weights = kWeights * kElems * sizeof(float);
  const bool rss_known = reset_peak_rss();
  const size_t rss_before_kb = proc_status_kb("VmRSS:");
  auto model = export_onnx(path);
  const size_t peak_rss_kb = proc_status_kb("VmHWM:");
  ASSERT_TRUE(model.ok()) << model.error().message();
  if (rss_known && peak_rss_kb > rss_before_kb) {
    EXPECT_LT((peak_rss_kb - rss_before_kb) * 1024, weights + weights / 2) << "peak RSS grew past the weights";
  }
}

TEST(ExportRead, WhatIsNotAModelIsAUserError) {
  ExportScratch scratch;
  auto error_of = [](const Result<Model>& r) { return r.ok() ? std::string("ok") : r.error().message(); };
  write_text(scratch.file("empty.onnx"), "");
  write_text(scratch.file("junk.onnx"), std::string("\xff\xff\xff\xff junk", 9));
  EXPECT_NE(error_of(export_onnx(scratch.file("empty.onnx"))).find("not a valid ONNX model"), std::string::npos);
  EXPECT_NE(error_of(export_onnx(scratch.file("junk.onnx"))).find("not a valid ONNX model"), std::string::npos);
  EXPECT_NE(error_of(export_onnx(scratch.dir.string())).find("is a directory"), std::string::npos);
  EXPECT_NE(error_of(export_onnx(scratch.file("missing.onnx"))).find("cannot open file"), std::string::npos);
  const Result<Model> junk = export_onnx(scratch.file("junk.onnx"));
  ASSERT_FALSE(junk.ok());
  EXPECT_EQ(junk.error().kind, ErrorKind::user);
  EXPECT_EQ(junk.error().file, scratch.file("junk.onnx"));
}

}  // namespace
}  // namespace kiln
