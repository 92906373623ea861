#include "shardwise/comm/file_rendezvous.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "shardwise/core/atomic_file.h"
#include "shardwise/core/error.h"

namespace shardwise::comm {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

void write_atomic(const fs::path& path, std::string_view bytes) {
  const std::string problem = write_file_atomically(path, bytes);
  SW_CHECK(problem.empty(), "file rendezvous: {}", problem);
}

// The file's bytes, or nothing while it does not exist.
std::optional<std::string> read_if_there(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream s;
  s << f.rdbuf();
  return std::move(s).str();
}

// Calls `ready` until it returns true (short sleeps between, growing to 5 ms); false at the deadline.
template <class Ready>
bool poll_until(Ready&& ready, Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(50);
  while (!ready()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(5));
  }
  return true;
}

std::string random_nonce() {
  std::random_device rd;
  const uint64_t bits = (uint64_t{rd()} << 32 | rd()) ^ static_cast<uint64_t>(::getpid()) ^
                        static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return fmt::format("{:016x}", bits);
}

bool is_rendezvous_file(const std::string& name) { return name.starts_with("rdv-") || name.starts_with(".rdv-"); }

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// What a rank's hello file holds: its nonce, then where it runs ("<nonce> <host> <pid>").
std::string hello_text(const std::string& nonce) { return fmt::format("{} {} {}", nonce, host_name(), ::getpid()); }

// A rank's process as its hello file told it (an empty host: not known).
FileRendezvous::Process parse_process(std::istringstream& in) {
  FileRendezvous::Process p;
  if (!(in >> p.host >> p.pid)) p = {};
  return p;
}

// An exited process its parent has not reaped yet (state Z in /proc/<pid>/stat) still answers kill().
bool is_zombie(int64_t pid) {
  std::istringstream stat(read_if_there(fmt::format("/proc/{}/stat", pid)).value_or(""));
  std::string rest;
  std::getline(stat, rest);
  const size_t name_end = rest.rfind(')');  // "<pid> (<command>) <state> ..."; the command may hold spaces
  return name_end != std::string::npos && name_end + 2 < rest.size() && rest[name_end + 2] == 'Z';
}

}  // namespace

std::string FileRendezvous::exited_rank(const std::vector<int>& missing) const {
  static const std::string here = host_name();
  for (int r : missing) {
    const Process& p = processes_[static_cast<size_t>(r)];
    if (p.host != here || p.pid <= 0) continue;  // another machine's process cannot be asked
    if ((::kill(static_cast<pid_t>(p.pid), 0) != 0 && errno == ESRCH) || is_zombie(p.pid))
      return fmt::format("rank {} (process {} on this machine, {}) has exited", r, p.pid, here);
  }
  return "";
}

namespace {

// Polls as poll_until does, and once a second asks whether a missing rank's process has exited: a
// rank that died never arrives, so waiting out the timeout would only delay the error. `missing`
// is what `ready` left there; returns the exited rank's description, or "" (arrived or timed out).
template <class Ready>
std::string poll_while_alive(const FileRendezvous& rdv, Ready&& ready, const std::vector<int>& missing,
                             Clock::time_point deadline, bool& arrived) {
  auto next_check = Clock::now() + std::chrono::seconds(1);
  std::string exited;
  arrived = poll_until([&] {
    if (ready()) return true;
    if (Clock::now() < next_check) return false;
    next_check = Clock::now() + std::chrono::seconds(1);
    exited = rdv.exited_rank(missing);
    return !exited.empty();
  }, deadline) && exited.empty();
  return exited;
}

}  // namespace

FileRendezvous::FileRendezvous(fs::path dir, int rank, int size, std::chrono::milliseconds timeout)
    : dir_(std::move(dir)), rank_(rank), size_(size), timeout_(timeout) {
  SW_CHECK(size >= 1 && rank >= 0 && rank < size, "file rendezvous '{}': rank {} is not a rank of a group of {}",
           dir_.string(), rank, size);
  SW_CHECK(timeout.count() > 0, "file rendezvous '{}': the timeout must be positive, got {} ms", dir_.string(),
           timeout.count());
  std::error_code ec;
  fs::create_directories(dir_, ec);
  SW_CHECK(fs::is_directory(dir_), "file rendezvous: cannot create the directory '{}'{}", dir_.string(),
           ec ? ": " + ec.message() : "");
  processes_.resize(static_cast<size_t>(size_));
  const std::string nonce = random_nonce();
  if (rank_ == 0) open_session(nonce);
  else join_session(nonce);
}

std::string FileRendezvous::describe() const {
  return fmt::format("file rendezvous '{}' (rank {} of {})", dir_.string(), rank_, size_);
}

void FileRendezvous::open_session(const std::string& nonce) {
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (is_rendezvous_file(e.path().filename().string())) stale.push_back(e.path());
  }
  for (const fs::path& p : stale) {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
  std::vector<std::string> nonces(static_cast<size_t>(size_));
  nonces[0] = nonce;
  processes_[0] = {host_name(), ::getpid()};
  std::vector<int> missing;
  bool all = poll_until([&] {
    missing.clear();
    for (int r = 1; r < size_; ++r) {
      auto& n = nonces[static_cast<size_t>(r)];
      if (n.empty()) {
        std::istringstream hello(read_if_there(dir_ / fmt::format("rdv-hello-{}", r)).value_or(""));
        hello >> n;
        processes_[static_cast<size_t>(r)] = parse_process(hello);
      }
      if (n.empty()) missing.push_back(r);
    }
    return missing.empty();
  }, Clock::now() + timeout_);
  SW_CHECK(all, "file rendezvous '{}': rank(s) {} of {} did not arrive within {} ms (no rdv-hello-<rank> file from "
           "them); every rank must start a FileRendezvous over this directory", dir_.string(),
           fmt::join(missing, ", "), size_, timeout_.count());
  session_dir_ = dir_ / ("rdv-" + nonce);
  fs::create_directory(session_dir_);
  std::string where;
  for (const Process& p : processes_) where += fmt::format("{} {}\n", p.host.empty() ? "?" : p.host, p.pid);
  write_atomic(dir_ / "rdv-session", fmt::format("{}\n{}\n{}", nonce, fmt::join(nonces, " "), where));
}

