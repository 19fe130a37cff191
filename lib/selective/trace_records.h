// The records a ForwardTrace (forward_trace.h) is made of: the storages the forward used, the ops
// it ran with their arguments and the tensors those used, and the tensors autograd saved. Plain
// data: the trace appends them as the forward runs, and the functions that read a forward (its
// summary, forward_summary.h; its replay plan, replay_plan.h; the replay, replay_executor.h) read
// them through ForwardTrace's const accessors.
#pragma once

#include "batch_norm_replay.h"
#include "draw_mask.h"
#include "dropout_draw.h"
#include "generator_effect.h"
#include "kept_output.h"
#include "op_traits.h"
#include "parameter_casts.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace recompose::detail {

// Where a tensor lies in its storage.
struct TensorGeometry {
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset = 0;
  at::ScalarType dtype = at::kFloat;

  static TensorGeometry of(const at::Tensor& t);
  // Becomes t's geometry, in place (a geometry moved is copied element by element).
  void set(const at::Tensor& t);
  // Same sizes, strides and dtype (the storage offset apart).
  bool same_shape(const at::Tensor& t) const;
  bool operator==(const TensorGeometry& o) const {
    return offset == o.offset && dtype == o.dtype && sizes == o.sizes && strides == o.strides;
  }
};

// One use of a tensor in the forward.
struct TensorUse {
  static constexpr uint32_t kUndefined = UINT32_MAX;  // an undefined (optional) tensor
  static constexpr uint32_t kUnsupported =
      UINT32_MAX - 1;  // no strided storage, conjugate/negative bit
  uint32_t storage = kUndefined;
  uint32_t version = 0;  // recorded writes into the storage before this use
  TensorGeometry geometry;
};

// A storage the forward used: made by a recorded op, a region input, or from outside the region.
struct TraceStorage {
  enum class Source : uint8_t { Op, Input, Outside };
  Source source = Source::Outside;
  const c10::StorageImpl* key = nullptr;
  c10::weak_intrusive_ptr<c10::StorageImpl> weak{c10::intrusive_ptr<c10::StorageImpl>()};
  uint32_t op = 0;      // Op: the node that created it
  uint32_t output = 0;  // Op: which of its (flattened) outputs
  uint32_t input = 0;   // Input: which region input
  at::Tensor outside;   // Outside: an alias of the tensor (shares its version counter)
  uint32_t outside_version = 0;
  TensorGeometry base;  // the creating output, the input, or the outside tensor
  std::vector<uint32_t>
      writers;         // node of each recorded write: version v is made by writers[v - 1]
  bool saved = false;  // autograd saved a tensor of it (counted in saved_bytes_from_ops)
  // Since its value was last kept: an op a replay may run read it, or autograd saved it.
  bool read = false;
  // Op storages of a kept op: the version its cache entry holds (writes carried into it).
  uint32_t kept_version = 0;
};

// One argument of a recorded op.
struct TraceArg {
  // StandIn: a tensor the replay makes anew (a training batch norm's running statistic).
  enum class Kind : uint8_t { Constant, Tensor, TensorList, OptionalTensorList, StandIn };
  Kind kind = Kind::Constant;
  uint32_t first = 0;  // its node's uses [first, first + count)
  uint32_t count = 0;
  c10::IValue constant;
  std::unique_ptr<RunningStatStandIn> stand_in;  // StandIn
};

// One recorded op (a node): an op that wrote into an argument or returned new tensors.
struct TraceNode {
  TraceNode(const c10::OperatorHandle& o, const OpTraits& t) : op(o), traits(&t) {}
  c10::OperatorHandle op;
  const OpTraits* traits;  // never freed (OpTraits::of)
  // Its arguments and the tensors they use, in the trace's arrays (ForwardTrace::args_of,
  // uses_of): one array for every node, not two allocations per op.
  uint32_t first_arg = 0;
  uint32_t arg_count = 0;
  uint32_t first_use = 0;
  uint32_t use_count = 0;
  c10::SmallVector<uint32_t, 1> writes;  // storages written (one version each)
  c10::SmallVector<std::pair<uint32_t, uint32_t>, 2> created;  // (flattened output, storage)
  std::unique_ptr<KeptOutput> kept;                            // the forward kept its outputs
  uint32_t carrier = OpCalls::kNoNode;  // a write a kept output carries: that output's node
  std::unique_ptr<GeneratorEffect> rng;
  std::unique_ptr<DrawMask> draw;
  std::unique_ptr<DropoutDraw> dropout;  // native_dropout's draw (dropout_draw.h)
  std::unique_ptr<KeptCast> cast;        // an autocast parameter cast kept (parameter_casts.h)
  // A cheaper op the replay runs instead, with the same arguments (replay_substitute.h).
  std::optional<c10::OperatorHandle> replay_as;
  bool unsupported = false;    // an argument the replay cannot rebuild (tensors in a tuple...)
  bool hidden_writes = false;  // writes into arguments its schema does not declare
  bool complete = false;       // ForwardTrace::end ran
  bool makes_values = false;   // returns a value of its own (Note in ForwardTrace::end)
  // For the summary only: the storages of its outputs, each once, with their bytes (created
  // ones and aliases of known ones).
  c10::SmallVector<uint32_t, 1> aliased;  // known storages its outputs alias
  int64_t output_bytes = 0;
  // Of a draw kept as bits (`draw`): the host seconds the op took, which a replay does not spend.
  double draw_seconds = 0;
};

// A call of a view op, recorded only for the summary.
struct TraceViewCall {
  uint32_t position;  // nodes recorded before it
  c10::OperatorHandle op;
  int64_t call_index;
  int64_t output_bytes;
};

// A tensor autograd saved in the region's forward.
struct TraceSaved {
  std::size_t index;  // its saved tensor's index in the region
  uint32_t position;  // recorded ops before it was saved
  TensorUse use;
};

}  // namespace recompose::detail
