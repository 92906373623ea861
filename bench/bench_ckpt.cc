// Checkpoint throughput: `bench_ckpt save DIR GIB RANKS [tp|dp2tp2 [DIRECT [PIECE_MIB]]]` saves a
// model of GIB GiB (F32 matrices of 64 MiB, tensor-parallel S(0) over RANKS LocalWorld ranks, or
// "R,S(0)" on dp=2 x tp=2 with `dp2tp2`) with DIRECT O_DIRECT writes in flight of PIECE_MIB each
// (0: the page cache; ckpt::SaveTuning) and prints the wall time; `bench_ckpt load DIR RANKS [READERS [HUGE_PAGES [WILLNEED [DIRECT [SPAN_MIB [AHEAD]]]]]]` loads it
// back on RANKS ranks with S(1) (another layout than saved) with READERS reader threads per read, the
// destinations on huge pages or not, and DIRECT O_DIRECT requests in flight (0: the page cache;
// ckpt::LoadTuning) and a span cache of SPAN_MIB MiB (0: none; span_cache.h) reading ahead or not (AHEAD 1/0); `bench_ckpt
// async DIR GIB` prints how long a synchronous save and an AsyncSaver::save() block the caller.
// bench/ckpt.sh runs them next to dd on the same disk.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "shardwise/ckpt/async_saver.h"
#include "shardwise/ckpt/checkpoint.h"
#include "shardwise/ckpt/direct_write.h"
#include "shardwise/ckpt/parallel_read.h"
#include "shardwise/ckpt/span_cache.h"
#include "shardwise/comm/local.h"
#include "shardwise/mesh/shard_math.h"

using namespace shardwise;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kRows = 4096, kCols = 4096;  // 64 MiB of F32

