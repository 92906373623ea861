// Executing a save plan: every rank writes its pieces as byte ranges of whole tensors into the
// shared .tmp directory, owners fsync and digest the files, rank 0 writes the manifest last and
// commits. Ranks talk only to rank 0, by tagged point-to-point messages (collectives where the
// communicator has none), after every phase, so a failure anywhere becomes the same Error on every
// rank instead of a hang.
#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/device_staging.h"
#include "shardwise/ckpt/direct_write.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/save_plan.h"
#include "shardwise/comm/exchange_communicator.h"
#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {

namespace detail {

namespace {

using json = nlohmann::json;

// Tags of the save's messages, apart from anything a trainer sends.
constexpr int kTagReport = 0x636b7001;
constexpr int kTagAnswer = 0x636b7002;

void send_text(comm::Communicator& comm, const std::string& s, int peer, int tag) {
  int64_t n = static_cast<int64_t>(s.size());
  comm.send(&n, 1, DType::I64, peer, tag);
  comm.send(s.data(), n, DType::U8, peer, tag);
}

std::string recv_text(comm::Communicator& comm, int peer, int tag) {
  int64_t n = 0;
  comm.recv(&n, 1, DType::I64, peer, tag);
  std::string s(static_cast<size_t>(n), '\0');
  comm.recv(s.data(), n, DType::U8, peer, tag);
  return s;
}

// Every rank reports to rank 0; rank 0 decides (an exception becomes an error answer) and every
// rank gets the answer. Reports and answers are JSON objects; "error" marks a failure. A
// communicator without send/recv (the exchange backend over an all-gather only, such as a PyTorch
// job's group) carries them by an all-gather and a broadcast instead; then an AsyncSaver's worker
// makes collectives, and its caller none on that communicator until finish().
json report_to_root(comm::Communicator& comm, const json& mine, const std::function<json(std::vector<json>&)>& decide) {
  const bool messages = comm::has_point_to_point(comm);
  if (comm.rank() != 0) {
    if (!messages) {
      comm::all_gather_object(comm, mine);
      return comm::broadcast_object(comm, json(), 0);
    }
    send_text(comm, mine.dump(), 0, kTagReport);
    return json::parse(recv_text(comm, 0, kTagAnswer));
  }
  std::vector<json> reports = {mine};
  if (!messages) reports = comm::all_gather_object(comm, mine);
  for (int r = 1; r < comm.size() && messages; ++r) reports.push_back(json::parse(recv_text(comm, r, kTagReport)));
  json answer;
  for (size_t r = 0; r < reports.size() && answer.is_null(); ++r) {
    if (reports[r].contains("error")) answer = {{"error", fmt::format("rank {}: {}", r, reports[r]["error"].get<std::string>())}};
  }
  if (answer.is_null()) {
    try {
      answer = decide(reports);
    } catch (const std::exception& e) {
      answer = {{"error", fmt::format("rank 0: {}", e.what())}};
    }
  }
  if (!messages) return comm::broadcast_object(comm, answer, 0);
  std::string text = answer.dump();
  for (int r = 1; r < comm.size(); ++r) send_text(comm, text, r, kTagAnswer);
  return answer;
}

// Every rank has answered before this runs, so nothing writes into the .tmp directory any more:
// rank 0 removes it at once (a full disk gets its space back; nothing committed is touched).
void raise_if_error(comm::Communicator& comm, const json& answer, const SavePlan& plan) {
  if (answer.contains("error")) {
    std::error_code ec;
    if (comm.rank() == 0 && !plan.tmp_dir.empty()) fs::remove_all(plan.tmp_dir, ec);
    fail("save checkpoint-{} into '{}' failed, nothing was committed{}: {}", plan.step, plan.root.string(),
         ec ? fmt::format(" (removing {} failed: {})", plan.tmp_dir.string(), ec.message()) : "",
         answer["error"].get<std::string>());
  }
}

// A small file of the checkpoint, written and fsync'ed in place (the .tmp directory is private).
void write_synced(const fs::path& path, std::string_view text) {
  FileHandle h(path, O_WRONLY | O_CREAT | O_TRUNC);
  h.write_all(std::as_bytes(std::span<const char>(text)));
  crash_point("file written");
  h.sync();
  crash_point("file fsync");
  h.close();
}

// Calls fn(file offset, bytes) for every run of the pieces of file `f` that rank `me` writes.
template <class Fn>
void for_each_piece_run(const SavePlan& plan, const Sources& sources, size_t f, int me, Fn&& fn) {
  const PlannedFile& pf = plan.files[f];
  for (const Piece& p : plan.pieces) {
    if (p.writer != me || p.file != f) continue;
    const StTensorInfo& info = pf.layout.tensors[p.entry];
    const BlockSource& src = sources.at({p.group, p.tensor});
    const size_t es = st_dtype_size(info.dtype);
    const uint64_t base = pf.layout.data_start() + info.begin;
    for_each_run(p.box, src.region, p.dst, [&](int64_t s, int64_t d, int64_t n) {
      fn(base + static_cast<uint64_t>(d) * es, std::span<const std::byte>(src.data + static_cast<size_t>(s - src.flat_begin) * es,
                                                                         static_cast<size_t>(n) * es));
    });
  }
}

// Rank `me`'s bytes of file `f` in file order: the header when it owns the file, and the runs of
// its pieces.
std::vector<WriteSegment> runs_of(const SavePlan& plan, const Sources& sources, size_t f, int me) {
  const PlannedFile& pf = plan.files[f];
  std::vector<WriteSegment> runs;
  if (pf.owner == me) runs.push_back({0, reinterpret_cast<const std::byte*>(pf.layout.header.data()), pf.layout.header.size()});
  for_each_piece_run(plan, sources, f, me, [&](uint64_t offset, std::span<const std::byte> bytes) {
    runs.push_back({offset, bytes.data(), bytes.size()});
  });
  std::sort(runs.begin(), runs.end(), [](const WriteSegment& a, const WriteSegment& b) { return a.offset < b.offset; });
  return runs;
}

// Whether rank `me` writes all of file `f`: it owns it, no other rank writes a piece of it, and
// its runs (runs_of) tile the file.
bool writes_whole(const SavePlan& plan, size_t f, int me, std::span<const WriteSegment> runs) {
  const PlannedFile& pf = plan.files[f];
  if (pf.owner != me) return false;
  for (const Piece& p : plan.pieces) {
    if (p.file == f && p.writer != me) return false;
  }
  uint64_t at = 0;
  for (const WriteSegment& s : runs) {
    if (s.offset != at) return false;  // a gap or an overlap: the plan's pieces do not tile it
    at += s.n;
  }
  return at == pf.layout.file_size();
}

// A stretch of a file several ranks write: bytes [offset, offset + n) that one rank writes, not
// adjacent to another of its own.
struct Stretch {
  uint64_t offset, n;
  int writer;
};

// The stretches of file `f` that their writers digest from memory (and write with O_DIRECT): those
// of at least SaveTuning::direct_min_stretch bytes (row blocks, ranges; not the column blocks'
// run per row), in file order; the owner digests the rest of the file after the fsync. Every rank
// finds the same from the plan. None where a SHA-256 of the whole file is asked for.
std::vector<Stretch> long_stretches(const SavePlan& plan, size_t f) {
  if (plan.options.sha256) return {};
  const PlannedFile& pf = plan.files[f];
  std::vector<Stretch> runs = {{0, pf.layout.header.size(), pf.owner}};
  for (const Piece& p : plan.pieces) {
    if (p.file != f) continue;
    const StTensorInfo& info = pf.layout.tensors[p.entry];
    const uint64_t es = st_dtype_size(info.dtype), base = pf.layout.data_start() + info.begin;
    for_each_run(p.box, Region::of(p.box), p.dst, [&](int64_t, int64_t d, int64_t n) {
      runs.push_back({base + static_cast<uint64_t>(d) * es, static_cast<uint64_t>(n) * es, p.writer});
    });
  }
  std::sort(runs.begin(), runs.end(), [](const Stretch& a, const Stretch& b) { return a.offset < b.offset; });
  std::vector<Stretch> out;
  for (size_t i = 0; i < runs.size();) {
    Stretch s = runs[i++];
    for (; i < runs.size() && runs[i].writer == s.writer && runs[i].offset == s.offset + s.n; ++i) s.n += runs[i].n;
    if (s.n >= save_tuning().direct_min_stretch) out.push_back(s);
  }
  return out;
}

// Writes this rank's pieces. A file this rank writes whole is written as one stream (O_DIRECT where
// SaveTuning and the file system allow it) and its digests, computed on the way, are returned in
// `streamed`. A file several ranks write gets this rank's runs: those in its long stretches by
// write_runs (O_DIRECT, each stretch's digest returned in `parts`), the others through the page
// cache; its owner digests the rest of the file after the fsync (`long_of` the owned files' long
// stretches, every writer's).
struct Written {
  std::map<std::string, FileDigest> streamed;
  std::map<std::string, std::vector<PartDigest>> parts;
  std::map<std::string, std::vector<Stretch>> long_of;
};

Written write_pieces(comm::Communicator& comm, const SavePlan& plan, const Sources& sources) {
  const int me = comm.rank();
  Written out;
  std::set<size_t> touched;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    if (plan.files[f].owner == me) touched.insert(f);
  }
  for (const Piece& p : plan.pieces) {
    if (p.writer == me) touched.insert(p.file);
  }
  for (size_t f : touched) {
    const PlannedFile& pf = plan.files[f];
    const std::vector<WriteSegment> runs = runs_of(plan, sources, f, me);
    if (writes_whole(plan, f, me, runs)) {
      out.streamed[pf.name] = write_file_streamed(plan.tmp_dir / pf.name, runs, plan.options.sha256, save_tuning());
      crash_point("file written");
      continue;
    }
    FileHandle h(plan.tmp_dir / pf.name, O_WRONLY | O_CREAT);
    h.truncate(pf.layout.file_size());  // every writer sets the same final size: order does not matter
    const std::vector<Stretch> stretches = long_stretches(plan, f);
    std::vector<WriteSegment> in_long;
    size_t k = 0;
    for (const WriteSegment& r : runs) {  // both in file order
      while (k < stretches.size() && stretches[k].offset + stretches[k].n <= r.offset) ++k;
      if (k < stretches.size() && stretches[k].writer == me && stretches[k].offset <= r.offset) {
        in_long.push_back(r);
      } else {
        h.pwrite_all({r.data, r.n}, r.offset);  // the owner digests it from the page cache
      }
    }
    if (!stretches.empty()) out.parts[pf.name] = write_runs(h, in_long, save_tuning());
    if (!stretches.empty() && pf.owner == me) out.long_of[pf.name] = stretches;
    h.close();
    crash_point("file written");
  }
  if (me == 0) {
    for (const auto& [name, text] : plan.text_files) write_synced(plan.tmp_dir / name, text);
  }
  return out;
}

json parts_json(const std::vector<PartDigest>& parts) {
  json out = json::array();
  for (const PartDigest& p : parts) out.push_back({p.offset, p.n, p.xxh64});
  return out;
}

// The xxh64 of every stretch of the file at `path` between the long stretches (those its writers
// digest), read after the fsync; they are in the page cache.
std::vector<PartDigest> digest_between(const fs::path& path, const std::vector<Stretch>& long_ones) {
  MappedFile m(path);
  std::vector<PartDigest> out;
  uint64_t at = 0;
  auto add = [&](uint64_t end) {
    if (end > at) out.push_back({at, end - at, xxh64_hex(m.bytes().subspan(at, end - at))});
  };
  for (const Stretch& s : long_ones) {
    add(s.offset);
    at = s.offset + s.n;
  }
  add(m.size());
  return out;
}

// The owners fsync their files and report each file's size and digests: those of the files written
// as one stream (`written.streamed`); for a file with long stretches the parts (every writer
// reports those of its long stretches, `written.parts`, and the owner the rest of the file); the
// others read back whole.
json sync_and_digest(comm::Communicator& comm, const SavePlan& plan, const Written& written) {
  json digests = json::object();
  auto add = [&](const std::string& name) {
    if (written.long_of.count(name)) {
      std::vector<PartDigest> parts = digest_between(plan.tmp_dir / name, written.long_of.at(name));
      if (written.parts.count(name)) parts.insert(parts.end(), written.parts.at(name).begin(), written.parts.at(name).end());
      digests[name] = {{"size", fs::file_size(plan.tmp_dir / name)}, {"parts", parts_json(parts)}};
      return;
    }
    auto it = written.streamed.find(name);
    FileDigest d = it != written.streamed.end() ? it->second : digest_file(plan.tmp_dir / name, plan.options.sha256);
    digests[name] = {{"size", d.size}, {"xxh64", d.xxh64}, {"sha256", d.sha256}};
  };
  for (const auto& [name, parts] : written.parts) {  // a writer's parts of a file another rank owns
    if (!written.long_of.count(name)) digests[name] = {{"parts", parts_json(parts)}};
  }
  for (const PlannedFile& f : plan.files) {
    if (f.owner != comm.rank()) continue;
    FileHandle h(plan.tmp_dir / f.name, O_RDONLY);
    h.sync();  // flushes every writer's pages of the file
    crash_point("file fsync");
    h.close();
    add(f.name);
  }
  if (comm.rank() == 0) {
    for (const auto& [name, text] : plan.text_files) add(name);
  }
  return digests;
}

// The manifest's digests from every rank's report: a file's size, xxh64 and SHA-256 from its
// owner, and the parts of a file digested by parts from all its writers, which must tile it.
std::map<std::string, FileDigest> merge_digests(const std::vector<json>& reports) {
  std::map<std::string, FileDigest> files;
  for (const json& r : reports) {
    for (const auto& [name, d] : r["digests"].items()) {
      FileDigest& f = files[name];
      if (d.contains("size")) f.size = d["size"].get<uint64_t>();
      if (d.contains("xxh64")) f.xxh64 = d["xxh64"].get<std::string>(), f.sha256 = d["sha256"].get<std::string>();
      for (const json& p : d.value("parts", json::array())) {
        f.parts.push_back({p[0].get<uint64_t>(), p[1].get<uint64_t>(), p[2].get<std::string>()});
      }
    }
  }
  for (auto& [name, f] : files) {
    std::sort(f.parts.begin(), f.parts.end(), [](const PartDigest& a, const PartDigest& b) { return a.offset < b.offset; });
    uint64_t at = 0;
    for (const PartDigest& p : f.parts) {
      SW_CHECK(p.offset == at, "'{}': its writers' parts leave bytes [{}, {}) undigested or digest them twice", name,
               std::min(at, p.offset), std::max(at, p.offset));
      at += p.n;
    }
    SW_CHECK(f.parts.empty() || at == f.size, "'{}': its writers' parts cover {} of its {} bytes", name, at, f.size);
  }
  return files;
}

fs::path commit(const SavePlan& plan, std::vector<json>& reports) {
  const std::map<std::string, FileDigest> files = merge_digests(reports);
  std::string text = make_manifest(plan.step, files, plan.groups, plan.saved_on, plan.key_maps).dump(2) + "\n";
  write_synced(plan.tmp_dir / kManifestName, text);
  fs::path dir = finish_commit(plan.root, plan.step);
  rotate_checkpoints(plan.root, plan.step, plan.options.save_total_limit);
  return dir;
}

}  // namespace

