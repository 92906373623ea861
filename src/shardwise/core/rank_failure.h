#pragma once
// An error that every rank of a job raises alike after they agreed on it, naming the one rank where
// it arose: "rank 3 failed: <message>". The world that runs the ranks reports it as it is, without
// adding the rank that happened to raise it first (comm::LocalWorld::run).
#include <cstdint>
#include <string>

#include "shardwise/core/error.h"

namespace shardwise {

// `kind`: what the error is about (core/error.h), kept for callers that sort errors (the Python
// package's DataError, CheckpointError).
class RankFailure : public KindedError {
 public:
  RankFailure(int64_t rank, const std::string& message, ErrorKind kind = ErrorKind::General)
      : KindedError(kind, fmt::format("rank {} failed: {}", rank, message)), rank_(rank) {}
  int64_t rank() const { return rank_; }

 private:
  int64_t rank_;
};

}  // namespace shardwise
