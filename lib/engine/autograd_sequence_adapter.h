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

}  // namespace recompose::detail
