// Zip reading and writing for .npz files. Field layouts follow PKWARE's APPNOTE.TXT
// (sections 4.3.7 local header, 4.3.12 central directory, 4.3.14-16 zip64 end records,
// 4.5.3 zip64 extra field). Every offset read from the archive is bounds-checked before use.
#include "formats/zip.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <new>
#include <utility>
#include <string>

namespace kiln {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kLocator64Sig = 0x07064b50;
constexpr uint32_t k32Max = 0xFFFFFFFFu;
constexpr uint16_t k16Max = 0xFFFFu;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndSize = 22;
constexpr size_t kEnd64Size = 56;
constexpr size_t kLocator64Size = 20;
constexpr uint16_t kMethodStored = 0;
constexpr uint16_t kMethodDeflate = 8;
// zlib's counters are 32-bit; large members are fed through it in pieces of this size.
constexpr size_t kZlibChunk = size_t{1} << 30;
// DEFLATE cannot expand data by more than about 1032:1; a larger declared size is corrupt
// (and refusing it keeps a forged header from making us allocate terabytes).
constexpr uint64_t kMaxDeflateRatio = 1032;

uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t get32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t get64(const uint8_t* p) { return get32(p) | (static_cast<uint64_t>(get32(p + 4)) << 32); }

void put16(std::vector<uint8_t>& o, uint16_t v) {
  o.push_back(static_cast<uint8_t>(v));
  o.push_back(static_cast<uint8_t>(v >> 8));
}
void put32(std::vector<uint8_t>& o, uint32_t v) {
  put16(o, static_cast<uint16_t>(v));
  put16(o, static_cast<uint16_t>(v >> 16));
}
void put64(std::vector<uint8_t>& o, uint64_t v) {
  put32(o, static_cast<uint32_t>(v));
  put32(o, static_cast<uint32_t>(v >> 32));
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t crc32_of(std::span<const uint8_t> data) {
  return static_cast<uint32_t>(crc32_z(0, data.data(), data.size()));
}

// Inflates raw DEFLATE data into exactly `size` bytes.
Status inflate_member(std::span<const uint8_t> in, uint64_t size, const std::string& where,
                      std::vector<uint8_t>& out) {
  if (size > in.size() * kMaxDeflateRatio + 1024)
    return user_error(where, "declared size of " + std::to_string(size) + " bytes is impossible for " +
                                 std::to_string(in.size()) + " deflated bytes");
  out.resize(static_cast<size_t>(size));
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) throw std::bad_alloc();
  uint8_t dummy = 0;  // zlib rejects a null next_out even when nothing is to be written
  zs.next_out = out.empty() ? &dummy : out.data();
  size_t in_pos = 0;
  size_t out_pos = 0;
  Status status;
  for (;;) {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      size_t n = std::min(in.size() - in_pos, kZlibChunk);
      zs.next_in = const_cast<Bytef*>(in.data() + in_pos);
      zs.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
    if (zs.avail_out == 0 && out_pos < out.size()) {
      size_t n = std::min(out.size() - out_pos, kZlibChunk);
      zs.next_out = out.data() + out_pos;
      zs.avail_out = static_cast<uInt>(n);
      out_pos += n;
    }
    int ret = inflate(&zs, Z_NO_FLUSH);
    if (ret == Z_STREAM_END) {
      if (zs.total_out != size)
        status = user_error(where, "deflate data inflates to " + std::to_string(zs.total_out) +
                                       " bytes, the directory says " + std::to_string(size));
      break;
    }
    if (ret == Z_OK) continue;
    if (ret == Z_BUF_ERROR && zs.avail_in == 0 && in_pos == in.size()) {
      status = user_error(where, "deflate data is truncated");
    } else if (ret == Z_BUF_ERROR && zs.avail_out == 0 && out_pos == out.size()) {
      status = user_error(where, "deflate data inflates to more than the " + std::to_string(size) +
                                     " bytes the directory says");
    } else if (ret == Z_MEM_ERROR) {
      inflateEnd(&zs);
      throw std::bad_alloc();
    } else {
      status = user_error(where, std::string("deflate data is corrupt: ") + (zs.msg ? zs.msg : "zlib error " + std::to_string(ret)));
    }
    break;
  }
  inflateEnd(&zs);
  return status;
}

std::vector<uint8_t> deflate_bytes(std::span<const uint8_t> in) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::bad_alloc();
  std::vector<uint8_t> out(std::max<size_t>(deflateBound(&zs, in.size()), 64));
  size_t in_pos = 0;
  for (;;) {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      size_t n = std::min(in.size() - in_pos, kZlibChunk);
      zs.next_in = const_cast<Bytef*>(in.data() + in_pos);
      zs.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
    if (zs.avail_out == 0) {
      if (zs.total_out == out.size()) out.resize(out.size() * 2);
      zs.next_out = out.data() + zs.total_out;
      zs.avail_out = static_cast<uInt>(std::min(out.size() - zs.total_out, kZlibChunk));
    }
    int ret = deflate(&zs, in_pos == in.size() ? Z_FINISH : Z_NO_FLUSH);
    if (ret == Z_STREAM_END) break;
    if (ret != Z_OK && ret != Z_BUF_ERROR) {
      deflateEnd(&zs);
      throw std::bad_alloc();  // only Z_MEM_ERROR is possible with valid arguments
    }
  }
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

struct EndRecord {
  uint64_t entries = 0;
  uint64_t cd_size = 0;
  uint64_t cd_offset = 0;
  uint64_t limit = 0;  // where the central directory must end: the first end record
};

Result<EndRecord> find_end_record(std::span<const uint8_t> a) {
  const size_t n = a.size();
  const uint8_t* b = a.data();
  if (n < kEndSize)
    return user_error("", "not a zip archive: " + std::to_string(n) + " bytes is too short");
  // The end record sits at the very end unless the archive has a comment (up to 64 KiB).
  size_t lowest = n - kEndSize > 0xFFFF ? n - kEndSize - 0xFFFF : 0;
  size_t pos = n - kEndSize + 1;
  bool found = false;
  while (pos-- > lowest) {
    if (get32(b + pos) == kEndSig && pos + kEndSize + get16(b + pos + 20) <= n) {
      found = true;
      break;
    }
  }
  if (!found)
    return user_error("", "no end of central directory record: the archive is truncated or not a zip file");
  const uint8_t* e = b + pos;
  uint32_t disk = get16(e + 4);
  uint32_t cd_disk = get16(e + 6);
  EndRecord r;
  uint64_t entries_here = get16(e + 8);
  r.entries = get16(e + 10);
  r.cd_size = get32(e + 12);
  r.cd_offset = get32(e + 16);
  r.limit = pos;
  if (pos >= kLocator64Size && get32(e - kLocator64Size) == kLocator64Sig) {
    const uint8_t* loc = e - kLocator64Size;
    uint64_t off = get64(loc + 8);
    if (off > pos - kLocator64Size || pos - kLocator64Size - off < kEnd64Size)
      return user_error("", "zip64 end of central directory record at offset " + std::to_string(off) +
                                " lies outside the archive");
    const uint8_t* z = b + off;
    if (get32(z) != kEnd64Sig)
      return user_error("", "bad zip64 end of central directory signature " + hex32(get32(z)) +
                                " at offset " + std::to_string(off));
    disk = get32(z + 16);
    cd_disk = get32(z + 20);
    entries_here = get64(z + 24);
    r.entries = get64(z + 32);
    r.cd_size = get64(z + 40);
    r.cd_offset = get64(z + 48);
    r.limit = off;
  } else if (r.entries == k16Max || r.cd_size == k32Max || r.cd_offset == k32Max) {
    return user_error("", "the end record refers to zip64 records but the zip64 locator is missing");
  }
  if (disk != 0 || cd_disk != 0 || entries_here != r.entries)
    return user_error("", "multi-volume zip archives are not supported");
  if (r.cd_offset > r.limit || r.cd_size > r.limit - r.cd_offset)
    return user_error("", "central directory (" + std::to_string(r.cd_size) + " bytes at offset " +
                              std::to_string(r.cd_offset) + ") lies outside the archive");
  return r;
}

}  // namespace

