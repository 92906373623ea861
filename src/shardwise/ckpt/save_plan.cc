#include "shardwise/ckpt/save_plan.h"

#include <algorithm>
#include <numeric>
#include <regex>
#include <set>

#include "shardwise/ckpt/commit.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"
#include "shardwise/mesh/shard_math.h"
#include "shardwise/core/rank_failure.h"

namespace shardwise::ckpt::detail {

namespace {

using json = nlohmann::json;

bool plain_name(const std::string& s) { return std::regex_match(s, std::regex("[A-Za-z0-9_.-]+")) && s[0] != '.'; }

// The group's key map against its tensors: a placed tensor has the shape the table declares, the
// tensors of one stored tensor share a dtype and are all given (else the file would have a hole),
// and a stored key is not also the name of a tensor stored whole.
void check_placements(const TensorGroup& g) {
  g.keys.check_tiling();
  std::set<std::string> given;
  for (const DistTensor& t : g.tensors) given.insert(t.name);
  std::map<std::string, std::vector<std::string>> parts;  // stored key -> the names placed in it
  for (const auto& [name, ps] : g.keys.entries()) {
    for (const KeyPlacement& p : ps) parts[p.key].push_back(name);
  }
  std::map<std::string, DType> key_dtype;
  for (const DistTensor& t : g.tensors) {
    const std::span<const KeyPlacement> placed = g.keys.placements(t.name);
    if (placed.empty()) {
      SW_CHECK(!parts.count(t.name),
               "group '{}': tensor '{}' is stored whole, but the key map also fuses other tensors into '{}'", g.name,
               t.name, t.name);
      continue;
    }
    for (const KeyPlacement& p : placed) {
      SW_CHECK(p.shape == t.global_shape, "group '{}': tensor '{}' has shape {}, the key map places it as {} in '{}'",
               g.name, t.name, t.global_shape.to_string(), p.shape.to_string(), p.key);
      auto [it, fresh] = key_dtype.try_emplace(p.key, t.dtype);
      SW_CHECK(fresh || it->second == t.dtype, "group '{}': the tensors stored in '{}' differ in dtype ({} and {})",
               g.name, p.key, dtype_name(it->second), dtype_name(t.dtype));
      for (const std::string& other : parts.at(p.key)) {
        SW_CHECK(given.count(other), "group '{}': '{}' is stored in '{}' with '{}', which is not given: the stored "
                 "tensor would have a hole", g.name, t.name, p.key, other);
      }
    }
  }
}

// Local checks of one rank; an empty string when its part of the content is fine.
std::string local_problem(comm::Communicator& comm, const CheckpointContent& content, const SaveOptions& options) {
  try {
    SW_CHECK(options.max_shard_bytes > 0, "max_shard_bytes must be > 0");
    SW_CHECK(content.step >= 0, "step must be >= 0, got {}", content.step);
    std::set<std::string> files = {kManifestName};
    for (const TensorGroup& g : content.groups) {
      SW_CHECK(plain_name(g.name), "group name '{}': use letters, digits, '_', '-', '.'", g.name);
      SW_CHECK(files.insert(index_file_name(g.name)).second && files.insert(single_file_name(g.name)).second,
               "group '{}' is given twice", g.name);
      check_placements(g);
      std::set<std::string> names;
      for (const DistTensor& t : g.tensors) {
        SW_CHECK(!t.name.empty() && t.name != "__metadata__", "group '{}': tensor name '{}' is not allowed", g.name, t.name);
        SW_CHECK(names.insert(t.name).second, "group '{}': tensor '{}' is given twice", g.name, t.name);
        std::string what = fmt::format("tensor '{}' of group '{}'", t.name, g.name);
        const auto& mesh = t.layout.mesh;
        t.layout.dist.validate(t.global_shape.ndim(), mesh.ndim(), what);
        for (int d = 0; d < mesh.ndim(); ++d) {
          SW_CHECK(!t.layout.dist[d].is_partial(),
                   "{}: placement {} on mesh dim {} is Partial; a checkpoint holds values, not parts of a reduction: "
                   "reshard it to Replicate or Shard first", what, t.layout.dist.to_string(), d);
        }
        for (int64_t p : mesh.process_ids()) {
          SW_CHECK(p >= 0 && p < comm.size(), "{}: mesh {} names process {}, but the communicator has ranks 0..{}", what,
                   mesh.to_string(), p, comm.size() - 1);
        }
        if (!mesh.contains(comm.rank())) continue;
        auto coords = mesh.coords(mesh.rank_index_of_process(comm.rank()));
        Shape want = mesh::local_shape(t.global_shape, t.layout.dist, mesh, coords);
        SW_CHECK(t.local.defined(), "{}: rank {} is in mesh {} but gives no local block", what, comm.rank(), mesh.to_string());
        SW_CHECK(t.local.dtype() == t.dtype, "{}: local block is {}, the tensor is declared {}", what,
                 dtype_name(t.local.dtype()), dtype_name(t.dtype));
        if (!t.range) {
          SW_CHECK(t.local.shape() == want, "{}: rank {} holds a block of shape {}, its layout {} gives {}", what,
                   comm.rank(), t.local.shape().to_string(), t.layout.to_string(), want.to_string());
          continue;
        }
        const FlatRange& r = *t.range;
        SW_CHECK(r.begin >= 0 && r.count >= 0 && r.begin + r.count <= want.numel(),
                 "{}: rank {} holds elements [{}, {}) of its block {}, which has {} elements", what, comm.rank(),
                 r.begin, r.begin + r.count, want.to_string(), want.numel());
        SW_CHECK(t.local.shape() == Shape{r.count}, "{}: rank {} holds a range of {} elements as a tensor of shape {}; "
                 "a range is held 1-D", what, comm.rank(), r.count, t.local.shape().to_string());
      }
    }
    for (const auto& [name, value] : content.json_files) {
      SW_CHECK(plain_name(name) && name.ends_with(".json"), "JSON file name '{}': use a plain name ending in .json", name);
      SW_CHECK(files.insert(name).second, "JSON file '{}' collides with another file of the checkpoint", name);
    }
    for (const auto& [name, bytes] : content.raw_files) {
      SW_CHECK(plain_name(name), "file name '{}': use a plain name", name);
      SW_CHECK(files.insert(name).second, "file '{}' collides with another file of the checkpoint", name);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

json describe(const CheckpointContent& content, const SaveOptions& options) {
  json groups = json::array();
  for (const TensorGroup& g : content.groups) {
    json ts = json::array();
    for (const DistTensor& t : g.tensors) {
      ts.push_back({t.name, t.global_shape.to_string(), dtype_name(t.dtype), t.layout.mesh.to_string(),
                    t.layout.mesh.process_ids(), t.layout.dist.to_string()});
    }
    groups.push_back({g.name, ts, g.keys.to_json(), g.single_file});
  }
  json names = json::array();
  for (const auto& [name, v] : content.json_files) names.push_back(name);
  for (const auto& [name, bytes] : content.raw_files) names.push_back(name);
  return {{"step", content.step}, {"groups", groups}, {"json_files", names},
          {"options", {options.max_shard_bytes, options.save_total_limit, options.sha256, options.split_bytes}}};
}

// A candidate piece: a box and the ranks allowed to write it (holders of that box).
struct Candidate {
  Piece piece;
  std::vector<int> writers;
};

// The distinct blocks of a tensor and the processes holding each (sorted).
std::vector<std::pair<reshard::Box, std::vector<int>>> block_classes(const DistTensor& t) {
  const auto& mesh = t.layout.mesh;
  std::vector<std::pair<reshard::Box, std::vector<int>>> classes;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    reshard::Box b = reshard::block_at(t.global_shape, t.layout, mesh.coords(r));
    int proc = static_cast<int>(mesh.process_ids()[static_cast<size_t>(r)]);
    auto same = [&](const auto& c) {
      if (!(c.first.shape == b.shape)) return false;
      return std::equal(c.first.offset.begin(), c.first.offset.begin() + b.shape.ndim(), b.offset.begin());
    };
    auto it = std::find_if(classes.begin(), classes.end(), same);
    if (it == classes.end()) classes.push_back({b, {proc}});
    else it->second.push_back(proc);
  }
  for (auto& c : classes) std::sort(c.second.begin(), c.second.end());
  return classes;
}

// Every rank's FlatRange of each tensor it holds in part: (group, tensor) -> process -> range.
using HeldRanges = std::map<std::pair<size_t, size_t>, std::map<int, FlatRange>>;

// A flat interval [begin, end) of a block and the holders that hold all of it.
struct Held {
  int64_t begin = 0, end = 0;
  std::vector<int> holders;
};

// A block of `numel` elements cut wherever a holder's range starts or ends; each interval with the
// holders covering it (a holder without a range holds the whole block). An interval with no holder
// is a hole of the file.
std::vector<Held> held_intervals(int64_t numel, const std::vector<int>& holders, const std::map<int, FlatRange>& ranges) {
  auto span_of = [&](int h) {
    auto it = ranges.find(h);
    return it == ranges.end() ? std::pair<int64_t, int64_t>{0, numel}
                              : std::pair<int64_t, int64_t>{it->second.begin, it->second.begin + it->second.count};
  };
  std::set<int64_t> cuts = {0, numel};
  for (int h : holders) {
    auto [a, b] = span_of(h);
    if (a < b) cuts.insert({a, b});
  }
  std::vector<Held> out;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) {
    Held piece{*it, *std::next(it), {}};
    for (int h : holders) {
      auto [a, b] = span_of(h);
      if (a <= piece.begin && piece.end <= b) piece.holders.push_back(h);
    }
    out.push_back(std::move(piece));
  }
  return out;
}

// The ranks that hold parts of blocks must together hold every element of each block. The same
// answer on every rank (they all have every rank's ranges), before anything is written.
void check_ranges_cover(const CheckpointContent& content, const HeldRanges& ranges) {
  for (const auto& [at, by_rank] : ranges) {
    const TensorGroup& g = content.groups[at.first];
    const DistTensor& t = g.tensors[at.second];
    for (const auto& [box, holders] : block_classes(t)) {
      for (const Held& h : held_intervals(box.numel(), holders, by_rank)) {
        SW_CHECK(!h.holders.empty(), "save checkpoint: tensor '{}' of group '{}': elements [{}, {}) of the block {} "
                 "at {} are held by none of its ranks ({}): each rank gives only a range of the block, and the ranges "
                 "leave a hole", t.name, g.name, h.begin, h.end, box.shape.to_string(),
                 fmt::join(std::span(box.offset).first(static_cast<size_t>(box.shape.ndim())), ","),
                 fmt::join(holders, ", "));
      }
    }
  }
}

// Boxes are in the named tensor's coordinates, cut to the part of it the stored tensor holds
// (`placed`; null: the tensor is stored whole), which each piece keeps as its destination region.
// `ranges`: the holders' ranges of the tensor's blocks (empty when every holder has whole blocks).
void add_candidates(const DistTensor& t, const KeyPlacement* placed, size_t gi, size_t ti, size_t file,
                    size_t entry, uint64_t split_bytes, const std::map<int, FlatRange>& ranges,
                    std::vector<Candidate>& out) {
  const size_t es = dtype_size(t.dtype);
  const Region dst = placed ? placed->stored_region() : Region::whole(t.global_shape);
  auto in_part = [&](const reshard::Box& b) { return placed ? reshard::intersect(b, placed->part()) : b; };
  for (auto& [block, holders] : block_classes(t)) {
    const reshard::Box box = in_part(block);
    uint64_t bytes = static_cast<uint64_t>(box.numel()) * es;
    if (bytes == 0) continue;  // empty blocks and zero-size tensors: the header says it all
    if (std::any_of(holders.begin(), holders.end(), [&](int h) { return ranges.count(h) > 0; })) {
      // Holders of parts: each interval of the block (ranges are of the whole block, flat), as its
      // boxes cut to the stored part, by one of the holders covering it.
      for (const Held& h : held_intervals(block.numel(), holders, ranges)) {
        for (const reshard::Box& run : flat_range_boxes(block, h.begin, h.end - h.begin)) {
          const reshard::Box part = in_part(run);
          if (part.numel() == 0) continue;
          Candidate c;
          c.piece = Piece{gi, ti, file, entry, part, dst, h.holders.front(), static_cast<uint64_t>(part.numel()) * es};
          c.writers = h.holders;
          out.push_back(std::move(c));
        }
      }
      continue;
    }
    // Large replicated blocks are cut along dim 0 so that every replica writes a part.
    int64_t parts = 1;
    if (holders.size() > 1 && box.shape.ndim() > 0 && bytes >= split_bytes) {
      parts = std::min<int64_t>(static_cast<int64_t>(holders.size()), box.shape[0]);
    }
    for (int64_t k = 0; k < parts; ++k) {
      reshard::Box part = box;
      if (parts > 1) {
        mesh::Range r = mesh::chunk_range(box.shape[0], parts, k);
        part.offset[0] = box.offset[0] + r.offset;
        part.shape[0] = r.size;
      }
      Candidate c;
      c.piece = Piece{gi, ti, file, entry, part, dst, holders.front(), static_cast<uint64_t>(part.numel()) * es};
      c.writers = holders;
      out.push_back(std::move(c));
    }
  }
}

// A tensor of the files: a tensor stored whole, a fused one and the tensors placed in it, or one
// slice of a stacked tensor.
struct Stored {
  StSpec spec;
  std::vector<std::pair<size_t, const KeyPlacement*>> members;  // tensor indices in the group, placements
};

// In the order the group gives the tensors (a fused tensor where its first member comes, the
// slices of a stacked one in order).
std::vector<Stored> stored_tensors(const TensorGroup& g) {
  std::vector<Stored> out;
  std::map<std::string, size_t> at;
  auto add = [&](size_t ti, const std::string& key, const Shape& shape, const KeyPlacement* p) {
    auto [it, fresh] = at.try_emplace(key, out.size());
    if (fresh) out.push_back({StSpec{key, to_st_dtype(g.tensors[ti].dtype), shape}, {}});
    out[it->second].members.emplace_back(ti, p);
  };
  for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
    const DistTensor& t = g.tensors[ti];
    const std::span<const KeyPlacement> placed = g.keys.placements(t.name);
    if (placed.empty()) add(ti, t.name, t.global_shape, nullptr);
    for (const KeyPlacement& p : placed) add(ti, p.key, p.key_shape, &p);
  }
  return out;
}

const std::map<int, FlatRange> kWhole;  // no holder gives a range

// This rank's ranges: [group, tensor, begin, count] for each tensor of which it holds a range.
json ranges_of(comm::Communicator& comm, const CheckpointContent& content) {
  json out = json::array();
  for (size_t gi = 0; gi < content.groups.size(); ++gi) {
    const std::vector<DistTensor>& ts = content.groups[gi].tensors;
    for (size_t ti = 0; ti < ts.size(); ++ti) {
      if (ts[ti].range && ts[ti].layout.mesh.contains(comm.rank()))
        out.push_back({gi, ti, ts[ti].range->begin, ts[ti].range->count});
    }
  }
  return out;
}

// Least-loaded assignment: pieces with fewer possible writers first, then larger pieces first.
void assign_writers(std::vector<Candidate>& cands, int world, std::vector<Piece>& out) {
  std::vector<uint64_t> load(static_cast<size_t>(world), 0);
  std::vector<size_t> order(cands.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (cands[a].writers.size() != cands[b].writers.size()) return cands[a].writers.size() < cands[b].writers.size();
    return cands[a].piece.bytes > cands[b].piece.bytes;
  });
  for (size_t i : order) {
    Candidate& c = cands[i];
    int best = c.writers.front();
    for (int w : c.writers) {
      if (load[static_cast<size_t>(w)] < load[static_cast<size_t>(best)]) best = w;
    }
    c.piece.writer = best;
    load[static_cast<size_t>(best)] += c.piece.bytes;
  }
  for (auto& c : cands) out.push_back(c.piece);
}

}  // namespace

