// Every core op is documented in docs/ops/*.md, and every ONNX op kiln converts maps to one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "formats/op_schema.h"
#include "runtime/kernel.h"

namespace kiln {
namespace {

std::string all_op_docs() {
  std::string text;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(KILN_SOURCE_DIR) + "/docs/ops")) {
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  return text;
}

TEST(Docs, EveryCoreOpIsDocumented) {
  std::string docs = all_op_docs();
  for (const auto& [domain, schema] : core_ops().all()) {
    std::string needle = "`" + std::string(schema->name) + "`";
    EXPECT_NE(docs.find(needle), std::string::npos) << schema->name << " is missing from docs/ops/*.md";
  }
}

TEST(Registry, EveryCoreOpHasAReferenceKernel) {
  for (const auto& [domain, schema] : core_ops().all()) {
    std::string op = domain.empty() ? std::string(schema->name) : domain + "::" + std::string(schema->name);
    EXPECT_FALSE(default_kernels().find(op, "cpu").empty()) << op << " has no reference kernel";
  }
}

}  // namespace
}  // namespace kiln
