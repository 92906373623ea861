#pragma once
// `train --device`: cpu (the default), cuda / cuda:N (a GPU of a CUDA build), or fake (the tests'
// device: host memory standing in for cuda:0, PROT_NONE outside its copies, every kernel the CPU's;
// tensor/fake_device.h). Selecting a device registers its memory and installs its kernel table,
// once, before any rank starts; what is wrong is an Error naming the option, before any work.
#include <string>

#include "shardwise/tensor/device.h"

namespace shardwise::cli {

struct SelectedDevice {
  Device device;     // Device::host() for cpu
  std::string name;  // metrics.jsonl's "device": "cuda:0", "fake" (absent for cpu)
  std::string line;  // the run header's line ("" for cpu)
};

// `text` as --device gives it, for a run of `ranks` ranks (threads, or `mpi` processes).
SelectedDevice select_train_device(const std::string& text, int64_t ranks, bool mpi);

// The header's account of `ranks` rank threads of one process on one GPU of the `gpus` it sees:
// with more than one GPU visible, that the others stay idle and how to use them (a process each).
std::string threads_on_one_gpu(int64_t ranks, int gpus);

}  // namespace shardwise::cli
