// kiln's command line: subcommands, exit codes, and the one-line error format
// `kiln <verb>: error: <file>: <node/value>: <what>`.
#include "cli/app.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>

#include "export/exporter.h"
#include "formats/atomic_file.h"
#include "formats/ir.h"
#include "formats/memory.h"
#include "formats/npy.h"
#include "formats/serialize.h"
#include "runtime/threads.h"

namespace kiln::cli {

namespace fs = std::filesystem;

int report(const std::string& verb, const Error& e) {
  std::cerr << "kiln" << (verb.empty() ? "" : " " + verb) << ": error: " << e.message() << "\n";
  return static_cast<int>(e.kind);
}

int report(const std::string& verb, const Status& s) { return s.ok() ? 0 : report(verb, s.error()); }

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += i == 0 ? std::string("kiln") : std::string(argv[i]);
  }
  return s;
}

Result<std::string> read_input(const std::string& path) {
  if (path == "-") {
    // In blocks: a character at a time, through the stream synced with stdio, a 55 MB model took
    // 1.1 s to read.
    constexpr size_t kBlock = size_t{1} << 20;
    std::string bytes;
    std::streambuf* in = std::cin.rdbuf();
    for (;;) {
      const size_t at = bytes.size();
      bytes.resize(at + kBlock);
      const auto got = static_cast<size_t>(in->sgetn(bytes.data() + at, static_cast<std::streamsize>(kBlock)));
      bytes.resize(at + got);
      if (got == 0) break;
    }
    return bytes;
  }
  return read_file_string(path);
}

namespace {

// An ONNX model where a .kiln one belongs: the error says what to do with it.
Result<Model> with_onnx_hint(const std::string& path, Result<Model> m) {
  if (!m.ok() && path.ends_with(".onnx") && m.error().what.starts_with("not a kiln file"))
    m.error().what += " (an ONNX model: kiln export it to a .kiln first)";
  return m;
}

}  // namespace

Result<HashedModel> load_model_arg_hashed(const std::string& path) {
  HashedModel out;
  const LoadOptions hashed{.sha256 = &out.sha256};
  if (path != "-") {
    // Hashed where it is mapped, as `kiln run` maps it. Read into memory and copied into a
    // buffer of its own, BERT-base's 438 MB took its compile 3.1 s against 1.1, at a peak RSS of
    // 872 MB against 625.
    KILN_ASSIGN_OR_RETURN(out.model, with_onnx_hint(path, load_model(path, hashed)));
    return out;
  }
  KILN_ASSIGN_OR_RETURN(out.model, load_model_from_fd(STDIN_FILENO, "<stdin>", hashed));
  return out;
}

Result<Model> load_model_arg(const std::string& path) {
  if (path != "-") return with_onnx_hint(path, load_model(path));
  return load_model_from_fd(STDIN_FILENO, "<stdin>");
}

