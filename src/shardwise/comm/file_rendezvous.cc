#include "shardwise/comm/file_rendezvous.h"

#include <unistd.h>

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
  std::vector<int> missing;
  bool all = poll_until([&] {
    missing.clear();
    for (int r = 1; r < size_; ++r) {
      auto& n = nonces[static_cast<size_t>(r)];
      if (n.empty()) n = read_if_there(dir_ / fmt::format("rdv-hello-{}", r)).value_or("");
      if (n.empty()) missing.push_back(r);
    }
    return missing.empty();
  }, Clock::now() + timeout_);
  SW_CHECK(all, "file rendezvous '{}': rank(s) {} of {} did not arrive within {} ms (no rdv-hello-<rank> file from "
           "them); every rank must start a FileRendezvous over this directory", dir_.string(),
           fmt::join(missing, ", "), size_, timeout_.count());
  session_dir_ = dir_ / ("rdv-" + nonce);
  fs::create_directory(session_dir_);
  write_atomic(dir_ / "rdv-session", fmt::format("{}\n{}\n", nonce, fmt::join(nonces, " ")));
}

void FileRendezvous::join_session(const std::string& nonce) {
  const fs::path hello = dir_ / fmt::format("rdv-hello-{}", rank_);
  std::string session;
  bool joined = poll_until([&] {
    // Again when rank 0's clean-up removed it (or its temporary file midway), or a stale one is there.
    if (read_if_there(hello) != nonce) write_file_atomically(hello, nonce);
    std::istringstream in(read_if_there(dir_ / "rdv-session").value_or(""));
    std::string id, n;
    std::vector<std::string> nonces;
    in >> id;
    while (in >> n) nonces.push_back(n);
    if (static_cast<int>(nonces.size()) != size_ || nonces[static_cast<size_t>(rank_)] != nonce) return false;
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
  bool all = poll_until([&] {
    missing.clear();
    for (int r = 0; r < size_; ++r) {
      auto& g = got[static_cast<size_t>(r)];
      if (!g) g = read_if_there(file(call, r));
      if (!g) missing.push_back(r);
    }
    return missing.empty();
  }, Clock::now() + timeout_);
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
  bool arrived = poll_until([&] { return (got = read_if_there(path)).has_value(); }, Clock::now() + timeout_);
  SW_CHECK(arrived, "{}: rank {} sent no message {} (tag {}) within {} ms ('{}' is missing)", describe(), peer, n, tag,
           timeout_.count(), path.string());
  std::error_code ec;
  fs::remove(path, ec);
  return std::move(*got);
}

}  // namespace shardwise::comm
