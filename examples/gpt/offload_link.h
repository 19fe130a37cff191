// The device <-> host link the example plans and offloads with (--link): given, or measured once
// on CUDA (recompose::measure_link). The planner's copy-window model and the never-stall offload
// (--policy offload-window) use it.
#pragma once

#include <recompose/copy_link.h>
#include <recompose/planner.h>

#include <torch/torch.h>

#include <optional>
#include <string_view>

namespace gpt {

// "measure" (the default on CUDA) or "D2H,H2D,COST": bytes/s each way and seconds per copy
// ("53e9,35e9,10e-6"). Throws std::invalid_argument on other text.
recompose::LinkModel parse_link(std::string_view text);
void set_link(std::string_view text);

// The link for `device`: --link when given, else measured on CUDA; none on CPU.
std::optional<recompose::LinkModel> link_for(const torch::Device& device);
// The never-stall offload's link: link_for(device), or on CPU a nominal 10 GB/s, 10 us per copy
// (CPU "host" copies save nothing; the policy runs so that its logic and losses are compared).
recompose::LinkModel offload_link(const torch::Device& device);
// --offload-window-ms: the forward window of offload-window's copies, in seconds (0: each block's
// own forward time on the host clock, which on a GPU is the launch time unless the step is
// device-bound: give a block's forward time from the profile there, profile.json's
// forward_seconds).
void set_offload_window(double seconds);
double offload_window();
// The planner's options: the copy-window model with link_for(device).
recompose::SolveOptions solve_options(const torch::Device& device);

}  // namespace gpt
