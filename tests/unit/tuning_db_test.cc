// The tuning database (compile/tuning_db.h): records round-trip through their JSON line, the file
// is in canonical order, merge is deterministic and idempotent and keeps the fastest winner, a
// record of another machine or other versions is never used, corrupt lines are refused with
// their line number, and concurrent or killed writers lose no record.
#include "compile/tuning_db.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <thread>

#include "runtime/target.h"

namespace kiln::tuning {
namespace {

namespace fs = std::filesystem;

MachineFingerprint machine_a() {
  MachineFingerprint m;
  m.model_name = "Intel(R) Xeon(R) Platinum 8480+";
  m.vendor = "GenuineIntel";
  m.family = 6;
  m.model = 143;
  m.stepping = 8;
  m.features = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512-vnni", "avx512-bf16", "avx512-fp16", "amx"};
  m.physical_cores = 56;
  m.l1d_bytes = 48 << 10;
  m.l2_bytes = 2 << 20;
  m.l3_bytes = 105 << 20;
  return m;
}

MachineFingerprint machine_b() {
  MachineFingerprint m;
  m.model_name = "AMD EPYC 9654 96-Core Processor";
  m.vendor = "AuthenticAMD";
  m.family = 25;
  m.model = 17;
  m.stepping = 1;
  m.features = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512-vnni", "avx512-bf16"};
  m.physical_cores = 96;
  m.l1d_bytes = 32 << 10;
  m.l2_bytes = 1 << 20;
  m.l3_bytes = 32 << 20;
  return m;
}

TuningVersions versions_now() {
  TuningVersions v;
  v.kernel_templates = kKernelTemplateVersion;
  v.onednn = "3.4.1";
  return v;
}

TuningProblem problem(int64_t m, int threads = 1) {
  TuningProblem p;
  p.op = "MatMul";
  p.inputs = {{{m, 256}, "f32"}, {{256, 512}, "f32"}};
  p.layout = "b_packed";
  p.epilogue = "bias+relu";
  p.threads = threads;
  return p;
}

TimedKernel gemm(int mr, int nr, double time_us) {
  TimedKernel k;
  k.kernel.name = "kiln.gemm_f32_avx512";
  k.kernel.params = {{"nr", int64_t{nr}}, {"mr", int64_t{mr}}, {"kc", int64_t{256}}, {"isa", std::string("avx512")},
                     {"split", 0.5}};
  k.time_us = time_us;
  return k;
}

TuningRecord record(int64_t m, const MachineFingerprint& machine, double time_us, const TuningVersions& v = versions_now()) {
  TuningRecord r;
  r.problem = problem(m);
  r.machine = machine;
  r.versions = v;
  r.winner = gemm(6, 64, time_us);
  TimedKernel onednn;
  onednn.kernel.name = "onednn.matmul";
  onednn.time_us = time_us * 1.3;
  r.candidates = {onednn, gemm(8, 48, time_us * 1.1)};
  return r;
}

TuningDb db_of(const std::vector<TuningRecord>& records) {
  TuningDb db;
  for (const TuningRecord& r : records) db.add(r);
  return db;
}

// A varied set: two machines, two version sets, duplicate keys with other times.
std::vector<TuningRecord> sample_records(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  TuningVersions old = versions_now();
  old.onednn = "2.6.3";
  std::vector<TuningRecord> out;
  for (int i = 0; i < n; ++i) {
    const int64_t m = 1 + static_cast<int64_t>(rng() % 7);
    const double t = 10 + static_cast<double>(rng() % 50) / 4;
    out.push_back(record(m, rng() % 2 ? machine_a() : machine_b(), t, rng() % 4 ? versions_now() : old));
  }
  return out;
}

std::string temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kiln-tuning-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

TEST(TuningDb, RecordRoundTripsThroughItsLine) {
  const TuningRecord r = record(64, machine_a(), 12.5);
  const std::string line = serialize_tuning_record(r);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line.rfind("{\"format_version\":1,", 0), 0u) << line;
  Result<TuningRecord> back = parse_tuning_record(line);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(*back, canonical(r));
  EXPECT_EQ(serialize_tuning_record(*back), line);
  // Parameter types survive: an int stays an int, 0.5 a double, a string a string.
  EXPECT_NE(back->winner.kernel.param<int64_t>("mr"), nullptr);
  EXPECT_EQ(*back->winner.kernel.param<int64_t>("mr"), 6);
  ASSERT_NE(back->winner.kernel.param<double>("split"), nullptr);
  EXPECT_EQ(*back->winner.kernel.param<double>("split"), 0.5);
  EXPECT_EQ(*back->winner.kernel.param<std::string>("isa"), "avx512");
  // A double that happens to be whole stays a double.
  TuningRecord whole = r;
  whole.winner.kernel.params = {{"ratio", 2.0}};
  Result<TuningRecord> whole_back = parse_tuning_record(serialize_tuning_record(whole));
  ASSERT_TRUE(whole_back.ok());
  EXPECT_NE(whole_back->winner.kernel.param<double>("ratio"), nullptr);
}

TEST(TuningDb, DatabaseRoundTripsThroughItsFile) {
  const TuningDb db = db_of(sample_records(1, 40));
  const std::string text = db.serialize();
  Result<TuningDb> back = parse_tuning_db(text, "db.jsonl");
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(*back, db);
  EXPECT_EQ(back->serialize(), text);
  // Blank lines and CRLF endings are read too.
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n\n") : std::string(1, c);
  Result<TuningDb> from_crlf = parse_tuning_db(crlf, "db.jsonl");
  ASSERT_TRUE(from_crlf.ok()) << from_crlf.error().message();
  EXPECT_EQ(*from_crlf, db);
}

TEST(TuningDb, CanonicalOrderDoesNotDependOnInsertionOrder) {
  std::vector<TuningRecord> records = sample_records(2, 30);
  const std::string first = db_of(records).serialize();
  std::mt19937 rng(7);
  for (int i = 0; i < 5; ++i) {
    std::shuffle(records.begin(), records.end(), rng);
    EXPECT_EQ(db_of(records).serialize(), first);
  }
  // Parameters sorted by name, candidates fastest first.
  const TuningRecord c = canonical(record(3, machine_a(), 10));
  ASSERT_EQ(c.winner.kernel.params.size(), 5u);
  EXPECT_EQ(c.winner.kernel.params[0].first, "isa");
  EXPECT_EQ(c.winner.kernel.params[4].first, "split");
  ASSERT_EQ(c.candidates.size(), 2u);
  EXPECT_EQ(c.candidates[0].kernel.name, "kiln.gemm_f32_avx512");
  EXPECT_EQ(c.candidates[1].kernel.name, "onednn.matmul");
  ASSERT_TRUE(c.runner_up_margin().has_value());
  EXPECT_NEAR(*c.runner_up_margin(), 0.1, 1e-12);
  // The lines of the file are in the order of their keys: by problem first (m = 1 before 2).
  const TuningDb two = db_of({record(2, machine_a(), 5), record(1, machine_b(), 9)});
  ASSERT_EQ(two.records().size(), 2u);
  EXPECT_EQ(two.records()[0]->problem.inputs[0].shape[0], 1);
}

TEST(TuningDb, MergeIsDeterministicAndIdempotent) {
  const TuningDb a = db_of(sample_records(3, 50)), b = db_of(sample_records(4, 50));
  TuningDb ab = a, ba = b;
  ab.merge(b);
  ba.merge(a);
  EXPECT_EQ(ab.serialize(), ba.serialize()) << "merge(A, B) != merge(B, A)";
  TuningDb aa = a;
  aa.merge(a);
  EXPECT_EQ(aa.serialize(), a.serialize()) << "merge(X, X) != X";
  TuningDb abb = ab;
  abb.merge(b);
  EXPECT_EQ(abb.serialize(), ab.serialize()) << "merge(merge(A, B), B) != merge(A, B)";
  TuningDb ab_a = ab;
  ab_a.merge(a);
  EXPECT_EQ(ab_a.serialize(), ab.serialize()) << "merge(merge(A, B), A) != merge(A, B)";
  // Equal winner times: the same record stays whichever comes first.
  TuningRecord x = record(5, machine_a(), 10), y = x;
  y.winner = gemm(4, 64, 10);
  EXPECT_EQ(db_of({x, y}).serialize(), db_of({y, x}).serialize());
}

TEST(TuningDb, FastestWinnerPerProblemAndMachine) {
  TuningDb db;
  db.add(record(64, machine_a(), 20));
  db.add(record(64, machine_a(), 12));
  db.add(record(64, machine_a(), 15));
  db.add(record(64, machine_b(), 30));
  ASSERT_EQ(db.size(), 2u);
  const TuningRecord* a = db.lookup(problem(64), machine_a(), versions_now());
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->winner.time_us, 12);
  const TuningRecord* b = db.lookup(problem(64), machine_b(), versions_now());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->winner.time_us, 30);
  // Merged databases from two machines keep one record per machine.
  TuningDb other;
  other.add(record(64, machine_b(), 25));
  db.merge(other);
  EXPECT_EQ(db.size(), 2u);
  EXPECT_EQ(db.lookup(problem(64), machine_b(), versions_now())->winner.time_us, 25);
  EXPECT_EQ(db.lookup(problem(64), machine_a(), versions_now())->winner.time_us, 12);
}

