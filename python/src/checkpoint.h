#pragma once
// shardwise.checkpoint's native half: the group a save sends its few control messages through
// (checkpoint_groups.cc: a file rendezvous, a Python group object, MPI, one process) and save /
// load / info over ckpt/checkpoint.h (checkpoint.cc, checkpoint_save.cc).
// python/shardwise/checkpoint.py is the Python API over them.
#include <nanobind/nanobind.h>

#include <memory>
#include <string>

#include "shardwise/comm/communicator.h"

namespace shardwise::py {

namespace nb = nanobind;

// The ranks of a save: a communicator whose ranks are the mesh's process ids.
struct CheckpointGroup {
  std::shared_ptr<comm::Communicator> comm;
  std::string what;  // names the group in errors and repr: "file rendezvous '/shared/rdv'", ...
};

void bind_checkpoint_groups(nb::module_& m);
void bind_checkpoint_save(nb::module_& m);
void bind_checkpoint_load(nb::module_& m);

}  // namespace shardwise::py
