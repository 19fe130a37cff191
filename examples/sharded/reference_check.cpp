#include "reference_check.h"

#include "device.h"
#include "optimizer.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace sharded {

void CheckTally::expect(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAIL", what.c_str());
  std::fflush(stdout);
  ++(ok ? passed_ : failed_);
}

Reference train_reference(const Options& o, const ModelConfig& c) {
  const torch::Device device = rank_device(o);
  Reference ref{make_model(c, o.seed), {}};
  ref.model->to(device);
  auto opt = make_optimizer(o, ref.model->parameters());
  for (int step = 0; step < o.steps; ++step) {
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < o.world; ++r) {
      auto [x, y] = make_batch(o.seed, r, step, o.batch, c);
      xs.push_back(x);
      ys.push_back(y);
    }
    auto loss =
        torch::mse_loss(ref.model->forward(torch::cat(xs).to(device)), torch::cat(ys).to(device));
    loss.backward();
    opt->step();
    opt->zero_grad();
    ref.losses.push_back(loss.item<double>());
  }
  return ref;
}

namespace {

// Fully-qualified names of a saved archive's tensors ("blocks.0.fc1.weight"), in archive order.
void archive_keys(torch::serialize::InputArchive& a, const std::string& prefix,
                  std::vector<std::string>& out) {
  for (const auto& k : a.keys()) {
    torch::Tensor t;
    torch::serialize::InputArchive sub;
    if (a.try_read(k, t))
      out.push_back(prefix + k);
    else if (a.try_read(k, sub))
      archive_keys(sub, prefix + k + ".", out);
  }
}

std::vector<std::string> saved_keys(const MlpModel& m, std::string& bytes) {
  std::stringstream s;
  torch::save(m, s);
  bytes = s.str();
  torch::serialize::InputArchive a;
  std::istringstream in(bytes);
  a.load_from(in);
  std::vector<std::string> keys;
  archive_keys(a, "", keys);
  return keys;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

}  // namespace

void compare_with_reference(const MlpModel& sharded, const std::vector<double>& sharded_losses,
                            const Reference& ref, const ModelConfig& c, double tolerance,
                            CheckTally& tally) {
  const auto mine = sharded->named_parameters(), theirs = ref.model->named_parameters();
  tally.expect(mine.keys() == theirs.keys(),
               "fully-qualified parameter names: " + std::to_string(mine.size()) +
                   " identical to the plain model's");

  double max_diff = 0;
  std::string worst;
  bool shapes = mine.size() == theirs.size();
  for (const auto& item : mine) {
    const torch::Tensor* other = theirs.find(item.key());
    if (!other || !other->sizes().equals(item.value().sizes())) {
      shapes = false;
      continue;
    }
    const double d = (item.value() - *other).abs().max().item<double>();
    if (d > max_diff || worst.empty()) {
      max_diff = d;
      worst = item.key();
    }
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "parameters equal single-process training: max |diff| %.3g (at %s), tolerance %.0e",
                max_diff, worst.c_str(), tolerance);
  tally.expect(shapes && max_diff <= tolerance, buf);

  double max_loss_diff = 0;
  for (std::size_t i = 0; i < sharded_losses.size() && i < ref.losses.size(); ++i) {
    max_loss_diff = std::max(max_loss_diff, std::abs(sharded_losses[i] - ref.losses[i]));
  }
  std::snprintf(buf, sizeof buf,
                "per-step loss equals single-process loss: max |diff| %.3g over %zu steps",
                max_loss_diff, ref.losses.size());
  tally.expect(sharded_losses.size() == ref.losses.size() && max_loss_diff <= tolerance, buf);

  std::string sharded_bytes, plain_bytes;
  const auto sharded_keys = saved_keys(sharded, sharded_bytes);
  const auto plain_keys = saved_keys(ref.model, plain_bytes);
  tally.expect(sharded_keys == plain_keys && !plain_keys.empty(),
               "state_dict (torch::save) keys: " + std::to_string(sharded_keys.size()) +
                   " identical to the plain model's" +
                   (sharded_keys == plain_keys ? ""
                                               : "\n    sharded: " + join(sharded_keys) +
                                                     "\n    plain:   " + join(plain_keys)));

  // The saved sharded model loads into a plain model and gives back exactly its parameters.
  auto loaded = make_model(c, 12345);
  std::istringstream in(sharded_bytes);
  bool same = true;
  try {
    torch::load(loaded, in);
    for (const auto& item : loaded->named_parameters()) {
      const torch::Tensor* src = mine.find(item.key());
      same = same && src && item.value().equal(*src);
    }
  } catch (const std::exception& e) {
    std::printf("    torch::load failed: %.300s\n", e.what());
    same = false;
  }
  tally.expect(same, "state_dict loads into a plain model with identical values");
}

}  // namespace sharded
