// The tuning database: record (de)serialization with nlohmann-json, the canonical order, merge
// and prune, this machine's fingerprint, and the locked, atomic file updates.
#include "compile/tuning_db.h"

#include <cpuid.h>
#include <cpuinfo.h>
#include <fcntl.h>
#include <oneapi/dnnl/dnnl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "formats/atomic_file.h"
#include "formats/sha256.h"
#include "runtime/target.h"

namespace kiln::tuning {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

// Every dump goes through here: one form for keys, lines and hashes. Strings built in code (a
// CPU's brand string) may hold invalid UTF-8; they are written with U+FFFD rather than throw.
template <class J>
std::string dump(const J& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- to JSON (fixed key order) ----

ojson param_json(const KernelParam& p) {
  if (const auto* i = std::get_if<int64_t>(&p)) return *i;
  if (const auto* d = std::get_if<double>(&p)) return *d;
  return std::get<std::string>(p);
}

ojson kernel_json(const TimedKernel& k) {
  ojson params = ojson::object();
  for (const auto& [name, value] : k.kernel.params) params[name] = param_json(value);
  return {{"kernel", k.kernel.name}, {"params", std::move(params)}, {"time_us", k.time_us}};
}

ojson problem_json(const TuningProblem& p) {
  ojson inputs = ojson::array();
  for (const TuningInput& in : p.inputs) inputs.push_back({{"shape", in.shape}, {"dtype", in.dtype}});
  return {{"op", p.op}, {"inputs", std::move(inputs)}, {"layout", p.layout}, {"epilogue", p.epilogue}, {"threads", p.threads}};
}

ojson machine_json(const MachineFingerprint& m) {
  return {{"model_name", m.model_name}, {"vendor", m.vendor},   {"family", m.family},
          {"model", m.model},           {"stepping", m.stepping}, {"features", m.features},
          {"physical_cores", m.physical_cores}, {"l1d_bytes", m.l1d_bytes}, {"l2_bytes", m.l2_bytes},
          {"l3_bytes", m.l3_bytes}};
}

ojson versions_json(const TuningVersions& v) { return {{"kernel_templates", v.kernel_templates}, {"onednn", v.onednn}}; }

// The key a database stores a record under: its problem, machine and versions, in that order,
// so that the map's order is the canonical order of the file.
std::string key_of(const TuningRecord& r) {
  return dump(problem_json(r.problem)) + '\x1f' + dump(machine_json(r.machine)) + '\x1f' + dump(versions_json(r.versions));
}

// ---- from JSON (every field checked; the error names it by its path) ----

Error field_error(const std::string& path, const std::string& what) { return user_error("", "field '" + path + "' " + what); }

Result<const json*> need(const json& obj, const std::string& prefix, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end()) return field_error(prefix + name, "is missing");
  return &*it;
}

Result<int64_t> get_int(const json& obj, const std::string& prefix, const char* name, int64_t lo, int64_t hi) {
  KILN_ASSIGN_OR_RETURN(const json* j, need(obj, prefix, name));
  if (!j->is_number_integer()) return field_error(prefix + name, "is not an integer");
  if (j->is_number_unsigned() && j->get<uint64_t>() > static_cast<uint64_t>(hi))
    return field_error(prefix + name, "is " + dump(*j) + ", more than " + std::to_string(hi));
  const int64_t v = j->get<int64_t>();
  if (v < lo || v > hi)
    return field_error(prefix + name, "is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

Result<std::string> get_string(const json& obj, const std::string& prefix, const char* name, bool non_empty) {
  KILN_ASSIGN_OR_RETURN(const json* j, need(obj, prefix, name));
  if (!j->is_string()) return field_error(prefix + name, "is not a string");
  std::string s = j->get<std::string>();
  if (non_empty && s.empty()) return field_error(prefix + name, "is empty");
  return s;
}

Result<const json*> get_object(const json& obj, const std::string& prefix, const char* name) {
  KILN_ASSIGN_OR_RETURN(const json* j, need(obj, prefix, name));
  if (!j->is_object()) return field_error(prefix + name, "is not an object");
  return j;
}

Result<const json*> get_array(const json& obj, const std::string& prefix, const char* name) {
  KILN_ASSIGN_OR_RETURN(const json* j, need(obj, prefix, name));
  if (!j->is_array()) return field_error(prefix + name, "is not an array");
  return j;
}

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxSmall = 1 << 20;  // threads, cores, CPUID fields, versions

Result<TimedKernel> kernel_from(const json& j, const std::string& path) {
  if (!j.is_object()) return field_error(path, "is not an object");
  const std::string p = path + ".";
  TimedKernel k;
  KILN_ASSIGN_OR_RETURN(k.kernel.name, get_string(j, p, "kernel", true));
  KILN_ASSIGN_OR_RETURN(const json* params, get_object(j, p, "params"));
  for (const auto& [name, value] : params->items()) {
    const std::string where = p + "params." + name;
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(kMaxInt))
      return field_error(where, "is " + dump(value) + ", more than " + std::to_string(kMaxInt));
    if (value.is_number_integer()) {
      k.kernel.params.emplace_back(name, value.get<int64_t>());
    } else if (value.is_number_float()) {
      const double d = value.get<double>();
      if (!std::isfinite(d)) return field_error(where, "is not a finite number");
      k.kernel.params.emplace_back(name, d);
    } else if (value.is_string()) {
      k.kernel.params.emplace_back(name, value.get<std::string>());
    } else {
      return field_error(where, "is not an integer, a number or a string");
    }
  }
  KILN_ASSIGN_OR_RETURN(const json* t, need(j, p, "time_us"));
  if (!t->is_number()) return field_error(p + "time_us", "is not a number");
  k.time_us = t->get<double>();
  if (!std::isfinite(k.time_us) || k.time_us < 0) return field_error(p + "time_us", "is " + dump(*t) + ", not a time");
  return k;
}

Result<TuningProblem> problem_from(const json& j) {
  const std::string p = "problem.";
  TuningProblem out;
  KILN_ASSIGN_OR_RETURN(out.op, get_string(j, p, "op", true));
  KILN_ASSIGN_OR_RETURN(const json* inputs, get_array(j, p, "inputs"));
  for (size_t i = 0; i < inputs->size(); ++i) {
    const json& in = (*inputs)[i];
    const std::string ip = p + "inputs[" + std::to_string(i) + "]";
    if (!in.is_object()) return field_error(ip, "is not an object");
    TuningInput ti;
    KILN_ASSIGN_OR_RETURN(const json* shape, get_array(in, ip + ".", "shape"));
    for (size_t d = 0; d < shape->size(); ++d) {
      const json& dim = (*shape)[d];
      const std::string dp = ip + ".shape[" + std::to_string(d) + "]";
      if (!dim.is_number_integer()) return field_error(dp, "is not an integer");
      if (dim.is_number_unsigned() ? dim.get<uint64_t>() > static_cast<uint64_t>(kMaxInt) : dim.get<int64_t>() < 0)
        return field_error(dp, "is " + dump(dim) + ", not a dimension");
      ti.shape.push_back(dim.get<int64_t>());
    }
    KILN_ASSIGN_OR_RETURN(ti.dtype, get_string(in, ip + ".", "dtype", true));
    out.inputs.push_back(std::move(ti));
  }
  KILN_ASSIGN_OR_RETURN(out.layout, get_string(j, p, "layout", false));
  KILN_ASSIGN_OR_RETURN(out.epilogue, get_string(j, p, "epilogue", false));
  KILN_ASSIGN_OR_RETURN(int64_t threads, get_int(j, p, "threads", 1, kMaxSmall));
  out.threads = static_cast<int>(threads);
  return out;
}

Result<MachineFingerprint> machine_from(const json& j) {
  const std::string p = "machine.";
  MachineFingerprint m;
  KILN_ASSIGN_OR_RETURN(m.model_name, get_string(j, p, "model_name", false));
  KILN_ASSIGN_OR_RETURN(m.vendor, get_string(j, p, "vendor", false));
  KILN_ASSIGN_OR_RETURN(int64_t family, get_int(j, p, "family", 0, kMaxSmall));
  KILN_ASSIGN_OR_RETURN(int64_t model, get_int(j, p, "model", 0, kMaxSmall));
  KILN_ASSIGN_OR_RETURN(int64_t stepping, get_int(j, p, "stepping", 0, kMaxSmall));
  m.family = static_cast<int>(family);
  m.model = static_cast<int>(model);
  m.stepping = static_cast<int>(stepping);
  KILN_ASSIGN_OR_RETURN(const json* features, get_array(j, p, "features"));
  for (size_t i = 0; i < features->size(); ++i) {
    if (!(*features)[i].is_string()) return field_error(p + "features[" + std::to_string(i) + "]", "is not a string");
    m.features.push_back((*features)[i].get<std::string>());
  }
  KILN_ASSIGN_OR_RETURN(int64_t cores, get_int(j, p, "physical_cores", 0, kMaxSmall));
  m.physical_cores = static_cast<int>(cores);
  KILN_ASSIGN_OR_RETURN(m.l1d_bytes, get_int(j, p, "l1d_bytes", 0, kMaxInt));
  KILN_ASSIGN_OR_RETURN(m.l2_bytes, get_int(j, p, "l2_bytes", 0, kMaxInt));
  KILN_ASSIGN_OR_RETURN(m.l3_bytes, get_int(j, p, "l3_bytes", 0, kMaxInt));
  return m;
}

Result<TuningVersions> versions_from(const json& j) {
  TuningVersions v;
  KILN_ASSIGN_OR_RETURN(int64_t templates, get_int(j, "versions.", "kernel_templates", 0, kMaxSmall));
  v.kernel_templates = static_cast<int>(templates);
  KILN_ASSIGN_OR_RETURN(v.onednn, get_string(j, "versions.", "onednn", false));
  return v;
}

// ---- this machine ----

std::string trimmed(std::string s) {
  const size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

MachineFingerprint detect() {
  MachineFingerprint m;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
    char vendor[13] = {};
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    m.vendor = trimmed(std::string(vendor, strnlen(vendor, 12)));
  }
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    // The displayed family and model, as /proc/cpuinfo shows them (Intel SDM, CPUID leaf 1).
    const int base_family = static_cast<int>(eax >> 8 & 0xf), base_model = static_cast<int>(eax >> 4 & 0xf);
    m.family = base_family == 0xf ? base_family + static_cast<int>(eax >> 20 & 0xff) : base_family;
    m.model = base_family == 0x6 || base_family == 0xf ? (static_cast<int>(eax >> 16 & 0xf) << 4) + base_model : base_model;
    m.stepping = static_cast<int>(eax & 0xf);
  }
  // The brand string (what /proc/cpuinfo calls "model name"); cpuinfo's package name, which
  // it shortens, where the CPU has none.
  if (static_cast<unsigned>(__get_cpuid_max(0x80000000, nullptr)) >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      unsigned regs[4] = {};
      __get_cpuid(0x80000002 + leaf, &regs[0], &regs[1], &regs[2], &regs[3]);
      std::memcpy(brand + 16 * leaf, regs, 16);
    }
    m.model_name = trimmed(std::string(brand, strnlen(brand, 48)));
  }
  m.features = CpuFeatures::host().names();
  if (cpuinfo_initialize()) {
    if (m.model_name.empty())
      if (const cpuinfo_package* pkg = cpuinfo_get_package(0)) m.model_name = trimmed(std::string(pkg->name, strnlen(pkg->name, sizeof pkg->name)));
    m.physical_cores = static_cast<int>(cpuinfo_get_cores_count());
    if (const cpuinfo_cache* c = cpuinfo_get_l1d_cache(0)) m.l1d_bytes = c->size;
    if (const cpuinfo_cache* c = cpuinfo_get_l2_cache(0)) m.l2_bytes = c->size;
    if (const cpuinfo_cache* c = cpuinfo_get_l3_cache(0)) m.l3_bytes = c->size;
  }
  if (m.model_name.empty()) m.model_name = "unknown";
  return m;
}