void FileRendezvous::join_session(const std::string& nonce) {
  const fs::path hello = dir_ / fmt::format("rdv-hello-{}", rank_);
  const std::string mine = hello_text(nonce);
  std::string session;
  bool joined = poll_until([&] {
    // Again when rank 0's clean-up removed it (or its temporary file midway), or a stale one is there.
    if (read_if_there(hello) != mine) write_file_atomically(hello, mine);
    std::istringstream in(read_if_there(dir_ / "rdv-session").value_or(""));
    std::string id, line, n;
    std::vector<std::string> nonces;
    std::getline(in, id);
    std::getline(in, line);
    std::istringstream nonce_line(line);
    while (nonce_line >> n) nonces.push_back(n);
    if (static_cast<int>(nonces.size()) != size_ || nonces[static_cast<size_t>(rank_)] != nonce) return false;
    for (Process& p : processes_) {  // where each rank runs (a line each)
      std::getline(in, line);
      std::istringstream where(line);
      p = parse_process(where);
    }
    session = id;
    return true;
  }, Clock::now() + timeout_);
  SW_CHECK(joined, "file rendezvous '{}': rank {} of {} found no session naming it within {} ms: rank 0 writes "
           "rdv-session once every rank's rdv-hello-<rank> file is there, and rank 0 or another rank did not arrive", dir_.string(), rank_,
           size_, timeout_.count());
  std::error_code ec;
  fs::remove(hello, ec);
  session_dir_ = dir_ / ("rdv-" + session);
}

std::vector<std::string> FileRendezvous::all_gather_bytes(std::string_view mine) {
  const uint64_t call = calls_++;
  auto file = [&](uint64_t k, int r) { return session_dir_ / fmt::format("c{}-r{}", k, r); };
  write_atomic(file(call, rank_), mine);
  std::vector<std::optional<std::string>> got(static_cast<size_t>(size_));
  got[static_cast<size_t>(rank_)] = std::string(mine);
  std::vector<int> missing;
  bool all = false;
  const std::string exited = poll_while_alive(*this, [&] {
    missing.clear();
    for (int r = 0; r < size_; ++r) {
      auto& g = got[static_cast<size_t>(r)];
      if (!g) g = read_if_there(file(call, r));
      if (!g) missing.push_back(r);
    }
    return missing.empty();
  }, missing, Clock::now() + timeout_, all);
  SW_CHECK(exited.empty(), "{}: call {}: {}; it will never arrive (no c{}-r<rank> file from it in '{}')", describe(),
           call, exited, call, session_dir_.string());
  SW_CHECK(all, "{}: call {}: rank(s) {} did not arrive within {} ms (no c{}-r<rank> file from them in '{}')",
           describe(), call, fmt::join(missing, ", "), timeout_.count(), call, session_dir_.string());
  if (call > 0) {  // every rank has read it: each wrote this call's file after reading the last call's
    std::error_code ec;
    fs::remove(file(call - 1, rank_), ec);
  }
  std::vector<std::string> out;
  for (auto& g : got) out.push_back(std::move(*g));
  return out;
}

void FileRendezvous::send_bytes(std::string_view bytes, int peer, int tag) {
  SW_CHECK(peer >= 0 && peer < size_ && peer != rank_, "{}: send to rank {}: not another rank of the group",
           describe(), peer);
  uint64_t n = 0;
  {
    std::lock_guard lock(messages_mu_);
    n = sent_[{peer, tag}]++;
  }
  write_atomic(session_dir_ / fmt::format("m{}-{}-t{}-{}", rank_, peer, tag, n), bytes);
}

std::string FileRendezvous::recv_bytes(int peer, int tag) {
  SW_CHECK(peer >= 0 && peer < size_ && peer != rank_, "{}: recv from rank {}: not another rank of the group",
           describe(), peer);
  uint64_t n = 0;
  {
    std::lock_guard lock(messages_mu_);
    n = received_[{peer, tag}]++;
  }
  const fs::path path = session_dir_ / fmt::format("m{}-{}-t{}-{}", peer, rank_, tag, n);
  std::optional<std::string> got;
  bool arrived = false;
  const std::vector<int> sender = {peer};
  const std::string exited = poll_while_alive(*this, [&] { return (got = read_if_there(path)).has_value(); }, sender,
                                              Clock::now() + timeout_, arrived);
  SW_CHECK(exited.empty(), "{}: {} before sending message {} (tag {}; '{}' is missing)", describe(), exited, n, tag,
           path.string());
  SW_CHECK(arrived, "{}: rank {} sent no message {} (tag {}) within {} ms ('{}' is missing)", describe(), peer, n, tag,
           timeout_.count(), path.string());
  std::error_code ec;
  fs::remove(path, ec);
  return std::move(*got);
}

}  // namespace shardwise::comm
