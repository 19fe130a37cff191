// The checkpointing policies the example can train with, and the one place that turns a policy
// into recompose calls on the model's blocks.
#pragma once

#include "model.h"

#include <recompose/swap.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace gpt {

enum class Policy {
  None,           // plain training: autograd keeps every activation
  Full,           // each block saves only its input and recomputes its forward in backward
  Selective,      // each block saves matrix products and attention, recomputes the cheap rest
  Swap,           // each block keeps its matrix products in host memory, recomputes the rest
  Offload,        // each block's saved activations go to host memory, nothing is recomputed
  EverySecondMm,  // selective, but every second matrix product is recomputed too (less memory)
  OffloadWindow,  // offload that never stalls: only what the link moves inside the copy windows
                  // (--link)
  Planned,        // what the memory-budget planner chose per block (--budget, --plan); not in
                  // kAllPolicies
};

inline constexpr std::array<Policy, 7> kAllPolicies = {
    Policy::None,    Policy::Full,          Policy::Selective,    Policy::Swap,
    Policy::Offload, Policy::EverySecondMm, Policy::OffloadWindow};

std::string_view policy_name(Policy policy);
std::optional<Policy> parse_policy(std::string_view name);

// Attaches `policy` to every block of `model` (one recompose call per block). Returns the swap
// manager the blocks use under Policy::Swap and Policy::Offload (for its statistics), null
// otherwise.
std::shared_ptr<recompose::SwapManager> apply_policy(GPT& model, Policy policy);

}  // namespace gpt