TEST(TuningDb, AnotherMachineIsNeverMatched) {
  TuningDb db;
  db.add(record(64, machine_a(), 10));
  EXPECT_NE(db.lookup(problem(64), machine_a(), versions_now()), nullptr);
  EXPECT_EQ(db.lookup(problem(64), machine_b(), versions_now()), nullptr);
  // Each field of the fingerprint on its own is enough to refuse the record (a VM's generic
  // model name on two different hosts, the same model with other features or cores).
  std::vector<MachineFingerprint> near;
  for (int i = 0; i < 8; ++i) near.push_back(machine_a());
  near[0].model_name = "QEMU Virtual CPU version 2.5+";
  near[1].stepping = 7;
  near[2].model = 106;
  near[3].features.pop_back();
  near[4].physical_cores = 28;
  near[5].l3_bytes = 60 << 20;
  near[6].vendor = "AuthenticAMD";
  near[7].family = 25;
  for (const MachineFingerprint& m : near) {
    EXPECT_EQ(db.lookup(problem(64), m, versions_now()), nullptr) << m.model_name;
    EXPECT_NE(m.id(), machine_a().id());
  }
  // Another problem (threads, shape) is not matched either.
  EXPECT_EQ(db.lookup(problem(64, 2), machine_a(), versions_now()), nullptr);
  EXPECT_EQ(db.lookup(problem(65), machine_a(), versions_now()), nullptr);
}

