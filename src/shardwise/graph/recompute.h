#pragma once
// Activation recompute: the forward values of a recompute segment (Graph::begin_segment) are not
// kept for the backward; the backward recomputes them right before it needs them.
//
// apply_recompute runs on a graph whose backward autodiff has appended and that completion has laid
// out. For every Backward node of a segment's forward node, each forward tensor the gradient kernel
// reads the value of (OpDef::backward_reads) and that the segment itself produced is replaced by a
// recompute copy: a new forward node (Node::recomputes) with the same op, attributes and, where
// they come from outside the segment, the same inputs (the segment's entry values: the layer input,
// parameters, masks), its own inputs being the copies of its in-segment producers. Only the copies
// some gradient reads (and what they need) are made. Copies take the original's distributions from
// the completion (so lowering plans the same kernels and reshards on the same inputs: gradients are
// bit-identical), and the returned node order places each segment's copies right before the first
// backward node that reads one of them. The originals then have no reader after the forward and
// the runtime frees them after their last forward use; a gradient's read of an original's shape
// only is left to the runtime's stand-ins (RuntimeOptions::release_shape_only_reads).
//
// Dropout reproduces its mask: its key is (seed, stream) from the attributes and the global index
// plus KernelContext::sample_offset, which a pipeline sets to the micro-batch's before its backward.
#include <vector>

#include "shardwise/graph/completion.h"
#include "shardwise/graph/graph.h"

namespace shardwise::graph {

struct RecomputeResult {
  std::vector<NodeId> order;  // every node, copies placed before their first reader: lower()'s order
  int copies = 0;             // recompute nodes added
};

RecomputeResult apply_recompute(Graph& g, Completion& c);

}  // namespace shardwise::graph
