// Seeded random models for the differential test; see random_model.h.
#include "random_model.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace rt::diff {

using recompose::CheckpointPolicy;

// ---------------------------------------------------------------------------------- features

const std::vector<std::pair<std::string, std::string>>& Features::all() {
  static const std::vector<std::pair<std::string, std::string>> list = {
      {"bn", "BatchNorm1d ops (running stats are buffers)"},
      {"dropout", "nn::Dropout ops"},
      {"layernorm", "LayerNorm ops"},
      {"softmax", "softmax ops"},
      {"attention", "matmul(x, x^T) -> softmax -> matmul"},
      {"bmm", "bmm over a reshaped view"},
      {"inplace",
       "in-place ops (relu_ on a Linear output, mul_/add_ on a clone, add_ into a slice)"},
      {"views", "view/transpose/reshape round trips, slices and cat"},
      {"random", "random ops (randn_like noise, bernoulli masks)"},
      {"argwrites",
       "ops that write into an argument they save (rrelu: its slopes into its noise buffer in "
       "training, random; nothing written in eval)"},
      {"composite_branch",
       "composite ops that choose their decomposition by at::isTensorSubclassLike (cross entropy "
       "with class weights, label smoothing and ignored targets, added to the activations)"},
      {"rank3", "3-d inputs (batch, seq, width): Linear through matmul/_unsafe_view"},
      {"nesting", "sub-blocks (nested checkpointed regions)"},
      {"functional", "functional recompose::checkpoint around a run of ops inside a block"},
      {"full", "full checkpointing of a region"},
      {"sac_fn", "selective checkpointing with a random callable policy"},
      {"sac_list", "selective checkpointing with an op list (MUST_SAVE list or a value per list)"},
      {"must_swap", "CheckpointPolicy::MUST_SWAP in selective policies"},
      {"swap_inputs", "CheckpointOptions::swap_inputs"},
      {"async_save", "AsyncSaveOnCpu around the forward (with or without swap groups)"},
      {"context_fn", "selective policies through context_fn(create_selective_checkpoint_contexts)"},
      {"default_manager", "MUST_SWAP / swap_inputs through SwapManager::default_manager()"},
      {"early_stop_off", "regions with early_stop(false)"},
      {"es_guard", "set_checkpoint_early_stop(true/false) guard around the forward"},
      {"autocast", "CPU autocast (bf16) around the forward"},
      {"retain", "backward with retain_graph, then a second backward"},
      {"eval", "forward in eval mode"},
      {"eval_switch", "train/eval flipped between forward and backward"},
      {"nograd", "an eval forward under NoGradGuard after the training steps"},
      {"adam", "Adam instead of SGD with momentum"},
      {"sac_random", "selective policies may keep outputs of random ops (randn_like, bernoulli)"},
      {"nested_sac", "selective regions nested in selective regions"},
      {"nested_must_swap", "MUST_SWAP in selective regions nested with other selective regions"},
      {"bn_twice",
       "a top-level block called twice per step (its BatchNorms run in two invocations of its "
       "region)"},
      {"bn_shared",
       "one BatchNorm1d shared by blocks (a child of each): called in several regions"},
      {"bn_outside",
       "the shared BatchNorm also called by the model outside any region, before or after a block"},
      {"bn_idle",
       "the shared BatchNorm called on an all-zero batch (ReLU of -|x|): its running mean stays as "
       "it was"},
      {"bn_kinds",
       "BatchNorm ops without affine parameters, without running statistics, 2-d (contiguous or "
       "channels-last) and 3-d (channels-last)"},
      {"autocast_fp16", "autocast in float16 instead of bfloat16 (where the CPU runs it)"},
      {"back_to_back",
       "every top-level block checkpointed: each boundary between two regions held once"},
  };
  return list;
}

const std::vector<std::string>& Features::known() {
  static const std::vector<std::string> list = {
      "bn",       "eval_switch", "sac_random", "nested_sac", "nested_must_swap",
      "autocast", "bn_twice",    "bn_shared",  "bn_outside", "bn_idle"};
  return list;
}

Features Features::parse(const std::string& spec) {
  Features f;
  for (const auto& [name, what] : all()) f.on[name] = true;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    bool value = true;
    if (item[0] == '-' || item[0] == '+') {
      value = item[0] == '+';
      item = item.substr(1);
    }
    if (item == "all" || item == "none") {
      const bool v = (item == "all") == value;
      for (auto& [name, on] : f.on) on = v;
      continue;
    }
    if (item == "known") {  // the features that hit bugs known when this test was written
      for (const auto& name : known()) f.on[name] = value;
      continue;
    }
    if (!f.on.contains(item))
      throw std::invalid_argument("RECOMPOSE_DIFF_FEATURES: unknown feature '" + item + "'");
    f.on[item] = value;
  }
  return f;
}

bool Features::operator()(const std::string& name) const {
  auto it = on.find(name);
  if (it == on.end()) throw std::logic_error("differential test: no feature named " + name);
  return it->second;
}

std::string Features::str() const {
  std::string out;
  for (const auto& [name, what] : all()) {
    if (!on.at(name)) out += (out.empty() ? "-" : ",-") + name;
  }
  return out.empty() ? "all" : out;
}

