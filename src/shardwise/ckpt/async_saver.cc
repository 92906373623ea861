#include "shardwise/ckpt/async_saver.h"

#include <iostream>

#include "shardwise/ckpt/save_plan.h"

namespace shardwise::ckpt {

AsyncSaver::~AsyncSaver() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::cerr << "shardwise: error: asynchronous checkpoint save failed and finish() was never called: " << e.what()
              << "\n";
  }
}

std::optional<fs::path> AsyncSaver::finish() {
  if (worker_.joinable()) worker_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  return std::exchange(done_, std::nullopt);
}

size_t AsyncSaver::staging_bytes() const {
  size_t n = 0;
  for (const auto& [k, v] : staging_) n += v.capacity();
  return n;
}

void AsyncSaver::save(comm::Communicator& comm, const fs::path& root, const CheckpointContent& content) {
  auto start = std::chrono::steady_clock::now();
  finish();  // the previous save's error surfaces here
  detail::SavePlan plan = detail::plan_save(comm, root, content, options_);
  detail::Sources sources = detail::sources_in(plan, content, comm.rank());
  // Host copies of the blocks this rank writes (device blocks copied from the device), into
  // buffers kept from earlier saves; the caller may change its tensors once save() returns.
  detail::stage_blocks(content, sources, staging_, true);
  worker_ = std::thread([this, &comm, plan = std::move(plan), sources = std::move(sources)] {
    try {
      done_ = detail::execute_save(comm, plan, sources);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
  blocked_ = std::chrono::steady_clock::now() - start;
}

}  // namespace shardwise::ckpt
