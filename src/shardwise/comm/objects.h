#pragma once
// Objects over a Communicator: nested numbers, strings, lists and maps (nlohmann::json values)
// serialized as JSON text, or raw bytes through Communicator::broadcast_bytes/all_gather_bytes.
#include <nlohmann/json.hpp>
#include <vector>

#include "shardwise/comm/communicator.h"

namespace shardwise::comm {

// Every rank gets root's object (the argument is ignored elsewhere).
nlohmann::json broadcast_object(Communicator& comm, const nlohmann::json& object, int root);
// Every rank gets every rank's object, in rank order.
std::vector<nlohmann::json> all_gather_object(Communicator& comm, const nlohmann::json& object);

}  // namespace shardwise::comm