Status read_zip(std::span<const uint8_t> archive, const ZipMemberFn& fn) {
  KILN_ASSIGN_OR_RETURN(EndRecord end, find_end_record(archive));
  const uint8_t* b = archive.data();
  const uint64_t n = archive.size();
  uint64_t p = end.cd_offset;
  const uint64_t cd_end = end.cd_offset + end.cd_size;
  std::vector<uint8_t> inflated;
  for (uint64_t i = 0; i < end.entries; ++i) {
    std::string entry = "central directory entry " + std::to_string(i);
    if (cd_end - p < kCentralHeaderSize)
      return user_error(entry, "the central directory is truncated (" + std::to_string(end.entries) +
                                   " entries declared)");
    const uint8_t* c = b + p;
    if (get32(c) != kCentralSig)
      return user_error(entry, "bad signature " + hex32(get32(c)) + " at offset " + std::to_string(p));
    uint16_t flags = get16(c + 8);
    uint16_t method = get16(c + 10);
    uint32_t crc = get32(c + 16);
    uint64_t csize = get32(c + 20);
    uint64_t usize = get32(c + 24);
    size_t name_len = get16(c + 28);
    size_t extra_len = get16(c + 30);
    size_t comment_len = get16(c + 32);
    uint32_t disk_start = get16(c + 34);
    uint64_t local = get32(c + 42);
    if (cd_end - p - kCentralHeaderSize < name_len + extra_len + comment_len)
      return user_error(entry, "the central directory is truncated");
    std::string name(reinterpret_cast<const char*>(c + kCentralHeaderSize), name_len);
    std::string where = "member '" + name + "'";

    // Zip64 extra field: each classic field holding its maximum is replaced, in this order.
    const uint8_t* x = c + kCentralHeaderSize + name_len;
    const uint8_t* x_end = x + extra_len;
    bool have_zip64 = false;
    while (x_end - x >= 4) {
      uint16_t id = get16(x);
      size_t size = get16(x + 2);
      if (static_cast<size_t>(x_end - x - 4) < size)
        return user_error(where, "malformed extra field in the central directory");
      if (id == 0x0001) {
        have_zip64 = true;
        const uint8_t* f = x + 4;
        const uint8_t* f_end = f + size;
        auto take = [&](uint64_t& field) -> bool {
          if (f_end - f < 8) return false;
          field = get64(f);
          f += 8;
          return true;
        };
        if ((usize == k32Max && !take(usize)) || (csize == k32Max && !take(csize)) ||
            (local == k32Max && !take(local)))
          return user_error(where, "zip64 extra field is too short");
        if (disk_start == k16Max) {
          if (f_end - f < 4) return user_error(where, "zip64 extra field is too short");
          disk_start = get32(f);
        }
      }
      x += 4 + size;
    }
    if (!have_zip64 && (usize == k32Max || csize == k32Max || local == k32Max))
      return user_error(where, "sizes or offset need a zip64 extra field, which is missing");
    p += kCentralHeaderSize + name_len + extra_len + comment_len;

    if (!name.empty() && name.back() == '/') continue;  // a directory entry
    if (disk_start != 0) return user_error(where, "multi-volume zip archives are not supported");
    if (flags & 0x1) return user_error(where, "encrypted zip members are not supported");
    if (method != kMethodStored && method != kMethodDeflate)
      return user_error(where, "unsupported compression method " + std::to_string(method) +
                                   " (only stored and deflate are supported)");

    if (local > n || n - local < kLocalHeaderSize)
      return user_error(where, "local header offset " + std::to_string(local) + " lies outside the archive");
    const uint8_t* l = b + local;
    if (get32(l) != kLocalSig)
      return user_error(where, "bad local header signature " + hex32(get32(l)) + " at offset " +
                                   std::to_string(local));
    size_t lname_len = get16(l + 26);
    size_t lextra_len = get16(l + 28);
    if (n - local - kLocalHeaderSize < lname_len + lextra_len)
      return user_error(where, "the local header is truncated");
    std::string_view lname(reinterpret_cast<const char*>(l + kLocalHeaderSize), lname_len);
    if (lname != name)
      return user_error(where, "the local header names it '" + std::string(lname) + "'");
    uint64_t data_off = local + kLocalHeaderSize + lname_len + lextra_len;
    if (csize > n - data_off)
      return user_error(where, "data is truncated: " + std::to_string(csize) + " bytes at offset " +
                                   std::to_string(data_off) + " but the archive has " + std::to_string(n) +
                                   " bytes");
    std::span<const uint8_t> raw(b + data_off, static_cast<size_t>(csize));
    std::span<const uint8_t> data = raw;
    if (method == kMethodStored) {
      if (usize != csize)
        return user_error(where, "stored member has size " + std::to_string(usize) + " but " +
                                     std::to_string(csize) + " stored bytes");
    } else {
      KILN_RETURN_IF_ERROR(inflate_member(raw, usize, where, inflated));
      data = inflated;
    }
    uint32_t actual = crc32_of(data);
    if (actual != crc)
      return user_error(where, "crc-32 mismatch: the directory says " + hex32(crc) + ", the data has " +
                                   hex32(actual));
    KILN_RETURN_IF_ERROR(fn(name, data));
  }
  return Status();
}