// Why a lookup found nothing, for --require-db's error: other versions on this machine come
// first, then other thread counts on it, then other machines; a shape no record has is none.
TEST(TuningDb, MissReasonSaysWhatTheDatabaseHasInstead) {
  TuningVersions old = versions_now();
  old.onednn = "2.6.3";
  TuningRecord two_threads = record(64, machine_a(), 10);
  two_threads.problem.threads = 2;
  TuningRecord four_threads = two_threads;
  four_threads.problem.threads = 4;
  EXPECT_EQ(db_of({record(64, machine_a(), 10, old), two_threads, record(64, machine_b(), 9)}).miss_reason(problem(64), machine_a(), versions_now()),
            "its record is of other kernel versions (kernel templates " + std::to_string(kKernelTemplateVersion) +
                ", oneDNN 2.6.3; this kiln: kernel templates " + std::to_string(kKernelTemplateVersion) + ", oneDNN 3.4.1)");
  EXPECT_EQ(db_of({four_threads, two_threads, record(64, machine_b(), 9)}).miss_reason(problem(64), machine_a(), versions_now()),
            "it has records for 2, 4 threads on this machine, not 1");
  EXPECT_EQ(db_of({record(64, machine_a(), 10)}).miss_reason(problem(64, 2), machine_a(), versions_now()),
            "it has records for 1 thread on this machine, not 2");
  EXPECT_EQ(db_of({record(64, machine_b(), 9)}).miss_reason(problem(64), machine_a(), versions_now()),
            "it has records for other machines only (AMD EPYC 9654 96-Core Processor, family 25 model 17, 96 cores; this one: "
            "Intel(R) Xeon(R) Platinum 8480+, family 6 model 143, 56 cores)");
  MachineFingerprint stepping = machine_a();
  stepping.stepping = 7;
  EXPECT_EQ(db_of({record(64, stepping, 9)}).miss_reason(problem(64), machine_a(), versions_now()),
            "it has records for another machine of this model only (its stepping, ISA features or caches differ)");
  EXPECT_EQ(db_of({record(64, machine_a(), 10)}).miss_reason(problem(65), machine_a(), versions_now()), "no record of it");
  EXPECT_EQ(TuningDb{}.miss_reason(problem(64), machine_a(), versions_now()), "no record of it");
}

