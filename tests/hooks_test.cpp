// The forward-hook layer: registration, firing paths, always_call, removal, state, re-invocation,
// module-tree invariance and thread safety.
#include "support/test_modules.h"

#include <recompose/hooks/composable_api.h>
#include <recompose/hooks/forward_hooks.h>
#include <recompose/hooks/module_lifetime.h>
#include <recompose/hooks/module_state.h>
#include <recompose/hooks/registry_stats.h>

#include <doctest/doctest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <new>
#include <sstream>
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

using namespace recompose::hooks;
using recompose::hooks::detail::registry_stats;

namespace {

std::vector<std::string> names_of(const torch::OrderedDict<std::string, torch::Tensor>& d) {
  std::vector<std::string> out;
  for (const auto& item : d) out.push_back(item.key());
  return out;
}

}  // namespace

// Freed-memory poisoning for this test binary, like MALLOC_PERTURB_ but for operator delete and
// switchable at run time: while on, memory is overwritten as it is freed, so a read through a
// dangling pointer sees garbage instead of the old bytes (which glibc's tcache leaves in place).
// The replacement operators below serve the whole binary; with poisoning off they behave as the
// default ones.
namespace {
std::atomic<bool> g_poison_freed{false};

struct PoisonFreedMemory {
  PoisonFreedMemory() { g_poison_freed.store(true); }
  ~PoisonFreedMemory() { g_poison_freed.store(false); }
  PoisonFreedMemory(const PoisonFreedMemory&) = delete;
  PoisonFreedMemory& operator=(const PoisonFreedMemory&) = delete;
};

void poison_and_free(void* p) noexcept {
#if defined(__GLIBC__)
  if (p != nullptr && g_poison_freed.load(std::memory_order_relaxed)) {
    // volatile: the compiler would drop a plain memset before free() as a dead store.
    auto* bytes = static_cast<volatile unsigned char*>(p);
    for (std::size_t i = 0, n = malloc_usable_size(p); i < n; ++i) bytes[i] = 0xDB;
  }
#endif
  std::free(p);
}
}  // namespace

