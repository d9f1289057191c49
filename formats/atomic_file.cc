// Atomic file writes (temporary file, fsync, rename).
#include "formats/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace kiln {

namespace {

constexpr size_t kChunkBytes = size_t{2} << 20;  // a transparent huge page

// The writer pid of a temporary named `<...>.tmp.<pid>.<n>`, or 0 when the name is not one.
pid_t temp_writer(const std::string& name) {
  size_t at = name.rfind(".tmp.");
  if (at == std::string::npos) return 0;
  const char* p = name.c_str() + at + 5;
  char* end = nullptr;
  long pid = std::strtol(p, &end, 10);
  if (end == p || *end != '.' || pid <= 0) return 0;
  const char* n = end + 1;
  if (!*n) return 0;
  for (; *n; ++n)
    if (*n < '0' || *n > '9') return 0;
  return static_cast<pid_t>(pid);
}

std::string folder_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// True when the process `pid` is gone. A pid that belongs to someone else (EPERM) is alive.
bool writer_gone(pid_t pid) { return pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH; }

// Removes the temporary `path` unless its writer still holds the lock it takes on creation
// (flock locks die with their process, SIGKILL included). Where the file system has no flock,
// the dead pid alone decides.
void remove_unlocked(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK) ::unlink(path.c_str());
  ::close(fd);
}

}  // namespace

std::string errno_text(int err) { return std::strerror(err); }

void remove_stale_temporaries(const std::string& final_path) {
  std::string prefix = ".";
  prefix += std::filesystem::path(final_path).filename().string();
  prefix += '.';
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder_of(final_path), ec)) {
    std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    pid_t pid = temp_writer(name);
    std::error_code type_ec;
    if (pid > 0 && entry.is_regular_file(type_ec) && !entry.is_symlink(type_ec) && writer_gone(pid))
      remove_unlocked(entry.path().string());
  }
}

void sync_folder(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

FolderLock::FolderLock(const std::string& dir) {
  fd_ = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) return;
  while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

Status ChunkedWriter::append(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (!pending_.empty() || size < chunk_) {
    const size_t take = std::min(size, chunk_ - pending_.size());
    pending_.insert(pending_.end(), p, p + take);
    p += take;
    size -= take;
    if (pending_.size() < chunk_) return {};
    KILN_RETURN_IF_ERROR(finish());
  }
  // Nothing gathered: the file ends on a chunk's boundary.
  if (const size_t whole = size / chunk_ * chunk_; whole > 0) {
    KILN_RETURN_IF_ERROR(write_(p, whole));
    p += whole;
    size -= whole;
  }
  pending_.assign(p, p + size);
  return {};
}

Status ChunkedWriter::finish() {
  if (pending_.empty()) return {};
  Status s = write_(pending_.data(), pending_.size());
  pending_.clear();
  return s;
}

AtomicFile::AtomicFile() : out_(kChunkBytes, [this](const uint8_t* p, size_t n) { return write_all(p, n); }) {}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

Status AtomicFile::open(const std::string& final_path) {
  final_ = final_path;
  std::filesystem::path p(final_path);
  std::string base = p.filename().string();
  if (base.empty() || base == "." || base == "..")
    return user_error("", "cannot write '" + final_path + "': not a file name");
  std::filesystem::path dir = p.parent_path();
  remove_stale_temporaries(final_path);
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = "." + base + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    std::string temp = dir.empty() ? name : (dir / name).string();
    fd_ = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) {
      temp_ = temp;
      // Held until this process ends: it tells remove_stale_temporaries the writer is alive
      // even where the pid in the name means nothing (another pid namespace).
      (void)::flock(fd_, LOCK_EX | LOCK_NB);
      return {};
    }
    if (errno != EEXIST)
      return user_error("", "cannot create a temporary file next to '" + final_path + "': " + errno_text(errno));
  }
  return user_error("", "cannot create a temporary file next to '" + final_path + "': too many attempts");
}

Status AtomicFile::write(const void* data, size_t size) { return out_.append(data, size); }

Status AtomicFile::sync() {
  if (synced_) return {};
  KILN_RETURN_IF_ERROR(out_.finish());
  if (::fsync(fd_) != 0) return user_error("", "cannot write '" + final_ + "': " + errno_text(errno));
  synced_ = true;
  return {};
}

Status AtomicFile::commit() {
  KILN_RETURN_IF_ERROR(sync());
  // The file stays open (and locked) until it has its final name; its data is on disk, so
  // closing it cannot lose any.
  if (::rename(temp_.c_str(), final_.c_str()) != 0)
    return user_error("", "cannot replace '" + final_ + "': " + errno_text(errno));
  committed_ = true;
  ::close(fd_);
  fd_ = -1;
  sync_folder(folder_of(final_));
  return {};
}

Status AtomicFile::write_all(const uint8_t* p, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return user_error("", "cannot write '" + final_ + "': " + errno_text(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

Status write_file_atomic(const std::string& path, std::span<const uint8_t> bytes) {
  AtomicFile f;
  Status s = f.open(path);
  if (s.ok()) s = f.write(bytes.data(), bytes.size());
  if (s.ok()) s = f.commit();
  return with_file(s, path);
}

}  // namespace kiln