// ---- files ----

// An exclusive flock on `<db>.lock`, released when destroyed (or when the process dies, so a
// killed writer never blocks the next one). The lock file itself is never removed: removing it
// would let two writers lock two different files.
class DbLock {
 public:
  DbLock() = default;
  DbLock(const DbLock&) = delete;
  DbLock& operator=(const DbLock&) = delete;
  ~DbLock() {
    if (fd_ >= 0) ::close(fd_);
  }

  Status lock(const std::string& db_path) {
    const std::string path = lock_path(db_path);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) return Error{ErrorKind::user, path, "", "cannot open the lock file: " + errno_text(errno)};
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      // File systems without flock: go on unlocked (a lost record is re-tuned, never wrong).
      if (errno == ENOLCK || errno == EOPNOTSUPP) break;
      return Error{ErrorKind::user, path, "", "cannot lock: " + errno_text(errno)};
    }
    return {};
  }

 private:
  int fd_ = -1;
};

Status write_db(const TuningDb& db, const std::string& path) {
  const std::string text = db.serialize();
  AtomicFile out;
  KILN_RETURN_IF_ERROR(with_file(out.open(path), path));
  KILN_RETURN_IF_ERROR(with_file(out.write(text.data(), text.size()), path));
  return with_file(out.commit(), path);
}