void* operator new(std::size_t size) {
  for (;;) {
    if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}
void operator delete(void* p) noexcept { poison_and_free(p); }
void operator delete(void* p, std::size_t) noexcept { poison_and_free(p); }

TEST_CASE("pre-hook sees the arguments, post-hook sees arguments and output") {
  rt::TinyBlock block(4);
  torch::Tensor x = torch::randn({2, 4});
  std::vector<std::string> order;
  torch::Tensor seen_in, seen_out;
  auto pre = register_forward_pre_hook(*block, [&](ForwardCall& c) {
    order.push_back("pre");
    seen_in = c.input_leaves().at(0);
    CHECK_FALSE(c.has_output());
  });
  auto post = register_forward_hook(*block, [&](ForwardCall& c) {
    order.push_back("post");
    REQUIRE(c.has_output());
    seen_out = c.output_leaves().at(0);
    CHECK(c.input_leaves().at(0).is_same(x));
  });
  torch::Tensor y = block(x);
  CHECK(order == std::vector<std::string>{"pre", "post"});
  CHECK(seen_in.is_same(x));
  CHECK(seen_out.is_same(y));
  CHECK(block->body_runs == 1);
}

TEST_CASE("hooks run in registration order; prepend puts a hook first") {
  rt::TinyBlock block(4);
  std::vector<int> order;
  register_forward_pre_hook(*block, [&](ForwardCall&) { order.push_back(1); });
  register_forward_pre_hook(*block, [&](ForwardCall&) { order.push_back(2); });
  register_forward_pre_hook(
      *block, [&](ForwardCall&) { order.push_back(0); }, HookOptions().prepend(true));
  register_forward_hook(*block, [&](ForwardCall&) { order.push_back(11); });
  register_forward_hook(
      *block, [&](ForwardCall&) { order.push_back(10); }, HookOptions().prepend(true));
  block(torch::randn({1, 4}));
  CHECK(order == std::vector<int>{0, 1, 2, 10, 11});
  CHECK(hook_count(*block) == 5);
}

TEST_CASE("HookOptions is a builder, as every options struct of recompose") {
  const HookOptions options = HookOptions().owner("my_api").always_call(true);
  CHECK(options.owner() == "my_api");
  CHECK(options.always_call());
  CHECK_FALSE(options.prepend());
  // A copy changed further keeps the original as it was.
  const HookOptions first = HookOptions(options).always_call(false).prepend(true);
  CHECK(first.prepend());
  CHECK_FALSE(first.always_call());
  CHECK(options.always_call());
  // The owner given here is the one StoredCall::invoke switches off.
  rt::TinyBlock block(4);
  int mine = 0;
  std::shared_ptr<StoredCall> stored;
  register_forward_pre_hook(
      *block,
      [&](ForwardCall& c) {
        ++mine;
        stored = c.store();
      },
      HookOptions().owner("my_api"));
  block(torch::randn({1, 4}));
  stored->invoke({}, "my_api");
  CHECK(mine == 1);
}

TEST_CASE("hooks fire however the module is called") {
  rt::TinyBlock block(4);
  int fired = 0;
  register_forward_hook(*block, [&](ForwardCall&) { ++fired; });
  torch::Tensor x = torch::randn({1, 4});

  block(x);                          // ModuleHolder
  block->forward(x);                 // the Impl directly
  torch::nn::Sequential seq(block);  // Sequential
  seq->forward(x);
  torch::nn::AnyModule any(block);  // AnyModule
  any.forward(x);
  torch::nn::ModuleList list;  // ModuleList
  list->push_back(block);
  list[0]->as<rt::TinyBlockImpl>()->forward(x);
  torch::nn::ModuleDict dict;  // ModuleDict
  dict->update({{"blk", block.ptr()}});
  dict["blk"]->as<rt::TinyBlockImpl>()->forward(x);
  CHECK(fired == 6);
  CHECK(block->body_runs == 6);
}

TEST_CASE("nested annotated modules each run their own hooks") {
  rt::Nested net;
  std::vector<std::string> order;
  register_forward_pre_hook(*net, [&](ForwardCall&) { order.push_back("outer-pre"); });
  register_forward_hook(*net, [&](ForwardCall&) { order.push_back("outer-post"); });
  register_forward_pre_hook(*net->a, [&](ForwardCall&) { order.push_back("a-pre"); });
  register_forward_hook(*net->b, [&](ForwardCall&) { order.push_back("b-post"); });
  net(torch::randn({3, 4}));
  CHECK(order == std::vector<std::string>{"outer-pre", "a-pre", "b-post", "outer-post"});
}

TEST_CASE("always_call post-hooks run when the body throws, then the exception goes on") {
  rt::Throwing m;
  int plain = 0, always = 0;
  std::string message;
  register_forward_hook(*m, [&](ForwardCall&) { ++plain; });
  register_forward_hook(
      *m,
      [&](ForwardCall& c) {
        ++always;
        if (!c.error()) return;
        try {
          std::rethrow_exception(c.error());
        } catch (const std::runtime_error& e) {
          message = e.what();
        }
      },
      HookOptions().always_call(true));
  CHECK_THROWS_WITH_AS(m(torch::ones({1}), true), "body failed", std::runtime_error);
  CHECK(plain == 0);
  CHECK(always == 1);
  CHECK(message == "body failed");
  // and without failure both run, with no error set
  message.clear();
  m(torch::ones({1}), false);
  CHECK(message.empty());
  CHECK(plain == 1);
  CHECK(always == 2);
}

TEST_CASE("exceptions in hooks: a throwing pre-hook stops the call; always_call hooks still run") {
  rt::TinyBlock block(4);
  int always = 0, after = 0;
  register_forward_pre_hook(*block, [&](ForwardCall&) { throw std::logic_error("pre failed"); });
  register_forward_hook(
      *block,
      [&](ForwardCall& c) {
        ++always;
        CHECK(c.error() != nullptr);
        throw std::runtime_error("dropped");  // the original exception must win
      },
      HookOptions().always_call(true));
  register_forward_hook(*block, [&](ForwardCall&) { ++after; });
  CHECK_THROWS_WITH_AS(block(torch::randn({1, 4})), "pre failed", std::logic_error);
  CHECK(always == 1);
  CHECK(after == 0);
  CHECK(block->body_runs == 0);
}

TEST_CASE("a throwing post-hook: later always_call hooks run, the exception goes on") {
  rt::TinyBlock block(4);
  int always = 0;
  register_forward_hook(*block, [&](ForwardCall&) { throw std::runtime_error("post failed"); });
  register_forward_hook(
      *block, [&](ForwardCall&) { ++always; }, HookOptions().always_call(true));
  CHECK_THROWS_WITH(block(torch::randn({1, 4})), "post failed");
  CHECK(always == 1);
  // The layer is still usable afterwards (no stale body marker).
  CHECK_THROWS_WITH(block(torch::randn({1, 4})), "post failed");
  CHECK(block->body_runs == 2);
}

TEST_CASE("removing hooks, also from inside a running hook") {
  rt::TinyBlock block(4);
  int a = 0, b = 0, c = 0;
  HookHandle hb;
  HookHandle ha = register_forward_pre_hook(*block, [&](ForwardCall&) {
    ++a;
    hb.remove();  // removes a hook that would run later in this very call
  });
  hb = register_forward_pre_hook(*block, [&](ForwardCall&) { ++b; });
  HookHandle hc;
  hc = register_forward_hook(*block, [&](ForwardCall&) {
    ++c;
    hc.remove();  // removes itself
  });
  block(torch::randn({1, 4}));
  CHECK(a == 1);
  CHECK(b == 0);
  CHECK(c == 1);
  CHECK_FALSE(hb.active());
  CHECK_FALSE(hc.active());
  block(torch::randn({1, 4}));
  CHECK(a == 2);
  CHECK(c == 1);
  ha.remove();
  ha.remove();  // idempotent
  CHECK(hook_count(*block) == 0);
  block(torch::randn({1, 4}));
  CHECK(a == 2);
}

TEST_CASE("a hook that calls the module again sees the nested call's hooks run too") {
  rt::TinyBlock block(4);
  int pre_calls = 0;
  bool inside = false;
  torch::Tensor nested_out;
  register_forward_pre_hook(*block, [&](ForwardCall& c) {
    ++pre_calls;
    if (inside) return;
    inside = true;
    nested_out = block->forward(c.input_leaves()[0]);
    inside = false;
  });
  torch::Tensor x = torch::randn({2, 4});
  torch::Tensor y = block(x);
  CHECK(pre_calls == 2);
  CHECK(block->body_runs == 2);
  CHECK(torch::equal(y, nested_out));
}

TEST_CASE("registering on a module whose forward is not annotated fails, naming the type") {
  rt::Plain plain;
  CHECK_FALSE(has_annotated_forward(*plain));
  CHECK(has_annotated_forward(*rt::TinyBlock(4)));
  try {
    register_forward_hook(*plain, [](ForwardCall&) {});
    FAIL("expected std::invalid_argument");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("rt::PlainImpl") != std::string::npos);
    CHECK(msg.find("RECOMPOSE_FORWARD") != std::string::npos);
  }
  CHECK_THROWS_AS(register_forward_pre_hook(*plain, [](ForwardCall&) {}), std::invalid_argument);
  CHECK_THROWS_AS(register_forward_pre_hook(
                      *rt::TinyBlock(4), [](ForwardCall&) {}, HookOptions().always_call(true)),
                  std::invalid_argument);
}

