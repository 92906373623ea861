#pragma once
// FileRendezvous: a ByteExchange (comm/byte_exchange.h) through a directory every rank sees (one
// machine's disk, or a network file system), for jobs with no MPI and no group object: each call
// writes this rank's bytes to a file of its own (a temporary name, then a rename, so a reader never
// sees half a file) and polls for the other ranks' files.
//
// Sessions. A directory may hold the files of an earlier run that crashed, whose call numbers
// restart at 0 just like this run's: names alone cannot tell them apart. So the ranks first agree
// on a session no earlier run used: every rank draws a random nonce; rank 0 removes every
// rendezvous file of earlier runs ("rdv-*"; nothing else in the directory is touched), then waits
// for each rank's `rdv-hello-<rank>` file (a rank rewrites its own while it waits, should rank 0's
// clean-up have removed it) and writes `rdv-session`: a session id and the nonce it read from each
// rank. A rank joins only a session file naming its own nonce, so a stale one is never joined. The
// session's files live in `rdv-<session>/`: call k's are `c<k>-r<rank>`, a message's
// `m<from>-<to>-t<tag>-<n>` (the n-th from that rank to that rank with that tag).
// Clean-up: a rank removes its file of call k - 1 once it has every rank's file of call k (each
// rank read call k - 1's files before writing call k's), a receiver removes each message it read;
// the last call's files stay until the next run's rank 0 removes them.
// One rendezvous at a time per directory (two would remove each other's files): give each group
// (or an AsyncSaver's own rendezvous) a directory of its own.
// Timeouts: a call that waits longer than `timeout` for a rank is an Error naming the ranks that
// did not arrive and the directory; every rank that waits raises one. A rank whose process has
// exited is an Error at once (within a second), not at the timeout: each hello file and the
// session file say where every rank runs (host name and process id), and a waiting rank asks
// the system (kill(pid, 0)) about each missing rank on its own machine; a rank on another machine
// is waited for until the timeout.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/comm/byte_exchange.h"

namespace shardwise::comm {

class FileRendezvous final : public ByteExchange {
 public:
  // Joins (rank 0: opens) a session in `dir` (created if missing); every rank of the group must
  // construct one with the same directory and size. Waits up to `timeout` for the others.
  FileRendezvous(std::filesystem::path dir, int rank, int size,
                 std::chrono::milliseconds timeout = std::chrono::seconds(300));

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> all_gather_bytes(std::string_view mine) override;
  bool has_messages() const override { return true; }
  void send_bytes(std::string_view bytes, int peer, int tag) override;
  std::string recv_bytes(int peer, int tag) override;
  std::string describe() const override;
  // The session's directory (tests).
  const std::filesystem::path& session_dir() const { return session_dir_; }
  // Where a rank runs, as its hello file said (an empty host: not known).
  struct Process {
    std::string host;
    int64_t pid = 0;
  };
  // "rank R (process P on this machine, HOST) has exited" for the first of `ranks` whose process
  // runs on this machine and is gone; "" when none is known to be gone.
  std::string exited_rank(const std::vector<int>& ranks) const;

 private:
  std::filesystem::path dir_, session_dir_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  uint64_t calls_ = 0;
  std::vector<Process> processes_;  // where each rank runs
  std::mutex messages_mu_;  // the message counters (another thread may send or receive)
  std::map<std::pair<int, int>, uint64_t> sent_, received_;  // (peer, tag) -> messages so far

  void open_session(const std::string& nonce);
  void join_session(const std::string& nonce);
};

}  // namespace shardwise::comm