Status make_parent(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return {};
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return Error{ErrorKind::user, parent.string(), "", "cannot create the folder: " + ec.message()};
  return {};
}

}  // namespace

// ---- records ----

std::string TuningProblem::str() const {
  std::string s = op + "(";
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) s += ", ";
    for (size_t d = 0; d < inputs[i].shape.size(); ++d) {
      if (d) s += 'x';
      s += std::to_string(inputs[i].shape[d]);
    }
    if (inputs[i].shape.empty()) s += "scalar";
    s += " " + inputs[i].dtype;
  }
  s += ")";
  if (!layout.empty()) s += " " + layout;
  if (!epilogue.empty()) s += " +" + epilogue;
  return s + " t" + std::to_string(threads);
}

const MachineFingerprint& MachineFingerprint::host() {
  static const MachineFingerprint m = detect();
  return m;
}

std::string MachineFingerprint::id() const {
  const std::string text = dump(machine_json(*this));
  return sha256_hex({reinterpret_cast<const uint8_t*>(text.data()), text.size()}).substr(0, 12);
}

const TuningVersions& TuningVersions::current() {
  static const TuningVersions v = [] {
    TuningVersions out;
    const dnnl_version_t* d = dnnl_version();
    out.onednn = std::to_string(d->major) + "." + std::to_string(d->minor) + "." + std::to_string(d->patch);
    return out;
  }();
  return v;
}

