// `kiln export IN.onnx -o OUT.kiln`: ONNX → .kiln.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "cli/app.h"
#include "export/exporter.h"
#include "formats/serialize.h"

namespace kiln::cli {

namespace {

struct ExportArgs {
  std::string input;
  std::string output;
  std::vector<std::string> input_shapes;
  bool list_ops = false;
  bool verbose = false;
  uint64_t sidecar_threshold = SaveOptions{}.sidecar_threshold;
};

int run_export(const ExportArgs& args, const std::string& cmdline) {
  const std::string verb = "export";
  if (args.list_ops) {
    for (const std::string& line : supported_onnx_ops()) std::cout << line << "\n";
    return 0;
  }
  if (args.input.empty()) return report(verb, user_error("", "no input model given (kiln export IN.onnx -o OUT.kiln)"));
  if (args.output.empty()) return report(verb, user_error("", "no output given (-o OUT.kiln, or -o - for stdout)"));
  if (Status s = check_output_paths({&args.output}); !s.ok()) return report(verb, s);
  ExportOptions options;
  options.command_line = cmdline;
  options.verbose = args.verbose;
  for (const std::string& spec : args.input_shapes) {
    auto flag = parse_input_shape_flag(spec, "input=1x3x224x224");
    if (!flag.ok()) return report(verb, flag.error());
    options.input_shapes[flag->first] = flag->second;
  }
  Result<Model> model = Error{};
  if (args.input == "-") {
    model = export_onnx_fd(STDIN_FILENO, "<stdin>", ".", options);
  } else {
    model = export_onnx(args.input, options);
  }
  if (!model.ok()) return report(verb, model.error());
  SaveOptions save;
  save.sidecar_threshold = args.sidecar_threshold;
  return report(verb, write_model_output(*model, args.output, save));
}

}  // namespace

void add_export_command(CLI::App& app, int& exit_code, const std::string& cmdline) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand("export", "Capture an ONNX model as a kiln graph of core ops");
  cmd->add_option("input", args->input, "ONNX model (- for stdin)");
  cmd->add_option("-o,--output", args->output, "output .kiln file (- for stdout)");
  cmd->add_option("--input-shape", args->input_shapes,
                  "NAME=SHAPE, e.g. input=1x3x224x224 or ids=batchx128 (repeatable)");
  cmd->add_option("--sidecar-threshold", args->sidecar_threshold,
                  "weights larger than this many bytes go to a sidecar OUT.kiln.<hash>.weights")
      ->capture_default_str();
  add_max_memory_option(cmd);
  cmd->add_flag("--list-ops", args->list_ops, "print the supported ONNX ops and op versions, then exit");
  cmd->add_flag("-v,--verbose", args->verbose, "name every node of each unsupported op");
  cmd->callback([args, &exit_code, cmdline] { exit_code = run_export(*args, cmdline); });
}

}  // namespace kiln::cli
