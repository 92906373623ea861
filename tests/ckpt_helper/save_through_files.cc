// One rank of a checkpoint save through the file rendezvous, as a process of its own (no MPI):
//   ckpt_exchange_helper RENDEZVOUS_DIR ROOT RANK SIZE
// saves tests/ckpt/exchange_save.h's checkpoint into ROOT; exits 1 with the error on stderr.
#include <iostream>

#include "../ckpt/exchange_save.h"
#include "shardwise/comm/exchange_communicator.h"
#include "shardwise/comm/file_rendezvous.h"

int main(int argc, char** argv) {
  using namespace shardwise;
  if (argc != 5) {
    std::cerr << "usage: " << argv[0] << " RENDEZVOUS_DIR ROOT RANK SIZE\n";
    return 2;
  }
  try {
    const int rank = std::stoi(argv[3]), size = std::stoi(argv[4]);
    comm::ExchangeCommunicator c(std::make_shared<comm::FileRendezvous>(argv[1], rank, size, std::chrono::seconds(60)));
    using namespace ckpt::testing;
    ckpt::save_checkpoint(c, argv[2], content_for(small_model(), exchange_topology(), rank, kExchangeStep),
                          exchange_save_options());
  } catch (const std::exception& e) {
    std::cerr << "rank " << argv[3] << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
