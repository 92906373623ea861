#include "shardwise/ckpt/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

#include "shardwise/core/error.h"

namespace shardwise::ckpt {

void fail_errno(std::string_view what, const fs::path& path) {
  int e = errno;
  fail("{} '{}': {}", what, path.string(), std::strerror(e));
}

namespace {

std::atomic<int64_t> g_kill_at{0};
std::atomic<CrashAction> g_action{CrashAction::Kill};
std::atomic<int64_t> g_points{0};
std::atomic<int64_t> g_armed{0};  // arm_crash_point calls so far: a held point waits for the next
std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_errno("cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("'{}' is not a regular file", path.string());
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail_errno("cannot map", path);
    }
    data_ = static_cast<std::byte*>(p);
  }
  ::close(fd);
}

MappedFile::MappedFile(MappedFile&& o) noexcept : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void MappedFile::will_need(uint64_t offset, uint64_t length) const {
  if (!data_ || length == 0) return;
  uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t start = offset / page * page;
  ::madvise(data_ + start, offset + length - start, MADV_WILLNEED);
}

bool MappedFile::mostly_cached(uint64_t offset, uint64_t length) const {
  if (!data_ || length == 0) return false;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const uint64_t pages = (offset + length - start + page - 1) / page;
  std::vector<unsigned char> resident(static_cast<size_t>(pages));
  if (::mincore(data_ + start, static_cast<size_t>(offset + length - start), resident.data()) != 0) return false;
  uint64_t in = 0;
  for (unsigned char r : resident) in += r & 1u;
  return 2 * in >= pages;
}

FileHandle::FileHandle(const fs::path& path, int flags) : path_(path) {
  fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_errno("cannot open", path);
}

FileHandle& FileHandle::operator=(FileHandle&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<FileHandle> FileHandle::open_direct(const fs::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  FileHandle h;
  h.path_ = path;
  h.fd_ = fd;
  return h;
}

void FileHandle::write_all(std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot write", path_);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void FileHandle::pwrite_all(std::span<const std::byte> bytes, uint64_t offset) {
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::pwrite(fd_, p, left, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot write", path_);
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    left -= static_cast<size_t>(n);
  }
}

void FileHandle::pread_all(std::span<std::byte> out, uint64_t offset) const {
  std::byte* p = out.data();
  size_t left = out.size();
  while (left > 0) {
    ssize_t n = ::pread(fd_, p, left, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot read", path_);
    }
    if (n == 0) fail("cannot read '{}': file ends before byte {}", path_.string(), offset + left);
    p += n;
    offset += static_cast<uint64_t>(n);
    left -= static_cast<size_t>(n);
  }
}

void FileHandle::truncate(uint64_t size) {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) fail_errno("cannot resize", path_);
}

void FileHandle::sync() {
  if (::fsync(fd_) != 0) fail_errno("cannot fsync", path_);
}

void FileHandle::close() {
  if (fd_ < 0) return;
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_errno("cannot close", path_);
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open directory", dir);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  errno = e;
  if (rc != 0) fail_errno("cannot fsync directory", dir);
  crash_point("directory fsync");
}

fs::path temp_path_beside(const fs::path& path) {
  return path.parent_path() / fmt::format(".{}.tmp.{}.{}", path.filename().string(), ::getpid(),
                                          g_temp_counter.fetch_add(1));
}

void rename_path(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int e = errno;
    fail("cannot rename '{}' to '{}': {}", from.string(), to.string(), std::strerror(e));
  }
  crash_point("rename");
}

void write_file_atomic(const fs::path& path, const std::function<void(FileHandle&)>& write_body) {
  fs::path tmp = temp_path_beside(path);
  try {
    FileHandle f(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    write_body(f);
    crash_point("file written");
    f.sync();
    crash_point("file fsync");
    f.close();
    rename_path(tmp, path);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  fsync_dir(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

void write_file_atomic(const fs::path& path, std::span<const std::byte> bytes) {
  write_file_atomic(path, [&](FileHandle& f) { f.write_all(bytes); });
}

void write_file_atomic(const fs::path& path, std::string_view text) {
  write_file_atomic(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

std::string read_text_file(const fs::path& path) {
  MappedFile f(path);
  return std::string(reinterpret_cast<const char*>(f.data()), f.size());
}

void crash_point(std::string_view what) {
  int64_t n = g_points.fetch_add(1) + 1;
  int64_t k = g_kill_at.load();
  if (k > 0 && n == k) {
    if (g_action.load() == CrashAction::Kill) ::raise(SIGKILL);
    if (g_action.load() == CrashAction::Hold) {
      const int64_t armed = g_armed.load();
      while (g_armed.load() == armed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    fail("injected failure at crash point {} ({})", k, what);
  }
}

void arm_crash_point(int64_t k, CrashAction action) {
  g_armed.fetch_add(1);  // releases a point held by the last arming
  g_points.store(0);
  g_action.store(action);
  g_kill_at.store(k);
}

int64_t crash_points_passed() { return g_points.load(); }

}  // namespace shardwise::ckpt