// ---------------------------------------------------------------------------------- printing

namespace {

const char* short_name(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::MUST_SAVE:
      return "MS";
    case CheckpointPolicy::PREFER_SAVE:
      return "PS";
    case CheckpointPolicy::MUST_RECOMPUTE:
      return "MR";
    case CheckpointPolicy::PREFER_RECOMPUTE:
      return "PR";
    case CheckpointPolicy::MUST_SWAP:
      return "SW";
  }
  return "?";
}

bool is_random_op(const std::string& name) {
  static const std::set<std::string> random = {
      "aten::randn_like",     "aten::rand_like",       "aten::bernoulli",   "aten::normal",
      "aten::native_dropout", "aten::randint_like",    "aten::multinomial", "aten::rand",
      "aten::randn",          "aten::randint",         "aten::randperm",    "aten::dropout",
      "aten::poisson",        "aten::rrelu_with_noise"};
  return random.contains(name);
}

uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string strip_aten(const std::string& s) { return s.rfind("aten::", 0) == 0 ? s.substr(6) : s; }

}  // namespace

bool RegionDesc::uses_swap() const {
  if (kind == Kind::SwapInputs) return true;
  if (kind == Kind::SacFn)
    return std::find(values.begin(), values.end(), CheckpointPolicy::MUST_SWAP) != values.end();
  if (kind == Kind::SacList) return list_value == CheckpointPolicy::MUST_SWAP;
  return false;
}

std::string RegionDesc::str() const {
  std::string s;
  switch (kind) {
    case Kind::None:
      return "none";
    case Kind::Full:
      s = "full";
      break;
    case Kind::SwapInputs:
      s = "swapin";
      break;
    case Kind::SacFn: {
      s = "sac-fn{";
      for (size_t i = 0; i < values.size(); ++i)
        s += std::string(i ? "," : "") + short_name(values[i]);
      char buf[16];
      std::snprintf(buf, sizeof buf, "#%04x", static_cast<unsigned>(salt & 0xffff));
      s += std::string("}") + buf;
      break;
    }
    case Kind::SacList: {
      s = std::string("sac-list{") + short_name(list_value) + ":";
      for (size_t i = 0; i < list_ops.size(); ++i)
        s += std::string(i ? "," : "") + strip_aten(list_ops[i]);
      s += "}";
      break;
    }
  }
  if (!early_stop) s += ",es=0";
  if (via_context_fn) s += allow_mutation ? ",ctx+mut" : ",ctx";
  if (default_manager && uses_swap()) s += ",dm";
  return s;
}

recompose::CheckpointOptions RegionDesc::make(
    const std::shared_ptr<recompose::SwapManager>& manager) const {
  recompose::CheckpointOptions o;
  o.early_stop(early_stop);
  std::shared_ptr<recompose::SwapManager> mgr = default_manager ? nullptr : manager;
  if (kind == Kind::SwapInputs) {
    o.swap_inputs(true);
    o.swap_manager(mgr);
  }
  if (!is_sac()) return o;
  std::optional<recompose::SelectivePolicy> policy;
  if (kind == Kind::SacFn) {
    auto vals = values;
    const uint64_t s = salt;
    const bool keep_random = this->keep_random;
    policy.emplace([vals, s, keep_random](const recompose::SelectiveCheckpointContext& ctx,
                                          const c10::OperatorHandle& op, const torch::jit::Stack&) {
      const std::string& name = op.schema().name();
      if (!keep_random && is_random_op(name)) return CheckpointPolicy::PREFER_RECOMPUTE;
      const uint64_t h = mix(fnv1a(name + "." + op.schema().overload_name()) ^ s ^
                             mix(static_cast<uint64_t>(ctx.call_index) + 0x9E3779B97F4A7C15ULL));
      return vals[h % vals.size()];
    });
  } else if (list_value == CheckpointPolicy::MUST_SAVE) {
    policy.emplace(list_ops);  // the op-list constructor itself
  } else {
    auto names = std::make_shared<std::set<std::string>>(list_ops.begin(), list_ops.end());
    const CheckpointPolicy v = list_value;
    policy.emplace([names, v](const recompose::SelectiveCheckpointContext&,
                              const c10::OperatorHandle& op, const torch::jit::Stack&) {
      const std::string& name = op.schema().name();
      if (names->contains(name) || names->contains(name + "." + op.schema().overload_name()))
        return v;
      return CheckpointPolicy::PREFER_RECOMPUTE;
    });
  }
  // Autocast's parameter casts kept for the replay (issue 45): none, within a small budget, or all;
  // derived from the region's salt, so that the draws of the case stay as they were.
  static constexpr double kCastBudgets[] = {0, 0.05, 1e6};
  policy->keep_parameter_casts(kCastBudgets[mix(salt ^ 0xCA57CA57ULL) % 3]);
  if (via_context_fn) {
    const recompose::SelectivePolicy p = *policy;
    const bool allow = allow_mutation;
    o.context_fn(
        [p, allow, mgr] { return recompose::create_selective_checkpoint_contexts(p, allow, mgr); });
  } else {
    o.policy(*policy);
    o.swap_manager(mgr);
  }
  return o;
}

