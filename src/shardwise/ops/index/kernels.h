#pragma once
// Reference CPU kernels of the indexing ops: index_select, gather, scatter_add, embedding and
// index_put, with their analytic gradients.
//
// Indices are int64 (int32 is accepted too). Every index must lie in [0, extent) of the dim it
// indexes; a negative or too-large index is an Error naming the op, the value, its position and
// the allowed range (negative indices are not wrapped).
//
// Copying kernels (index_select, gather, embedding, index_put with accumulate = false) take every
// dtype. Accumulating ones (scatter_add, index_put with accumulate = true and every gradient)
// reject bool. Sums are sequential in index order (row-major over the index tensor) and done in
// the element type (f16/bf16: in float, rounded back after each add), so a kernel run on a block
// of the dims that are not indexed adds exactly the same terms in the same order as on the whole
// tensor: duplicates accumulate bit for bit alike on one device and on a mesh.
#include <cstdint>
#include <span>
#include <string_view>

#include "shardwise/tensor/tensor.h"

namespace shardwise::ops {

// Error unless `dtype` is an index dtype (i64, i32); `what` names the input in the message.
void check_index_dtype(std::string_view op, std::string_view what, DType dtype);

// ---- index_select(x, index; axis) ------------------------------------------------------------
// index is 1-D [k]; out = x with `axis` replaced by the k rows x[.., index[i], ..].
// Returns the normalized axis; Error (naming the op) on a bad axis or index rank.
int check_index_select_shapes(const Shape& x, const Shape& index, int64_t axis);
Shape index_select_shape(const Shape& x, const Shape& index, int64_t axis);
Tensor index_select(const Tensor& x, const Tensor& index, int64_t axis);
// dx: zeros of x_shape (dout's dtype) with dout's rows added at index along axis (duplicates sum).
Tensor index_select_backward(const Shape& x_shape, const Tensor& index, const Tensor& dout, int64_t axis);

// ---- gather(x, index; axis) ------------------------------------------------------------------
// torch.gather: index has x's rank and index.shape[d] <= x.shape[d] for d != axis; out has index's
// shape and out[p] = x[p with p[axis] replaced by index[p]].
int check_gather_shapes(const Shape& x, const Shape& index, int64_t axis);
Tensor gather(const Tensor& x, const Tensor& index, int64_t axis);
// dx: zeros of x_shape with dout (index's shape) scatter-added at index.
Tensor gather_backward(const Shape& x_shape, const Tensor& index, const Tensor& dout, int64_t axis);

// ---- scatter_add(x, index, src; axis) --------------------------------------------------------
// torch.scatter_add: out = x, then out[p with p[axis] replaced by index[p]] += src[p] for every p
// of index's shape in row-major order. index, src and x have the same rank; index.shape[d] <=
// src.shape[d] for every d and <= x.shape[d] for d != axis; src has x's dtype.
int check_scatter_add_shapes(const Shape& x, const Shape& index, const Shape& src, int64_t axis);
Tensor scatter_add(const Tensor& x, const Tensor& index, const Tensor& src, int64_t axis);
// dsrc: zeros of src_shape with dout (x's shape) gathered at index in the index-shaped corner
// (the src elements that index does not cover take no part: zero gradient). dx is dout itself.
Tensor scatter_add_src_backward(const Shape& src_shape, const Tensor& index, const Tensor& dout, int64_t axis);

// ---- embedding(ids, weight) ------------------------------------------------------------------
// ids [...] (any rank), weight [V, H] -> out [..., H] with out[i] = weight[ids[i]].
Shape embedding_shape(const Shape& ids, const Shape& weight);
// `weight` may be the block of rows [vocab_offset, vocab_offset + weight.shape[0]) of a vocab of
// `vocab_size` rows (vocab-parallel); single device: offset 0, vocab_size = weight.shape[0]. An id
// outside [0, vocab_size) is an Error; an id outside the block gives a row of zeros, so the
// blocks' outputs sum to the full embedding.
Tensor embedding(const Tensor& ids, const Tensor& weight, int64_t vocab_offset, int64_t vocab_size);
// dweight: zeros of weight_shape (the block) with dout's rows added at the ids that fall in the
// block (duplicates sum, in id order). ids take no gradient.
Tensor embedding_backward(const Tensor& ids, const Tensor& dout, const Shape& weight_shape, int64_t vocab_offset,
                          int64_t vocab_size);

// ---- index_put(x, indices..., value; accumulate) ---------------------------------------------
// indices (k >= 1 int tensors, k <= rank of x) index x's first k dims and broadcast together to
// B; value broadcasts to B ++ x.shape[k:]. For every b of B (row-major) the block
// x[indices[0][b], .., indices[k-1][b], ...] is set to (accumulate = false) or incremented by
// (accumulate = true) value[b, ...]. With duplicate positions and accumulate = false the LAST
// write (in row-major order of B) wins; with accumulate = true duplicates sum in that order.
// Error unless the index shapes broadcast and value broadcasts to B ++ x.shape[k:] (rank <= 8).
// Returns B.
Shape index_put_index_shape(const Shape& x, std::span<const Shape> index_shapes, const Shape& value);
Tensor index_put(const Tensor& x, std::span<const Tensor> indices, const Tensor& value, bool accumulate);
struct IndexPutGrads {
  Tensor x;      // dout, with zeros at every written position when accumulate = false
  Tensor value;  // dout gathered at the written positions, summed over value's broadcast dims
};
// Gradients of index_put; every position is gathered for value's gradient, duplicates included
// (PyTorch's convention: with accumulate = false and duplicates, an overwritten value still
// receives the gradient of the position it was written to).
IndexPutGrads index_put_backward(const Tensor& dout, std::span<const Tensor> indices, const Shape& value_shape,
                                 bool accumulate);

}  // namespace shardwise::ops
