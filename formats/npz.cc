// .npz archives on libzip. Reading opens the archive with ZIP_CHECKCONS (every local header
// must agree with the central directory), checks each member's declared sizes and method before
// anything is allocated, and streams the member from the archive straight into its tensor;
// reading a member to its end is what makes libzip compare the CRC-32. Writing builds the
// archive in a libzip memory buffer with fixed timestamps and reads the bytes back.
#include <zip.h>
#include <zlib.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "formats/atomic_file.h"
#include "formats/npy.h"
#include "formats/npy_stream.h"

namespace kiln {
namespace {

using npy_detail::file_error;

// The smallest zip archive: an end of central directory record alone (an empty archive).
constexpr uint8_t kEmptyArchive[22] = {'P', 'K', 5, 6};
// DEFLATE cannot expand data by more than about 1032:1; a larger declared size is corrupt, and
// refusing it keeps a forged size from reaching an allocation.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr uint32_t kDeflateLevel = 6;           // zlib's default, as numpy.savez_compressed uses
constexpr zip_uint16_t kDosTime = 0;            // 00:00:00
constexpr zip_uint16_t kDosDate = (1 << 5) | 1;  // 1980-01-01, the earliest DOS date
constexpr zip_uint32_t kFileMode = 0100644;     // a regular file, rw-r--r--
constexpr size_t kCopyChunk = size_t{1} << 20;  // reading a built archive back

struct ArchiveDiscarder {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct MemberCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};
struct SourceFreer {
  void operator()(zip_source_t* s) const { zip_source_free(s); }
};
using Archive = std::unique_ptr<zip_t, ArchiveDiscarder>;
using MemberFile = std::unique_ptr<zip_file_t, MemberCloser>;
using Source = std::unique_ptr<zip_source_t, SourceFreer>;

// A zip_error_t that is always finalised.
struct ZipError {
  ZipError() { zip_error_init(&e); }
  ~ZipError() { zip_error_fini(&e); }
  ZipError(const ZipError&) = delete;
  ZipError& operator=(const ZipError&) = delete;
  zip_error_t e;
};

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// A libzip error in kiln's words (libzip's own strings are capitalised and terse).
std::string describe(zip_error_t* e) {
  const int sys = zip_error_code_system(e);
  switch (zip_error_code_zip(e)) {
    case ZIP_ER_NOZIP:
      return "no valid zip central directory: the archive is truncated, damaged or not a zip file";
    case ZIP_ER_INCONS:
      return "the central directory disagrees with the archive (sizes, offsets or local headers)";
    case ZIP_ER_MULTIDISK: return "multi-volume zip archives are not supported";
    case ZIP_ER_EOF: return "the archive ends inside a member's data";
    case ZIP_ER_READ:
    case ZIP_ER_SEEK:
    case ZIP_ER_TELL:
      return zip_error_system_type(e) == ZIP_ET_SYS && sys != 0 ? std::string("cannot read: ") + std::strerror(sys)
                                                                : "cannot read the archive";
    case ZIP_ER_COMPRESSED_DATA: return "deflate data is corrupt";
    case ZIP_ER_ZLIB: return std::string("deflate data is corrupt (zlib: ") + zError(sys) + ")";
    case ZIP_ER_CRC: return "crc-32 mismatch";
    case ZIP_ER_ENCRNOTSUPP:
    case ZIP_ER_NOPASSWD: return "encrypted zip members are not supported";
    case ZIP_ER_MEMORY: return "out of memory";
    default: {
      std::string s = zip_error_strerror(e);
      if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
      return s;
    }
  }
}

// A member being inflated (or copied, when stored) by libzip.
class MemberSource final : public npy_detail::ByteSource {
 public:
  MemberSource(zip_file_t* file, const zip_stat_t& st) : file_(file), crc_(st.crc), size_(st.size) {}