std::string OpDesc::str() const {
  switch (kind) {
    case OpKind::Linear:
      return "lin";
    case OpKind::LinearReluInplace:
      return "lin+relu_";
    case OpKind::LayerNorm:
      return "ln";
    case OpKind::BatchNorm:
      return "bn" + BnKind{arg}.str();
    case OpKind::Gelu:
      return "gelu";
    case OpKind::Relu:
      return "relu";
    case OpKind::Tanh:
      return "tanh";
    case OpKind::Dropout:
      return "drop." + std::to_string(arg);
    case OpKind::Softmax:
      return "softmax";
    case OpKind::Attention:
      return "attn";
    case OpKind::Bmm:
      return "bmm";
    case OpKind::InplaceMul:
      return "clone+mul_";
    case OpKind::SliceInplace:
      return "slice-mul_";
    case OpKind::ViewRoundTrip:
      return "view";
    case OpKind::SliceCat:
      return "slicecat";
    case OpKind::Residual:
      return "res";
    case OpKind::RandNoise:
      return "randn";
    case OpKind::Bernoulli:
      return "bern";
    case OpKind::RRelu:
      return arg == 1 ? "rrelu" : "rrelu-eval";
    case OpKind::SmoothedCe:
      return "ce";
    case OpKind::Sub:
      return "sub" + std::to_string(arg);
    case OpKind::Functional:
      return "ckpt" + std::to_string(arg) + "{" + region.str() + "}";
    case OpKind::SharedBn:
      return "sbn";
    case OpKind::SharedBnIdle:
      return "sbn0";
  }
  return "?";
}

std::string BnKind::str() const {
  static const char* const layouts[] = {"", "2d", "2d-cl", "3d-cl"};
  std::string s = layouts[layout()];
  if (!affine()) s += "-noaffine";
  if (!tracked()) s += "-untracked";
  return s.empty() ? s : "(" + s + ")";
}

std::string BlockDesc::str(const std::string& name) const {
  std::string s = name + "[" + region.str() + "](";
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i) s += ",";
    if (ops[i].kind == OpKind::Sub) {
      s += children[ops[i].arg].str(name + "." + std::to_string(ops[i].arg));
    } else {
      s += ops[i].str();
    }
  }
  return s + ")";
}

std::string CaseDesc::str() const {
  std::ostringstream s;
  s << "seed=" << seed << " B=" << batch << " W=" << width;
  if (seq) s << " T=" << seq;
  s << " steps=" << steps << " autocast=" << (autocast ? (autocast_fp16 ? "fp16" : "bf16") : "off")
    << (back_to_back ? " back-to-back" : "") << " retain=" << retain
    << " mode=" << (eval ? "eval" : "train") << (eval_switch ? "->flip" : "")
    << " async=" << (async_save ? (async_groups ? "groups" : "on") : "off") << " es_guard="
    << (es_guard == 0   ? "-"
        : es_guard == 1 ? "on"
                        : "off")
    << " opt=" << (adam ? "adam" : "sgd") << " xgrad=" << x_grad << " nograd=" << nograd
    << " prefetch=" << prefetch << " |";
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::string name = "B";
    name += std::to_string(i);
    const int outside = i < outside_bn.size() ? outside_bn[i] : 0;
    s << (outside == 1 ? " sbn" : "") << " " << blocks[i].str(name)
      << (i < twice.size() && twice[i] ? "x2" : "") << (outside == 2 ? " sbn" : "");
  }
  return s.str();
}

// ---------------------------------------------------------------------------------- generation

namespace {

struct Gen {
  std::mt19937_64 rng;
  const Features& f;
  // The draws of the features added for issue 23 (bn_twice, bn_shared, bn_outside, bn_idle): a
  // stream of their own, so that the cases drawn before them stay the same cases.
  std::mt19937_64 extra;
  bool extra_coin(double p) { return std::uniform_real_distribution<double>(0, 1)(extra) < p; }
  int uni_extra(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(extra); }
  // The draws of the features added for issue 31 (argwrites): a stream of their own too.
  std::mt19937_64 argwrites;
  int uni_argwrites(int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(argwrites);
  }
  // And the composite_branch feature's (issue 31, item 2).
  std::mt19937_64 composite;
  int uni_composite(int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(composite);
  }
  // And issue 48's (bn_kinds, autocast_fp16, back_to_back).
  std::mt19937_64 issue48;
  int uni_issue48(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(issue48); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  int uni(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(uni(0, static_cast<int>(v.size()) - 1))];
  }

  // Every draw below happens whatever the features are; a feature switched off only masks what
  // was drawn. So switching a feature off changes a case only where the feature was used, and a
  // failing seed can be attributed by rerunning it with one feature off.
  static constexpr CheckpointPolicy kValues[] = {
      CheckpointPolicy::MUST_SAVE, CheckpointPolicy::PREFER_SAVE, CheckpointPolicy::MUST_RECOMPUTE,
      CheckpointPolicy::PREFER_RECOMPUTE, CheckpointPolicy::MUST_SWAP};

  CheckpointPolicy masked(CheckpointPolicy p) const {
    return p == CheckpointPolicy::MUST_SWAP && !f("must_swap") ? CheckpointPolicy::MUST_SAVE : p;
  }

