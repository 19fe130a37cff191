// Adapter over the autograd node sequence of a thread: every node a differentiable op creates
// takes the thread's next sequence number (at::sequence_number, Node::sequence_nr). A region
// compares them to learn, without watching every op, whether its forward ended with the op
// whose output it saved last: then early stop has nothing left to skip (frame.cpp). See
// Note [ Early stop only where it skips something ].
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace recompose::detail {

// The sequence number the next autograd node made on this thread will take.
uint64_t next_autograd_sequence_nr();

// True if `tensor` is an output of the newest autograd node made on this thread (its grad_fn,
// read without regenerating a view's, took the last sequence number).
bool is_output_of_newest_node(const at::Tensor& tensor);

// At a pack hook: `tensor` is an input of the op saving it that needs no gradient, saved before
// the op's kernel ran, which may still write into it (rrelu_with_noise's noise). A copy made now
// would miss that write. See Note [ Early stop after the op's own writes ].
// `output_of_newest_node`: is_output_of_newest_node(tensor), where the caller has it already.
inline bool may_be_written_by_saving_op(const at::Tensor& tensor, bool output_of_newest_node) {
  return tensor.defined() && !tensor.requires_grad() && !output_of_newest_node;
}
inline bool may_be_written_by_saving_op(const at::Tensor& tensor) {
  return may_be_written_by_saving_op(tensor, is_output_of_newest_node(tensor));
}

}  // namespace recompose::detail