// Rank `rank`'s part of the model: 1-d tensor-parallel S(0) over `ranks`, or with `dp_tp` on a
// dp=2 x tp=2 mesh "R,S(0)" (both dp replicas hold the same blocks; the save plan writes one copy).
ckpt::CheckpointContent content(int rank, int ranks, int tensors, int64_t step, bool dp_tp) {
  ckpt::CheckpointContent c;
  c.step = step;
  c.groups.push_back({"model", {}, {}});
  mesh::ProcessMesh m = dp_tp ? mesh::ProcessMesh(Shape{2, 2}) : mesh::ProcessMesh(Shape{ranks});
  mesh::DistAttr d = mesh::parse_dist(dp_tp ? "R,S(0)" : "S(0)", m.ndim());
  auto coords = m.coords(m.rank_index_of_process(rank));
  for (int i = 0; i < tensors; ++i) {
    Shape local = mesh::local_shape(Shape{kRows, kCols}, d, m, coords);
    Tensor t = Tensor::full(DType::F32, local, static_cast<double>(i + (dp_tp ? coords[1] : rank)));
    c.groups[0].tensors.push_back({"layer" + std::to_string(i) + ".weight", Shape{kRows, kCols}, DType::F32, {m, d}, t});
  }
  return c;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: bench_ckpt save DIR GIB RANKS [tp|dp2tp2 [DIRECT [PIECE_MIB]]] | load DIR RANKS [READERS [HUGE_PAGES [WILLNEED [DIRECT [SPAN_MIB [AHEAD]]]]]] | async DIR GIB\n");
    return 2;
  }
  std::string mode = argv[1];
  ckpt::fs::path dir = argv[2];
  if (mode == "save" || mode == "async") {
    int tensors = std::atoi(argv[3]) * 16;
    int ranks = mode == "save" && argc > 4 ? std::atoi(argv[4]) : 1;
    bool dp_tp = mode == "save" && argc > 5 && std::string(argv[5]) == "dp2tp2";
    if (dp_tp) ranks = 4;
    ckpt::SaveTuning& tuning = ckpt::save_tuning();
    if (mode == "save" && argc > 6) {
      tuning.direct = std::atoi(argv[6]) > 0;
      if (tuning.direct) tuning.direct_requests = std::atoi(argv[6]);
    }
    if (mode == "save" && argc > 7) tuning.direct_piece = static_cast<size_t>(std::atoi(argv[7])) << 20;
    double bytes = static_cast<double>(tensors) * kRows * kCols * 4;
    std::vector<ckpt::CheckpointContent> parts;
    for (int r = 0; r < ranks; ++r) parts.push_back(content(r, ranks, tensors, 1, dp_tp));
    if (mode == "save") {
      const uint64_t direct0 = ckpt::direct_write_bytes();
      auto t0 = Clock::now();
      comm::LocalWorld::run(ranks, [&](comm::Communicator& c) { ckpt::save_checkpoint(c, dir, parts[static_cast<size_t>(c.rank())]); });
      double s = seconds_since(t0);
      std::string how = tuning.direct ? fmt::format("O_DIRECT x{} of {} MiB: {:.0f}% of the bytes", tuning.direct_requests,
                                                    tuning.direct_piece >> 20,
                                                    100.0 * static_cast<double>(ckpt::direct_write_bytes() - direct0) / bytes)
                                      : std::string("page cache");
      std::printf("shardwise save: %.2f GB in %.2f s = %.2f GB/s (%s, %s, fsync + xxh64 manifest included)\n", bytes / 1e9,
                  s, bytes / 1e9 / s, dp_tp ? "dp=2 x tp=2 ranks" : (std::to_string(ranks) + " ranks").c_str(), how.c_str());
      return 0;
    }
    double sync_s = 0, async_s = 0, async_total = 0, async2_s = 0;
    comm::LocalWorld::run(1, [&](comm::Communicator& c) {
      auto t0 = Clock::now();
      ckpt::save_checkpoint(c, dir, parts[0]);
      sync_s = seconds_since(t0);
      ckpt::AsyncSaver saver;
      ckpt::CheckpointContent next = parts[0];
      next.step = 2;
      t0 = Clock::now();
      saver.save(c, dir, next);
      async_s = saver.last_blocking_time().count();
      saver.finish();
      async_total = seconds_since(t0);
      next.step = 3;  // the host buffers are reused from here on
      saver.save(c, dir, next);
      async2_s = saver.last_blocking_time().count();
      saver.finish();
    });
    std::printf("caller blocked: sync save %.3f s; async save %.3f s the first time (host buffers allocated), %.3f s "
                "with reused buffers (background write + commit took %.2f s)\n",
                sync_s, async_s, async2_s, async_total);
    return 0;
  }
  int ranks = std::atoi(argv[3]);
  ckpt::LoadTuning& tuning = ckpt::load_tuning();
  if (argc > 4) tuning.reader_threads = std::atoi(argv[4]);
  if (argc > 5) tuning.huge_pages = std::atoi(argv[5]) != 0;
  if (argc > 6) tuning.will_need = std::atoi(argv[6]) != 0;
  if (argc > 7) {
    tuning.direct = std::atoi(argv[7]) > 0;
    if (tuning.direct) tuning.direct_requests = std::atoi(argv[7]);
  }
  if (argc > 8) tuning.span_cache_bytes = static_cast<size_t>(std::atoi(argv[8])) << 20;
  if (argc > 9) tuning.span_read_ahead = std::atoi(argv[9]) != 0;
  std::vector<ckpt::LoadSpec> specs;
  auto index = ckpt::load_json(dir, "model.safetensors.index.json");
  for (const auto& [name, file] : index["weight_map"].items()) {
    specs.push_back({name, Shape{kRows, kCols}, DType::F32, {mesh::ProcessMesh(Shape{ranks}), mesh::parse_dist("S(1)", 1)}});
  }
  double bytes = static_cast<double>(specs.size()) * kRows * kCols * 4;
  auto t0 = Clock::now();
  double check = 0;
  comm::LocalWorld::run(ranks, [&](comm::Communicator& c) {
    auto loaded = ckpt::load_group(dir, "model", specs, c.rank());
    if (c.rank() == 0) check = loaded.at("layer1.weight").at(0);
  });
  double s = seconds_since(t0);
  std::string direct = tuning.direct ? fmt::format("O_DIRECT x{}: {:.0f}% of the bytes, span cache {} MiB{}: {:.0f}%",
                                                   tuning.direct_requests,
                                                   100.0 * static_cast<double>(ckpt::direct_read_bytes()) / bytes,
                                                   tuning.span_cache_bytes >> 20,
                                                   tuning.span_read_ahead ? " + read-ahead" : "",
                                                   100.0 * static_cast<double>(ckpt::span_cache_read_bytes()) / bytes)
                                     : std::string("page cache");
  std::printf("shardwise load: %.2f GB in %.2f s = %.2f GB/s (%d ranks, S(0) saved -> S(1) loaded, %d reader threads, "
              "huge pages %s, WILLNEED %s, %s; check %g)\n", bytes / 1e9, s, bytes / 1e9 / s, ranks, tuning.reader_threads,
              tuning.huge_pages ? "on" : "off", tuning.will_need ? "on" : "off", direct.c_str(), check);
  return 0;
}
