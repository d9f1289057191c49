// Writing outputs atomically: every file kiln writes (models, sidecars, .npy outputs) goes to a
// temporary file in the same folder and is renamed into place once complete, so a failed or
// interrupted command never leaves a half-written output or clobbers the old one.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "formats/status.h"

namespace kiln {

/// strerror(err) as a string, for the messages of failed file operations.
std::string errno_text(int err);

/// Appends bytes to a file in whole chunks, each at an offset that is a multiple of the chunk (the
/// last chunk may be partial): bytes that come in smaller or unaligned pieces are gathered, the
/// aligned middle of a large piece goes straight through. AtomicFile writes 2 MiB chunks: the page
/// cache then keeps the file in 2 MiB folios, which a later mapping of it takes on 2 MiB pages (a
/// compiled model's weights, read in place on every run; bench/README.md has what it gains).
class ChunkedWriter {
 public:
  /// Writes `size` bytes at the end of the file.
  using Write = std::function<Status(const uint8_t* data, size_t size)>;
  ChunkedWriter(size_t chunk_bytes, Write write) : chunk_(chunk_bytes), write_(std::move(write)) {}

  Status append(const void* data, size_t size);
  /// Writes what is gathered: the end of the file.
  Status finish();

 private:
  size_t chunk_;
  Write write_;
  std::vector<uint8_t> pending_;  // the file's bytes past the last whole chunk written
};

/// A temporary file next to `final_path` that becomes `final_path` on commit() and is removed
/// otherwise (also when destroyed without commit).
class AtomicFile {
 public:
  AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  /// Creates the temporary file.
  Status open(const std::string& final_path);
  /// Appends bytes, in 2 MiB chunks (ChunkedWriter).
  Status write(const void* data, size_t size);
  /// Flushes and syncs the data (commit does it when not done yet): call it before taking a
  /// lock that commit needs, to hold the lock only for the rename.
  Status sync();
  /// Renames the synced file into place, then syncs the folder so that the rename is durable
  /// before anything that depends on it (a model naming this sidecar) is renamed.
  Status commit();

 private:
  Status write_all(const uint8_t* p, size_t size);

  std::string final_;
  std::string temp_;
  int fd_ = -1;
  bool synced_ = false;
  bool committed_ = false;
  ChunkedWriter out_;
};

/// Removes the temporary files that killed writers left next to `final_path` (its own and those
/// of files named after it, such as its sidecars): `.<name>.<...>tmp.<pid>.<n>` whose writer is
/// gone, that is the pid in the name is not alive (kill(pid, 0) fails with ESRCH) and no process
/// holds the lock every writer keeps on its temporary (a writer in another pid namespace sharing
/// the folder). A live writer's temporary is never touched. AtomicFile::open calls this, so the
/// next write of an output cleans up after an interrupted one.
void remove_stale_temporaries(const std::string& final_path);

/// Makes the renames and removals in folder `dir` ("" is the current folder) durable: fsync of
/// the folder. Best effort: file systems that cannot sync a folder are left as they are.
void sync_folder(const std::string& dir);

/// An exclusive lock (flock) on a folder, held while a group of files in it is switched and
/// cleaned up as one step (a model and its sidecar), so that concurrent writers never see each
/// other's half-switched state. Where the file system has no such lock, none is taken.
class FolderLock {
 public:
  explicit FolderLock(const std::string& dir);
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();

 private:
  int fd_ = -1;
};

/// Writes a whole file atomically. Errors name the file in Error::file.
Status write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace kiln