TEST_CASE("a module not owned by a shared_ptr is refused with a clear message") {
  rt::TinyBlockImpl on_stack(4);
  CHECK_THROWS_WITH_AS(register_forward_hook(on_stack, [](ForwardCall&) {}),
                       doctest::Contains("not owned by a std::shared_ptr"), std::invalid_argument);
}

TEST_CASE("attachable typed state, like composable contract") {
  struct ApiState {
    int value = 7;
  };
  struct OtherState {};
  rt::TinyBlock block(4);
  CHECK(applied_apis(*block).empty());
  CHECK(find_state<ApiState>(*block, "my_api") == nullptr);
  auto st = attach_state(*block, "my_api", std::make_shared<ApiState>());
  attach_state(*block, "other_api", std::make_shared<OtherState>());
  CHECK(find_state<ApiState>(*block, "my_api") == st);
  CHECK(find_state<ApiState>(*block, "my_api")->value == 7);
  CHECK(applied_apis(*block) == std::vector<std::string>{"my_api", "other_api"});
  CHECK_THROWS_AS(attach_state(*block, "my_api", std::make_shared<ApiState>()), CompositionError);
  CHECK_THROWS_AS(find_state<OtherState>(*block, "my_api"), CompositionError);
  CHECK(detach_state(*block, "my_api"));
  CHECK_FALSE(detach_state(*block, "my_api"));
  CHECK(applied_apis(*block) == std::vector<std::string>{"other_api"});
  // State belongs to the instance, not the type.
  rt::TinyBlock other(4);
  CHECK(applied_apis(*other).empty());
}

namespace {
struct CounterState {
  int pre_calls = 0;
  int post_calls = 0;
};
const ComposableApi<CounterState> kCounterApi("test.counter", "test::apply_counter");
std::shared_ptr<CounterState> apply_counter(torch::nn::Module& module) {
  return kCounterApi.apply(
      module, std::make_shared<CounterState>(),
      [](ApiHooks& hooks, std::weak_ptr<CounterState> state) {
        hooks.pre([state](ForwardCall&) {
          if (auto s = state.lock()) ++s->pre_calls;
        });
        hooks.post(
            [state](ForwardCall&) {
              if (auto s = state.lock()) ++s->post_calls;
            },
            HookOptions().always_call(true).owner("ignored: the API owns its hooks"));
      });
}
}  // namespace

TEST_CASE("ComposableApi: apply once, find the state, remove everything it attached") {
  rt::TinyBlock block(4);
  CHECK_FALSE(kCounterApi.is_applied(*block));
  CHECK(kCounterApi.state(*block) == nullptr);
  auto state = apply_counter(*block);
  CHECK(kCounterApi.is_applied(*block));
  CHECK(kCounterApi.state(*block) == state);
  CHECK(applied_apis(*block) == std::vector<std::string>{"test.counter"});
  CHECK(hook_count(*block) == 2);
  block(torch::randn({1, 4}));
  CHECK(state->pre_calls == 1);
  CHECK(state->post_calls == 1);
  // Applied twice: refused, and the first application is untouched.
  CHECK_THROWS_AS(apply_counter(*block), CompositionError);
  CHECK(hook_count(*block) == 2);
  CHECK(kCounterApi.state(*block) == state);
  CHECK(kCounterApi.remove(*block));
  CHECK_FALSE(kCounterApi.remove(*block));
  CHECK_FALSE(kCounterApi.is_applied(*block));
  CHECK(hook_count(*block) == 0);
  CHECK(applied_apis(*block).empty());
  block(torch::randn({1, 4}));
  CHECK(state->pre_calls == 1);
  // Applied again after removal: a fresh state.
  auto again = apply_counter(*block);
  CHECK(again != state);
  CHECK(kCounterApi.remove(*block));
}

TEST_CASE("ComposableApi: the hooks are owned by the API, so its re-invocation switches them off") {
  rt::TinyBlock block(4);
  auto state = apply_counter(*block);
  std::shared_ptr<StoredCall> stored;
  register_forward_pre_hook(*block, [&](ForwardCall& c) { stored = c.store(); });
  block(torch::randn({1, 4}));
  CHECK(state->pre_calls == 1);
  stored->invoke({}, "test.counter");
  CHECK(state->pre_calls == 1);  // off during the API's own re-invocation
  stored->invoke({}, "someone.else");
  CHECK(state->pre_calls == 2);
}