fs::path execute_save(comm::Communicator& comm, const SavePlan& plan, const Sources& sources) {
  json status = json::object();
  Written written;
  try {
    written = write_pieces(comm, plan, sources);
  } catch (const std::exception& e) {
    status = {{"error", e.what()}};
  }
  raise_if_error(comm, report_to_root(comm, status, [](std::vector<json>&) { return json::object(); }), plan);
  try {
    status = {{"digests", sync_and_digest(comm, plan, written)}};
  } catch (const std::exception& e) {
    status = {{"error", e.what()}};
  }
  json answer = report_to_root(comm, status, [&](std::vector<json>& reports) {
    return json{{"dir", commit(plan, reports).string()}};
  });
  raise_if_error(comm, answer, plan);
  return answer["dir"].get<std::string>();
}

}  // namespace detail

fs::path save_checkpoint(comm::Communicator& comm, const fs::path& root, const CheckpointContent& content,
                         const SaveOptions& options) {
  detail::SavePlan plan = detail::plan_save(comm, root, content, options);
  detail::Sources sources = detail::sources_in(plan, content, comm.rank());
  StagingBuffers staged;  // host copies of device blocks, back to the staging pool after the write
  detail::stage_blocks(content, sources, staged, false);
  return detail::execute_save(comm, plan, sources);
}

}  // namespace shardwise::ckpt
