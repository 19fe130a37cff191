// The RNG stash copies the CPU generator's engine and normal-sample caches directly
// (lib/engine/cpu_generator_adapter.cpp): restoring that copy must replay exactly the draws that
// restoring get_state()'s tensor replays.
#include "engine/cpu_generator_adapter.h"

#include <ATen/CPUGeneratorImpl.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

namespace {

using recompose::detail::read_cpu_generator;
using recompose::detail::write_cpu_generator;

// Draws that use every part of the state: uniform and normal samples of both precisions, and
// scalar normal draws, which consume (or leave) the cached second Box-Muller sample.
std::vector<torch::Tensor> draws(const at::Generator& gen) {
  std::vector<torch::Tensor> out;
  out.push_back(at::rand({7}, gen));
  out.push_back(at::randn({3}, gen));  // under 16 elements: one Box-Muller sample at a time
  out.push_back(at::randn({3}, gen, torch::kDouble));
  out.push_back(at::randn({40}, gen));  // the vectorised path
  out.push_back(torch::empty({1}).normal_(0, 1, gen));
  out.push_back(torch::empty({1}, torch::kDouble).normal_(0, 1, gen));
  out.push_back(at::randint(1000, {5}, gen));
  return out;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("cpu generator: restoring the engine copy replays the draws get_state/set_state replay") {
  at::Generator gen = at::detail::createCPUGenerator(1234);
  // Leave a cached normal sample of each precision in the generator.
  auto* impl = gen.get<at::CPUGeneratorImpl>();
  std::ignore = draws(gen);
  impl->set_next_float_normal_sample(0.25f);
  impl->set_next_double_normal_sample(-1.5);

  const auto copy = read_cpu_generator(gen);
  const at::Tensor serialised = gen.get_state();
  const auto first = draws(gen);

  write_cpu_generator(gen, copy);
  CHECK(impl->next_float_normal_sample() == std::optional<float>(0.25f));
  CHECK(impl->next_double_normal_sample() == std::optional<double>(-1.5));
  const auto via_copy = draws(gen);
  gen.set_state(serialised);
  const auto via_state = draws(gen);
  CHECK(same(first, via_copy));
  CHECK(same(first, via_state));

  SUBCASE("the whole state round-trips: get_state after a restore equals get_state before") {
    write_cpu_generator(gen, copy);
    CHECK(torch::equal(gen.get_state(), serialised));
  }
  SUBCASE("empty caches are restored empty") {
    impl->set_next_float_normal_sample(std::nullopt);
    impl->set_next_double_normal_sample(std::nullopt);
    const auto empty = read_cpu_generator(gen);
    const auto expected = draws(gen);
    impl->set_next_float_normal_sample(3.0f);
    write_cpu_generator(gen, empty);
    CHECK_FALSE(impl->next_float_normal_sample().has_value());
    CHECK_FALSE(impl->next_double_normal_sample().has_value());
    CHECK(same(draws(gen), expected));
  }
  SUBCASE("a copy moves to another generator") {
    at::Generator other = at::detail::createCPUGenerator(99);
    write_cpu_generator(other, copy);
    CHECK(torch::equal(other.get_state(), serialised));
    CHECK(same(draws(other), first));
  }
}

TEST_CASE("cpu generator: states compare equal exactly when they replay the same draws") {
  using recompose::detail::same_cpu_generator_state;
  at::Generator gen = at::detail::createCPUGenerator(5);
  auto* impl = gen.get<at::CPUGeneratorImpl>();
  const auto a = read_cpu_generator(gen);
  CHECK(same_cpu_generator_state(a, read_cpu_generator(gen)));
  SUBCASE("a draw moves the state") {
    std::ignore = at::rand({3}, gen);
    CHECK_FALSE(same_cpu_generator_state(a, read_cpu_generator(gen)));
  }
  SUBCASE("a cached normal sample is part of the state") {
    impl->set_next_double_normal_sample(0.5);
    CHECK_FALSE(same_cpu_generator_state(a, read_cpu_generator(gen)));
    impl->set_next_double_normal_sample(std::nullopt);
    impl->set_next_float_normal_sample(0.5f);
    CHECK_FALSE(same_cpu_generator_state(a, read_cpu_generator(gen)));
  }
  SUBCASE("another seed is another state") {
    CHECK_FALSE(same_cpu_generator_state(a, read_cpu_generator(at::detail::createCPUGenerator(6))));
    CHECK(same_cpu_generator_state(a, read_cpu_generator(at::detail::createCPUGenerator(5))));
  }
}

TEST_CASE("cpu generator: a generator of another device is refused") {
  at::Generator gen = at::detail::createCPUGenerator(1);
  CHECK_NOTHROW(read_cpu_generator(gen));
  CHECK_THROWS(read_cpu_generator(at::Generator()));
}
