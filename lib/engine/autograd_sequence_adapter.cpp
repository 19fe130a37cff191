// Adapter: at::sequence_number (the thread's autograd node counter) and
// torch::autograd::impl::grad_fn_unsafe (a tensor's grad_fn without regenerating a view's).
#include "engine/autograd_sequence_adapter.h"
#include "engine/torch_version_guard.h"

#if !RECOMPOSE_TORCH_VERSION_CHECKED
#error \
    "recompose: port lib/engine/autograd_sequence_adapter.cpp to this LibTorch version (checked: see \
lib/engine/torch_version_guard.h): check ATen/SequenceNumber.h (peek), Node::sequence_nr and \
torch::autograd::impl::grad_fn_unsafe in torch/csrc/autograd/variable.h, then extend torch_version_guard.h"
#endif

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

namespace recompose::detail {

uint64_t next_autograd_sequence_nr() { return at::sequence_number::peek(); }

bool is_output_of_newest_node(const at::Tensor& tensor) {
  if (!tensor.defined()) return false;
  const torch::autograd::Node* fn = torch::autograd::impl::grad_fn_unsafe(tensor);
  return fn != nullptr && fn->sequence_nr() + 1 == at::sequence_number::peek();
}

}  // namespace recompose::detail
