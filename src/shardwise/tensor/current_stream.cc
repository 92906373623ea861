#include "shardwise/tensor/current_stream.h"

namespace shardwise {

namespace {
thread_local Stream current;
}  // namespace

Stream current_stream() { return current; }

StreamScope::StreamScope(Stream stream) : previous_(current) { current = stream; }

StreamScope::~StreamScope() { current = previous_; }

}  // namespace shardwise
