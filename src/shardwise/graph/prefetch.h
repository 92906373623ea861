#pragma once
// Sharding stage 3's parameter prefetch (`--prefetch-params N`): which all-gathers of dp-sharded
// parameters a run starts early, and where. The runtime runs it and the memory plan replays it,
// both from this one schedule.
//
// A prefetchable gather is a Reshard instruction that makes a parameter's copy in another
// distribution than its own (LowerOptions::regather_params) by one all-gather step. Its layer is
// the parameter name up to its first numeric component ("transformer.h.3.", "model.layers.3.");
// a name without one is a layer of its own. Walking the positions [begin, end) of an execution
// order, the gathers form units: maximal runs of consecutive gathers of one layer (the forward
// meets layers 0, 1, ...; the backward the reverse). At the first gather of unit u the run starts
// every not yet started gather of units u .. u + depth, so at most `depth` units beyond the one
// computing have their gathered copies alive. Every collective is the same as without prefetch, in
// the same order; only started earlier.
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/graph/graph.h"
#include "shardwise/graph/program.h"

namespace shardwise::graph {

// The layer a parameter belongs to (see above).
std::string param_layer(std::string_view name);

// Whether instruction `ins` is a prefetchable gather.
bool prefetchable_gather(const Graph& g, const Program& p, const Instr& ins);

// Per position of `order` (size order.size()): the positions whose gather is started there, in
// increasing order (empty outside [begin, end) and with depth <= 0).
std::vector<std::vector<size_t>> prefetch_starts(const Graph& g, const Program& p, const std::vector<int>& order,
                                                 size_t begin, size_t end, int depth);

}  // namespace shardwise::graph
