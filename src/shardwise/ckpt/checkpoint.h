#pragma once
// Unified checkpoints: named tensors distributed over meshes, saved as whole tensors in global
// coordinates (Hugging Face indexed safetensors shards, one set per group) and loaded back on any
// mesh and layout. The on-disk layout is in docs/architecture.md ("Checkpoint format on disk").
//
// Saving: every rank calls save_checkpoint with the same names, shapes, dtypes and layouts and its
// own blocks. No tensor data moves between ranks: each distinct block is written, as byte ranges
// of the whole tensor, by one of the ranks that hold it (replicas split large blocks among
// themselves), and the writers are balanced by bytes. This needs every rank to see the same file
// system (threads of one process, or processes sharing a disk or a network file system).
// Partial placements are refused: a checkpoint holds values, not parts of a sum; reduce first.
//
// Loading: each rank reads (mapped) only the byte ranges of its own blocks, for any layout.
//
// A rank may hold only part of its block (a sharded optimizer's range of a parameter's moments):
// a FlatRange of the block seen flat, row-major. Saving, the ranks holding a block write the
// elements their ranges cover (together they must cover the block); loading, a rank asks for its
// range and reads only those elements. The files are the same as from whole blocks.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/ckpt/file_io.h"
#include "shardwise/ckpt/key_map.h"
#include "shardwise/comm/communicator.h"
#include "shardwise/reshard/plan.h"
#include "shardwise/tensor/tensor.h"

namespace shardwise::ckpt {

// Elements [begin, begin + count) of a block seen flat (row-major): a range may start and end
// mid-row. flat_range_boxes (box_runs.h) cuts it into boxes.
struct FlatRange {
  int64_t begin = 0, count = 0;
};

// One tensor as a rank holds it. The mesh's process ids are ranks of the save's communicator.
struct DistTensor {
  std::string name;
  Shape global_shape;
  DType dtype = DType::F32;
  reshard::Layout layout;
  Tensor local;  // this rank's block; undefined when the rank is not in layout.mesh
  // Set when the rank holds only this range of its block: `local` is then the range, 1-D, `count`
  // elements. Every element of a block must be held by one of the ranks holding that block (whole
  // or in ranges); a range held by several ranks is written by one of them.
  std::optional<FlatRange> range = std::nullopt;
};

// A set of tensors saved as one indexed set of files: "<name>.safetensors.index.json" and
// "<name>-0000k-of-0000n.safetensors". Usual names: model, optimizer (keys "<param>/exp_avg",
// "<param>/exp_avg_sq"), master_weights.
// `keys` places tensors in boxes of stored (possibly fused) tensors (key_map.h); a fused stored
// tensor needs every tensor the table places in it. The manifest keeps each group's table.
// `single_file`: one "<name>.safetensors" and no index, whatever its size (PEFT reads its adapters
// only from adapter_model.safetensors); loading reads either form.
struct TensorGroup {
  std::string name;
  std::vector<DistTensor> tensors;
  KeyMap keys;
  bool single_file = false;
};

// The files of a transformers tokenizer a model directory may hold (save_pretrained's): a
// checkpoint of a model started from such a directory, and the tools' output, carry them byte for byte.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json",          "tokenizer.model",   "tokenizer_config.json",
                                                  "special_tokens_map.json", "vocab.json",        "merges.txt",
                                                  "added_tokens.json",       "chat_template.jinja"};

struct CheckpointContent {
  int64_t step = 0;
  std::vector<TensorGroup> groups;
  // Whole JSON files ("config.json", "generation_config.json", "trainer_state.json"); rank 0's
  // are written.
  std::vector<std::pair<std::string, nlohmann::json>> json_files;
  // Other whole files as bytes (a run's tokenizer.model); rank 0's are written, covered by the manifest.
  std::vector<std::pair<std::string, std::string>> raw_files;
};

struct SaveOptions {
  uint64_t max_shard_bytes = 5'000'000'000;  // per safetensors file (a bigger tensor gets a file alone)
  int64_t save_total_limit = 0;              // keep at most this many checkpoints; 0 keeps all
  bool sha256 = false;                       // manifest gets SHA-256 besides xxHash64
  uint64_t split_bytes = 4u << 20;           // replicated blocks from this size are split among replicas
};

// Collective over `comm`. Writes `root`/checkpoint-<step> by the commit protocol (commit.h) and
// returns that directory. Nothing already saved is touched when the input is bad: every check
// runs before the first byte is written, on every rank, and all ranks raise the same Error.
fs::path save_checkpoint(comm::Communicator& comm, const fs::path& root, const CheckpointContent& content,
                         const SaveOptions& options = {});

// What a rank wants to load: a tensor's global shape, the dtype it wants and its layout.
struct LoadSpec {
  std::string name;
  Shape global_shape;
  DType dtype = DType::F32;
  reshard::Layout layout;
  // Only this range of the rank's block (then loaded as a 1-D tensor of `count` elements): only
  // those elements are read.
  std::optional<FlatRange> range = std::nullopt;
};

struct LoadOptions {
  // Glob patterns (fnmatch) of names that may be missing from the checkpoint or present without
  // being asked for. Everything else must match exactly.
  // Matched against a tensor's name and against its file key.
  std::vector<std::string> ignore_keys;
  // A tensor stored in another dtype than asked is an Error unless this is set.
  bool convert_dtype = false;
  // Where the asked tensors lie in the files (key_map.h); a tensor it does not name is stored whole
  // under its own name.
  KeyMap keys;
  // Where the loaded blocks live: a device's blocks are read on the host and copied into device
  // memory through a staging buffer (device_staging.h), one counted copy each.
  Device device = Device::host();
};

// This process's blocks of the group's tensors (an undefined Tensor where the process is not in
// a spec's mesh). Reads only the byte ranges of those blocks. Errors name every missing and every
// unexpected key, a shape mismatch with both shapes, a dtype mismatch with both dtypes.
std::map<std::string, Tensor> load_group(const fs::path& dir, std::string_view group, std::span<const LoadSpec> specs,
                                         int64_t process, const LoadOptions& options = {});

// A whole JSON file of a checkpoint.
nlohmann::json load_json(const fs::path& dir, std::string_view file);

}  // namespace shardwise::ckpt