  Result<size_t> read(void* dst, size_t n) override {
    zip_int64_t got = zip_fread(file_, dst, n);
    if (got >= 0) return static_cast<size_t>(got);
    zip_error_t* e = zip_file_get_error(file_);
    switch (zip_error_code_zip(e)) {
      case ZIP_ER_CRC:
        return user_error("", "crc-32 mismatch: the data does not match the directory's " + hex32(crc_));
      case ZIP_ER_INCONS:
        return user_error("", "the data is not the " + std::to_string(size_) + " bytes the directory declares");
      default: return user_error("", describe(e));
    }
  }

 private:
  zip_file_t* file_;
  uint32_t crc_;
  uint64_t size_;
};

// A file member of the archive, named as its tensor.
struct Member {
  zip_uint64_t index = 0;
  std::string name;    // the member's name in the archive
  std::string tensor;  // the tensor's name: the member's without ".npy"
  zip_stat_t st{};
};

std::string member_where(const std::string& name) { return "member '" + name + "'"; }

// The file members in directory order; directory entries are skipped and duplicate tensor
// names refused. Errors have no file.
Result<std::vector<Member>> list_members(zip_t* za) {
  const zip_int64_t count = zip_get_num_entries(za, 0);
  std::vector<Member> out;
  std::set<std::string> seen;
  for (zip_int64_t i = 0; i < count; ++i) {
    Member m;
    m.index = static_cast<zip_uint64_t>(i);
    zip_stat_init(&m.st);
    if (zip_stat_index(za, m.index, 0, &m.st) < 0)
      return user_error("central directory entry " + std::to_string(i), describe(zip_get_error(za)));
    m.name = (m.st.valid & ZIP_STAT_NAME) && m.st.name ? m.st.name : "";
    if (!m.name.empty() && m.name.back() == '/') continue;  // a directory entry
    m.tensor = m.name.ends_with(".npy") ? m.name.substr(0, m.name.size() - 4) : m.name;
    if (!seen.insert(m.tensor).second)
      return user_error(member_where(m.name), "duplicate array name '" + m.tensor + "'");
    out.push_back(std::move(m));
  }
  return out;
}

// Opens an archive on `source` with libzip's consistency checks. Errors name `file`.
Result<Archive> open_archive(Source source, std::string_view file) {
  {
    ZipError error;
    if (zip_t* za = zip_open_from_source(source.get(), ZIP_RDONLY | ZIP_CHECKCONS, &error.e)) {
      source.release();  // the archive owns it now
      return Archive(za);
    }
    if (zip_error_code_zip(&error.e) != ZIP_ER_EXISTS)
      return file_error(file, "", "corrupt .npz archive: " + describe(&error.e));
  }
  // Two entries share a name, which the checks refuse outright: open without them to say which.
  ZipError error;
  if (zip_t* za = zip_open_from_source(source.get(), ZIP_RDONLY, &error.e)) {
    source.release();
    Archive archive(za);
    auto members = list_members(archive.get());
    if (!members.ok()) return with_file(members.status(), std::string(file));
  }
  return file_error(file, "", "corrupt .npz archive: two entries have the same name");
}

// Reads one member into its tensor. Errors have no file and no where.
Result<Tensor> read_member(zip_t* za, const Member& m) {
  const zip_stat_t& st = m.st;
  constexpr zip_uint64_t kNeeded = ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD | ZIP_STAT_CRC;
  if ((st.valid & kNeeded) != kNeeded) return user_error("", "the central directory entry is incomplete");
  if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE)
    return user_error("", "encrypted zip members are not supported");
  if (st.comp_method == ZIP_CM_STORE) {
    if (st.size != st.comp_size)
      return user_error("", "stored member has size " + std::to_string(st.size) + " but " +
                                std::to_string(st.comp_size) + " stored bytes");
  } else if (st.comp_method == ZIP_CM_DEFLATE) {
    if (st.comp_size < (UINT64_MAX - 1024) / kMaxDeflateRatio && st.size > st.comp_size * kMaxDeflateRatio + 1024)
      return user_error("", "declared size of " + std::to_string(st.size) + " bytes is impossible for " +
                                std::to_string(st.comp_size) + " deflated bytes");
  } else {
    return user_error("", "unsupported compression method " + std::to_string(st.comp_method) +
                              " (only stored and deflate are supported)");
  }
  MemberFile file(zip_fopen_index(za, m.index, 0));
  if (!file) return user_error("", describe(zip_get_error(za)));
  MemberSource source(file.get(), st);
  return npy_detail::read_npy_stream(source, st.size, "member");
}

Result<NamedTensors> read_archive(Source source, std::string_view file) {
  KILN_ASSIGN_OR_RETURN(Archive archive, open_archive(std::move(source), file));
  auto members = list_members(archive.get());
  if (!members.ok()) return with_file(members.status(), std::string(file));
  NamedTensors out;
  out.reserve(members->size());
  for (const Member& m : *members) {
    auto t = read_member(archive.get(), m);
    if (!t.ok()) {
      Error e = std::move(t.error());
      e.file = std::string(file);
      e.where = e.where.empty() ? member_where(m.name) : member_where(m.name) + ": " + e.where;
      return e;
    }
    out.emplace_back(m.tensor, std::move(t.value()));
  }
  return out;
}

Error too_short(std::string_view file, uint64_t size) {
  return file_error(file, "", "corrupt .npz archive: not a zip archive: " + std::to_string(size) +
                                  " bytes is too short");
}

// ---- writing ------------------------------------------------------------------------------

// An internal error from building an archive; libzip failing to allocate is an allocation failure.
Error build_error(zip_error_t* e) {
  if (zip_error_code_zip(e) == ZIP_ER_MEMORY) throw std::bad_alloc();
  return internal_error("", "cannot build the .npz archive: " + describe(e));
}

// Builds the archive in memory: a libzip buffer source holding its bytes.
Result<Source> build_npz(const NamedTensors& tensors, const NpzWriteOptions& options) {
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) return user_error("", "an .npz array name cannot be empty");
    if (name.find('\0') != std::string::npos)
      return user_error("", "the .npz array name '" + name + "' holds a NUL byte");
    if (!seen.insert(name).second) return user_error("", "duplicate .npz array name '" + name + "'");
  }
  ZipError error;
  if (tensors.empty()) {  // libzip writes nothing at all for an archive without entries
    Source empty(zip_source_buffer_create(kEmptyArchive, sizeof kEmptyArchive, 0, &error.e));
    if (!empty) throw std::bad_alloc();
    return empty;
  }
  Source out(zip_source_buffer_create(nullptr, 0, 0, &error.e));
  if (!out) throw std::bad_alloc();
  Archive archive(zip_open_from_source(out.get(), ZIP_CREATE | ZIP_TRUNCATE, &error.e));
  if (!archive) return build_error(&error.e);
  zip_source_keep(out.get());  // zip_close writes into it; it must outlive the archive

  // libzip reads the members only in zip_close: their headers and data must live until then.
  // The data is not copied: each member is its header and the tensor's own bytes.
  std::vector<Tensor> data;
  std::vector<std::vector<uint8_t>> headers;
  data.reserve(tensors.size());
  headers.reserve(tensors.size());
  zip_t* za = archive.get();
  for (const auto& [name, t] : tensors) {
    const Tensor& d = data.emplace_back(npy_detail::npy_storable(t));
    std::vector<uint8_t>& header = headers.emplace_back(npy_detail::npy_header(d.dtype(), d.shape()));
    const zip_buffer_fragment_t parts[2] = {
        {header.data(), header.size()},
        {static_cast<zip_uint8_t*>(const_cast<void*>(d.raw())), d.nbytes()},
    };
    zip_source_t* member = zip_source_buffer_fragment_create(parts, d.nbytes() ? 2 : 1, 0, &error.e);
    if (!member) return build_error(&error.e);
    const zip_int64_t index = zip_file_add(za, (name + ".npy").c_str(), member, ZIP_FL_ENC_GUESS);
    if (index < 0) {
      zip_source_free(member);
      return build_error(zip_get_error(za));
    }
    const auto i = static_cast<zip_uint64_t>(index);
    // Fixed attributes, so that the same tensors always give the same bytes: no mtime taken
    // from the clock, no extra fields (libzip adds none for a buffer source).
    if (zip_set_file_compression(za, i, options.compress ? ZIP_CM_DEFLATE : ZIP_CM_STORE,
                                 options.compress ? kDeflateLevel : 0) < 0 ||
        zip_file_set_dostime(za, i, kDosTime, kDosDate, 0) < 0 ||
        zip_file_set_external_attributes(za, i, 0, ZIP_OPSYS_UNIX, kFileMode << 16) < 0)
      return build_error(zip_get_error(za));
  }
  if (zip_close(za) < 0) return build_error(zip_get_error(za));
  archive.release();  // zip_close freed it
  return out;
}

