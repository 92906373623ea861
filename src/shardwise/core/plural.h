#pragma once
// A count and its noun for user-facing messages: "1 rank", "2 ranks", "1 micro-batch", "3 micro-batches".
#include <cstdint>
#include <string>
#include <string_view>

namespace shardwise {

// `many` defaults to `one` + "s" (or + "es" after s, x, ch and sh: "batch" -> "batches").
std::string plural_noun(int64_t n, std::string_view one, std::string_view many = {});
// "<n> <noun>": counted(1, "rank") == "1 rank", counted(0, "rank") == "0 ranks".
std::string counted(int64_t n, std::string_view one, std::string_view many = {});

}  // namespace shardwise