  RegionDesc region(bool allow_none) {
    RegionDesc r;
    static const std::vector<std::pair<RegionDesc::Kind, int>> all_kinds = {
        {RegionDesc::Kind::None, 3},
        {RegionDesc::Kind::Full, 2},
        {RegionDesc::Kind::SacFn, 3},
        {RegionDesc::Kind::SacList, 3},
        {RegionDesc::Kind::SwapInputs, 1}};
    int total = 0;
    for (auto& k : all_kinds)
      total += (allow_none || k.first != RegionDesc::Kind::None) ? k.second : 0;
    int x = uni(0, total - 1);
    for (auto& k : all_kinds) {
      if (!allow_none && k.first == RegionDesc::Kind::None) continue;
      if (x < k.second) {
        r.kind = k.first;
        break;
      }
      x -= k.second;
    }
    const bool es = coin(0.6);
    const bool dm = coin(0.2);
    bool picked[5];
    for (bool& b : picked) b = coin(0.5);
    const int fallback = uni(0, 4);
    const uint64_t salt = rng();
    const bool list_save = coin(0.5);
    const int list_pick = uni(0, 4);
    std::vector<std::string> names = {"aten::mm",
                                      "aten::addmm",
                                      "aten::bmm",
                                      "aten::_softmax",
                                      "aten::gelu",
                                      "aten::relu",
                                      "aten::tanh",
                                      "aten::native_layer_norm",
                                      "aten::native_batch_norm",
                                      "aten::add.Tensor",
                                      "aten::mul.Tensor",
                                      "aten::cat",
                                      "aten::clone",
                                      "aten::_to_copy",
                                      "aten::_unsafe_view",
                                      "aten::randn_like",
                                      "aten::bernoulli"};
    // Issue 31's op, from its own stream: the lists drawn before it stay the same lists.
    if (f("argwrites") && uni_argwrites(0, 3) == 0) names.push_back("aten::rrelu_with_noise");
    std::shuffle(names.begin(), names.end(), rng);
    names.resize(static_cast<size_t>(uni(1, 4)));
    const bool ctx = coin(0.25);
    const bool mut = coin(0.5);

    static const std::map<RegionDesc::Kind, const char*> feature_of = {
        {RegionDesc::Kind::Full, "full"},
        {RegionDesc::Kind::SacFn, "sac_fn"},
        {RegionDesc::Kind::SacList, "sac_list"},
        {RegionDesc::Kind::SwapInputs, "swap_inputs"}};
    if (r.kind != RegionDesc::Kind::None && !f(feature_of.at(r.kind)))
      r.kind = RegionDesc::Kind::None;
    r.early_stop = f("early_stop_off") ? es : true;
    r.default_manager = f("default_manager") && dm;
    r.keep_random = f("sac_random");
    if (r.kind == RegionDesc::Kind::SacFn) {
      for (int i = 0; i < 5; ++i) {
        if (picked[i] && (i < 4 || f("must_swap"))) r.values.push_back(kValues[i]);
      }
      if (r.values.empty()) r.values.push_back(masked(kValues[fallback]));
      r.salt = salt;
    } else if (r.kind == RegionDesc::Kind::SacList) {
      r.list_value = list_save ? CheckpointPolicy::MUST_SAVE : masked(kValues[list_pick]);
      for (const auto& name : names) {
        if (r.keep_random || !is_random_op(name)) r.list_ops.push_back(name);
      }
      if (r.list_ops.empty()) r.list_ops.push_back("aten::mm");
    }
    if (r.is_sac() && f("context_fn") && ctx) {
      r.via_context_fn = true;
      r.allow_mutation = mut;
    }
    return r;
  }