Status write_output(const std::string& path, const std::string& bytes) {
  if (path == "-") {
    std::cout.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::cout.flush();
    if (!std::cout) return Error{ErrorKind::user, "<stdout>", "", "write failed"};
    return {};
  }
  return write_file_atomic(path, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

Status check_output_paths(std::initializer_list<const std::string*> paths) {
  for (const std::string* path : paths) {
    if (path->empty() || *path == "-") continue;
    std::error_code ec;
    if (fs::is_directory(*path, ec)) return Error{ErrorKind::user, *path, "", "is a folder; the output is a file"};
    const fs::path dir = fs::path(*path).parent_path().empty() ? fs::path(".") : fs::path(*path).parent_path();
    if (!fs::is_directory(dir, ec)) return Error{ErrorKind::user, *path, "", "cannot be written: the folder '" + dir.string() + "' does not exist"};
    if (::access(dir.c_str(), W_OK) != 0)
      return Error{ErrorKind::user, *path, "", "cannot be written: the folder '" + dir.string() + "' is not writable"};
  }
  return {};
}

Status write_model_output(const Model& model, const std::string& path, const SaveOptions& options) {
  if (path != "-") return save_model(model, path, options);
  KILN_ASSIGN_OR_RETURN(auto bytes, serialize_model(model));
  return write_output("-", std::string(bytes.begin(), bytes.end()));
}

void add_max_memory_option(CLI::App* cmd) {
  cmd->add_option_function<std::string>(
         "--max-memory",
         [](const std::string& text) {
           std::optional<size_t> bytes = parse_byte_size(text);
           if (!bytes) throw CLI::ValidationError("--max-memory", "'" + text + "' is not a size such as 256MiB, 4G or 1500000000");
           set_memory_limit(*bytes);
         },
         "most memory kiln may use for tensors and buffers, e.g. 4GiB (default: the machine's available memory)")
      ->type_name("SIZE");
}

// The number a flag's text starts with and the unit after it ("500ms" → 500, "ms"); nullopt
// when it does not start with a number.
std::optional<std::pair<double, std::string>> number_and_unit(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return std::make_pair(v, text.substr(used));
}

// "5s", "500ms", "2m" or plain seconds; nullopt for anything else.
std::optional<double> parse_seconds(const std::string& text) {
  auto n = number_and_unit(text);
  if (!n) return std::nullopt;
  const std::string& unit = n->second;
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "ms" ? 1e-3 : unit == "m" || unit == "min" ? 60 : -1;
  if (scale < 0 || !(n->first > 0) || n->first * scale > 86400) return std::nullopt;
  return n->first * scale;
}

CLI::Validator whole_number(int64_t least, int64_t most) {
  const std::string range = most == INT32_MAX ? "from " + std::to_string(least) + " up"
                                              : "from " + std::to_string(least) + " to " + std::to_string(most);
  return CLI::Validator(
      [least, most, range](std::string& text) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || v < least || v > most) return text + " is not a whole number " + range;
        return {};
      },
      most == INT32_MAX ? std::to_string(least) + " or more" : std::to_string(least) + " to " + std::to_string(most));
}

CLI::Validator thread_count() { return whole_number(1, kMaxThreads); }

int thread_arg(const std::string& verb, int requested, bool runs_here) {
  const int cores = available_cores();
  if (requested <= 0) return cores;
  if (runs_here && requested > cores)
    std::cerr << "kiln " << verb << ": warning: --threads " << requested << " is more than the " << cores
              << (cores == 1 ? " core" : " cores") << " kiln may use here (its affinity mask and CPU quota): the threads will take turns\n";
  return requested;
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !(v > 0) || !std::isfinite(v)) return text + " is not a number above 0";
        return {};
      },
      "above 0");
}

Result<std::pair<std::string, Shape>> parse_input_shape_flag(const std::string& spec, std::string_view example) {
  size_t eq = spec.rfind('=');
  if (eq == std::string::npos || eq == 0)
    return user_error("", "--input-shape '" + spec + "' is not NAME=SHAPE (e.g. " + std::string(example) + ")");
  auto shape = parse_shape(spec.substr(eq + 1));
  if (!shape.ok()) return user_error("", "--input-shape '" + spec + "': " + shape.error().what);
  return std::make_pair(spec.substr(0, eq), *shape);
}

int main(int argc, char** argv) {
  CLI::App app{"kiln: capture, quantize, compile and profile models"};
  app.name("kiln");
  app.set_version_flag("--version", "kiln " + std::string(kiln_version()));
  app.require_subcommand(1);
  app.fallthrough(false);
  int exit_code = 0;
  std::string cmdline = command_line(argc, argv);
  add_export_command(app, exit_code, cmdline);
  add_quant_command(app, exit_code, cmdline);
  add_compile_command(app, exit_code, cmdline);
  add_run_command(app, exit_code);
  add_profile_command(app, exit_code, cmdline);
  add_inspect_command(app, exit_code);
  add_tune_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string verb;
    for (const CLI::App* sub : app.get_subcommands()) verb = sub->get_name();
    std::cerr << "kiln" << (verb.empty() ? "" : " " + verb) << ": error: " << e.what()
              << " (see kiln" << (verb.empty() ? "" : " " + verb) << " --help)\n";
    return 2;
  } catch (const std::bad_alloc& e) {
    // Libraries turn allocation failures into errors about a node or value; this is the net.
    std::string verb;
    for (const CLI::App* sub : app.get_subcommands()) verb = sub->get_name();
    const auto* limit = dynamic_cast<const MemoryLimitExceeded*>(&e);
    std::cerr << "kiln" << (verb.empty() ? "" : " " + verb) << ": error: "
              << (limit ? std::string(limit->what()) : kMachineOutOfMemory)
              << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kiln: error: internal error: " << e.what() << " (please report this as a kiln bug)\n";
    return 1;
  }
  return exit_code;
}

}  // namespace kiln::cli