TEST_CASE("ComposableApi: an install that throws leaves the module as it was") {
  rt::TinyBlock block(4);
  CHECK_THROWS_WITH_AS(
      kCounterApi.apply(
          *block, std::make_shared<CounterState>(),
          [](ApiHooks& hooks, std::weak_ptr<CounterState>) {
            hooks.pre([](ForwardCall&) {});
            hooks.pre([](ForwardCall&) {},
                      HookOptions().always_call(true));  // always_call on a pre-hook: refused
          }),
      doctest::Contains("always_call"), std::invalid_argument);
  CHECK(hook_count(*block) == 0);
  CHECK_FALSE(kCounterApi.is_applied(*block));
  CHECK(applied_apis(*block).empty());
  apply_counter(*block);  // and it can be applied afterwards
  CHECK(kCounterApi.remove(*block));
}

TEST_CASE("ComposableApi: a module that cannot be hooked is refused with what to do instead") {
  rt::Plain plain;
  try {
    apply_counter(*plain);
    FAIL("expected std::invalid_argument");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("test::apply_counter") != std::string::npos);
    CHECK(msg.find("rt::PlainImpl") != std::string::npos);
    CHECK(msg.find("RECOMPOSE_FORWARD") != std::string::npos);
  }
  CHECK(applied_apis(*plain).empty());
  // LibTorch's own modules: their source is not the user's to annotate, so it is not pointed at.
  torch::nn::Linear linear(2, 2);
  CHECK(is_libtorch_module(*linear));
  CHECK_FALSE(is_libtorch_module(*plain));
  CHECK(module_type_name(*linear) == "torch::nn::LinearImpl");
  try {
    apply_counter(*linear);
    FAIL("expected std::invalid_argument");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("one of LibTorch's own modules") != std::string::npos);
    CHECK(msg.find("LinearImpl::forward") == std::string::npos);
  }
  const ComposableApi<CounterState> advised(
      "test.advised", "test::apply_advised",
      [](const torch::nn::Module& m) { return "Use X for " + m.name() + "."; });
  CHECK_THROWS_WITH_AS(advised.apply(*linear, std::make_shared<CounterState>(),
                                     [](ApiHooks&, std::weak_ptr<CounterState>) {}),
                       doctest::Contains("Use X for torch::nn::LinearImpl."),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(register_forward_hook(*linear, [](ForwardCall&) {}),
                       doctest::Contains("one of LibTorch's own modules"), std::invalid_argument);
}

TEST_CASE("ComposableApi: state_or_throw names the caller and the function to apply first") {
  rt::TinyBlock block(4);
  CHECK_THROWS_WITH_AS(kCounterApi.state_or_throw(*block, "test::counter_stats"),
                       doctest::Contains("test::counter_stats: test::apply_counter is not applied"),
                       recompose::CheckpointError);
  auto state = apply_counter(*block);
  CHECK(kCounterApi.state_or_throw(*block, "test::counter_stats") == state);
  CHECK(kCounterApi.remove(*block));
}

TEST_CASE("re-invocation: the owner's hooks are off, other owners' hooks run") {
  rt::TinyBlock block(4);
  int mine = 0, theirs = 0;
  std::shared_ptr<StoredCall> stored;
  register_forward_pre_hook(
      *block,
      [&](ForwardCall& c) {
        ++mine;
        if (!stored) stored = c.store();
      },
      HookOptions().owner("me"));
  register_forward_pre_hook(
      *block, [&](ForwardCall&) { ++theirs; }, HookOptions().owner("them"));
  torch::Tensor x = torch::randn({2, 4});
  torch::Tensor y = block(x);
  REQUIRE(stored);
  CHECK(stored->leaf_count() == 1);
  CHECK(&stored->module() == block.get());
  auto again = stored->invoke({}, "me");
  CHECK(mine == 1);
  CHECK(theirs == 2);
  REQUIRE(again.size() == 1);
  CHECK(torch::equal(again[0], y));
  // with replacement leaves
  torch::Tensor x2 = torch::randn({2, 4});
  auto replaced = stored->invoke({x2}, "me");
  CHECK(torch::equal(replaced[0], block->forward(x2)));
  CHECK_THROWS_AS(stored->invoke({x2, x2}, "me"), std::invalid_argument);
  // rerun: the same re-invocation, output dropped
  const int mine_before = mine, theirs_before = theirs;
  stored->rerun({x2}, "me");
  CHECK(mine == mine_before);
  CHECK(theirs == theirs_before + 1);
  CHECK_THROWS_AS(stored->rerun({x2, x2}, "me"), std::invalid_argument);
}