TEST(TuningDb, OtherVersionsAreNotMatchedAndPruneDropsThem) {
  TuningVersions old_onednn = versions_now(), old_templates = versions_now();
  old_onednn.onednn = "2.6.3";
  old_templates.kernel_templates = kKernelTemplateVersion + 1;
  TuningDb db;
  db.add(record(64, machine_a(), 10, old_onednn));
  db.add(record(64, machine_a(), 11, old_templates));
  db.add(record(32, machine_a(), 9, versions_now()));
  EXPECT_EQ(db.lookup(problem(64), machine_a(), versions_now()), nullptr);
  EXPECT_NE(db.lookup(problem(64), machine_a(), old_onednn), nullptr);
  EXPECT_EQ(db.prune(versions_now()), 2u);
  ASSERT_EQ(db.size(), 1u);
  EXPECT_NE(db.lookup(problem(32), machine_a(), versions_now()), nullptr);
  EXPECT_EQ(db.prune(versions_now()), 0u);

  // On a file: rewritten atomically, untouched when nothing is dropped.
  const std::string dir = temp_dir("prune"), path = dir + "/db.jsonl";
  ASSERT_TRUE(save_tuning_db(db_of({record(64, machine_a(), 10, old_onednn), record(32, machine_b(), 9)}), path).ok());
  Result<PruneCounts> counts = prune_tuning_db_file(path, versions_now());
  ASSERT_TRUE(counts.ok()) << counts.error().message();
  EXPECT_EQ(counts->dropped, 1u);
  EXPECT_EQ(counts->kept, 1u);
  EXPECT_EQ(read_file(path), db_of({record(32, machine_b(), 9)}).serialize());
  const auto mtime = fs::last_write_time(path);
  counts = prune_tuning_db_file(path, versions_now());
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->dropped, 0u);
  EXPECT_EQ(fs::last_write_time(path), mtime);
  EXPECT_FALSE(prune_tuning_db_file(dir + "/nosuch.jsonl", versions_now()).ok());
  fs::remove_all(dir);
}