void ZipWriter::add(std::string_view name, std::span<const uint8_t> data) {
  Entry e;
  e.name = std::string(name);
  e.crc = crc32_of(data);
  e.size = data.size();
  e.offset = out_.size();
  std::vector<uint8_t> packed;
  std::span<const uint8_t> body = data;
  if (options_.deflate) {
    packed = deflate_bytes(data);
    body = packed;
    e.method = kMethodDeflate;
  }
  e.compressed_size = body.size();
  e.zip64 = options_.force_zip64 || e.size >= k32Max || e.compressed_size >= k32Max;
  bool utf8 = std::any_of(e.name.begin(), e.name.end(), [](char ch) { return static_cast<uint8_t>(ch) >= 0x80; });

  put32(out_, kLocalSig);
  put16(out_, e.zip64 || e.offset >= k32Max ? 45 : 20);
  put16(out_, utf8 ? 0x0800 : 0);
  put16(out_, e.method);
  put16(out_, 0);       // time 00:00:00
  put16(out_, 0x0021);  // date 1980-01-01
  put32(out_, e.crc);
  put32(out_, e.zip64 ? k32Max : static_cast<uint32_t>(e.compressed_size));
  put32(out_, e.zip64 ? k32Max : static_cast<uint32_t>(e.size));
  put16(out_, static_cast<uint16_t>(e.name.size()));
  put16(out_, e.zip64 ? 20 : 0);
  out_.insert(out_.end(), e.name.begin(), e.name.end());
  if (e.zip64) {
    put16(out_, 0x0001);
    put16(out_, 16);
    put64(out_, e.size);
    put64(out_, e.compressed_size);
  }
  out_.insert(out_.end(), body.begin(), body.end());
  entries_.push_back(std::move(e));
}

