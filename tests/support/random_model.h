// Seeded random models for the differential test (tests/differential_test.cpp): a case is a seed;
// the seed gives a model description (blocks of random ops, nested sub-blocks, a checkpointing
// choice per region, training switches) that prints on one line, and the description builds the
// same model (same initial weights) as often as needed, with or without recompose.
#pragma once

#include <recompose/recompose.h>

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace rt::diff {

// Every feature the generator can use, each switchable (RECOMPOSE_DIFF_FEATURES=-bn,-autocast).
struct Features {
  std::map<std::string, bool> on;
  // Size limits (RECOMPOSE_DIFF_MAX_OPS, _MAX_BLOCKS, _MAX_DEPTH): small values give small repros.
  int max_ops = 6, max_blocks = 3, max_depth = 2;
  static const std::vector<std::pair<std::string, std::string>>& all();  // name, what it covers
  // The features of the bugs known when the test was written ("known" in a spec).
  static const std::vector<std::string>& known();
  // Parses "-a,+b,none,all,known"; throws std::invalid_argument on an unknown name.
  static Features parse(const std::string& spec);
  bool operator()(const std::string& name) const;
  std::string str() const;  // the features switched off, "-a,-b" (or "all")
};

// How one region (a block, or a functional checkpoint segment) is checkpointed.
struct RegionDesc {
  enum class Kind { None, Full, SacFn, SacList, SwapInputs };
  Kind kind = Kind::None;
  bool early_stop = true;
  bool via_context_fn = false;   // SAC through context_fn(create_selective_checkpoint_contexts)
  bool allow_mutation = false;   // with via_context_fn
  bool default_manager = false;  // MUST_SWAP / swap_inputs through the default SwapManager
  std::vector<recompose::CheckpointPolicy> values;  // SacFn: the values the callable draws from
  uint64_t salt = 0;                                // SacFn
  bool keep_random = true;                          // SacFn/SacList may keep outputs of random ops
  recompose::CheckpointPolicy list_value = recompose::CheckpointPolicy::MUST_SAVE;  // SacList
  std::vector<std::string> list_ops;                                                // SacList
  bool is_sac() const { return kind == Kind::SacFn || kind == Kind::SacList; }
  bool uses_swap() const;
  std::string str() const;
  recompose::CheckpointOptions make(const std::shared_ptr<recompose::SwapManager>& manager) const;
};

enum class OpKind {
  Linear,
  LinearReluInplace,
  LayerNorm,
  BatchNorm,
  Gelu,
  Relu,
  Tanh,
  Dropout,
  Softmax,
  Attention,
  Bmm,
  InplaceMul,
  SliceInplace,
  ViewRoundTrip,
  SliceCat,
  Residual,
  RandNoise,
  Bernoulli,
  Sub,
  Functional,
  SharedBn,      // the case's shared BatchNorm (CaseDesc::shared_bn)
  SharedBnIdle,  // cur + shared BatchNorm of an all-zero batch: its running mean stays where it was
  RRelu,         // rrelu: writes the slopes it draws into a noise buffer it saves (arg 1: training)
  SmoothedCe,    // cur + class-weighted, label-smoothed cross entropy of cur with ignored targets
};

// The kinds of BatchNorm (OpDesc::arg of OpKind::BatchNorm, feature bn_kinds): bit 0 without
// affine parameters, bit 1 without running statistics, bits 2-3 the layout: BatchNorm1d on
// [N, W], BatchNorm2d on [N, W/4, 2, 2] contiguous or channels-last, BatchNorm3d on
// [N, W/4, 1, 2, 2] channels-last.
struct BnKind {
  enum Layout { D1 = 0, D2 = 1, D2ChannelsLast = 2, D3ChannelsLast = 3 };
  int bits = 0;
  bool affine() const { return (bits & 1) == 0; }
  bool tracked() const { return (bits & 2) == 0; }
  Layout layout() const { return static_cast<Layout>((bits >> 2) & 3); }
  std::string str() const;  // "" for the default (BatchNorm1d, affine, tracked)
};

struct OpDesc {
  OpKind kind;
  int arg = 0;  // Sub: child index; Functional: how many following ops it wraps; Dropout: p in
                // tenths; BatchNorm: its BnKind's bits
  RegionDesc region;  // Functional
  std::string str() const;
};

struct BlockDesc {
  std::vector<OpDesc> ops;
  std::vector<BlockDesc> children;
  RegionDesc region;
  std::string str(const std::string& name) const;
};

struct CaseDesc {
  uint64_t seed = 0;
  int64_t batch = 4, width = 8, seq = 0;  // seq > 0: inputs (batch, seq, width)
  std::vector<BlockDesc> blocks;
  int steps = 2;
  bool autocast = false;
  bool autocast_fp16 = false;  // autocast in float16 instead of bfloat16 (feature autocast_fp16)
  bool retain = false;         // retain_graph and a second backward
  bool eval = false;           // forward in eval mode
  bool eval_switch = false;    // mode flipped between forward and backward
  bool async_save = false;     // AsyncSaveOnCpu around the forward
  bool async_groups = false;   // one SwapGroupScope per top-level block
  int es_guard = 0;  // 0: none, 1: set_checkpoint_early_stop(true), 2: (false) around the forward
  bool adam = false;
  bool x_grad = false;   // the input requires grad
  bool nograd = false;   // an eval forward without grad after the steps
  int64_t prefetch = 1;  // SwapOptions::prefetch_groups of the case's manager
  // Per top-level block: called twice per step; the shared BatchNorm called outside any region
  // just before it (1) or just after it (2), or not (0).
  std::vector<bool> twice;
  std::vector<int> outside_bn;
  bool shared_bn = false;  // one BatchNorm1d shared by the blocks that use it and by the model
  // Every top-level block checkpointed (full where none was drawn): each boundary is the output of
  // one region and the input of the next (feature back_to_back).
  bool back_to_back = false;
  std::string str() const;
};

// Whether this CPU's autocast runs matrix products in float16 (feature autocast_fp16 is masked
// where it does not).
bool cpu_autocast_fp16_supported();

// The description drawn from `seed` with `features`.
CaseDesc generate(uint64_t seed, const Features& features);

// An annotated block: its forward interprets the op list; sub-blocks are registered children.
struct RandBlockImpl : torch::nn::Module {
  // `shared_bn`: the case's shared BatchNorm (null if it has none); registered as a child of the
  // blocks that use it, so that it belongs to their regions' module state.
  RandBlockImpl(const BlockDesc& desc, int64_t width, bool checkpointed,
                std::shared_ptr<recompose::SwapManager> manager,
                std::shared_ptr<torch::nn::BatchNorm1dImpl> shared_bn = nullptr);
  torch::Tensor forward(torch::Tensor x);
  // Ops [begin, end) of the list on `cur`; `res` is what Residual adds.
  torch::Tensor run(torch::Tensor cur, torch::Tensor res, size_t begin, size_t end);

  BlockDesc desc;
  int64_t width;
  bool checkpointed;
  std::shared_ptr<recompose::SwapManager> manager;
  std::vector<std::shared_ptr<torch::nn::Module>> op_modules;  // per op (null if none)
  std::vector<std::shared_ptr<RandBlockImpl>> children;
  std::shared_ptr<torch::nn::BatchNorm1dImpl> shared_bn;
};

struct RandModelImpl : torch::nn::Module {
  RandModelImpl(const CaseDesc& desc, bool checkpointed,
                std::shared_ptr<recompose::SwapManager> manager);
  torch::Tensor forward(torch::Tensor x, recompose::SwapManager* groups);
  std::vector<std::shared_ptr<RandBlockImpl>> blocks;
  std::vector<bool> twice;
  std::vector<int> outside_bn;
  std::shared_ptr<torch::nn::BatchNorm1dImpl> shared_bn;  // null if the case has none
  torch::nn::Linear head{nullptr};
};

}  // namespace rt::diff