TEST_CASE("re-invocation with every argument kind, stored with and without tensors") {
  rt::MixedArgs m;
  std::shared_ptr<StoredCall> full, bare;
  std::vector<torch::Tensor> leaves;
  register_forward_pre_hook(
      *m,
      [&](ForwardCall& c) {
        if (full) return;
        full = c.store(true);
        bare = c.store(false);
        leaves = c.input_leaves();
      },
      HookOptions().owner("me"));
  torch::Tensor x = torch::randn({3}), b = torch::randn({3}), e1 = torch::randn({3}),
                e2 = torch::randn({3}), s = torch::randn({3});
  torch::Tensor y = m(x, b, std::vector<torch::Tensor>{e1, e2}, std::make_tuple(s, 0.5),
                      std::make_pair(int64_t{3}, std::string("tag")), rt::Mode::Mul);
  // leaves: x, bias, e1, e2, s
  REQUIRE(leaves.size() == 5);
  CHECK(leaves[1].is_same(b));
  CHECK(leaves[4].is_same(s));
  CHECK(torch::equal(full->invoke({}, "me")[0], y));
  CHECK_THROWS_AS(bare->invoke({}, "me"), std::invalid_argument);
  m->last_tag.clear();
  CHECK(torch::equal(bare->invoke(leaves, "me")[0], y));
  CHECK(m->last_tag == "tag");  // plain values were stored

  // an absent optional is an undefined leaf and stays absent
  std::shared_ptr<StoredCall> no_bias;
  register_forward_hook(*m, [&](ForwardCall& c) {
    if (!no_bias && c.input_leaves()[1].defined() == false) no_bias = c.store();
  });
  torch::Tensor y2 = m(x, std::nullopt, std::vector<torch::Tensor>{}, std::make_tuple(s, 2.0),
                       std::make_pair(int64_t{1}, std::string("t")), rt::Mode::Add);
  REQUIRE(no_bias);
  CHECK(no_bias->leaf_count() == 3);
  CHECK(torch::equal(no_bias->invoke({}, "me")[0], y2));
}

TEST_CASE("a stored call keeps its module alive") {
  std::shared_ptr<StoredCall> stored;
  std::weak_ptr<torch::nn::Module> weak;
  torch::Tensor x = torch::randn({1, 4});
  {
    rt::TinyBlock block(4);
    weak = block.ptr();
    register_forward_pre_hook(
        *block, [&](ForwardCall& c) { stored = c.store(); }, HookOptions().owner("me"));
    block(x);
  }
  CHECK_FALSE(weak.expired());
  CHECK(stored->invoke({}, "me").size() == 1);
  stored.reset();
  CHECK(weak.expired());
}

TEST_CASE("post-hooks see every output leaf of a tuple output") {
  rt::TwoOut m;
  std::size_t n = 0;
  register_forward_hook(*m, [&](ForwardCall& c) { n = c.output_leaves().size(); });
  auto [s, co] = m(torch::randn({2}));
  CHECK(n == 2);
}

TEST_CASE("per-call slots carry data from a pre-hook to the post-hook of the same call") {
  rt::TinyBlock block(4);
  std::vector<int> seen;
  int counter = 0;
  register_forward_pre_hook(
      *block, [&](ForwardCall& c) { c.slot("me") = std::make_shared<int>(++counter); });
  register_forward_hook(*block, [&](ForwardCall& c) {
    seen.push_back(*std::static_pointer_cast<int>(c.slot("me")));
  });
  block(torch::randn({1, 4}));
  block(torch::randn({1, 4}));
  CHECK(seen == std::vector<int>{1, 2});
}

TEST_CASE("the module tree, state_dict, save/load and clone are identical with and without hooks") {
  torch::manual_seed(0);
  rt::Nested plain_net;
  torch::manual_seed(0);
  rt::Nested hooked;
  register_forward_hook(*hooked, [](ForwardCall&) {});
  register_forward_pre_hook(*hooked->a, [](ForwardCall&) {});
  attach_state(*hooked->b, "some_api", std::make_shared<int>(1));

  CHECK(names_of(plain_net->named_parameters()) == names_of(hooked->named_parameters()));
  CHECK(names_of(plain_net->named_buffers()) == names_of(hooked->named_buffers()));
  std::vector<std::string> m1, m2;
  for (const auto& it : plain_net->named_modules()) m1.push_back(it.key());
  for (const auto& it : hooked->named_modules()) m2.push_back(it.key());
  CHECK(m1 == m2);

  std::stringstream s1, s2;
  torch::save(plain_net, s1);
  torch::save(hooked, s2);
  CHECK(s1.str() == s2.str());
  rt::Nested loaded;
  torch::load(loaded, s2);
  for (const auto& p : hooked->named_parameters()) {
    CHECK(torch::equal(p.value(), loaded->named_parameters()[p.key()]));
  }
  // hooks still fire after save/load on the original
  int fired = 0;
  register_forward_hook(*hooked->b, [&](ForwardCall&) { ++fired; });
  hooked(torch::randn({1, 4}));
  CHECK(fired == 1);
}

namespace {
// Threads that, once released, each run `calls` no-grad forwards of `block` and count the
// outputs that differ from the block's own computation.
class ConcurrentForwards {
 public:
  ConcurrentForwards(rt::TinyBlock& block, int threads, int calls) {
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, &block, calls] {
        torch::NoGradGuard no_grad;
        while (!go_.load()) std::this_thread::yield();
        torch::Tensor x = torch::ones({1, 4});
        torch::Tensor expect = torch::tanh(block->fc->forward(x));
        for (int i = 0; i < calls; ++i) {
          if (!torch::equal(block(x), expect)) bad_.fetch_add(1);
        }
      });
    }
  }
  ~ConcurrentForwards() { join(); }
  void release() { go_ = true; }
  // Waits for every thread; returns the number of wrong outputs.
  int join() {
    release();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    return bad_.load();
  }

 private:
  std::atomic<bool> go_{false};
  std::atomic<int> bad_{0};
  std::vector<std::thread> threads_;  // last: started once the counters exist
};
}  // namespace