std::vector<uint8_t> ZipWriter::finish() {
  const bool force = options_.force_zip64;
  auto big = [&](uint64_t v) { return force || v >= k32Max; };
  const uint64_t cd_offset = out_.size();
  for (const Entry& e : entries_) {
    std::vector<uint8_t> extra;
    if (big(e.size)) put64(extra, e.size);
    if (big(e.compressed_size)) put64(extra, e.compressed_size);
    if (big(e.offset)) put64(extra, e.offset);
    bool utf8 = std::any_of(e.name.begin(), e.name.end(), [](char ch) { return static_cast<uint8_t>(ch) >= 0x80; });
    uint16_t version = extra.empty() && !e.zip64 ? 20 : 45;
    put32(out_, kCentralSig);
    put16(out_, static_cast<uint16_t>((3 << 8) | version));  // made by: Unix
    put16(out_, version);
    put16(out_, utf8 ? 0x0800 : 0);
    put16(out_, e.method);
    put16(out_, 0);
    put16(out_, 0x0021);
    put32(out_, e.crc);
    put32(out_, big(e.compressed_size) ? k32Max : static_cast<uint32_t>(e.compressed_size));
    put32(out_, big(e.size) ? k32Max : static_cast<uint32_t>(e.size));
    put16(out_, static_cast<uint16_t>(e.name.size()));
    put16(out_, static_cast<uint16_t>(extra.empty() ? 0 : extra.size() + 4));
    put16(out_, 0);  // comment
    put16(out_, 0);  // disk
    put16(out_, 0);  // internal attributes
    put32(out_, 0644u << 16);  // external attributes: a regular file, rw-r--r--
    put32(out_, big(e.offset) ? k32Max : static_cast<uint32_t>(e.offset));
    out_.insert(out_.end(), e.name.begin(), e.name.end());
    if (!extra.empty()) {
      put16(out_, 0x0001);
      put16(out_, static_cast<uint16_t>(extra.size()));
      out_.insert(out_.end(), extra.begin(), extra.end());
    }
  }
  const uint64_t cd_size = out_.size() - cd_offset;
  const uint64_t count = entries_.size();
  const bool zip64 = force || count >= k16Max || cd_offset >= k32Max || cd_size >= k32Max;
  if (zip64) {
    const uint64_t end64 = out_.size();
    put32(out_, kEnd64Sig);
    put64(out_, kEnd64Size - 12);  // size of the rest of the record
    put16(out_, (3 << 8) | 45);
    put16(out_, 45);
    put32(out_, 0);
    put32(out_, 0);
    put64(out_, count);
    put64(out_, count);
    put64(out_, cd_size);
    put64(out_, cd_offset);
    put32(out_, kLocator64Sig);
    put32(out_, 0);
    put64(out_, end64);
    put32(out_, 1);
  }
  put32(out_, kEndSig);
  put16(out_, 0);
  put16(out_, 0);
  const uint16_t count16 = zip64 ? k16Max : static_cast<uint16_t>(count);
  put16(out_, count16);
  put16(out_, count16);
  put32(out_, zip64 ? k32Max : static_cast<uint32_t>(cd_size));
  put32(out_, zip64 ? k32Max : static_cast<uint32_t>(cd_offset));
  put16(out_, 0);
  entries_.clear();
  return std::exchange(out_, {});
}

}  // namespace kiln