  BlockDesc block(int depth) {
    BlockDesc b;
    b.region = region(true);
    const int n = uni(2, std::max(2, f.max_ops));
    static const std::vector<std::tuple<OpKind, int, const char*>> kinds = {
        {OpKind::Linear, 4, nullptr},        {OpKind::Gelu, 1, nullptr},
        {OpKind::Relu, 1, nullptr},          {OpKind::Tanh, 1, nullptr},
        {OpKind::Residual, 2, nullptr},      {OpKind::LinearReluInplace, 2, "inplace"},
        {OpKind::InplaceMul, 1, "inplace"},  {OpKind::SliceInplace, 1, "inplace"},
        {OpKind::LayerNorm, 2, "layernorm"}, {OpKind::BatchNorm, 2, "bn"},
        {OpKind::Dropout, 2, "dropout"},     {OpKind::Softmax, 1, "softmax"},
        {OpKind::Attention, 2, "attention"}, {OpKind::Bmm, 1, "bmm"},
        {OpKind::ViewRoundTrip, 1, "views"}, {OpKind::SliceCat, 1, "views"},
        {OpKind::RandNoise, 2, "random"},    {OpKind::Bernoulli, 1, "random"},
    };
    int total = 0;
    for (auto& k : kinds) total += std::get<1>(k);
    int segment_left = 0, nest_draws = 0;
    for (int i = 0; i < n; ++i) {
      OpDesc op{OpKind::Linear, 0, {}};
      const bool can_nest = depth < f.max_depth && nest_draws < 2;
      const bool can_segment = segment_left == 0 && i < n - 1;
      if (can_nest && coin(0.2)) {
        ++nest_draws;
        BlockDesc child = block(depth + 1);
        if (f("nesting")) {
          op.kind = OpKind::Sub;
          op.arg = static_cast<int>(b.children.size());
          b.children.push_back(std::move(child));
        }
      } else if (can_segment && coin(0.12)) {
        op.kind = OpKind::Functional;
        op.arg = uni(1, std::min(3, n - 1 - i));
        op.region = region(false);
        // Switched off: the same ops run inline, without a checkpoint of their own.
        if (!f("functional")) op.region = RegionDesc{};
        segment_left = op.arg + 1;
      } else {
        int x = uni(0, total - 1);
        const int p = uni(1, 5);
        for (auto& k : kinds) {
          if (x < std::get<1>(k)) {
            const char* feature = std::get<2>(k);
            op.kind = feature == nullptr || f(feature) ? std::get<0>(k) : OpKind::Linear;
            break;
          }
          x -= std::get<1>(k);
        }
        if (op.kind == OpKind::Dropout) op.arg = p;
      }
      // A BatchNorm of another kind half of the time (issue 48), from its own stream.
      const int bn_bits = uni_issue48(0, 31);
      if (op.kind == OpKind::BatchNorm && f("bn_kinds") && bn_bits < 16) op.arg = bn_bits;
      // Any simple op may become a call of the shared BatchNorm (idle or not).
      const bool shared = extra_coin(0.06);
      const bool idle = extra_coin(0.4);
      if (shared && op.kind != OpKind::Sub && op.kind != OpKind::Functional) {
        if (idle && f("bn_idle")) {
          op = OpDesc{OpKind::SharedBnIdle, 0, {}};
        } else if (f("bn_shared")) {
          op = OpDesc{OpKind::SharedBn, 0, {}};
        }
      }
      // Any simple op may become an rrelu (issue 31), in training mostly.
      const int rrelu = uni_argwrites(0, 15);
      if (f("argwrites") && rrelu < 2 && op.kind != OpKind::Sub && op.kind != OpKind::Functional &&
          op.kind != OpKind::SharedBn && op.kind != OpKind::SharedBnIdle) {
        op = OpDesc{OpKind::RRelu, rrelu == 0 ? 1 : uni_argwrites(0, 1), {}};
      }
      // Or a weighted, smoothed cross entropy (issue 31, item 2).
      const bool ce = uni_composite(0, 15) == 0;
      if (f("composite_branch") && ce && op.kind != OpKind::Sub && op.kind != OpKind::Functional &&
          op.kind != OpKind::SharedBn && op.kind != OpKind::SharedBnIdle) {
        op = OpDesc{OpKind::SmoothedCe, 0, {}};
      }
      if (segment_left > 0) --segment_left;
      b.ops.push_back(std::move(op));
    }
    return b;
  }
};

// Visits every region with the selective regions it runs inside.
void walk(BlockDesc& b, std::vector<RegionDesc*>& stack,
          const std::function<void(RegionDesc&, const std::vector<RegionDesc*>&)>& visit) {
  visit(b.region, stack);
  const bool pushed = b.region.is_sac();
  if (pushed) stack.push_back(&b.region);
  size_t seg_end = 0;
  bool seg_pushed = false;
  for (size_t i = 0; i < b.ops.size(); ++i) {
    if (seg_pushed && i >= seg_end) {
      stack.pop_back();
      seg_pushed = false;
    }
    OpDesc& op = b.ops[i];
    if (op.kind == OpKind::Functional) {
      visit(op.region, stack);
      seg_end = i + 1 + static_cast<size_t>(op.arg);
      if (op.region.is_sac()) {
        stack.push_back(&op.region);
        seg_pushed = true;
      }
    } else if (op.kind == OpKind::Sub) {
      walk(b.children[static_cast<size_t>(op.arg)], stack, visit);
    }
  }
  if (seg_pushed) stack.pop_back();
  if (pushed) stack.pop_back();
}

void walk_all(CaseDesc& c,
              const std::function<void(RegionDesc&, const std::vector<RegionDesc*>&)>& visit) {
  for (auto& b : c.blocks) {
    std::vector<RegionDesc*> stack;
    walk(b, stack, visit);
  }
}

}  // namespace

// True if the block or one of its sub-blocks runs rrelu (which LibTorch's CPU kernels do not run
// in float16).
bool uses_rrelu(const BlockDesc& b) {
  for (const auto& op : b.ops) {
    if (op.kind == OpKind::RRelu) return true;
  }
  return std::any_of(b.children.begin(), b.children.end(), uses_rrelu);
}

// True if the block or one of its sub-blocks calls the shared BatchNorm.
bool uses_shared_bn(const BlockDesc& b) {
  for (const auto& op : b.ops) {
    if (op.kind == OpKind::SharedBn || op.kind == OpKind::SharedBnIdle) return true;
  }
  return std::any_of(b.children.begin(), b.children.end(), uses_shared_bn);
}