std::optional<double> TuningRecord::runner_up_margin() const {
  if (candidates.empty() || !(winner.time_us > 0)) return std::nullopt;
  return candidates.front().time_us / winner.time_us - 1;
}

TuningRecord canonical(TuningRecord r) {
  auto sort_params = [](KernelChoice& k) {
    std::map<std::string, KernelParam> by_name;
    for (auto& [name, value] : k.params) by_name[name] = std::move(value);
    k.params.assign(std::make_move_iterator(by_name.begin()), std::make_move_iterator(by_name.end()));
  };
  sort_params(r.winner.kernel);
  for (TimedKernel& c : r.candidates) sort_params(c.kernel);
  std::vector<std::pair<std::string, TimedKernel>> keyed;
  for (TimedKernel& c : r.candidates) keyed.emplace_back(dump(kernel_json(c)), std::move(c));
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    return a.second.time_us != b.second.time_us ? a.second.time_us < b.second.time_us : a.first < b.first;
  });
  r.candidates.clear();
  for (auto& [text, c] : keyed) r.candidates.push_back(std::move(c));
  return r;
}

std::string serialize_tuning_record(const TuningRecord& record) {
  const TuningRecord r = canonical(record);
  ojson candidates = ojson::array();
  for (const TimedKernel& c : r.candidates) candidates.push_back(kernel_json(c));
  const ojson line = {{"format_version", kFormatVersion},      {"problem", problem_json(r.problem)},
                      {"machine", machine_json(r.machine)},   {"versions", versions_json(r.versions)},
                      {"winner", kernel_json(r.winner)},      {"candidates", std::move(candidates)}};
  return dump(line);
}