TEST_CASE("thread safety: hooks registered on one thread, forward on several at once") {
  rt::TinyBlock block(4);
  std::atomic<int> pre{0}, post{0};
  register_forward_pre_hook(*block, [&](ForwardCall&) { pre.fetch_add(1); });
  constexpr int kThreads = 4, kCalls = 200;
  ConcurrentForwards forwards(block, kThreads, kCalls);
  forwards.release();
  // register and remove post-hooks while the threads run
  for (int i = 0; i < 50; ++i) {
    auto h = register_forward_hook(*block, [&](ForwardCall&) { post.fetch_add(1); });
    std::this_thread::yield();
    h.remove();
  }
  CHECK(forwards.join() == 0);
  CHECK(pre.load() == kThreads * kCalls);
}

namespace {
struct Batch {
  torch::Tensor tokens;
  int64_t pad;
};
}  // namespace

template <>
struct recompose::hooks::ArgTraits<Batch> {
  static void flatten(const Batch& b, std::vector<torch::Tensor>& out) { out.push_back(b.tokens); }
  static Batch rebuild(const Batch& like, LeafCursor& c) { return Batch{c.next(), like.pad}; }
};

namespace {
struct BatchUserImpl : torch::nn::Module {
  torch::Tensor forward(Batch b) {
    RECOMPOSE_FORWARD(b);
    return b.tokens + static_cast<double>(b.pad);
  }
};
TORCH_MODULE(BatchUser);
}  // namespace

TEST_CASE("custom argument types through the ArgTraits customisation point") {
  BatchUser m;
  std::shared_ptr<StoredCall> stored;
  register_forward_pre_hook(
      *m, [&](ForwardCall& c) { stored = c.store(false); }, HookOptions().owner("me"));
  torch::Tensor t = torch::arange(3.0);
  torch::Tensor y = m(Batch{t, 2});
  REQUIRE(stored);
  CHECK(stored->leaf_count() == 1);
  CHECK(torch::equal(stored->invoke({t * 10}, "me")[0], t * 10 + 2));
  CHECK(torch::equal(y, t + 2));
}

namespace {
// One link of a chain of annotated modules: its body calls the next link.
struct ChainLinkImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    RECOMPOSE_FORWARD(x);
    torch::Tensor y = x + 1;
    return next ? next->forward(y) : y;
  }
  std::shared_ptr<ChainLinkImpl> next;
};
}  // namespace

TEST_CASE("nested re-invocations, several levels deep, keep each module's owner suppressed") {
  // Every link re-invokes itself from inside the re-invocation of the link before it, so the
  // thread's stack of suppressed owners grows (and its storage moves) while the outer calls are
  // still running; "ck" is short enough to live inside std::string's own buffer.
  constexpr int kDepth = 9;
  std::vector<std::shared_ptr<ChainLinkImpl>> links;
  for (int i = 0; i < kDepth; ++i) links.push_back(std::make_shared<ChainLinkImpl>());
  for (int i = 0; i + 1 < kDepth; ++i) links[i]->next = links[i + 1];

  std::vector<std::shared_ptr<StoredCall>> stored(kDepth);
  std::vector<bool> inside(kDepth, false), reinvoked(kDepth, false);
  std::vector<int> own_hooks_inside(kDepth, 0), others_inside(kDepth, 0);
  bool replaying = false;
  for (int i = 0; i < kDepth; ++i) {
    register_forward_pre_hook(
        *links[i],
        [&, i](ForwardCall& c) {
          if (inside[i]) {
            ++own_hooks_inside[i];  // must never happen: "ck" is off for this module's
                                    // re-invocation
            return;
          }
          if (!replaying) {
            if (!stored[i]) stored[i] = c.store();
            return;
          }
          if (reinvoked[i]) return;
          reinvoked[i] = true;
          inside[i] = true;
          stored[i]->invoke({}, "ck");
          inside[i] = false;
        },
        HookOptions().owner("ck"));
    register_forward_hook(
        *links[i],
        [&, i](ForwardCall&) {
          if (inside[i]) ++own_hooks_inside[i];
        },
        HookOptions().owner("ck"));
    register_forward_hook(
        *links[i],
        [&, i](ForwardCall&) {
          if (inside[i]) ++others_inside[i];
        },
        HookOptions().owner("other"));
  }
  torch::Tensor x = torch::zeros({2});
  torch::Tensor y = links[0]->forward(x);
  CHECK(torch::equal(y, torch::full({2}, double(kDepth))));

  PoisonFreedMemory poison;  // a view into moved storage must not read the old bytes by luck
  replaying = true;
  reinvoked[0] = true;
  inside[0] = true;
  auto again = stored[0]->invoke({}, "ck");
  inside[0] = false;
  REQUIRE(again.size() == 1);
  CHECK(torch::equal(again[0], y));
  for (int i = 0; i < kDepth; ++i) {
    CAPTURE(i);
    CHECK(reinvoked[i]);
    CHECK(own_hooks_inside[i] ==
          0);  // the suppressed owner stayed off, before and after the inner calls
    CHECK(others_inside[i] == 1);  // and every other owner's hooks ran, once per re-invocation
  }
}