// The catalogue of corrupt lines: each, as line 3 of a file whose lines 1-2 are good, is refused
// as a user error naming the file and line 3, with what is wrong.
TEST(TuningDb, CorruptLinesAreRefusedWithTheirLineNumber) {
  const std::string good = serialize_tuning_record(record(1, machine_a(), 10));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  struct Case {
    const char* name;
    std::string line;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"not json", "{\"format_version\":1,", "is not valid JSON"},
      {"garbage", "\x01\x02 hello", "is not valid JSON"},
      {"truncated", good.substr(0, good.size() / 2), "is not valid JSON"},
      {"two objects", good + good, "is not valid JSON"},
      {"array", "[1,2,3]", "is not a JSON object"},
      {"number", "42", "is not a JSON object"},
      {"string", "\"db\"", "is not a JSON object"},
      {"null", "null", "is not a JSON object"},
      {"no format version", with("\"format_version\":1,", ""), "has no format_version"},
      {"future format version", with("\"format_version\":1", "\"format_version\":2"), "format version 2 is newer than this kiln reads (1)"},
      {"huge format version", with("\"format_version\":1", "\"format_version\":18446744073709551615"), "is newer than this kiln reads"},
      {"format version zero", with("\"format_version\":1", "\"format_version\":0"), "field 'format_version' is 0, not a format version"},
      {"format version negative", with("\"format_version\":1", "\"format_version\":-1"), "not a format version"},
      {"format version string", with("\"format_version\":1", "\"format_version\":\"1\""), "not a format version"},
      {"format version float", with("\"format_version\":1", "\"format_version\":1.0"), "not a format version"},
      {"no problem", with("\"problem\":", "\"problemo\":"), "field 'problem' is missing"},
      {"problem not object", with("\"problem\":{", "\"problem\":7,\"p\":{"), "field 'problem' is not an object"},
      {"op empty", with("\"op\":\"MatMul\"", "\"op\":\"\""), "field 'problem.op' is empty"},
      {"op number", with("\"op\":\"MatMul\"", "\"op\":3"), "field 'problem.op' is not a string"},
      {"inputs number", with("\"inputs\":[", "\"inputs\":7,\"x\":["), "field 'problem.inputs' is not an array"},
      {"negative dim", with("[1,256]", "[-1,256]"), "field 'problem.inputs[0].shape[0]' is -1, not a dimension"},
      {"huge dim", with("[1,256]", "[18446744073709551615,256]"), "field 'problem.inputs[0].shape[0]' is 18446744073709551615"},
      {"float dim", with("[1,256]", "[1.5,256]"), "field 'problem.inputs[0].shape[0]' is not an integer"},
      {"no dtype", with("\"dtype\":\"f32\"},{", "\"dtipe\":\"f32\"},{"), "field 'problem.inputs[0].dtype' is missing"},
      {"threads string", with("\"threads\":1", "\"threads\":\"1\""), "field 'problem.threads' is not an integer"},
      {"threads zero", with("\"threads\":1", "\"threads\":0"), "field 'problem.threads' is 0, outside [1, "},
      {"machine null", with("\"machine\":{", "\"machine\":null,\"x\":{"), "field 'machine' is not an object"},
      {"features number", with("\"features\":[\"avx2\"", "\"features\":[2"), "field 'machine.features[0]' is not a string"},
      {"cores negative", with("\"physical_cores\":56", "\"physical_cores\":-56"), "field 'machine.physical_cores' is -56"},
      {"no versions", with("\"versions\":", "\"version\":"), "field 'versions' is missing"},
      {"onednn number", with("\"onednn\":\"3.4.1\"", "\"onednn\":3.4"), "field 'versions.onednn' is not a string"},
      {"winner string", with("\"winner\":{", "\"winner\":\"fast\",\"w\":{"), "field 'winner' is not an object"},
      {"no kernel name", with("\"kernel\":\"kiln.gemm_f32_avx512\",\"params\":{\"isa\"", "\"params\":{\"isa\""),
       "field 'winner.kernel' is missing"},
      {"param array", with("\"kc\":256", "\"kc\":[256]"), "field 'winner.params.kc' is not an integer, a number or a string"},
      {"param null", with("\"kc\":256", "\"kc\":null"), "field 'winner.params.kc' is not an integer, a number or a string"},
      {"param bool", with("\"kc\":256", "\"kc\":true"), "field 'winner.params.kc' is not an integer, a number or a string"},
      {"param huge", with("\"kc\":256", "\"kc\":18446744073709551615"), "field 'winner.params.kc' is 18446744073709551615"},
      {"params list", with("\"params\":{\"isa\"", "\"params\":[],\"p\":{\"isa\""), "field 'winner.params' is not an object"},
      {"time negative", with("\"time_us\":10.0}", "\"time_us\":-10.0}"), "field 'winner.time_us' is -10.0, not a time"},
      {"time string", with("\"time_us\":10.0}", "\"time_us\":\"10\"}"), "field 'winner.time_us' is not a number"},
      {"time overflow", with("\"time_us\":10.0}", "\"time_us\":1e999}"), "is not valid JSON"},
      {"candidates object", with("\"candidates\":[", "\"candidates\":{},\"c\":["), "field 'candidates' is not an array"},
      {"candidates missing", with("\"candidates\":", "\"candidate\":"), "field 'candidates' is missing"},
      {"candidate number", with("\"candidates\":[", "\"candidates\":[7,"), "field 'candidates[0]' is not an object"},
      {"candidate no time", with("\"time_us\":11.0", "\"timeus\":11.0"), "field 'candidates[0].time_us' is missing"},
  };
  for (const Case& c : cases) {
    const std::string text = good + "\n" + serialize_tuning_record(record(2, machine_b(), 3)) + "\n" + c.line + "\n" + good + "\n";
    Result<TuningDb> db = parse_tuning_db(text, "db.jsonl");
    ASSERT_FALSE(db.ok()) << c.name << ": accepted " << c.line;
    EXPECT_EQ(db.error().kind, ErrorKind::user) << c.name;
    EXPECT_EQ(db.error().file, "db.jsonl") << c.name;
    EXPECT_EQ(db.error().where, "line 3") << c.name;
    EXPECT_NE(db.error().what.find(c.expect), std::string::npos) << c.name << ": " << db.error().message();
    EXPECT_EQ(db.error().message().rfind("db.jsonl: line 3: ", 0), 0u) << c.name << ": " << db.error().message();
  }
  // A blank line still counts: the bad line after it is line 4.
  Result<TuningDb> db = parse_tuning_db(good + "\n\n   \n[]\n", "x.jsonl");
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.error().message(), "x.jsonl: line 4: is not a JSON object");
}