bool cpu_autocast_fp16_supported() {
  static const bool supported = [] {
    const bool was_enabled = at::autocast::is_autocast_enabled(at::kCPU);
    const at::ScalarType was_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    bool ok = true;
    try {
      at::autocast::set_autocast_dtype(at::kCPU, at::kHalf);
      at::autocast::set_autocast_enabled(at::kCPU, true);
      (void)torch::linear(torch::ones({2, 4}), torch::ones({4, 4}), torch::ones({4}));
    } catch (const c10::Error&) {
      ok = false;
    }
    at::autocast::set_autocast_enabled(at::kCPU, was_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, was_dtype);
    at::autocast::clear_cache();
    return ok;
  }();
  return supported;
}

CaseDesc generate(uint64_t seed, const Features& f) {
  Gen g{std::mt19937_64(mix(seed + 0x5eed)),     f,
        std::mt19937_64(mix(seed + 0xb4e23)),    std::mt19937_64(mix(seed + 0xa26317)),
        std::mt19937_64(mix(seed + 0xc0305173)), std::mt19937_64(mix(seed + 0x155e48))};
  CaseDesc c;
  c.seed = seed;
  c.batch = g.uni(4, 8);
  c.width = g.pick(std::vector<int64_t>{8, 12, 16});
  auto flag = [&](const char* feature, double p) {
    const bool drawn = g.coin(p);  // drawn whatever the feature says (see Gen)
    return f(feature) && drawn;
  };
  c.seq = flag("rank3", 0.3) ? 3 : 0;
  c.steps = g.uni(2, 3);
  c.autocast = flag("autocast", 0.3);
  c.retain = flag("retain", 0.25);
  c.eval = flag("eval", 0.2);
  c.eval_switch = flag("eval_switch", 0.15);
  c.async_save = flag("async_save", 0.2);
  c.async_groups = g.coin(0.5);
  const bool es_guard = flag("es_guard", 0.15);
  const int es_value = g.uni(1, 2);
  c.es_guard = es_guard ? es_value : 0;
  c.adam = flag("adam", 0.3);
  c.x_grad = g.coin(0.5);
  c.nograd = flag("nograd", 0.3);
  c.prefetch = g.uni(0, 2);
  const int n = g.uni(1, std::max(1, f.max_blocks));
  for (int i = 0; i < n; ++i) c.blocks.push_back(g.block(0));
  for (int i = 0; i < n; ++i) {
    const bool twice = g.extra_coin(0.2);
    const int outside = g.uni_extra(0, 6);
    c.twice.push_back(f("bn_twice") && twice);
    c.outside_bn.push_back(f("bn_outside") && outside <= 2 ? outside : 0);
  }
  // Issue 48's case switches, from its stream: the cases drawn before keep their draws.
  const bool fp16 = g.uni_issue48(0, 1) == 0;
  c.autocast_fp16 = c.autocast && fp16 && f("autocast_fp16") && cpu_autocast_fp16_supported() &&
                    !std::any_of(c.blocks.begin(), c.blocks.end(), uses_rrelu);
  const bool back_to_back = g.uni_issue48(0, 3) == 0;
  c.back_to_back = back_to_back && f("back_to_back") && n > 1;
  if (c.back_to_back) {
    for (auto& b : c.blocks) {
      if (b.region.kind == RegionDesc::Kind::None) b.region.kind = RegionDesc::Kind::Full;
    }
  }
  c.shared_bn = std::any_of(c.blocks.begin(), c.blocks.end(), uses_shared_bn) ||
                std::any_of(c.outside_bn.begin(), c.outside_bn.end(), [](int o) { return o != 0; });

  // A second backward over a selective region is an error by design ("backward an extra time").
  if (c.retain) {
    walk_all(c, [](RegionDesc& r, const std::vector<RegionDesc*>&) {
      if (r.is_sac()) r.kind = RegionDesc::Kind::Full;
    });
  }
  if (!f("nested_sac")) {
    walk_all(c, [](RegionDesc& r, const std::vector<RegionDesc*>& above) {
      if (r.is_sac() && !above.empty()) r.kind = RegionDesc::Kind::Full;
    });
  }
  if (!f("nested_must_swap")) {
    std::set<RegionDesc*> nested;
    walk_all(c, [&nested](RegionDesc& r, const std::vector<RegionDesc*>& above) {
      if (r.is_sac() && !above.empty()) {
        nested.insert(&r);
        nested.insert(above.begin(), above.end());
      }
    });
    for (RegionDesc* r : nested) {
      for (auto& v : r->values) {
        if (v == CheckpointPolicy::MUST_SWAP) v = CheckpointPolicy::MUST_SAVE;
      }
      if (r->list_value == CheckpointPolicy::MUST_SWAP) r->list_value = CheckpointPolicy::MUST_SAVE;
    }
  }
  return c;
}

// ---------------------------------------------------------------------------------- modules

namespace {
std::shared_ptr<RandBlockImpl> make_block(
    const BlockDesc& d, int64_t width, bool checkpointed,
    const std::shared_ptr<recompose::SwapManager>& manager,
    const std::shared_ptr<torch::nn::BatchNorm1dImpl>& shared_bn) {
  auto b = std::make_shared<RandBlockImpl>(d, width, checkpointed, manager, shared_bn);
  if (checkpointed && d.region.kind != RegionDesc::Kind::None)
    recompose::apply_checkpoint(b, d.region.make(manager));
  return b;
}
}  // namespace

