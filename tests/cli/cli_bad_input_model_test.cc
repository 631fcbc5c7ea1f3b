// Bad model-shape and architecture flags (cli_bad_input_test.cc's rule):
// each row ends in one line on stderr naming the problem and exit code 2,
// before any device thread starts.
#include <gtest/gtest.h>

#include "tests/cli/bad_input_table.h"

namespace shardlab {
namespace {

using testing::run_table;

// Zero, negative, NaN, infinity and absurd sizes: refused, never replaced by
// the preset's value or a default.
TEST(CliBadInput, ModelShapeFlags) {
  run_table({
      {"train --model nano --steps 1 --layers 0", "--layers: 0 is out of range: must be between 1 and 65536"},
      {"train --model nano --steps 1 --layers -1", "--layers: -1 is out of range"},
      {"train --model nano --steps 1 --layers 70000", "--layers: 70000 is out of range"},
      {"train --model nano --steps 1 --layers abc", "--layers: \"abc\" is not a number"},
      {"train --model nano --steps 1 --heads 0", "--heads: 0 is out of range"},
      {"train --model nano --steps 1 --heads -4", "--heads: -4 is out of range"},
      {"train --model nano --steps 1 --heads 3000000000", "--heads: 3000000000 is out of range"},
      {"train --model nano --steps 1 --heads 3", "--heads 3 must divide --embd 64"},
      {"train --model nano --steps 1 --embd 0", "--embd: 0 is out of range: must be between 1 and 1048576"},
      {"train --model nano --steps 1 --embd -128", "--embd: -128 is out of range"},
      {"train --model nano --steps 1 --embd 2000000000 --heads 1", "--embd: 2000000000 is out of range"},
      {"train --model nano --steps 1 --embd nan", "--embd: nan is not a finite number"},
      {"train --model nano --steps 1 --embd 1e3", "--embd"},
      {"train --model nano --steps 1 --vocab 0", "--vocab: 0 is out of range: must be between 2 and"},
      {"train --model nano --steps 1 --vocab 1", "--vocab: 1 is out of range"},
      {"train --model nano --steps 1 --vocab 100000000", "--vocab: 100000000 is out of range"},
      {"train --model nano --steps 1 --seq 0", "--seq: 0 is out of range"},
      {"train --model nano --steps 1 --seq -64", "--seq: -64 is out of range"},
      {"train --model nano --steps 1 --seq 2000000", "--seq: 2000000 is out of range"},
      {"train --model nano --steps 1 --batch 0", "--batch: 0 is out of range: must be between 1 and 16777216"},
      {"train --model nano --steps 1 --batch -8", "--batch: -8 is out of range"},
      {"train --model nano --steps 1 --batch 100000000", "--batch: 100000000 is out of range"},
      {"train --model nano --steps 1 --batch 2.5", "--batch"},
      {"train --model nano --steps 1 --ffn 0", "--ffn: 0 is out of range"},
      {"train --model nano --steps 1 --ffn inf", "--ffn: inf is not a finite number"},
      {"train --model nano --steps 1 --ffn 20000000", "--ffn: 20000000 is out of range"},
      {"train --model nano --steps 1 --make-vocab-size-divisible-by -1", "--make-vocab-size-divisible-by: -1"},
      {"train --model nano --steps 1 --make-vocab-size-divisible-by 100000",
       "--make-vocab-size-divisible-by: 100000 is out of range"},
      {"train --model nano --steps 1 --vocab 2", "--vocab 2 does not suit synthetic:markov"},
      {"train --model nano --steps 1 --experts -1", "--experts: -1 is out of range"},
      {"train --model nano --steps 1 --experts 100000", "--experts: 100000 is out of range"},
      {"train --model nano --steps 1 --experts 4 --moe-top-k 0", "--moe-top-k: 0 is out of range"},
      {"train --model nano --steps 1 --top-k -3", "--moe-top-k: -3 is out of range"},  // train's alias
      {"train --model nano --steps 1 --experts 4 --top-k 5", "--moe-top-k 5 must be between 1 and --experts 4"},
      {"train --model nano --steps 1 --experts 4 --moe-ffn -1", "--moe-ffn: -1 is out of range"},
      {"train --model nano --steps 1 --shared-experts 1", "--shared-experts, --moe-ffn and --moe-first-dense need "
                                                          "routed experts (--experts above 0)"},
      {"train --model nano --steps 1 --experts 4 --router relu", "--moe-router must be softmax or sigmoid (got \"relu\")"},
      {"train --model nano --steps 1 --experts 4 --moe-first-dense 3", "--moe-first-dense 3 must be between 0 and "
                                                                       "--layers 2"},
      {"train --model nano --steps 1 --experts 4 --moe-ffn 31 --tp 2",
       "--tp 2: must divide the expert width --moe-ffn = 31"},
      {"train --model nano --steps 1 --moe-every 0", "--moe-every: 0 is out of range"},
      {"train --model nano --steps 1 --experts 8 --moe-groups 3", "--moe-groups 3 must divide --experts 8"},
      {"train --model nano --steps 1 --experts 8 --moe-groups 4 --moe-group-top-k 5",
       "--moe-group-top-k 5 must be between 1 and --moe-groups 4"},
      {"train --model nano --steps 1 --experts 8 --top-k 3 --moe-groups 4 --moe-group-top-k 2",
       "--moe-group-top-k 2 must divide --moe-top-k 3"},
      {"train --model nano --steps 1 --experts 8 --top-k 4 --moe-groups 4 --moe-group-top-k 1",
       "--moe-top-k 4 exceeds the experts of the kept groups: --moe-group-top-k 1 x 2 per group"},
      {"train --model nano --steps 1 --experts 8 --moe-dispatcher deepep",
       "--moe-dispatcher deepep moves tokens between expert-parallel ranks: it needs an MoE model and --ep > 1"},
      {"train --model nano --steps 1 --experts 8 --moe-dispatcher hybrid",
       "--moe-dispatcher must be alltoall or deepep (got 'hybrid')"},
      {"train --model tiny-llama --heads 65536 --embd 65536 --head-dim 1048576 --steps 1",
       "--heads 65536 x --head-dim 1048576 = 68719476736: the attention width must be at most 16777216"},
      {"train --model tiny-llama --head-dim 47 --steps 1",
       "--head-dim 47 is odd: rotary embeddings rotate pairs of features"},
      {"train --model tiny --qk-norm --steps 1",
       "--qk-norm (RMSNorms over q's and k's heads) needs --family llama"},
      {"train --model tiny --head-dim 64 --steps 1",
       "--head-dim 64 apart from --embd / --heads needs --family llama (the gpt family's fused c_attn is 3 x "
       "n_embd wide)"},
      {"train --model tiny --steps 1 --recompute selective --recompute-num-layers 2",
       "--recompute-method uniform with --recompute-num-layers 2 choose the blocks full recomputation re-runs: they "
       "need --recompute full (got selective)"},
      {"train --model tiny --steps 1 --recompute full --recompute-method block",
       "--recompute-method block re-runs the first --recompute-num-layers blocks of each stage: give "
       "--recompute-num-layers"},
      {"train --model tiny --steps 1 --recompute full --recompute-method blocks --recompute-num-layers 1",
       "--recompute-method \"blocks\": expected uniform or block"},
      {"train --model tiny --steps 1 --pp 2 --recompute full --recompute-num-layers 3",
       "--recompute-num-layers 3 must be between 1 and the blocks of a pipeline rank, --layers 4 / --pp 2 = 2"},
      {"train --model tiny --steps 1 --dp 2 --zero 3 --recompute full --recompute-num-layers 2",
       "--recompute-method uniform with --recompute-num-layers 2 re-runs a group's blocks at its last block's "
       "backward, before ZeRO 3 gathers their parameters: not supported with --zero 3"},
      {"train --model tiny --steps 1 --recompute full --recompute-modules mlp",
       "--recompute-modules mlp chooses what selective recomputation re-runs: it needs --recompute selective (got "
       "full)"},
      {"train --model tiny-moe --steps 1 --recompute-modules core_attn,mla_up_proj",
       "--recompute-modules core_attn,mla_up_proj: mla_up_proj re-runs multi-head latent attention's "
       "up-projections, and this model's attention is not MLA (--kv-lora-rank 0)"},
      {"train --model tiny-llama --steps 1 --kv-heads 4 --q-lora-rank 16",
       "--q-lora-rank, --qk-rope-head-dim and --v-head-dim shape multi-head latent attention: they need "
       "--kv-lora-rank above 0"},
      {"train --model tiny-llama --steps 1 --kv-heads 4 --kv-lora-rank 16 --qk-rope-head-dim 5",
       "--qk-rope-head-dim 5 must be a positive even number under MLA (rotary embeddings rotate pairs of features)"},
      {"train --model tiny-llama --steps 1 --kv-lora-rank 16 --qk-rope-head-dim 4",
       "--kv-heads 2 below --heads: MLA gives every head its own keys and values (no GQA)"},
      {"train --model tiny-llama --steps 1 --kv-heads 4 --kv-lora-rank 16 --qk-rope-head-dim 4 --v-head-dim 64",
       "--v-head-dim 64 above the scores' head size 36 (--head-dim + --qk-rope-head-dim) is not modeled"},
      {"train --model tiny --steps 1 --kv-lora-rank 16 --qk-rope-head-dim 4",
       "multi-head latent attention (--kv-lora-rank) needs --family llama"},
      {"generate --model tiny-llama --kv-lora-rank 16 --qk-rope-head-dim 4 --prompt-tokens 1,2",
       "--kv-heads 2 below --heads: MLA gives every head its own keys and values (no GQA)"},
      {"train --model tiny-llama --steps 1 --kv-lora-rank -1", "--kv-lora-rank"},
      {"train --model tiny-moe --steps 1 --recompute-modules mlp,moe,mlp",
       "--recompute-modules \"mlp,moe,mlp\": mlp is listed twice"},
      {"train --model tiny-moe --steps 1 --recompute-modules mlp,",
       "--recompute-modules \"mlp,\": \"\" is not one of core_attn, layernorm, mlp, moe, moe_act, shared_experts, "
       "mla_up_proj (a list separated by , or +)"},
      {"train --model tiny --steps 1 --recompute-modules moe_act,layernorm",
       "--recompute-modules layernorm,moe_act: layernorm,moe_act re-runs part of an MoE layer and this model has "
       "none"},
      {"train --model tiny-moe --steps 1 --moe-first-dense 0 --recompute-modules mlp",
       "--recompute-modules mlp: mlp re-runs a dense block's MLP, and every block of this model is MoE (use moe or "
       "moe_act)"},
      {"train --model tiny-moe --steps 1 --tp 2 --dp 2 --ep 2 --expert-tp 1",
       "--expert-tp 1 with --tp > 1 routes each rank's sequence-parallel rows: it needs --sp (Megatron requires it "
       "with MoE and TP)"},
      {"train --model tiny-moe --steps 1 --tp 2 --sp --dp 2 --ep 2 --expert-tp 3",
       "--expert-tp 3 must be 1 (whole experts) or --tp 2 (experts split like the MLP)"},
      {"train --model tiny-moe --steps 1 --tp 4 --sp --dp 2 --ep 2 --expert-tp 1",
       "--expert-tp 1 draws the expert-parallel group from tp x dp, tp ranks first: --ep 2 must be a multiple of "
       "--tp 4"},
      {"train --model nano --steps 1 --moe-groups 2", "--moe-groups and --moe-group-top-k limit the routing of "
                                                      "routed experts: they need --experts above 0"},
      {"train --model nano --steps 1 --experts 8 --moe-groups 0", "--moe-groups: 0 is out of range"},
      {"train --model nano --steps 1 --experts 4 --aux-coef -5", "--aux-coef: -5 is out of range"},
      {"train --model nano --steps 1 --experts 4 --aux-coef nan", "--aux-coef: nan is not a finite number"},
      {"train --model nano --steps 1 --experts 4 --aux-coef inf", "--aux-coef: inf is not a finite number"},
      {"train --model nano --steps 1 --experts 4 --aux-coef -0.01", "--aux-coef: -0.01 is out of range"},
      {"train --model nano --steps 1 --capacity-factor -1", "--capacity-factor: -1 is out of range"},
      {"train --model nano --steps 1 --capacity-factor nan", "--capacity-factor: nan is not a finite number"},
      {"train --model nosuch --steps 1", "--model: unknown preset 'nosuch'"},
      {"train --model \"\" --steps 1", "--model: unknown preset ''"},
  });
}

}  // namespace
}  // namespace shardlab
