// `kiln inspect M.kiln`: what a model is (summary, --json, or the full --text form).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "cli/app.h"
#include "formats/serialize.h"
#include "formats/summary.h"
#include "formats/text.h"

namespace kiln::cli {

namespace {

struct InspectArgs {
  std::string model;
  bool json = false;
  bool text = false;
};

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int p = 0;
  while (v >= 1000 && p < 5) { v /= 1000; ++p; }
  char buf[64];
  std::snprintf(buf, sizeof buf, p ? "%.2f %s%s" : "%.0f %s%s", v, prefixes[p], unit);
  return buf;
}

int inspect(const InspectArgs& args) {
  const std::string verb = "inspect";
  auto model = load_model_arg(args.model);
  if (!model.ok()) return report(verb, model.error());
  if (args.text) {
    std::cout << model_to_text(*model);
    return 0;
  }
  ModelSummary s = summarize(*model);
  if (args.json) {
    std::cout << summary_json(*model, s);
    return 0;
  }
  const Graph& g = model->graph;
  std::cout << "stage: " << stage_name(model->stage) << "\n";
  for (const Provenance& p : model->provenance)
    std::cout << "provenance: " << p.tool << " " << p.version << " from " << p.input_file << " (sha256 "
              << p.input_sha256.substr(0, 16) << "…): " << p.command << "\n";
  if (const TargetRecord* t = model->target ? &*model->target : nullptr) {
    std::string isa;
    for (const std::string& f : t->isa) isa += (isa.empty() ? "" : " ") + f;
    std::cout << "target: " << t->device << " (" << (isa.empty() ? "baseline" : isa) << "), " << t->threads
              << (t->threads == 1 ? " thread" : " threads") << "\n";
  }
  if (const MemoryPlanRecord* mp = model->memory_plan ? &*model->memory_plan : nullptr)
    std::cout << "memory plan: arena " << human(static_cast<double>(mp->arena_bytes), "B") << " for " << mp->values.size()
              << " values, workspace " << human(static_cast<double>(mp->workspace_bytes), "B") << "\n";
  for (ValueId id : g.inputs)
    std::cout << "input  " << g.value(id).name << ": " << dtype_name(g.value(id).dtype) << " " << g.value(id).shape.str() << "\n";
  for (ValueId id : g.outputs)
    std::cout << "output " << g.value(id).name << ": " << dtype_name(g.value(id).dtype) << " " << g.value(id).shape.str() << "\n";
  std::cout << "nodes: " << s.nodes << "\nparameters: " << s.parameters << " (" << human(static_cast<double>(s.parameter_bytes), "B")
            << ")\nflops: " << s.flops << " (" << human(static_cast<double>(s.flops), "FLOP") << ", batch 1 where symbolic)\n"
            << "bytes: " << s.bytes << " (" << human(static_cast<double>(s.bytes), "B")
            << " read and written by the kernels, batch 1 where symbolic)\nops:\n";
  for (const auto& [op, n] : s.op_counts) std::cout << "  " << op << " " << n << "\n";
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Summarise a .kiln model");
  cmd->add_option("model", args->model, "model .kiln file (- for stdin)")->required();
  add_max_memory_option(cmd);
  auto* json = cmd->add_flag("--json", args->json, "machine-readable summary");
  cmd->add_flag("--text", args->text, "the whole graph as diffable text")->excludes(json);
  cmd->callback([args, &exit_code] { exit_code = inspect(*args); });
}

}  // namespace kiln::cli
