#pragma once
// POSIX file primitives of the checkpoint layer: read-only mappings, full writes, fsync of files
// and directories, atomic replacement (temporary file + fsync + rename + directory fsync), and
// the crash points the crash-safety test kills a saving process at.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace shardwise::ckpt {

namespace fs = std::filesystem;

// Error "<what> '<path>': <strerror(errno)>".
[[noreturn]] void fail_errno(std::string_view what, const fs::path& path);

// A whole file mapped read-only. The mapping stays valid when the path is later replaced by a
// rename (the writers never write into an existing file in place).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const fs::path& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, static_cast<size_t>(size_)}; }
  const fs::path& path() const { return path_; }
  // Hint that [offset, offset + length) will be read soon (madvise WILLNEED).
  void will_need(uint64_t offset, uint64_t length) const;
  // Whether at least half the pages of [offset, offset + length) are in the page cache (mincore).
  bool mostly_cached(uint64_t offset, uint64_t length) const;

 private:
  fs::path path_;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// An open file descriptor, closed on destruction.
class FileHandle {
 public:
  FileHandle() = default;
  // flags as for open(2); mode 0644 for created files.
  FileHandle(const fs::path& path, int flags);
  FileHandle(FileHandle&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
  FileHandle& operator=(FileHandle&& o) noexcept;
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  ~FileHandle();
  // `path` opened with O_DIRECT added to `flags` (no O_CREAT: the file exists), or nothing where
  // that fails, e.g. EINVAL on a file system without direct I/O: the caller reads or writes through
  // the page cache instead.
  static std::optional<FileHandle> open_direct(const fs::path& path, int flags);

  int fd() const { return fd_; }
  const fs::path& path() const { return path_; }
  void write_all(std::span<const std::byte> bytes);
  void pwrite_all(std::span<const std::byte> bytes, uint64_t offset);
  void pread_all(std::span<std::byte> out, uint64_t offset) const;
  void truncate(uint64_t size);
  void sync();   // fsync
  void close();  // close, reporting errors (a deferred write error shows up here)

 private:
  fs::path path_;
  int fd_ = -1;
};

void fsync_dir(const fs::path& dir);
// Writes `bytes` to a temporary file beside `path`, fsyncs it, renames it over `path` and fsyncs
// the directory: readers see the old file or the new one, never a part.
void write_file_atomic(const fs::path& path, const std::function<void(FileHandle&)>& write_body);
void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const fs::path& path, std::string_view text);
std::string read_text_file(const fs::path& path);
// A fresh name for a temporary file beside `path` (".<name>.tmp.<pid>.<n>").
fs::path temp_path_beside(const fs::path& path);
// rename(2) + Error naming both paths.
void rename_path(const fs::path& from, const fs::path& to);

// Crash points: every durable step of a save (a file written, fsync'ed, renamed) calls
// crash_point(). A test that called arm_crash_point(k, action) makes the k-th one (k >= 1, counted
// from the call) raise SIGKILL on the process, throw an Error, or wait (Hold) until the next
// arm_crash_point call (a test holding a background save mid-way); 0 disarms.
// crash_points_passed() counts the points reached since the last arm_crash_point.
enum class CrashAction { Kill, Throw, Hold };
void crash_point(std::string_view what);
void arm_crash_point(int64_t k, CrashAction action = CrashAction::Kill);
int64_t crash_points_passed();

}  // namespace shardwise::ckpt