Result<TuningRecord> parse_tuning_record(std::string_view line) {
  json j;
  try {
    j = json::parse(line.begin(), line.end());
  } catch (const json::parse_error& e) {
    // nlohmann says "[json.exception.parse_error.101] parse error at line 1, column 5: <why>";
    // the line is the file's, so only the column and the reason are kept.
    std::string why = e.what();
    if (size_t at = why.find("column "); at != std::string::npos)
      if (size_t colon = why.find(": ", at); colon != std::string::npos) why = why.substr(colon + 2);
    return user_error("", "is not valid JSON at column " + std::to_string(e.byte) + ": " + why);
  } catch (const json::exception& e) {
    // A number out of range ("number overflow parsing '1e999'"), without nlohmann's tag.
    std::string why = e.what();
    if (size_t tag = why.find("] "); tag != std::string::npos) why = why.substr(tag + 2);
    return user_error("", "is not valid JSON: " + why);
  }
  if (!j.is_object()) return user_error("", "is not a JSON object");
  auto version = j.find("format_version");
  if (version == j.end()) return user_error("", "has no format_version");
  if (!version->is_number_unsigned() || version->get<uint64_t>() == 0)
    return field_error("format_version", "is " + dump(*version) + ", not a format version");
  if (version->get<uint64_t>() > static_cast<uint64_t>(kFormatVersion))
    return user_error("", "format version " + dump(*version) + " is newer than this kiln reads (" +
                              std::to_string(kFormatVersion) + "): a newer kiln wrote it");
  TuningRecord r;
  KILN_ASSIGN_OR_RETURN(const json* problem, get_object(j, "", "problem"));
  KILN_ASSIGN_OR_RETURN(r.problem, problem_from(*problem));
  KILN_ASSIGN_OR_RETURN(const json* machine, get_object(j, "", "machine"));
  KILN_ASSIGN_OR_RETURN(r.machine, machine_from(*machine));
  KILN_ASSIGN_OR_RETURN(const json* versions, get_object(j, "", "versions"));
  KILN_ASSIGN_OR_RETURN(r.versions, versions_from(*versions));
  KILN_ASSIGN_OR_RETURN(const json* winner, need(j, "", "winner"));
  KILN_ASSIGN_OR_RETURN(r.winner, kernel_from(*winner, "winner"));
  KILN_ASSIGN_OR_RETURN(const json* candidates, get_array(j, "", "candidates"));
  for (size_t i = 0; i < candidates->size(); ++i) {
    KILN_ASSIGN_OR_RETURN(TimedKernel c, kernel_from((*candidates)[i], "candidates[" + std::to_string(i) + "]"));
    r.candidates.push_back(std::move(c));
  }
  return canonical(std::move(r));
}

// ---- the database ----

void TuningDb::add(TuningRecord r) {
  r = canonical(std::move(r));
  std::string key = key_of(r);
  auto it = records_.find(key);
  if (it == records_.end()) {
    records_.emplace(std::move(key), std::move(r));
    return;
  }
  const TuningRecord& old = it->second;
  // A total order on records of one key: the faster winner, then the line that sorts first.
  const bool better = r.winner.time_us != old.winner.time_us ? r.winner.time_us < old.winner.time_us
                                                             : serialize_tuning_record(r) < serialize_tuning_record(old);
  if (better) it->second = std::move(r);
}

void TuningDb::merge(const TuningDb& other) {
  for (const auto& [key, r] : other.records_) add(r);
}

const TuningRecord* TuningDb::lookup(const TuningProblem& problem, const MachineFingerprint& machine,
                                     const TuningVersions& versions) const {
  TuningRecord probe;
  probe.problem = problem;
  probe.machine = machine;
  probe.versions = versions;
  auto it = records_.find(key_of(probe));
  return it == records_.end() ? nullptr : &it->second;
}

