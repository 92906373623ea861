#pragma once
// The plan of a distributed save, computed identically on every rank from the agreed tensor
// descriptions: which files hold which tensors (HF shards of at most max_shard_bytes), which rank
// writes each block's byte ranges, which rank fsyncs and digests each file. Internal to ckpt.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/ckpt/box_runs.h"
#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/device_staging.h"
#include "shardwise/ckpt/safetensors_writer.h"

namespace shardwise::ckpt::detail {

struct PlannedFile {
  std::string name;
  StLayout layout;
  int owner = 0;  // writes the header, fsyncs and digests the file
};

// A box of one tensor, written by one rank holding it.
struct Piece {
  size_t group = 0, tensor = 0;  // position in the content
  size_t file = 0, entry = 0;    // files[file].layout.tensors[entry]
  reshard::Box box;              // the named tensor's global coordinates
  Region dst;                    // the stored tensor as a region in the same coordinates (key_map.h)
  int writer = 0;
  uint64_t bytes = 0;
};

struct SavePlan {
  int64_t step = 0;
  fs::path root, tmp_dir;
  SaveOptions options;
  std::vector<PlannedFile> files;
  std::vector<Piece> pieces;
  std::vector<std::pair<std::string, std::string>> text_files;  // written by rank 0
  std::map<std::string, std::string> groups;                     // group -> index file
  nlohmann::json key_maps = nlohmann::json::object();            // group -> its KeyMap (when not empty)
  nlohmann::json saved_on;
};

// Collective: checks the content on every rank (all raise the same Error), agrees on it, has rank 0
// open checkpoint-<step>.tmp, and returns the plan.
SavePlan plan_save(comm::Communicator& comm, const fs::path& root, const CheckpointContent& content,
                   const SaveOptions& options);

// Where this rank's block of a tensor lies in memory: `data` holds the block's elements from
// `flat_begin` on (the rank's FlatRange; 0 for a whole block), `region` is the whole block.
struct BlockSource {
  const std::byte* data = nullptr;
  Region region;
  int64_t flat_begin = 0;
};
using Sources = std::map<std::pair<size_t, size_t>, BlockSource>;  // (group, tensor) -> block
// The blocks of `content` this rank writes pieces of (pointing into the content's host tensors;
// a device block's data is null until detail::stage_blocks copies it to the host).
Sources sources_in(const SavePlan& plan, const CheckpointContent& content, int rank);

// Points the sources of this rank's device blocks (every block with `host_too`) at host copies in
// `buffers` (a buffer big enough is reused): one device-to-host copy per device block
// (device_staging.cc).
void stage_blocks(const CheckpointContent& content, Sources& sources, StagingBuffers& buffers, bool host_too);

// Writes the pieces, fsyncs, digests, writes the manifest and commits. Uses only tagged
// point-to-point messages with rank 0, so it can run on a background thread while the caller
// uses collectives on the same communicator. Every rank raises the same Error on a failure.
fs::path execute_save(comm::Communicator& comm, const SavePlan& plan, const Sources& sources);

}  // namespace shardwise::ckpt::detail