// Hands the bytes of a built archive to `sink`, a piece at a time.
Status drain(zip_source_t* archive, const std::function<Status(std::span<const uint8_t>)>& sink) {
  if (zip_source_open(archive) < 0) return build_error(zip_source_error(archive));
  std::vector<uint8_t> chunk(kCopyChunk);
  Status status;
  for (;;) {
    zip_int64_t n = zip_source_read(archive, chunk.data(), chunk.size());
    if (n < 0) {
      status = build_error(zip_source_error(archive));
      break;
    }
    if (n == 0) break;
    status = sink({chunk.data(), static_cast<size_t>(n)});
    if (!status.ok()) break;
  }
  zip_source_close(archive);
  return status;
}

}  // namespace

Result<NamedTensors> read_npz(std::span<const uint8_t> bytes, std::string_view file) {
  if (bytes.size() < sizeof kEmptyArchive) return too_short(file, bytes.size());
  ZipError error;
  Source source(zip_source_buffer_create(bytes.data(), bytes.size(), 0, &error.e));
  if (!source) throw std::bad_alloc();
  return read_archive(std::move(source), file);
}

Result<NamedTensors> read_npz_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(npy_detail::FilePtr f, npy_detail::open_file(path));
  std::optional<uint64_t> size = npy_detail::regular_file_size(f.get());
  if (!size) {  // a pipe cannot seek: read it whole
    std::vector<uint8_t> bytes;
    KILN_RETURN_IF_ERROR(npy_detail::read_rest(f.get(), path, bytes));
    return read_npz(bytes, path);
  }
  if (*size < sizeof kEmptyArchive) return too_short(path, *size);
  ZipError error;
  Source source(zip_source_filep_create(f.get(), 0, -1, &error.e));
  if (!source) return file_error(path, "", describe(&error.e));
  f.release();  // the source closes it
  return read_archive(std::move(source), path);
}

Result<std::vector<uint8_t>> write_npz(const NamedTensors& tensors, const NpzWriteOptions& options) {
  KILN_ASSIGN_OR_RETURN(Source archive, build_npz(tensors, options));
  std::vector<uint8_t> out;
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_source_stat(archive.get(), &st) == 0 && (st.valid & ZIP_STAT_SIZE)) out.reserve(st.size);
  KILN_RETURN_IF_ERROR(drain(archive.get(), [&](std::span<const uint8_t> bytes) {
    out.insert(out.end(), bytes.begin(), bytes.end());
    return Status();
  }));
  return out;
}

Status write_npz_file(const std::string& path, const NamedTensors& tensors, const NpzWriteOptions& options) {
  auto archive = build_npz(tensors, options);
  if (!archive.ok()) return with_file(archive.status(), path);
  AtomicFile f;
  Status s = f.open(path);
  if (s.ok())
    s = drain(archive->get(), [&](std::span<const uint8_t> bytes) { return f.write(bytes.data(), bytes.size()); });
  if (s.ok()) s = f.commit();
  return with_file(s, path);
}

}  // namespace kiln