SavePlan plan_save(comm::Communicator& comm, const fs::path& root, const CheckpointContent& content,
                   const SaveOptions& options) {
  // 1. Every rank checks its part; all learn every rank's verdict, description and ranges.
  json mine = {{"problem", local_problem(comm, content, options)},
               {"content", describe(content, options)},
               {"ranges", ranges_of(comm, content)}};
  std::vector<json> all = comm::all_gather_object(comm, mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r]["problem"].get<std::string>().empty()) {
      throw RankFailure(static_cast<int64_t>(r), "save checkpoint: " + all[r]["problem"].get<std::string>(),
                        ErrorKind::Checkpoint);
    }
  }
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r]["content"] != all[0]["content"]) {
      fail("save checkpoint: rank {} describes the checkpoint differently from rank 0 (every rank must pass the same "
           "step, groups, names, shapes, dtypes, layouts, JSON file names and options): rank 0 {} vs rank {} {}",
           r, all[0]["content"].dump().substr(0, 300), r, all[r]["content"].dump().substr(0, 300));
    }
  }
  HeldRanges ranges;
  for (size_t r = 0; r < all.size(); ++r) {
    for (const json& e : all[r]["ranges"]) {
      ranges[{e[0].get<size_t>(), e[1].get<size_t>()}][static_cast<int>(r)] = {e[2].get<int64_t>(), e[3].get<int64_t>()};
    }
  }
  check_ranges_cover(content, ranges);
  // 2. Rank 0 opens the .tmp directory (Error if the checkpoint exists); all learn the outcome.
  json opened;
  if (comm.rank() == 0) {
    try {
      opened = {{"tmp", begin_commit(root, content.step).string()}};
    } catch (const std::exception& e) {
      opened = {{"error", e.what()}};
    }
  }
  opened = comm::broadcast_object(comm, opened, 0);
  if (opened.contains("error")) fail("save checkpoint: {}", opened["error"].get<std::string>());

  // 3. The plan, the same on every rank.
  SavePlan plan;
  plan.step = content.step;
  plan.root = root;
  plan.tmp_dir = opened["tmp"].get<std::string>();
  plan.options = options;
  std::vector<Candidate> cands;
  std::set<std::string> meshes;
  const std::optional<StMetadata> format_pt = StMetadata{{"format", "pt"}};  // what HF loaders require
  for (size_t gi = 0; gi < content.groups.size(); ++gi) {
    const TensorGroup& g = content.groups[gi];
    // Shards as Hugging Face cuts them: in the given order, a new file when the next tensor
    // would overflow a non-empty one.
    const std::vector<Stored> stored = stored_tensors(g);
    std::vector<std::vector<size_t>> shards;
    uint64_t in_shard = 0, total = 0;
    for (size_t si = 0; si < stored.size(); ++si) {
      uint64_t b = stored[si].spec.nbytes();
      if (shards.empty() || (!g.single_file && in_shard > 0 && in_shard + b > options.max_shard_bytes)) {
        shards.emplace_back();
        in_shard = 0;
      }
      shards.back().push_back(si);
      in_shard += b;
      total += b;
    }
    if (shards.empty()) shards.emplace_back();  // an empty group still gets one (empty) file
    json weight_map = json::object();
    for (size_t k = 0; k < shards.size(); ++k) {
      PlannedFile f;
      f.name = g.single_file ? single_file_name(g.name) : shard_file_name(g.name, k + 1, shards.size());
      std::vector<StSpec> specs;
      for (size_t si : shards[k]) specs.push_back(stored[si].spec);
      f.layout = layout_safetensors(specs, format_pt, f.name);
      for (size_t e = 0; e < f.layout.order.size(); ++e) {
        const Stored& st = stored[shards[k][f.layout.order[e]]];
        weight_map[st.spec.name] = f.name;
        for (const auto& [ti, p] : st.members) {
          const DistTensor& t = g.tensors[ti];
          meshes.insert(fmt::format("{} ranks {}", t.layout.mesh.to_string(), fmt::join(t.layout.mesh.process_ids(), ",")));
          auto held = ranges.find({gi, ti});
          add_candidates(t, p, gi, ti, plan.files.size(), e, options.split_bytes,
                         held == ranges.end() ? kWhole : held->second, cands);
        }
      }
      plan.files.push_back(std::move(f));
    }
    if (!g.keys.empty()) plan.key_maps[g.name] = g.keys.to_json();
    if (g.single_file) {  // the group is its file
      plan.groups[g.name] = single_file_name(g.name);
      continue;
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    plan.text_files.emplace_back(index_file_name(g.name), index.dump(2) + "\n");
    plan.groups[g.name] = index_file_name(g.name);
  }
  for (const auto& [name, value] : content.json_files) plan.text_files.emplace_back(name, value.dump(2) + "\n");
  for (const auto& [name, bytes] : content.raw_files) plan.text_files.emplace_back(name, bytes);
  assign_writers(cands, comm.size(), plan.pieces);
  // File owners (fsync + digest), balanced by file bytes.
  std::vector<uint64_t> load(static_cast<size_t>(comm.size()), 0);
  std::vector<size_t> by_size(plan.files.size());
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return plan.files[a].layout.file_size() > plan.files[b].layout.file_size(); });
  for (size_t i : by_size) {
    auto best = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    plan.files[i].owner = static_cast<int>(best);
    load[best] += plan.files[i].layout.file_size();
  }
  plan.saved_on = {{"world_size", comm.size()}, {"meshes", meshes}};
  return plan;
}

Sources sources_in(const SavePlan& plan, const CheckpointContent& content, int rank) {
  Sources out;
  for (const Piece& p : plan.pieces) {
    if (p.writer != rank) continue;
    const DistTensor& t = content.groups[p.group].tensors[p.tensor];
    auto coords = t.layout.mesh.coords(t.layout.mesh.rank_index_of_process(rank));
    // The block in the named tensor's coordinates (pieces carry the stored tensor's region); a rank
    // holding a range of it keeps only those elements, from flat_begin on.
    // A device block has no host data yet: the save stages it (device_staging.h).
    out[{p.group, p.tensor}] = {t.local.on_device() ? nullptr : t.local.raw(), Region::of(reshard::block_at(t.global_shape, t.layout, coords)),
                                t.range ? t.range->begin : 0};
  }
  return out;
}

}  // namespace shardwise::ckpt::detail
