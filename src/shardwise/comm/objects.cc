#include "shardwise/comm/objects.h"

#include "shardwise/core/error.h"

namespace shardwise::comm {
namespace {

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

nlohmann::json parse(const std::vector<std::byte>& bytes, int from) {
  try {
    return nlohmann::json::parse(reinterpret_cast<const char*>(bytes.data()),
                                 reinterpret_cast<const char*>(bytes.data()) + bytes.size());
  } catch (const nlohmann::json::exception& e) {
    fail("object from rank {} is not valid JSON: {}", from, e.what());
  }
}

}  // namespace

nlohmann::json broadcast_object(Communicator& comm, const nlohmann::json& object, int root) {
  std::string text = comm.rank() == root ? object.dump() : std::string();
  return parse(comm.broadcast_bytes(as_bytes(text), root), root);
}

std::vector<nlohmann::json> all_gather_object(Communicator& comm, const nlohmann::json& object) {
  std::vector<nlohmann::json> out;
  int r = 0;
  for (const auto& bytes : comm.all_gather_bytes(as_bytes(object.dump()))) out.push_back(parse(bytes, r++));
  return out;
}

}  // namespace shardwise::comm
