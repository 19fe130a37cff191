// What a selective region keeps for its replay beyond the policy's kept outputs: autocast's casts
// of parameters (KeptCast), within a budget, and the rule that picks them.
//
// Note [ Parameter casts kept for the replay ]
// Under autocast, a region's forward casts each parameter it uses (aten::_to_copy of a float32
// leaf that requires grad, to bfloat16 or float16); autograd saves the cast for the matrix
// product's backward, and the replay cast it again from the parameter: on the H100 GPT, of the
// replay's 72 casts a step (docs/benchmarks/2026-11-26-h100-run14-verdict.txt), 48 cast the four
// weights of each of the 12 blocks (the others cast activations). The policy never
// sees these casts (autocast_cacheable_cast, op_traits.h), so a policy that asks for it
// (SelectivePolicy::keep_parameter_casts; transformer_policy does) has the region keep them
// instead: the forward holds each cast's tensor (the one autocast's cache holds in the forward
// anyway), and the replay takes it rather than casting again.
// Kept per region, not once per step for all regions: a parameter used by one region only (every
// weight of a transformer block) is cast once per forward either way, and a cast shared by several
// regions is the same tensor (autocast's cache), whose storage the meters count once. A kept cast
// costs its bytes from the forward to the region's backward and saves, in the replay, a kernel that
// reads 4 bytes and writes 2 per element: every cast saves the same time per byte kept, so which
// casts to keep is a question of how many bytes, not of which. The budget answers it: at the end of
// the region's forward, the casts autograd saved are kept, smallest first (more kernels saved per
// byte: each cast also costs a launch), while they and the region's kept draws (dropout's bits or
// masks, dropout_draw.h) hold at most `budget` times what the region would hold without
// checkpointing (ForwardTrace::saved_bytes_from_ops). The rest are released there and cast again in
// the replay. transformer_policy's default budget is 0.065: on the 12 x 1024 bf16 GPT on CUDA it
// keeps the casts of each block's two smaller weights (qkv and proj, 8 MiB) beside its MLP
// dropout's mask (8 MiB), and the held bytes come to an estimated 0.64x of no checkpointing (0.59x
// before; every weight's cast would add 0.07x; 0.085 would keep a third weight and pass 0.65x):
// docs/guide/selective.md, "What transformer_policy keeps".
#pragma once

#include "engine/meter_charge.h"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace recompose::detail {

// A parameter's cast, kept in the forward for the replay: held from the cast to the end of the
// forward, where it is charged as a kept output is (hold()) or released, so that the meters never
// count a cast the budget then releases.
struct KeptCast {
  explicit KeptCast(const at::Tensor& cast);
  ~KeptCast();
  KeptCast(const KeptCast&) = delete;
  KeptCast& operator=(const KeptCast&) = delete;
  // Kept past the forward: charged to the thread's meters and counted in the bytes kept.
  void hold();

  at::Tensor value;
  int64_t bytes = 0;
  MeterCharge charge;
  bool held = false;
};

// What a region keeps for its replay beyond the policy's outputs, once its forward ended.
struct KeptForReplay {
  std::vector<int64_t> casts;  // each kept cast's bytes, in forward order
  std::vector<int64_t> draws;  // each dropout draw's bytes (DrawMask, DropoutDraw): bits or masks
  int64_t cast_bytes() const;
  int64_t draw_bytes() const;
};

// Which of the casts offered (their bytes, in forward order) to keep within `room` bytes: the
// smallest first, each whole (Note above). Per cast, kept or not.
std::vector<bool> casts_within(c10::ArrayRef<int64_t> bytes, int64_t room);

// The room a region's casts may take: `budget` times `unchecked_bytes` (what the region would hold
// without checkpointing), less `draw_bytes`; 0 if none is left.
int64_t cast_room(double budget, int64_t unchecked_bytes, int64_t draw_bytes);

}  // namespace recompose::detail