namespace {
// State whose destruction the tests can observe.
struct TrackedState {
  explicit TrackedState(std::shared_ptr<bool> destroyed) : destroyed_(std::move(destroyed)) {}
  ~TrackedState() { *destroyed_ = true; }
  std::shared_ptr<bool> destroyed_;
};

// What a dead module leaves behind: a flag set when its state dies, a weak view of what its
// hook's callable holds, and the handle of that hook (kept, so only a purge can free the callable).
struct Leftovers {
  std::shared_ptr<bool> state_destroyed = std::make_shared<bool>(false);
  std::weak_ptr<int> hook_capture;
  HookHandle handle;
  int hook_runs = 0;
};

// A block with a hook and a state, run once.
rt::TinyBlock hooked_block(Leftovers& left) {
  rt::TinyBlock block(4);
  attach_state(*block, "tracked", std::make_shared<TrackedState>(left.state_destroyed));
  auto capture = std::make_shared<int>(0);
  left.hook_capture = capture;
  left.handle = register_forward_hook(*block, [capture, &left](ForwardCall&) { ++left.hook_runs; });
  block(torch::randn({1, 4}));
  CHECK(left.hook_runs == 1);
  return block;
}

void hooked_block_that_dies(Leftovers& left) { hooked_block(left); }

// Starts from an empty registry: what earlier tests left behind is purged first.
void start_from_empty_registry() {
  purge_expired();
  REQUIRE_MESSAGE(registry_stats().entries == 0, "a module of an earlier test is still alive");
}
}  // namespace

TEST_CASE(
    "a destroyed module's hooks and state die at the next registration, and the fast path comes "
    "back") {
  start_from_empty_registry();
  Leftovers left;
  hooked_block_that_dies(left);
  // Nothing has looked at the registry since the module died.
  CHECK_FALSE(*left.state_destroyed);
  CHECK(registry_stats().entries == 1);
  CHECK(registry_stats().hooked_modules == 1);

  rt::TinyBlock other(4);
  HookHandle h = register_forward_pre_hook(*other, [](ForwardCall&) {});  // the trigger
  CHECK(*left.state_destroyed);
  CHECK(left.hook_capture.expired());  // the callable is gone although its handle is still held
  CHECK_FALSE(left.handle.active());
  left.handle.remove();  // harmless on a purged hook
  CHECK(registry_stats().entries == 1);

  h.remove();  // the last hook of the last live entry: the table is empty again
  CHECK(registry_stats().entries == 0);
  CHECK(registry_stats().hooked_modules == 0);
}

TEST_CASE(
    "a destroyed module's hooks and state die within kForwardPurgePeriod forwards of any annotated "
    "module") {
  start_from_empty_registry();
  Leftovers left;
  hooked_block_that_dies(left);
  rt::TinyBlock unhooked(4);
  torch::Tensor x = torch::randn({1, 4});
  for (unsigned i = 0; i < kForwardPurgePeriod; ++i) unhooked(x);
  CHECK(*left.state_destroyed);
  CHECK(left.hook_capture.expired());
  CHECK(left.hook_runs == 1);
  CHECK(registry_stats().entries == 0);
  CHECK(registry_stats().hooked_modules == 0);
}

TEST_CASE("purge_expired destroys dead modules' entries at once and keeps live ones") {
  start_from_empty_registry();
  rt::TinyBlock alive(4);
  int alive_runs = 0;
  register_forward_hook(*alive, [&](ForwardCall&) { ++alive_runs; });
  auto alive_state = attach_state(*alive, "tracked", std::make_shared<int>(5));
  Leftovers a, b;
  {
    rt::TinyBlock block_a = hooked_block(a);
    rt::TinyBlock block_b = hooked_block(b);
  }
  CHECK(registry_stats().entries == 3);
  CHECK_FALSE(*a.state_destroyed);

  CHECK(purge_expired() == 2);
  CHECK(*a.state_destroyed);
  CHECK(*b.state_destroyed);
  CHECK(a.hook_capture.expired());
  CHECK(b.hook_capture.expired());
  CHECK(purge_expired() == 0);
  CHECK(registry_stats().entries == 1);
  alive(torch::randn({1, 4}));
  CHECK(alive_runs == 1);
  CHECK(find_state<int>(*alive, "tracked") == alive_state);
}

TEST_CASE("lookups purge too: find_state, applied_apis, hook_count, detach_state") {
  rt::TinyBlock alive(4);
  auto check_lookup_purges = [&](const std::string& name, const std::function<void()>& lookup) {
    CAPTURE(name);
    start_from_empty_registry();
    Leftovers left;
    hooked_block_that_dies(left);
    lookup();
    CHECK(*left.state_destroyed);
    CHECK(registry_stats().entries == 0);
  };
  check_lookup_purges("find_state", [&] { CHECK(find_state<int>(*alive, "x") == nullptr); });
  check_lookup_purges("applied_apis", [&] { CHECK(applied_apis(*alive).empty()); });
  check_lookup_purges("hook_count", [&] { CHECK(hook_count(*alive) == 0); });
  check_lookup_purges("detach_state", [&] { CHECK_FALSE(detach_state(*alive, "x")); });
}

