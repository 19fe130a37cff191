// Plan and profile files written by earlier recompose versions still load (recompose/memory_plan.h,
// recompose/memory_profile.h): tests/data/*-v1.json were written by d47b689's writer (before the
// planner's JSON went through nlohmann/json), docs/benchmarks/ holds files written on the H100.
#include <recompose/recompose.h>

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

using recompose::MemoryProfile;
using recompose::ModuleChoice;
using recompose::Plan;

namespace {

const std::filesystem::path kSource = RECOMPOSE_SOURCE_DIR;

}  // namespace

TEST_SUITE("planner") {
  TEST_CASE(
      "planner: a plan file of format version 1 loads, with every field, and survives a round "
      "trip") {
    const Plan plan = Plan::load(kSource / "tests/data/plan-v1.json");
    CHECK(plan.budget_bytes == 158464);
    CHECK(plan.bytes == 156672);
    CHECK(plan.step_seconds == 1.0110732759999999);  // doubles read back exactly
    CHECK(plan.none_bytes == 316928);
    CHECK(plan.none_step_seconds == 0.91393486599999996);
    CHECK(plan.solve_seconds == 6.4508e-05);
    REQUIRE(plan.modules.size() == 3);
    CHECK(plan.modules[0].name == "blocks.0");
    CHECK(plan.modules[0].type == "FBlockImpl");
    CHECK(plan.modules[0].choice == ModuleChoice::Selective);
    CHECK(plan.modules[0].bytes == 74240);
    REQUIRE(plan.modules[0].save.size() == 2);
    CHECK(plan.modules[0].save[1].op == "aten::bmm.default");
    CHECK(plan.modules[0].save[1].call_index == 1);
    REQUIRE(plan.modules[0].swap.size() == 1);
    CHECK(plan.modules[0].swap[0].op == "aten::gelu.default");
    CHECK(plan.modules[1].choice == ModuleChoice::Offload);
    CHECK(plan.modules[2].choice == ModuleChoice::FullSwapInputs);
    CHECK(Plan::from_json(plan.to_json()) == plan);
  }

  TEST_CASE(
      "planner: a profile file of format version 1 loads, with every field, and survives a round "
      "trip") {
    const MemoryProfile p = MemoryProfile::load(kSource / "tests/data/profile-v1.json");
    CHECK(p.device == "cpu");
    CHECK(p.bytes_held == 316928);
    CHECK(p.other_bytes == 8192);
    CHECK(p.step_seconds == 0.91393486599999996);
    CHECK(p.copy_bandwidth == 0);
    REQUIRE(p.modules.size() == 3);
    CHECK(p.modules[1].name == "blocks.1 \"quoted\"\ttab\\");  // escapes
    CHECK(p.modules[0].calls == 1);
    CHECK(p.modules[0].input_bytes == 8192);
    CHECK(p.modules[0].saved_bytes == 102912);
    CHECK(p.modules[0].replay_seconds == 0.00041409200000000002);
    REQUIRE(p.modules[0].ops.size() == 16);
    const auto& op = p.modules[0].ops[0];
    CHECK(op.op == "aten::native_layer_norm.default");
    CHECK(op.output_bytes == 8704);
    CHECK(op.seconds == 0.016134247000000001);
    CHECK(!op.random);
    bool mutated = false, random = false;
    for (const auto& o : p.modules[0].ops)
      mutated = mutated || o.mutated, random = random || o.random;
    CHECK(mutated);
    CHECK(random);
    // Saved before issue 25: no backward times (the 2x rule), recomputations taken as reruns.
    CHECK(!p.backward_measured());
    CHECK(!p.modules[0].replayed);
    CHECK(!recompose::solve_plan(p, recompose::Budget::fraction(0.6)).backward_measured);
    CHECK(MemoryProfile::from_json(p.to_json()).to_json() == p.to_json());
  }

  TEST_CASE("planner: the H100 profile and plans under docs/benchmarks still load and solve") {
    const MemoryProfile p = MemoryProfile::load(
        kSource / "docs/benchmarks/2026-11-23-h100-run11-gpt12x1024-bf16-profile.json");
    CHECK(p.device.starts_with("cuda"));
    CHECK(p.modules.size() == 12);
    CHECK(p.copy_bandwidth > 0);
    const Plan half = recompose::solve_plan(p, recompose::Budget::fraction(0.5));
    CHECK(half.bytes <= half.budget_bytes);
    int plans = 0;
    for (const auto& entry : std::filesystem::directory_iterator(
             kSource / "docs/benchmarks/2026-11-22-h100-run5-plans")) {
      CAPTURE(entry.path().string());
      const Plan plan = Plan::load(entry.path());
      CHECK(!plan.modules.empty());
      CHECK(plan.bytes <= plan.budget_bytes);
      CHECK(Plan::from_json(plan.to_json()) == plan);
      ++plans;
    }
    CHECK(plans == 5);
  }

  TEST_CASE("planner: a damaged plan file is a clear error naming what is wrong") {
    const std::string good = Plan::load(kSource / "tests/data/plan-v1.json").to_json();
    auto damaged = [&](const std::string& from, const std::string& to) {
      std::string text = good;
      const auto at = text.find(from);
      REQUIRE(at != std::string::npos);
      return text.replace(at, from.size(), to);
    };
    CHECK_THROWS_WITH_AS(Plan::from_json(damaged("\"bytes\": 156672", "\"bytes\": 1.5")),
                         doctest::Contains("bytes must be an integer"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Plan::from_json(damaged("\"bytes\": 156672", "\"bytez\": 156672")),
                         doctest::Contains("missing member 'bytes'"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Plan::from_json(damaged("\"version\": 2", "\"version\": 3")),
                         doctest::Contains("plan format version 3"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(
        Plan::from_json(damaged("\"choice\": \"offload\"", "\"choice\": \"later\"")),
        doctest::Contains(
            "unknown choice 'later' (one of: none, full, selective, offload, full-swap-inputs)"),
        std::invalid_argument);
    CHECK_THROWS_AS(Plan::from_json(good.substr(0, good.size() / 2)), std::invalid_argument);
    CHECK_THROWS_AS(MemoryProfile::from_json(good), std::invalid_argument);  // a plan is no profile
  }

  TEST_CASE(
      "planner: a profile of format version 2 has every member; version 1 may lack the later "
      "ones") {
    const std::string v2 =
        MemoryProfile::load(kSource / "tests/data/profile-v1.json").to_json();  // written as 2
    REQUIRE(v2.find("\"version\": 2") != std::string::npos);
    auto without = [&](std::string text, const std::string& member) {
      const auto at = text.find("\"" + member + "\": ");
      REQUIRE(at != std::string::npos);
      return text.replace(at, member.size() + 2, "\"unknown_" + member + "\"");
    };
    for (const char* member :
         {"resident_bytes", "draw_bytes", "backward_seconds", "carries_write", "reads"}) {
      CAPTURE(member);
      const std::string damaged = without(v2, member);
      const std::string missing = "missing member '" + std::string(member) + "'";
      CHECK_THROWS_WITH_AS(MemoryProfile::from_json(damaged), doctest::Contains(missing.c_str()),
                           std::invalid_argument);
      // The same file as version 1: the member reads as absent.
      std::string old = damaged;
      old.replace(old.find("\"version\": 2"), 12, "\"version\": 1");
      CHECK_NOTHROW(MemoryProfile::from_json(old));
    }
    std::string future = v2;
    future.replace(future.find("\"version\": 2"), 12, "\"version\": 3");
    CHECK_THROWS_WITH_AS(MemoryProfile::from_json(future),
                         doctest::Contains("profile format version 3"), std::invalid_argument);
  }

}  // TEST_SUITE
