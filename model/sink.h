// OpSink: how the model reports its work to whoever runs it.
//
// The math is plain host code; a sink turns each kernel call into virtual
// time (a device charges its cost model, see model/engine/device_sink.h) and
// each saved activation into arena bytes. With no sink (tests, gradient
// checks) the model only computes. One code path for math and for time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/buffer.h"
#include "model/fusions.h"
#include "runtime/cost_model.h"

namespace shardlab::model {

// The kernels an unfused chain of ops launches, in order (model/fusions.h).
template <std::size_t K>
using OpChain = std::array<OpCost, K>;

class OpSink {
 public:
  virtual ~OpSink() = default;
  // A kernel ran: `name` is a string literal ("attn.c_attn.fwd"), `cost` from its *_cost function.
  virtual void op(const char* name, const OpCost& cost) = 0;
  // Activations saved for backward (elements), and released after it.
  virtual void saved(int64_t elements) {}
  virtual void freed(int64_t elements) {}
  // Gradients of the flat parameter range [offset, offset + count) are final
  // for this backward (data parallelism starts reducing them).
  virtual void grads_ready(int64_t offset, int64_t count) {}
  // A backward that is not the step's last (of its model chunk) added its
  // whole contribution to [offset, offset + count): data parallelism that
  // reduces every micro-batch (ZeRO-2) may reduce this micro-batch's part now.
  virtual void grads_partial(int64_t offset, int64_t count) {}
  // A backward (of any micro-batch) produced the gradients of `count`
  // parameters, to be added into the main gradients (a runner without
  // gradient accumulation fusion charges that addition here). `key` names
  // the parameters (the same each micro-batch of a step).
  virtual void grads_accumulated(int64_t key, int64_t count) {}
  // Averages `data` over the data-parallel replicas, in place, if there are
  // any; returns false when this run has none. MoE layers use it so the
  // load-balancing fractions f_i cover the global batch, as in the unsharded model.
  virtual bool average_over_replicas(float* data, int64_t n) { return false; }
  // Modeled bytes per element for the *_cost functions.
  virtual int element_size() const { return 4; }
  // The run models Precision::kFp8 (Transformer Engine's linears in FP8).
  virtual bool fp8() const { return false; }
  // Which element-wise chains the run charges fused (model/fusions.h).
  virtual KernelFusions fusions() const { return {}; }
  // Tensor-parallel communication overlap (parallel/tensor/mappings.h): the
  // next GEMM op runs as ready.size() chunks of its rows (GemmShape::m), chunk
  // k starting no earlier than ready[k], as Transformer Engine's ring-exchange
  // GEMM computes each rank's rows as they arrive. A sink without a clock ignores it.
  virtual void split_next_gemm(std::vector<Time> ready) {}
  // [start, end) of the last GEMM op charged, for a collective pipelined
  // behind it; {0, 0} without a clock.
  virtual std::pair<Time, Time> last_gemm() const { return {0, 0}; }
};

// "attn.c_attn.fwd" -> "attn.c_attn.fwd.recompute": the same kernel run again
// in backward (activation recomputation). The returned string lives for the
// whole process (traces keep kernel names by pointer). Thread-safe.
const char* recompute_name(const char* name);

// What the layers receive: the sink (or none) and the modeled element size.
struct Exec {
  OpSink* sink = nullptr;
  int elem = 4;  // modeled bytes per element, for the *_cost functions
  // The kernels re-run a forward in backward (activation recomputation):
  // they charge their cost under recompute_name().
  bool recompute = false;
  // Shape-only execution (model/buffer.h's PhantomScope): the layers skip
  // every computation on activations, parameters and gradients and charge
  // exactly the same ops, collectives and bytes as a real run.
  bool phantom = false;
  // A Precision::kFp8 run (the sink's fp8()), and whether this call is one of
  // Transformer Engine's FP8 linears (te_linear(): the blocks' projections
  // and MLPs, experts included). The router, the LM head, the embedding and
  // the attention core stay BF16, as Megatron-LM with TE runs them.
  bool fp8_run = false;
  bool fp8_linear = false;
  KernelFusions fusions;  // the sink's (what is charged fused; the math is the same)
  // The local experts' kernels as grouped kernels (Megatron-core's
  // --moe-grouped-gemm, TEGroupedMLP; vLLM's fused MoE): each GEMM and
  // activation of the experts is one kernel over every expert's rows,
  // launched once. The first expert with rows charges its kernels as they
  // are (kFirst), the later ones without the launch (kMember: each expert's
  // GEMM keeps its own tiles and weight reads), an expert without rows
  // charges nothing (kEmpty: the grouped kernel skips it, its weights are
  // not read). Only the charge differs; the math and every other sink call
  // are the same.
  enum class Grouped : uint8_t { kNone, kFirst, kMember, kEmpty };
  Grouped grouped = Grouped::kNone;
  // FP8 inference (vLLM's W8A8 FP8: weights stored in FP8, each linear's
  // input quantized per token before its GEMM): an FP8 linear's cast is one
  // quantization of its input (fp8_quant_cost), not Transformer Engine's
  // cast-and-transpose for a backward that never runs.
  bool fp8_inference = false;

  static Exec with(OpSink* s) {
    return {s, s ? s->element_size() : 4, false, phantom_allocation(), s && s->fp8(), false,
            s ? s->fusions() : KernelFusions{}};
  }
  Exec te_linear() const {
    Exec e = *this;
    e.fp8_linear = fp8_run;
    return e;
  }
  bool math() const { return !phantom; }  // alone: only what is no kernel (below)
  void op(const char* name, const OpCost& cost) const {
    if (!sink || grouped == Grouped::kEmpty) return;
    if (grouped != Grouped::kMember) return sink->op(recompute ? recompute_name(name) : name, cost);
    OpCost member = cost;
    member.launch = false;
    sink->op(recompute ? recompute_name(name) : name, member);
  }
  // The Exec of one expert of a group whose experts before it charged
  // `launched` (set true once an expert with rows ran).
  Exec expert_of_group(int64_t rows, bool& launched) const {
    Exec e = *this;
    e.grouped = rows == 0 ? Grouped::kEmpty : launched ? Grouped::kMember : Grouped::kFirst;
    launched = launched || rows > 0;
    return e;
  }
  // The one way to run a kernel: `math` unless phantom, then `cost` charged as `name` (`math`
  // is a lambda, inlined: no allocation). Each kernel has an Exec overload on it (kernels.h);
  // hand loops call run(). math() alone guards only what is no kernel, each site saying which:
  // a handover (a copy or fill for the next kernel), a collective's data, a split kernel (loops
  // with collectives between, charged once by op() after the last) or a phantom stand-in.
  template <typename Math>
  void run(const char* name, const OpCost& cost, Math&& math) const {
    if (!phantom) math();
    op(name, cost);
  }
  // A kernel run unfused (fusions): the same math, charged as each kernel
  // of the chain its ops launch, all under `name`.
  template <std::size_t K, typename Math>
  void run_chain(const char* name, const OpChain<K>& chain, Math&& math) const {
    if (!phantom) math();
    for (const OpCost& c : chain) op(name, c);
  }
  // The math of a kernel that a fused kernel charges (it names the fused op):
  // runs unless phantom, charges nothing.
  Exec part_of_fused() const {
    Exec e = *this;
    e.sink = nullptr;
    return e;
  }
};

}  // namespace shardlab::model