RandBlockImpl::RandBlockImpl(const BlockDesc& d, int64_t w, bool ckpt,
                             std::shared_ptr<recompose::SwapManager> m,
                             std::shared_ptr<torch::nn::BatchNorm1dImpl> sbn)
    : desc(d), width(w), checkpointed(ckpt), manager(std::move(m)) {
  // A child of every block that calls it (as a user shares a module): part of the module state
  // of these blocks' regions.
  const bool calls_shared = std::any_of(desc.ops.begin(), desc.ops.end(), [](const OpDesc& op) {
    return op.kind == OpKind::SharedBn || op.kind == OpKind::SharedBnIdle;
  });
  if (calls_shared) shared_bn = register_module("shared_bn", sbn);
  op_modules.resize(desc.ops.size());
  for (size_t i = 0; i < desc.ops.size(); ++i) {
    const std::string name = "op" + std::to_string(i);
    switch (desc.ops[i].kind) {
      case OpKind::Linear:
      case OpKind::LinearReluInplace:
        op_modules[i] = register_module(name + "_lin", torch::nn::Linear(width, width));
        break;
      case OpKind::LayerNorm:
        op_modules[i] = register_module(name + "_ln",
                                        torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
        break;
      case OpKind::BatchNorm: {
        const BnKind k{desc.ops[i].arg};
        const bool a = k.affine(), t = k.tracked();
        if (k.layout() == BnKind::D1) {
          op_modules[i] = register_module(
              name + "_bn",
              torch::nn::BatchNorm1d(
                  torch::nn::BatchNorm1dOptions(width).affine(a).track_running_stats(t)));
        } else if (k.layout() == BnKind::D3ChannelsLast) {
          op_modules[i] = register_module(
              name + "_bn",
              torch::nn::BatchNorm3d(
                  torch::nn::BatchNorm3dOptions(width / 4).affine(a).track_running_stats(t)));
        } else {
          op_modules[i] = register_module(
              name + "_bn",
              torch::nn::BatchNorm2d(
                  torch::nn::BatchNorm2dOptions(width / 4).affine(a).track_running_stats(t)));
        }
        break;
      }
      case OpKind::Dropout:
        op_modules[i] = register_module(name + "_drop", torch::nn::Dropout(desc.ops[i].arg / 10.0));
        break;
      default:
        break;
    }
  }
  for (size_t j = 0; j < desc.children.size(); ++j) {
    children.push_back(
        register_module("sub" + std::to_string(j),
                        make_block(desc.children[j], width, checkpointed, manager, sbn)));
  }
}

torch::Tensor RandBlockImpl::forward(torch::Tensor x) {
  RECOMPOSE_FORWARD(x);
  return run(x, x, 0, desc.ops.size());
}

torch::Tensor RandBlockImpl::run(torch::Tensor cur, torch::Tensor res, size_t begin, size_t end) {
  const int64_t W = width;
  for (size_t i = begin; i < end; ++i) {
    const OpDesc& op = desc.ops[i];
    switch (op.kind) {
      case OpKind::Linear:
        cur = std::static_pointer_cast<torch::nn::LinearImpl>(op_modules[i])->forward(cur);
        break;
      case OpKind::LinearReluInplace:
        cur = std::static_pointer_cast<torch::nn::LinearImpl>(op_modules[i])->forward(cur);
        cur.relu_();
        break;
      case OpKind::LayerNorm:
        cur = std::static_pointer_cast<torch::nn::LayerNormImpl>(op_modules[i])->forward(cur);
        break;
      case OpKind::BatchNorm: {
        const auto sizes = cur.sizes().vec();
        const BnKind k{op.arg};
        switch (k.layout()) {
          case BnKind::D1:
            cur = std::static_pointer_cast<torch::nn::BatchNorm1dImpl>(op_modules[i])
                      ->forward(cur.reshape({-1, W}));
            break;
          case BnKind::D2:
          case BnKind::D2ChannelsLast: {
            torch::Tensor in = cur.reshape({-1, W / 4, 2, 2});
            if (k.layout() == BnKind::D2ChannelsLast)
              in = in.contiguous(at::MemoryFormat::ChannelsLast);
            cur = std::static_pointer_cast<torch::nn::BatchNorm2dImpl>(op_modules[i])->forward(in);
            break;
          }
          case BnKind::D3ChannelsLast:
            cur = std::static_pointer_cast<torch::nn::BatchNorm3dImpl>(op_modules[i])
                      ->forward(cur.reshape({-1, W / 4, 1, 2, 2})
                                    .contiguous(at::MemoryFormat::ChannelsLast3d));
            break;
        }
        cur = cur.reshape(sizes);
        break;
      }
      case OpKind::Gelu:
        cur = torch::gelu(cur);
        break;
      case OpKind::Relu:
        cur = torch::relu(cur);
        break;
      case OpKind::Tanh:
        cur = torch::tanh(cur);
        break;
      case OpKind::Dropout:
        cur = std::static_pointer_cast<torch::nn::DropoutImpl>(op_modules[i])->forward(cur);
        break;
      case OpKind::Softmax:
        cur = torch::softmax(cur, -1);
        break;
      case OpKind::Attention: {
        torch::Tensor s =
            torch::matmul(cur, cur.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(W)));
        cur = torch::matmul(torch::softmax(s, -1), cur);
        break;
      }
      case OpKind::Bmm: {
        const auto sizes = cur.sizes().vec();
        torch::Tensor v = cur.reshape({-1, 2, W / 2});
        torch::Tensor s = torch::bmm(v, v.transpose(1, 2));
        cur = torch::bmm(torch::tanh(s), v).reshape(sizes);
        break;
      }
      case OpKind::InplaceMul:
        cur = cur.clone();
        cur.mul_(1.5).add_(0.25);
        break;
      case OpKind::SliceInplace:
        cur = cur.clone();
        cur.narrow(-1, 0, W / 2).mul_(2.0);
        break;
      case OpKind::ViewRoundTrip: {
        const auto sizes = cur.sizes().vec();
        cur = cur.reshape({-1, 2, W / 2}).transpose(-1, -2).unsqueeze(0).squeeze(0).reshape(sizes);
        break;
      }
      case OpKind::SliceCat:
        cur = torch::cat({cur.narrow(-1, W / 2, W - W / 2), cur.narrow(-1, 0, W / 2) * 2}, -1);
        break;
      case OpKind::Residual:
        cur = cur + res;
        break;
      case OpKind::RandNoise:
        cur = cur + 0.1 * torch::randn_like(cur);
        break;
      case OpKind::RRelu:
        cur = torch::rrelu(cur, 0.1, 0.3, /*training=*/op.arg == 1);
        break;
      case OpKind::SmoothedCe: {
        // Targets and class weights made without the generator; every third target ignored.
        namespace F = torch::nn::functional;
        const torch::Tensor logits = cur.reshape({-1, W});
        torch::Tensor target = torch::arange(logits.size(0), torch::kLong).mul(5).remainder(W);
        target.masked_fill_(torch::arange(logits.size(0), torch::kLong).remainder(3) == 0, -100);
        const torch::Tensor weight = torch::arange(W, torch::kFloat).div(W).add(0.5);
        cur = cur +
              F::cross_entropy(logits, target,
                               F::CrossEntropyFuncOptions().weight(weight).label_smoothing(0.1));
        break;
      }
      case OpKind::Bernoulli:
        cur = cur * torch::bernoulli(torch::full_like(cur, 0.75, torch::kFloat));
        break;
      case OpKind::SharedBn: {
        const auto sizes = cur.sizes().vec();
        cur = shared_bn->forward(cur.reshape({-1, W})).reshape(sizes);
        break;
      }
      case OpKind::SharedBnIdle: {
        // An all-zero batch: batch mean 0, so a running mean at 0 is written and stays 0.
        const auto sizes = cur.sizes().vec();
        cur = cur + shared_bn->forward(torch::relu(-cur.abs()).reshape({-1, W})).reshape(sizes);
        break;
      }
      case OpKind::Sub:
        cur = children[static_cast<size_t>(op.arg)]->forward(cur);
        break;
      case OpKind::Functional: {
        const size_t b = i + 1, e = std::min(end, i + 1 + static_cast<size_t>(op.arg));
        if (checkpointed && op.region.kind != RegionDesc::Kind::None) {
          RandBlockImpl* self = this;
          // As documented for the functional form: name the modules whose state the body
          // touches (this block's BatchNorms, its train/eval mode).
          auto options = op.region.make(manager);
          options.state_modules({shared_from_this()});
          cur = recompose::checkpoint(
              options,
              [self, b, e](const torch::Tensor& c, const torch::Tensor& r) {
                return self->run(c, r, b, e);
              },
              cur, res);
        } else {
          cur = run(cur, res, b, e);
        }
        i = e - 1;
        break;
      }
    }
  }
  return cur;
}

