#pragma once
// A ByteExchange for ranks as threads of one process (the tests of the exchange backend): the
// hub holds each all-gather's bytes until every rank has read them, and (when `messages`) the
// point-to-point messages in flight. A rank that waits over a minute fails instead of hanging.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "shardwise/comm/byte_exchange.h"
#include "shardwise/core/error.h"

namespace shardwise::comm::testing {

struct MemoryHub {
  explicit MemoryHub(int size, bool messages = true) : size(size), messages(messages) {}
  const int size;
  const bool messages;
  std::mutex mu;
  std::condition_variable cv;
  struct Round {
    std::vector<std::optional<std::string>> bytes;
    int readers = 0;
  };
  std::map<uint64_t, Round> rounds;
  std::map<std::tuple<int, int, int>, std::deque<std::string>> mail;  // (from, to, tag)
};

class MemoryExchange final : public ByteExchange {
 public:
  MemoryExchange(std::shared_ptr<MemoryHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size; }
  std::string describe() const override { return fmt::format("memory exchange (rank {} of {})", rank_, hub_->size); }
  bool has_messages() const override { return hub_->messages; }

  std::vector<std::string> all_gather_bytes(std::string_view mine) override {
    const uint64_t k = calls_++;
    std::unique_lock lock(hub_->mu);
    MemoryHub::Round& round = hub_->rounds[k];
    round.bytes.resize(static_cast<size_t>(hub_->size));
    round.bytes[static_cast<size_t>(rank_)] = std::string(mine);
    hub_->cv.notify_all();
    wait(lock, [&] { return std::all_of(round.bytes.begin(), round.bytes.end(), [](const auto& b) { return b.has_value(); }); });
    std::vector<std::string> out;
    for (const auto& b : round.bytes) out.push_back(*b);
    if (++round.readers == hub_->size) hub_->rounds.erase(k);
    return out;
  }

  void send_bytes(std::string_view bytes, int peer, int tag) override {
    if (!hub_->messages) return ByteExchange::send_bytes(bytes, peer, tag);
    std::lock_guard lock(hub_->mu);
    hub_->mail[{rank_, peer, tag}].emplace_back(bytes);
    hub_->cv.notify_all();
  }

  std::string recv_bytes(int peer, int tag) override {
    if (!hub_->messages) return ByteExchange::recv_bytes(peer, tag);
    std::unique_lock lock(hub_->mu);
    auto& queue = hub_->mail[{peer, rank_, tag}];
    wait(lock, [&] { return !queue.empty(); });
    std::string out = std::move(queue.front());
    queue.pop_front();
    return out;
  }

 private:
  std::shared_ptr<MemoryHub> hub_;
  int rank_;
  uint64_t calls_ = 0;

  template <class Ready>
  void wait(std::unique_lock<std::mutex>& lock, Ready&& ready) {
    SW_CHECK(hub_->cv.wait_for(lock, std::chrono::minutes(1), ready), "{}: no peer for a minute", describe());
  }
};

}  // namespace shardwise::comm::testing
