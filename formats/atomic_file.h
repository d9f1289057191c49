// Writing outputs atomically: every file kiln writes (models, sidecars, .npy outputs) goes to a
// temporary file in the same folder and is renamed into place once complete, so a failed or
// interrupted command never leaves a half-written output or clobbers the old one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/status.h"

namespace kiln {

/// strerror(err) as a string, for the messages of failed file operations.
std::string errno_text(int err);

/// A temporary file next to `final_path` that becomes `final_path` on commit() and is removed
/// otherwise (also when destroyed without commit).
class AtomicFile {
 public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  /// Creates the temporary file.
  Status open(const std::string& final_path);
  /// Appends bytes (small writes are gathered, large ones go straight to the file).
  Status write(const void* data, size_t size);
  /// Flushes and syncs the data (commit does it when not done yet): call it before taking a
  /// lock that commit needs, to hold the lock only for the rename.
  Status sync();
  /// Renames the synced file into place, then syncs the folder so that the rename is durable
  /// before anything that depends on it (a model naming this sidecar) is renamed.
  Status commit();

 private:
  Status flush();
  Status write_all(const uint8_t* p, size_t size);

  std::string final_;
  std::string temp_;
  int fd_ = -1;
  bool synced_ = false;
  bool committed_ = false;
  std::vector<uint8_t> buffer_;
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