std::string TuningDb::miss_reason(const TuningProblem& problem, const MachineFingerprint& machine,
                                  const TuningVersions& versions) const {
  const TuningRecord* other_versions = nullptr;
  const TuningRecord* other_machine = nullptr;
  std::set<int> threads;
  for (const auto& [key, r] : records_) {
    TuningProblem same_threads = r.problem;
    same_threads.threads = problem.threads;
    if (!(same_threads == problem)) continue;
    if (r.problem.threads != problem.threads) {
      if (r.machine == machine && r.versions == versions) threads.insert(r.problem.threads);
    } else if (!(r.machine == machine)) {
      if (!other_machine) other_machine = &r;
    } else if (!other_versions) {
      other_versions = &r;
    }
  }
  const auto versions_text = [](const TuningVersions& v) {
    return "kernel templates " + std::to_string(v.kernel_templates) + ", oneDNN " + v.onednn;
  };
  if (other_versions)
    return "its record is of other kernel versions (" + versions_text(other_versions->versions) + "; this kiln: " + versions_text(versions) + ")";
  if (!threads.empty()) {
    std::string list;
    for (int t : threads) list += (list.empty() ? "" : ", ") + std::to_string(t);
    return "it has records for " + list + (threads.size() == 1 && *threads.begin() == 1 ? " thread" : " threads") + " on this machine, not " +
           std::to_string(problem.threads);
  }
  if (other_machine) {
    const MachineFingerprint& m = other_machine->machine;
    if (m.model_name == machine.model_name && m.family == machine.family && m.model == machine.model &&
        m.physical_cores == machine.physical_cores)
      return "it has records for another machine of this model only (its stepping, ISA features or caches differ)";
    return "it has records for other machines only (" + m.model_name + ", family " + std::to_string(m.family) + " model " +
           std::to_string(m.model) + ", " + std::to_string(m.physical_cores) + " cores; this one: " + machine.model_name + ", family " +
           std::to_string(machine.family) + " model " + std::to_string(machine.model) + ", " + std::to_string(machine.physical_cores) + " cores)";
  }
  return "no record of it";
}

size_t TuningDb::prune(const TuningVersions& versions) {
  return std::erase_if(records_, [&](const auto& kv) { return !(kv.second.versions == versions); });
}

std::vector<const TuningRecord*> TuningDb::records() const {
  std::vector<const TuningRecord*> out;
  out.reserve(records_.size());
  for (const auto& [key, r] : records_) out.push_back(&r);
  return out;
}

std::string TuningDb::serialize() const {
  std::string out;
  for (const auto& [key, r] : records_) out += serialize_tuning_record(r) + "\n";
  return out;
}

Result<TuningDb> parse_tuning_db(std::string_view text, const std::string& file) {
  TuningDb db;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    Result<TuningRecord> r = parse_tuning_record(line);
    if (!r.ok()) return Error{ErrorKind::user, file, "line " + std::to_string(line_no), r.error().what};
    db.add(std::move(*r));
  }
  return db;
}

Result<TuningDb> load_tuning_db(const std::string& path, IfMissing if_missing) {
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (!exists && !ec && if_missing == IfMissing::empty) return TuningDb{};
  if (!exists) return Error{ErrorKind::user, path, "", "no such file"};
  if (fs::is_directory(path, ec)) return Error{ErrorKind::user, path, "", "is a directory, expected a file"};
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{ErrorKind::user, path, "", "cannot open file: " + errno_text(errno)};
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Error{ErrorKind::user, path, "", "read failed"};
  return parse_tuning_db(text, path);
}

Status save_tuning_db(const TuningDb& db, const std::string& path) {
  KILN_RETURN_IF_ERROR(make_parent(path));
  DbLock lock;
  KILN_RETURN_IF_ERROR(lock.lock(path));
  return write_db(db, path);
}

Status add_tuning_records(const std::string& path, const std::vector<TuningRecord>& records) {
  KILN_RETURN_IF_ERROR(make_parent(path));
  DbLock lock;
  KILN_RETURN_IF_ERROR(lock.lock(path));
  // Re-read under the lock: what another process added since this one last read stays.
  KILN_ASSIGN_OR_RETURN(TuningDb db, load_tuning_db(path, IfMissing::empty));
  for (const TuningRecord& r : records) db.add(r);
  return write_db(db, path);
}

Result<PruneCounts> prune_tuning_db_file(const std::string& path, const TuningVersions& versions) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Error{ErrorKind::user, path, "", "no such file"};
  DbLock lock;
  KILN_RETURN_IF_ERROR(lock.lock(path));
  KILN_ASSIGN_OR_RETURN(TuningDb db, load_tuning_db(path));
  PruneCounts counts;
  counts.dropped = db.prune(versions);
  counts.kept = db.size();
  if (counts.dropped) KILN_RETURN_IF_ERROR(write_db(db, path));
  return counts;
}

std::string lock_path(const std::string& path) { return path + ".lock"; }

std::string default_tuning_db_path() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return (fs::path(xdg) / "kiln" / "tuning.jsonl").string();
  if (const char* home = std::getenv("HOME"); home && *home) return (fs::path(home) / ".cache" / "kiln" / "tuning.jsonl").string();
  return "";
}

}  // namespace kiln::tuning