TEST(TuningDb, LoadsFilesAndRefusesWhatIsNotOne) {
  const std::string dir = temp_dir("load"), path = dir + "/db.jsonl";
  Result<TuningDb> missing = load_tuning_db(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message(), path + ": no such file");
  Result<TuningDb> empty = load_tuning_db(path, IfMissing::empty);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  Result<TuningDb> folder = load_tuning_db(dir, IfMissing::empty);
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.error().what.find("is a directory"), std::string::npos);
  write_file(path, "");
  ASSERT_TRUE(load_tuning_db(path).ok());
  fs::remove_all(dir);
}

TEST(TuningDb, HostFingerprintAndVersions) {
  const MachineFingerprint& host = MachineFingerprint::host();
  EXPECT_FALSE(host.model_name.empty());
  EXPECT_GT(host.physical_cores, 0);
  EXPECT_GT(host.family, 0);
  EXPECT_EQ(host.features, CpuFeatures::host().names());
  EXPECT_TRUE(std::regex_match(host.id(), std::regex("[0-9a-f]{12}"))) << host.id();
  EXPECT_EQ(host.id(), MachineFingerprint::host().id());
  const TuningVersions& v = TuningVersions::current();
  EXPECT_EQ(v.kernel_templates, 5);
  EXPECT_TRUE(std::regex_match(v.onednn, std::regex("[0-9]+\\.[0-9]+\\.[0-9]+"))) << v.onednn;
  // The defaults of lookup are this machine and this kiln.
  TuningRecord r = record(64, host, 10, v);
  TuningDb db;
  db.add(r);
  EXPECT_NE(db.lookup(problem(64)), nullptr);
  // The host's record survives its line.
  Result<TuningRecord> back = parse_tuning_record(serialize_tuning_record(r));
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->machine, host);
}

TEST(TuningDb, DefaultPathIsTheUserCacheFolder) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(default_tuning_db_path(), "/x/cache/kiln/tuning.jsonl");
  setenv("XDG_CACHE_HOME", "", 1);
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(default_tuning_db_path(), "/home/u/.cache/kiln/tuning.jsonl");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  EXPECT_EQ(default_tuning_db_path(), "");
  if (xdg) setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (home) setenv("HOME", saved_home.c_str(), 1);
}

TEST(TuningDb, AddCreatesTheFolderAndKeepsWhatIsThere) {
  const std::string dir = temp_dir("add"), path = dir + "/sub/kiln/tuning.jsonl";
  ASSERT_TRUE(add_tuning_records(path, {record(1, machine_a(), 10)}).ok());
  ASSERT_TRUE(add_tuning_records(path, {record(2, machine_a(), 10), record(1, machine_a(), 8)}).ok());
  ASSERT_TRUE(add_tuning_records(path, {record(1, machine_a(), 9)}).ok());
  EXPECT_EQ(read_file(path), db_of({record(1, machine_a(), 8), record(2, machine_a(), 10)}).serialize());
  EXPECT_TRUE(fs::exists(lock_path(path)));
  // A corrupt database is not overwritten by an add: the error names its line.
  write_file(path, read_file(path) + "{oops\n");
  Status s = add_tuning_records(path, {record(3, machine_a(), 1)});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().where, "line 3");
  fs::remove_all(dir);
}

