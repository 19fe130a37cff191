#include "engine/noop_save_inputs.h"

#include <recompose/checkpoint_error.h>

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

namespace recompose::detail {
namespace {

struct NoopSaveInputs : torch::autograd::Function<NoopSaveInputs> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& dummy,
                            const std::vector<at::Tensor>& inputs) {
    ctx->save_for_backward(inputs);
    return at::empty({0}, dummy.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    throw CheckpointError("recompose: internal error: backward reached the input saver of a checkpointed region");
  }
};

}  // namespace

at::Tensor save_region_inputs(const std::vector<at::Tensor>& inputs) {
  // A dummy that requires grad makes the node exist even when no input requires grad.
  at::Tensor dummy = at::empty({0}).set_requires_grad(true);
  return NoopSaveInputs::apply(dummy, inputs);
}

std::vector<at::Tensor> unpack_region_inputs(const at::Tensor& input_saver) {
  // A raw pointer: grad_fn() is a std::shared_ptr up to LibTorch 2.12 and a c10::intrusive_ptr
  // from 2.13 on; input_saver keeps the node alive meanwhile.
  auto* node = dynamic_cast<torch::autograd::CppNode<NoopSaveInputs>*>(input_saver.grad_fn().get());
  if (node == nullptr) throw CheckpointError("recompose: internal error: a region's input saver lost its node");
  return node->ctx_.get_saved_variables();
}

}  // namespace recompose::detail