RandModelImpl::RandModelImpl(const CaseDesc& desc, bool checkpointed,
                             std::shared_ptr<recompose::SwapManager> manager)
    : twice(desc.twice), outside_bn(desc.outside_bn) {
  if (desc.shared_bn)
    shared_bn = register_module("shared_bn", torch::nn::BatchNorm1d(desc.width).ptr());
  for (size_t j = 0; j < desc.blocks.size(); ++j) {
    std::string name = "b";
    name += std::to_string(j);
    blocks.push_back(register_module(
        name, make_block(desc.blocks[j], desc.width, checkpointed, manager, shared_bn)));
  }
  // Never checkpointed: the loss always depends on a parameter, whatever the blocks hold.
  head = register_module("head", torch::nn::Linear(desc.width, desc.width));
}

torch::Tensor RandModelImpl::forward(torch::Tensor x, recompose::SwapManager* groups) {
  auto outside = [&](const torch::Tensor& t) {  // outside any region
    const auto sizes = t.sizes().vec();
    return shared_bn->forward(t.reshape({-1, t.size(-1)})).reshape(sizes);
  };
  for (size_t j = 0; j < blocks.size(); ++j) {
    const int where = j < outside_bn.size() ? outside_bn[j] : 0;
    if (where == 1) x = outside(x);
    for (int call = 0; call < (j < twice.size() && twice[j] ? 2 : 1); ++call) {
      std::optional<recompose::SwapGroupScope> group;
      if (groups) group.emplace(*groups);
      x = blocks[j]->forward(x);
    }
    if (where == 2) x = outside(x);
  }
  return head->forward(x);
}

}  // namespace rt::diff