TEST_CASE("a new module at a dead module's address inherits none of its hooks or state") {
  start_from_empty_registry();
  // Allocated apart from their control blocks, so a dead module's memory is freed at once and
  // the allocator may hand the same address to the next module.
  auto make_block = [] { return std::shared_ptr<rt::TinyBlockImpl>(new rt::TinyBlockImpl(4)); };
  int dead_runs = 0;
  auto dead_state_destroyed = std::make_shared<bool>(false);
  const void* dead_address = nullptr;
  {
    auto block = make_block();
    dead_address = block.get();
    register_forward_pre_hook(*block, [&](ForwardCall&) { ++dead_runs; });
    attach_state(*block, "tracked", std::make_shared<TrackedState>(dead_state_destroyed));
  }
  std::vector<std::shared_ptr<rt::TinyBlockImpl>> candidates;
  bool reused = false;
  for (int i = 0; i < 16 && !reused; ++i) {
    candidates.push_back(make_block());
    reused = candidates.back().get() == dead_address;
  }
  if (!reused) MESSAGE("the allocator did not reuse the address; checking the new modules anyway");
  torch::Tensor x = torch::randn({1, 4});
  for (auto& fresh : candidates) {
    fresh->forward(x);  // a forward may or may not purge; the dead hook must not run either way
    CHECK(dead_runs == 0);
    CHECK(hook_count(*fresh) == 0);
    CHECK(applied_apis(*fresh).empty());
    CHECK(find_state<TrackedState>(*fresh, "tracked") == nullptr);
    int fresh_runs = 0;
    HookHandle h = register_forward_pre_hook(*fresh, [&](ForwardCall&) { ++fresh_runs; });
    CHECK(hook_count(*fresh) == 1);
    fresh->forward(x);
    CHECK(fresh_runs == 1);
    CHECK(dead_runs == 0);
    h.remove();
  }
  CHECK(*dead_state_destroyed);
  CHECK(registry_stats().entries == 0);
}

TEST_CASE("thread safety: modules die and are purged while other threads run hooked forwards") {
  start_from_empty_registry();
  rt::TinyBlock shared_block(4);
  std::atomic<int> pre{0};
  register_forward_pre_hook(*shared_block, [&](ForwardCall&) { pre.fetch_add(1); });
  constexpr int kThreads = 3, kCalls = 300;
  ConcurrentForwards forwards(shared_block, kThreads, kCalls);
  forwards.release();
  std::vector<std::shared_ptr<bool>> destroyed;
  for (int i = 0; i < 40; ++i) {
    Leftovers left;
    hooked_block_that_dies(left);
    destroyed.push_back(left.state_destroyed);
    if (i % 3 == 0) purge_expired();
    std::this_thread::yield();
  }
  const int bad = forwards.join();
  purge_expired();
  CHECK(bad == 0);
  CHECK(pre.load() == kThreads * kCalls);
  CHECK(std::all_of(destroyed.begin(), destroyed.end(), [](const auto& d) { return *d; }));
  CHECK(registry_stats().entries == 1);
}

TEST_CASE("a slot reference stays valid while other owners add slots in the same call") {
  rt::TinyBlock block(4);
  int seen = 0;
  register_forward_pre_hook(*block, [&](ForwardCall& c) {
    PoisonFreedMemory poison;  // a reference into moved storage must not read the old bytes by luck
    std::shared_ptr<void>& mine = c.slot("me");
    mine = std::make_shared<int>(42);
    for (int i = 0; i < 20; ++i) c.slot("owner" + std::to_string(i)) = std::make_shared<int>(i);
    seen = *std::static_pointer_cast<int>(mine);  // the storage behind the slots grew meanwhile
    mine = std::make_shared<int>(43);
  });
  register_forward_hook(*block, [&](ForwardCall& c) {
    auto value = std::static_pointer_cast<int>(c.slot("me"));
    CHECK((value && *value == 43));
  });
  block(torch::randn({1, 4}));
  CHECK(seen == 42);
}

TEST_CASE("slots: short and long owner names, each its own slot, found again by the post-hook") {
  rt::TinyBlock block(4);
  // Short names are kept in the call itself, long ones (and any beyond the first two) elsewhere.
  const std::vector<std::string> owners = {"a", std::string(32, 'b'), std::string(33, 'c'), "d",
                                           std::string(40, 'a')};
  register_forward_pre_hook(*block, [&](ForwardCall& c) {
    for (std::size_t i = 0; i < owners.size(); ++i)
      c.slot(owners[i]) = std::make_shared<std::size_t>(i);
  });
  std::vector<std::size_t> seen;
  register_forward_hook(*block, [&](ForwardCall& c) {
    for (const auto& owner : owners)
      seen.push_back(*std::static_pointer_cast<std::size_t>(c.slot(owner)));
    CHECK_FALSE(c.slot("never set"));
  });
  block(torch::randn({1, 4}));
  CHECK(seen == std::vector<std::size_t>{0, 1, 2, 3, 4});
}

// A statement before the annotation: the hooks' body call runs it a second time.
struct LateAnnotationImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    x = x * 2;
    RECOMPOSE_FORWARD(x);
    return x + 1;
  }
};
TORCH_MODULE(LateAnnotation);

TEST_CASE("a forward whose annotation is not its first statement is an error under hooks") {
  LateAnnotation m;
  const auto x = torch::ones({2});
  CHECK(torch::equal(m(x), torch::full({2}, 3.0)));  // no hooks: the annotation does nothing
  auto pre = register_forward_pre_hook(*m, [](ForwardCall&) {});
  try {
    m(x);
    FAIL("expected a CheckpointError");
  } catch (const recompose::CheckpointError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("does not begin with RECOMPOSE_FORWARD") != std::string::npos);
    CHECK(msg.find("LateAnnotation") != std::string::npos);
  }
  pre.remove();
  CHECK(torch::equal(m(x), torch::full({2}, 3.0)));
}
