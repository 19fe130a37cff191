#include "flat_shard.h"

#include "process_group.h"

#include <ATen/native/Resize.h>

#include <stdexcept>

namespace sharded {
namespace {

void resize_storage(const torch::Tensor& t, std::size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (t.device().is_cpu()) {
    at::native::resize_bytes_cpu(storage, bytes);
    return;
  }
  // A GPU (resize_bytes_cuda is in the CUDA-only headers): a new block from the storage's own
  // allocator, the caching allocator, without copying the old bytes: an all-gather overwrites them.
  // Freeing is stream-ordered there, so kernels still queued on the old block finish first.
  storage->set_data_ptr_noswap(bytes > 0 ? storage->allocator()->allocate(bytes)
                                         : at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(bytes);
}

}  // namespace

FlatShard::FlatShard(c10d::Backend& pg, std::string name, std::vector<torch::Tensor> params,
                     CollectiveCounts& counts)
    : pg_(pg),
      name_(std::move(name)),
      params_(std::move(params)),
      counts_(counts),
      rank_(pg.getRank()),
      world_(pg.getSize()) {
  if (params_.empty())
    throw std::invalid_argument("sharded: unit '" + name_ + "' has no parameters");
  device_ = params_.front().device();
  for (const auto& p : params_) {
    if (p.scalar_type() != torch::kFloat || p.device() != device_ || !p.is_leaf()) {
      throw std::invalid_argument("sharded: unit '" + name_ +
                                  "' has a parameter that is not a float32 leaf on " +
                                  device_.str());
    }
    numel_ += p.numel();
  }
  shard_numel_ = (numel_ + world_ - 1) / world_;
  full_ = torch::zeros({shard_numel_ * world_}, torch::dtype(torch::kFloat).device(device_));
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params_) {
    auto view = full_.narrow(0, offset, p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);  // keeps p's identity, autograd meta and hooks; only its storage changes
    offset += p.numel();
  }
  shard_ = full_.narrow(0, rank_ * shard_numel_, shard_numel_).clone().set_requires_grad(true);
  reshard();
}

bool FlatShard::is_unsharded() const { return full_.storage().nbytes() != 0; }

bool FlatShard::unshard(Phase phase) {
  if (is_unsharded()) {
    ++counts_.unshard_already_done;
    return false;
  }
  resize_storage(full_, full_.numel() * full_.element_size());
  auto input = shard_.detach();  // c10d reads it raw; no autograd
  counts_.seconds += run_collective(device_, [&] { return pg_._allgather_base(full_, input); });
  counts_.bytes += full_.numel() * full_.element_size();
  ++counts_.gathers(phase);
  ++step_gathers_[std::size_t(phase)];
  return true;
}

void FlatShard::reshard() { resize_storage(full_, 0); }

void FlatShard::on_grad_ready() {
  if (++grads_ready_ < int(params_.size())) return;
  grads_ready_ = 0;
  auto flat = torch::zeros({shard_numel_ * world_}, full_.options());  // padding reduces as zeros
  int64_t offset = 0;
  for (auto& p : params_) {
    if (p.grad().defined()) flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape(-1));
    p.mutable_grad().reset();  // the full gradient is not kept: only the shard's
    offset += p.numel();
  }
  auto reduced = torch::empty({shard_numel_}, full_.options());
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::AVG;  // each rank's loss is a mean over its own batch
  counts_.seconds +=
      run_collective(device_, [&] { return pg_._reduce_scatter_base(reduced, flat, options); });
  counts_.bytes += flat.numel() * flat.element_size();
  ++counts_.scatters(Phase::Backward);
  ++step_scatters_;
  if (shard_.grad().defined()) {
    shard_.mutable_grad().add_(reduced);  // accumulate like .grad does over several backwards
  } else {
    shard_.mutable_grad() = reduced;
  }
  reshard();
}

void FlatShard::reset_step_counts() {
  step_gathers_.fill(0);
  step_scatters_ = 0;
}

}  // namespace sharded
