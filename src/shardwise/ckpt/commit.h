#pragma once
// The commit protocol of a checkpoint directory `root`:
//   1. write everything into root/checkpoint-<step>.tmp/, fsync every file;
//   2. write manifest.json last, fsync it and the directory;
//   3. rename to root/checkpoint-<step>/ and fsync root; a checkpoint either exists whole or not;
//   4. replace root/latest ("checkpoint-<step>") atomically.
// Resume takes the newest checkpoint whose manifest verifies, never `latest` or modification
// times; stale ".tmp" directories (and ".deleted" ones of an interrupted rotation) are removed.
// Rotation keeps `limit` checkpoints by step, counting and deleting only checkpoints not newer
// than the newest verified one.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardwise/ckpt/file_io.h"
#include "shardwise/comm/communicator.h"

namespace shardwise::ckpt {

std::string checkpoint_dir_name(int64_t step);  // "checkpoint-<step>"
// The step of a complete checkpoint's directory name ("checkpoint-12" -> 12); nullopt otherwise.
std::optional<int64_t> parse_checkpoint_dir(std::string_view name);

struct CheckpointEntry {
  int64_t step = 0;
  fs::path dir;
};
// Complete-looking checkpoint directories (no suffix), ascending by step.
std::vector<CheckpointEntry> list_checkpoints(const fs::path& root);

// Step 1's directory: Error when checkpoint-<step> already exists (never overwritten); removes a
// stale checkpoint-<step>.tmp; creates root when needed.
fs::path begin_commit(const fs::path& root, int64_t step);
// Steps 3 and 4 (the manifest is already in `tmp_dir`, fsync'ed). Returns the final directory.
fs::path finish_commit(const fs::path& root, int64_t step);
// Deletes the oldest checkpoints with step <= newest_verified_step beyond `limit` (0: none).
std::vector<int64_t> rotate_checkpoints(const fs::path& root, int64_t newest_verified_step, int64_t limit);
// Removes stale "checkpoint-*.tmp" and "checkpoint-*.deleted" directories; returns them.
std::vector<fs::path> clean_stale(const fs::path& root);

// The newest checkpoint whose manifest verifies (checksums too when `checksums`); cleans stale
// directories first. `rejected` gets one line per newer checkpoint that failed, with why; `notes`
// the harmless findings of the one taken (files its manifest does not list). A checkpoint a newer
// shardwise wrote (its manifest's version) is an Error, not a rejection: it is not ours to set aside.
std::optional<CheckpointEntry> find_resume(const fs::path& root, bool checksums = true,
                                           std::vector<std::string>* rejected = nullptr,
                                           std::vector<std::string>* notes = nullptr);
// Renames a checkpoint that failed verification to "<name>.rejected" (".rejected.<n>" when taken) so
// that a resumed run can save that step again; returns the new path.
fs::path set_aside(const fs::path& dir);
// Collective: rank 0 looks, sets every rejected newer checkpoint aside, and every rank gets its
// answer; `messages` (every rank) gets one line per rejected checkpoint (why, and where it went) and
// the notes of the one taken.
std::optional<CheckpointEntry> resume(comm::Communicator& comm, const fs::path& root, bool checksums = true,
                                      std::vector<std::string>* messages = nullptr);
// Collective: rank 0 verifies `dir` (checksums too when `checksums`); Error on every rank naming the
// checkpoint and its first problem when it does not verify. Returns the notes (every rank).
std::vector<std::string> verify_resume_dir(comm::Communicator& comm, const fs::path& dir, bool checksums = true);

}  // namespace shardwise::ckpt