// Two processes adding records one at a time to one file: every record of both lands (each add
// re-reads the file under the lock before it writes).
TEST(TuningDb, ConcurrentAddsFromTwoProcessesLoseNothing) {
  const std::string dir = temp_dir("concurrent"), path = dir + "/db.jsonl";
  constexpr int kEach = 40;
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int i = 0; i < kEach; ++i)
        if (!add_tuning_records(path, {record(1 + i, c ? machine_b() : machine_a(), 10 + i)}).ok()) _exit(1);
      _exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  Result<TuningDb> db = load_tuning_db(path);
  ASSERT_TRUE(db.ok()) << db.error().message();
  EXPECT_EQ(db->size(), 2u * kEach);
  for (int i = 0; i < kEach; ++i) {
    EXPECT_NE(db->lookup(problem(1 + i), machine_a(), versions_now()), nullptr) << i;
    EXPECT_NE(db->lookup(problem(1 + i), machine_b(), versions_now()), nullptr) << i;
  }
  fs::remove_all(dir);
}

// A writer SIGKILLed at points spread over its add (a few thousand records, so the write takes
// a while) leaves the old file or the new one, whole, never a mix; the lock dies with it, and
// the next add goes through and leaves no temporary behind.
TEST(TuningDb, KilledWriterLeavesTheOldFileOrTheNew) {
  const std::string dir = temp_dir("kill"), path = dir + "/db.jsonl";
  const std::vector<TuningRecord> old_records = {record(1, machine_a(), 10), record(2, machine_b(), 11)};
  std::vector<TuningRecord> added;
  for (int i = 0; i < 1000; ++i) added.push_back(record(100 + i, i % 2 ? machine_a() : machine_b(), 5 + i % 13));
  const std::string old_text = db_of(old_records).serialize();
  TuningDb all = db_of(old_records);
  for (const TuningRecord& r : added) all.add(r);
  const std::string new_text = all.serialize();

  auto start_writer = [&] {
    const pid_t pid = fork();
    if (pid == 0) _exit(add_tuning_records(path, added).ok() ? 0 : 1);
    return pid;
  };
  using clock = std::chrono::steady_clock;
  write_file(path, old_text);
  const auto t0 = clock::now();
  const pid_t timed = start_writer();
  ASSERT_GT(timed, 0);
  int status = 0;
  ASSERT_EQ(waitpid(timed, &status, 0), timed);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const double duration_us = std::chrono::duration<double, std::micro>(clock::now() - t0).count();
  ASSERT_EQ(read_file(path), new_text);

  std::mt19937 rng(11);
  int saw_old = 0, saw_new = 0, saw_temporary = 0;
  for (int k = 0; k < 16; ++k) {
    write_file(path, old_text);
    const pid_t pid = start_writer();
    ASSERT_GT(pid, 0);
    const double delay_us = std::uniform_real_distribution<double>(0.05, 1.1)(rng) * duration_us;
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(delay_us)));
    kill(pid, SIGKILL);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) ++saw_temporary;
    const std::string text = read_file(path);
    ASSERT_TRUE(text == old_text || text == new_text) << "kill " << k << " after " << delay_us << " us left " << text.size() << " bytes";
    (text == old_text ? saw_old : saw_new)++;
  }
  // The lock died with the writer: the next add completes and cleans up after the killed ones.
  ASSERT_TRUE(add_tuning_records(path, {record(1, machine_a(), 1)}).ok());
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  Result<TuningDb> db = load_tuning_db(path);
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(db->lookup(problem(1), machine_a(), versions_now())->winner.time_us, 1);
  std::cout << "[ info ] a complete add takes " << duration_us / 1000 << " ms; kills left the old file " << saw_old
            << " times, the new " << saw_new << ", a temporary " << saw_temporary << "\n";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::tuning
