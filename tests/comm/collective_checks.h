#pragma once
// Backend-independent checks of every Communicator operation. Each check runs on every rank of
// `comm`, computes the expected result from a closed formula of (rank, index) and throws
// shardwise::Error naming the operation, rank and element on the first difference. The local
// tests run them on 1..4 threads; the MPI tests on 2 and 4 processes.
#include "shardwise/comm/communicator.h"

namespace shardwise::comm::checks {

void all_reduce_every_op(Communicator& comm);
void reduce_to_every_root(Communicator& comm);
void broadcast_from_every_root(Communicator& comm);
void all_gather_equal_and_unequal(Communicator& comm);
void reduce_scatter_equal_and_unequal(Communicator& comm);
void all_to_all_equal_and_v(Communicator& comm);  // includes zero and all-zero counts
// Pieces out of order with gaps, peers interleaved, empty pieces, zero counts, no pieces at all;
// the receive buffer outside the pieces is untouched.
void all_to_all_pieces_scattered(Communicator& comm);
// all_to_all_pieces with `fill`: each rank's send pieces written only when fill names their peer
// (once per rank, this rank's last, writing its own piece straight into the receive buffer).
void all_to_all_pieces_filled(Communicator& comm);
void send_recv_ring_and_tags(Communicator& comm);
// start_send / start_recv around a ring: messages of several sizes (empty, one beyond an eager
// limit) on several tags, receives posted in another order of tags than the sends, two on one tag
// meeting their messages in order. `waits_in_any_order` (a backend that really starts them): every
// rank posts and starts everything before it waits for any, then waits for its receives last
// first; a blocking recv behind a pending started one on its tag gets the next message; a
// message of another size is an Error at the wait. Otherwise (the default that makes each call at
// its wait) the waits go in an order safe for blocking calls.
void started_send_recv(Communicator& comm, bool waits_in_any_order = true);
void objects_and_bytes(Communicator& comm);
void sub_groups(Communicator& comm);
// start_all_reduce (every op, f32 and f64, in place or not), start_reduce_scatter_v and
// start_all_gather_v (unequal counts) started together, a blocking collective between the starts and the waits, waited for in
// reverse order.
void started_collectives(Communicator& comm);

// shared_regions and shared_barrier (one node): every member writes its slots of every region,
// then reads every member's slots of every region; a call within the size keeps the regions and
// counts the call; a larger one grows them. NCCL: no regions.
void shared_regions(Communicator& comm);

// Every check above, in order.
void all(Communicator& comm);

}  // namespace shardwise::comm::checks
