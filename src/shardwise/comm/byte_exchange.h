#pragma once
// ByteExchange: the least a group of ranks made by someone else (a PyTorch job's
// torch.distributed group, a shared directory: comm/file_rendezvous.h) must offer for shardwise to
// run collectives over it through ExchangeCommunicator (comm/exchange_communicator.h). A checkpoint
// save's control traffic (its plan, the ranks' reports, the commit) is a few small messages, so one
// all-gather of bytes is enough; point-to-point messages are optional.
#include <string>
#include <string_view>
#include <vector>

namespace shardwise::comm {

class ByteExchange {
 public:
  virtual ~ByteExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: every rank calls it, the same number of times in the same order, with bytes of any
  // length; every rank gets every rank's bytes in rank order (its own included). One thread at a time.
  virtual std::vector<std::string> all_gather_bytes(std::string_view mine) = 0;
  // Optional point-to-point messages, independent of the all-gathers (another thread may make them
  // while one all-gathers): messages from one rank to another with one tag arrive in the order sent.
  // send_bytes may return before the receiver takes the message. Without them (the defaults, which
  // throw), a checkpoint save sends its reports by all-gathers (ckpt/save.cc).
  virtual bool has_messages() const { return false; }
  virtual void send_bytes(std::string_view bytes, int peer, int tag);
  virtual std::string recv_bytes(int peer, int tag);
  // Names the exchange in errors, e.g. "file rendezvous '/shared/rdv'".
  virtual std::string describe() const = 0;
};

}  // namespace shardwise::comm
