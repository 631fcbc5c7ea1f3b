// Bad input of every kind, as a hostile user would type it: each row must end
// in exactly one line on stderr naming the problem and exit code 2, before
// any device thread starts (so every row takes milliseconds). Rows use
// {dir} for a scratch directory and {file} for a regular file in it.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/bad_input_table.h"
#include "tests/support/cli_util.h"

namespace shardlab {
namespace {

using testing::expect_usage_error;
using testing::run_table;
using testing::scratch;

// One rule for every number a user types (runtime/parse_number.h): flags,
// --pp-layers, fault specs, --corrupt-shard and workload files alike refuse
// a '+', a space, hex, and a fraction where an integer goes.
TEST(CliBadInput, NumbersFollowOneRule) {
  std::ofstream(scratch() + "/plus.csv") << "arrival_s,prompt_len,output_len\n0,+5,3\n";
  run_table({
      {"train --model nano --steps +5", "--steps: \"+5\" is not a number"},
      {"train --model nano --steps ' 5'", "--steps: \" 5\" is not a number"},
      {"train --model nano --steps '5 '", "--steps: \"5 \" is not a number"},
      {"train --model nano --steps 0x10", "--steps: \"0x10\" is not a number"},
      {"train --model nano --steps 2.5", "--steps: 2.5 is not an integer"},
      {"train --model nano --steps 1 --seed ' 7'", "--seed: \" 7\" is not a number"},
      {"train --model nano --steps 1 --lr +0.001", "--lr: \"+0.001\" is not a number"},
      {"train --model nano --steps 1 --dropout ' 0.1'", "--dropout: \" 0.1\" is not a number"},
      {"train --model nano --steps 1 --pp 2 --pp-layers +1,1", "--pp-layers \"+1,1\": expected comma-separated"},
      {"train --model nano --steps 1 --dp 2 --fault dead:+1:step=0", "--fault dead:+1:step=0: device \"+1\""},
      {"verify --model nano --steps 1 --dp 2 --corrupt-shard transformer.wte.weight:+1",
       "--corrupt-shard \"transformer.wte.weight:+1\": expected NAME:RANK"},
      {"serve --model tiny --workload {dir}/plus.csv", "'+5' is not a finite number"},
  });
}

// Serving's clocks are seconds in doubles: an arrival past 1e6 s (a trace's,
// or a slow Poisson stream's) is refused. At 1e300 s every latency came out
// 0 (a step's milliseconds vanished in the sum), exit 0.
TEST(CliBadInput, ArrivalsPastAMillionSecondsAreRefused) {
  std::ofstream(scratch() + "/late.csv") << "arrival_s,prompt_len,output_len\n0,4,4\n1e300,4,4\n";
  run_table({
      {"serve --model tiny --workload {dir}/late.csv",
       "line 3: arrival 1e+300 s is after the last a run may have (1e+06 s)"},
      {"serve --model tiny --arrival poisson:1e-12 --requests 5 --prompt-len 4 --output-len 4",
       "--arrival poisson:1e-12: request 1 would arrive at"},
  });
}

TEST(CliBadInput, OptimizerFlags) {
  run_table({
      {"train --model nano --steps 0", "--steps: 0 is out of range: must be between 1 and 1000000"},
      {"train --model nano --steps -3", "--steps: -3 is out of range"},
      {"train --model nano --steps 1000000000", "--steps: 1000000000 is out of range"},
      {"train --model nano --steps nan", "--steps: nan is not a finite number"},
      {"train --model nano --steps 1 --seed -1", "--seed: -1 is out of range"},
      {"train --model nano --steps 1 --seed abc", "--seed: \"abc\" is not a number"},
      {"train --model nano --steps 1 --lr 0", "--lr: 0 is out of range: must be above 0"},
      {"train --model nano --steps 1 --lr -1", "--lr: -1 is out of range"},
      {"train --model nano --steps 1 --lr nan", "--lr: nan is not a finite number"},
      {"train --model nano --steps 1 --lr inf", "--lr: inf is not a finite number"},
      {"train --model nano --steps 1 --lr 1e300", "--lr: 1e300 is out of range"},
      {"train --model nano --steps 1 --beta1 -0.1", "--beta1: -0.1 is out of range"},
      {"train --model nano --steps 1 --beta1 1", "--beta1 must be in [0, 1)"},
      {"train --model nano --steps 1 --beta1 nan", "--beta1: nan is not a finite number"},
      {"train --model nano --steps 1 --beta2 1.5", "--beta2: 1.5 is out of range"},
      {"train --model nano --steps 1 --beta2 inf", "--beta2: inf is not a finite number"},
      {"train --model nano --steps 1 --eps 0", "--eps: 0 is out of range: must be above 0"},
      {"train --model nano --steps 1 --eps -1e-8", "--eps: -1e-8 is out of range"},
      {"train --model nano --steps 1 --eps inf", "--eps: inf is not a finite number"},
      {"train --model nano --steps 1 --weight-decay -0.1", "--weight-decay: -0.1 is out of range"},
      {"train --model nano --steps 1 --weight-decay inf", "--weight-decay: inf is not a finite number"},
      {"train --model nano --steps 1 --grad-clip -1", "--grad-clip: -1 is out of range"},
      {"train --model nano --steps 1 --grad-clip inf", "--grad-clip: inf is not a finite number"},
      {"train --model nano --steps 1 --grad-clip nan", "--grad-clip: nan is not a finite number"},
      {"train --model nano --steps 1 --warmup-steps -1", "--warmup-steps: -1 is out of range"},
      {"train --model nano --steps 1 --warmup-steps 2147483647", "--warmup-steps: 2147483647 is out of range"},
      {"train --model nano --steps 1 --lr-schedule linear", "--lr-schedule: unknown schedule \"linear\""},
      {"train --model nano --steps 1 --sampling shuffled", "--sampling: unknown value \"shuffled\""},
  });
}

TEST(CliBadInput, ParallelFlags) {
  run_table({
      {"train --model nano --steps 1 --dp 0", "--dp: 0 is out of range: must be between 1 and 1048576"},
      {"train --model nano --steps 1 --dp -2", "--dp: -2 is out of range"},
      {"train --model nano --steps 1 --dp 2000000", "--dp: 2000000 is out of range"},
      {"train --model nano --steps 1 --dp 1048576 --tp 1048576", "= 1099511627776 devices: at most 1048576"},
      {"train --model nano --steps 1 --dp 3", "--batch 4 is not divisible by --dp 3"},
      {"train --model nano --steps 1 --tp 0", "--tp: 0 is out of range"},
      {"train --model nano --steps 1 --tp 3", "--tp 3: must divide --heads 2"},
      {"train --model nano --steps 1 --pp 0", "--pp: 0 is out of range"},
      {"train --model nano --steps 1 --pp 3", "--pp 3 is more than --layers 2"},
      {"train --model nano --steps 1 --ep 0", "--ep: 0 is out of range"},
      {"train --model nano --steps 1 --dp 2 --zero 2 --use-distributed-optimizer",
       "--use-distributed-optimizer is ZeRO 1's memory with reduce-scattered gradients: it needs --zero 1 (got 2"},
      {"train --model nano --steps 1 --dp 2 --zero 3 --use-distributed-optimizer", "it needs --zero 1 (got 3"},
      {"train --model nano --steps 1 --no-overlap=yes",
       "--no-overlap is an on/off flag and takes no value: write --no-overlap alone to turn it on"},
      {"train --model nano --steps 1 --bucket-per-chunk=2", "--bucket-per-chunk is an on/off flag and takes no value"},
      {"train --model nano --steps 1 --micro-batches 0", "--micro-batches: 0 is out of range"},
      {"train --model nano --steps 1 --micro-batches 3", "--batch 4 is not divisible by --micro-batches 3"},
      {"train --model nano --steps 1 --vpp 0", "--vpp: 0 is out of range"},
      {"train --model nano --steps 1 --zero 4", "--zero must be 0, 1, 2 or 3 (got 4)"},
      {"train --model nano --steps 1 --zero -1", "--zero must be 0, 1, 2 or 3 (got -1)"},
      {"train --model nano --steps 1 --zero 2 --no-prefetch", "--no-prefetch needs --zero 3"},
      {"train --model nano --steps 1 --no-reshard-after-forward", "--no-reshard-after-forward needs --zero 3"},
      {"train --model nano --steps 1 --dp 4 --hsdp 2", "--hsdp needs --zero 3"},
      {"train --model nano --steps 1 --dp 2 --overlap-param-gather",
       "--overlap-param-gather defers ZeRO 1 and 2's parameter all-gathers: it needs --zero 1 or 2 (got 0)"},
      {"train --model nano --steps 1 --dp 2 --zero 3 --overlap-param-gather",
       "--overlap-param-gather defers ZeRO 1 and 2's parameter all-gathers: it needs --zero 1 or 2 (got 3)"},
      // A flag takes no value (CLI11 would read any number as "on").
      {"train --model nano --steps 1 --tp 2 --sp=2", "--sp is an on/off flag and takes no value"},
      {"train --model nano --steps 1 --dp 2 --zero 3 --no-prefetch=0", "--no-prefetch is an on/off flag and takes no value"},
      {"train --model nano --steps 1 --dp 2 --grad-reduce-in-bf16",
       "--grad-reduce-in-bf16 needs --precision bf16 or fp8 (in fp32 the gradients are the weights' own)"},
      {"train --model nano --steps 1 --dp 2 --zero 2 --overlap-param-gather --no-overlap",
       "--overlap-param-gather cannot run with --no-overlap"},
      {"train --model nano --steps 1 --dp 4 --zero 3 --hsdp 3", "--hsdp 3 must divide --dp 4"},
      {"train --model nano --steps 1 --dp 4 --zero 3 --hsdp 1", "--hsdp must be at least 2 (got 1)"},
      {"train --model nano --steps 1 --dp 4 --zero 3 --hsdp 2 --experts 4 --ep 2", "--hsdp with --ep > 1 is not supported"},
      {"train --model nano --steps 1 --cp 0", "--cp: 0 is out of range"},
      {"train --model nano --steps 1 --cp -2", "--cp: -2 is out of range"},
      {"train --model nano --steps 1 --cp 3", "--seq 32 is not divisible by 2 x --cp 3"},
      {"verify --model nano --steps 1 --cp 2 --seq 30", "--seq 30 is not divisible by 2 x --cp 2"},
      {"train --model nano --steps 1 --cp 32", "--seq 32 is not divisible by 2 x --cp 32"},
      {"train --model nano --steps 1 --cp 2 --cp-comm tree", "--cp-comm must be ring or allgather (got 'tree')"},
      {"train --model nano --steps 1 --cp-comm allgather", "--cp-comm allgather needs --cp > 1"},
      {"train --model nano --steps 1 --heads 4 --tp 4 --sp --cp 2 --seq 36", "--seq 36 / --cp 2 is not divisible by --tp 4 with --sp"},
      {"train --model nano --steps 1 --cp 2 --experts 4 --capacity-factor 1", "--cp with --capacity-factor is not supported"},
      {"train --model nano --steps 1 --cp 2 --dp 4 --zero 3 --hsdp 2", "--cp with --hsdp is not supported"},
      {"train --model nano --steps 1 --cp 2 --checkpoint-dir {dir}/cp", "--cp with --checkpoint-dir or --resume is not supported"},
      {"train --model nano --steps 1 --cp 1048576 --dp 1048576", "devices: at most 1048576"},
      {"train --model nano --steps 1 --bucket-mb 0", "--bucket-mb: 0 is out of range: must be above 0"},
      {"train --model nano --steps 1 --bucket-mb -25", "--bucket-mb: -25 is out of range"},
      {"train --model nano --steps 1 --bucket-mb inf", "--bucket-mb: inf is not a finite number"},
      {"train --model nano --steps 1 --bucket-mb nan", "--bucket-mb: nan is not a finite number"},
      {"train --model nano --steps 1 --sp", "--sp needs --tp"},
      {"train --model nano --steps 1 --pp 2 --schedule zigzag", "zigzag"},
      {"train --model nano --steps 1 --pp 2 --pp-layers 1,,1", "--pp-layers \"1,,1\""},
      {"train --model nano --steps 1 --pp 2 --pp-layers x", "--pp-layers \"x\""},
      {"train --model nano --steps 1 --pp 2 --pp-layers -1,3", "a stage cannot hold a negative number of blocks"},
      {"train --model nano --steps 1 --pp 3 --pp-layers 1,0,1", "every stage but the first and the last needs at least one block"},
      {"train --model nano --steps 1 --pp 2 --pp-layers 99999999999,1", "--pp-layers \"99999999999,1\""},
      {"train --model nano --steps 1 --pp 2 --pp-layers \"\"", "--pp-layers: must not be empty"},
      {"train --model nano --steps 1 --recompute most", "--recompute \"most\""},
      {"train --model nano --steps 1 --dp 64 --batch 64", "64 devices requested but profile a100-nvlink has 32"},
      {"train --model nano --steps 1 --phantom-routing zipf:0 --phantom", "--phantom-routing"},
      {"train --model nano --steps 1 --phantom-routing zipf:nan --phantom", "--phantom-routing"},
      {"train --model nano --steps 1 --phantom-routing zipf:abc --phantom", "--phantom-routing"},
      {"train --model nano --steps 1 --phantom-routing skewed --phantom", "--phantom-routing"},
      {"train --model nano --steps 1 --phantom-routing zipf:1", "applies to --phantom runs only"},
      {"train --model nano --steps 1 --arithmetic fast", "--arithmetic: \"fast\" is not native or portable"},
      {"verify --model nano --steps 1 --arithmetic Portable", "--arithmetic: \"Portable\" is not native or portable"},
      {"train --model nano --steps 1 --phantom --data synthetic:copy", "--data synthetic:copy: a phantom run reads no data"},
      {"train --model nano --steps 1 --phantom --init {file}", "--init cannot be combined with --phantom"},
      {"train --model nano --phantom --dp 128 --batch 128 --nodes 16 --steps 1000000",
       "--steps 1000000 on 128 devices: at most 100000000 device-steps"},
      {"train --model nano --steps 1 --tp 2 --sp --seq 31", "--tp 2: must divide --seq 31 with --sp"},
      {"train --model nano --steps 1 --ep 2", "--ep 2 needs an MoE model (--experts > 0)"},
      {"train --model nano --steps 1 --dp 2 --ep 2 --experts 3", "--ep 2 must divide --experts 3"},
      {"train --model nano --steps 1 --pp 2 --schedule interleaved", "needs at least 2 model chunks"},
  });
}

TEST(CliBadInput, HardwareFlags) {
  run_table({
      {"train --model nano --steps 1 --memory 0", "--memory 0: a device needs some memory"},
      {"train --model nano --steps 1 --memory 0B", "--memory 0: a device needs some memory"},
      {"train --model nano --steps 1 --memory -5", "--memory: cannot parse size \"-5\""},
      {"train --model nano --steps 1 --memory 1.5", "--memory: cannot parse size \"1.5\""},
      {"train --model nano --steps 1 --memory lots", "--memory: cannot parse size \"lots\""},
      {"train --model nano --steps 1 --memory \"\"", "--memory: must not be empty"},
      {"train --model nano --steps 1 --memory 99999999999T", "--memory: cannot parse size"},
      {"train --model nano --steps 1 --precision fp16", "--precision: unknown \"fp16\""},
      {"train --model nano --steps 1 --pace nan", "--pace: nan is not a finite number"},
      {"train --model nano --steps 1 --pace -1", "--pace: -1 is out of range"},
      {"train --model nano --steps 1 --pace inf", "--pace: inf is not a finite number"},
      {"train --model nano --steps 1 --pace 1e300", "--pace: 1e300 is out of range"},
      {"train --model nano --steps 1 --nodes 0", "--nodes: 0 is out of range"},
      {"train --model nano --steps 1 --nodes -1", "--nodes: -1 is out of range"},
      {"train --model nano --steps 1 --nodes 99999999999", "--nodes: 99999999999 is out of range"},
      {"train --model nano --steps 1 --nodes 200000", "--nodes 200000: must be between 1 and 131072"},
      {"train --model nano --steps 1 --profile tpu-v9", "unknown profile \"tpu-v9\""},
      {"train --model nano --steps 1 --profile \"\"", "--profile: must not be empty"},
      {"train --model nano --steps 1 --profile {dir}", "profile {dir}: is a directory, not a JSON file"},
      {"train --model nano --steps 1 --profile {dir}/none.json", "profile {dir}/none.json: no such file"},
      {"train --model nano --steps 1 --profile {file}", "profile {file}: not valid JSON"},
  });
}

// Megatron's combined 1F1B where it is not modeled or not allowed.
TEST(CliBadInput, OverlapMoeCommWhereItDoesNotApply) {
  run_table({
      {"train --model tiny --steps 1 --overlap-moe-expert-parallel-comm", "it needs an MoE model and --ep > 1"},
      {"train --model tiny-moe --steps 1 --dp 2 --overlap-moe-expert-parallel-comm",
       "it needs an MoE model and --ep > 1"},
      {"train --model tiny-moe --steps 1 --dp 2 --ep 2 --pp 2 --overlap-moe-expert-parallel-comm",
       "with --pp > 1 needs --schedule interleaved"},
      {"train --model tiny-moe --steps 1 --dp 2 --ep 2 --pp 2 --schedule zb-v --overlap-moe-expert-parallel-comm",
       "with --pp > 1 needs --schedule interleaved"},
      {"train --model tiny-moe --steps 1 --dp 2 --ep 2 --schedule interleaved --vpp 2 "
       "--overlap-moe-expert-parallel-comm",
       "with --pp 1 runs one model chunk"},
      {"train --model tiny-moe --steps 1 --dp 2 --ep 2 --recompute full --overlap-moe-expert-parallel-comm",
       "full recomputation"},
      {"train --model tiny-moe --steps 1 --dp 2 --ep 2 --recompute-modules moe --overlap-moe-expert-parallel-comm",
       "full recomputation"},
      {"train --model tiny-moe --steps 1 --dp 2 --ep 2 --zero 3 --overlap-moe-expert-parallel-comm",
       "with --zero 3 is not supported"},
      {"train --model tiny-moe --steps 1 --dp 2 --ep 2 --delay-wgrad-compute",
       "it needs --overlap-moe-expert-parallel-comm"},
  });
}

// Configs beyond the modeled device (or this host) end in the modeled
// out-of-memory message before any buffer exists: never std::bad_alloc,
// never minutes of zero-filling host memory.
TEST(CliBadInput, ConfigsBeyondTheDevice) {
  const char* oom = "out of memory";
  run_table({
      {"train --model nano --steps 1 --batch 4096 --seq 4096", oom},
      {"train --model nano --steps 1 --seq 1000000", oom},
      {"train --model tiny --steps 1 --batch 100000 --seq 4096 --embd 4096", oom},
      {"train --model tiny --steps 1 --batch 16000000", oom},
      {"train --model tiny --steps 1 --embd 65536 --heads 64", "out of memory before any activation"},
      {"train --model tiny --steps 1 --layers 60000", "more than its capacity 80.0 GiB"},
      {"train --model tiny --steps 1 --vocab 16000000", "of host memory for the parameters"},
      {"train --model tiny --steps 1 --experts 4 --batch 8192 --seq 1024", oom},
      {"train --model tiny --steps 1 --tp 4 --batch 4096 --seq 4096", oom},
      {"train --model tiny --steps 1 --pp 2 --batch 2048 --seq 8192", oom},
      {"train --model tiny --steps 1 --memory 1MiB", "more than its capacity 1.0 MiB"},
      {"train --model tiny --steps 1 --batch 1024 --seq 2048 --memory 1T", "of host memory for the activations"},
      {"train --model tiny --steps 1 --batch 4096 --seq 1024 --memory 100T", "of host memory for the activations"},
      {"verify --model tiny --steps 1 --batch 4096 --seq 4096", oom},
  });
}

TEST(CliBadInput, DataAndCheckpointFiles) {
  run_table({
      {"train --model nano --steps 1 --data synthetic:nosuch", "--data: unknown synthetic task \"nosuch\""},
      {"train --model nano --steps 1 --data /nonexistent/tokens.bin", "\"/nonexistent/tokens.bin\": no such file (expected synthetic:NAME or a .bin file)"},
      {"train --model nano --steps 1 --data {dir}", "is a directory, not a .bin file"},
      {"train --model nano --steps 1 --data \"\"", "--data: must not be empty"},
      {"train --model nano --steps 1 --init /nonexistent.safetensors", "/nonexistent.safetensors"},
      {"train --model nano --steps 1 --init {dir}", "is a directory, not a .safetensors file"},
      {"train --model nano --steps 1 --init {file}", "safetensors \"{file}\""},
      {"train --model nano --steps 1 --init \"\"", "--init: must not be empty"},
  });
}

// Every output path is checked before the run: nothing trains for minutes
// and then fails to save.
TEST(CliBadInput, OutputPaths) {
  run_table({
      {"train --model nano --steps 1 --save /nonexistent/x.safetensors",
       "--save \"/nonexistent/x.safetensors\": cannot write: directory \"/nonexistent\" does not exist"},
      {"train --model nano --steps 1 --report /nonexistent/r.json", "--report \"/nonexistent/r.json\": cannot write"},
      {"train --model nano --steps 1 --trace /nonexistent/t.json", "--trace \"/nonexistent/t.json\": cannot write"},
      {"train --model nano --steps 1 --save {dir}", "--save \"{dir}\": cannot write: it is a directory"},
      {"train --model nano --steps 1 --report {dir}", "--report \"{dir}\": cannot write: it is a directory"},
      {"train --model nano --steps 1 --trace {dir}", "--trace \"{dir}\": cannot write: it is a directory"},
      {"train --model nano --steps 1 --report {file}/r.json", "cannot write: \"{file}\" is not a directory"},
      {"train --model nano --steps 1 --save \"\"", "--save: must not be empty"},
      {"train --model nano --steps 1 --report \"\"", "--report: must not be empty"},
      {"train --model nano --steps 1 --trace \"\"", "--trace: must not be empty"},
      {"train --model nano --steps 1 --report {dir}/a.json --trace {dir}/./a.json",
       "--report and --trace both write \"{dir}/a.json\""},
      {"train --model nano --steps 1 --save {dir}/a --report {dir}/a", "--save and --report both write"},
      {"train --model nano --steps 1 --phantom --save {dir}/p.safetensors", "--save cannot be combined with --phantom"},
      {"verify --model nano --steps 1 --report {dir}", "--report \"{dir}\": cannot write: it is a directory"},
      {"verify --model nano --steps 1 --trace /nonexistent/t.json", "--trace \"/nonexistent/t.json\": cannot write"},
      {"verify --model nano --steps 1 --save {dir}/v.safetensors", "--save: verify trains two models"},
      {"collectives --ranks 2 --max-bytes 8 --trace /nonexistent/t.json", "--trace \"/nonexistent/t.json\""},
      {"collectives --ranks 2 --max-bytes 8 --trace {dir}", "--trace \"{dir}\": cannot write: it is a directory"},
      {"p2p --max-bytes 8 --trace {file}/t.json", "cannot write: \"{file}\" is not a directory"},
  });
}

TEST(CliBadInput, VerifyFlags) {
  run_table({
      {"verify --model nano --steps 1 --tol-loss nan", "--tol-loss: nan is not a finite number"},
      {"verify --model nano --steps 1 --tol-loss -1", "--tol-loss: -1 is out of range"},
      {"verify --model nano --steps 1 --tol-loss inf", "--tol-loss: inf is not a finite number"},
      {"verify --model nano --steps 1 --tol-param nan", "--tol-param: nan is not a finite number"},
      {"verify --model nano --steps 1 --tol-param inf", "--tol-param: inf is not a finite number"},
      {"verify --model nano --steps 1 --tol-param -0.5", "--tol-param: -0.5 is out of range"},
      {"verify --model nano --steps 1 --dp 2 --corrupt-shard transformer.wte.weight:abc",
       "expected NAME:RANK with RANK below 2"},
      {"verify --model nano --steps 1 --dp 2 --corrupt-shard transformer.wte.weight:5",
       "expected NAME:RANK with RANK below 2"},
      {"verify --model nano --steps 1 --dp 2 --corrupt-shard transformer.wte.weight:-1", "RANK below 2"},
      {"verify --model nano --steps 1 --dp 2 --corrupt-shard transformer.wte.weight", "RANK below 2"},
      {"verify --model nano --steps 1 --dp 2 --corrupt-shard nosuch:1", "the model has no parameter \"nosuch\""},
      {"verify --model nano --steps 1 --phantom", "--phantom: verify compares values"},
      {"verify --model nano --steps 0", "--steps: 0 is out of range"},
      {"verify --model nano --steps 1 --batch 0", "--batch: 0 is out of range"},
  });
}

// What CLI11 itself refuses: the line names the flag and the fix, in the
// order typed ("The following arguments were not expected: 2 --tpp" before).
TEST(CliBadInput, ParseErrorsNameTheFlagAndTheFix) {
  run_table({
      {"train --tpp 2", "train: unknown flag --tpp (did you mean --tp?)"},
      {"train --micro-batch 4", "train: unknown flag --micro-batch (did you mean --micro-batches?)"},
      {"collectives --rank 4", "collectives: unknown flag --rank (did you mean --ranks?)"},
      {"serve --temprature 1", "serve: unknown flag --temprature (did you mean --temperature?)"},
      {"train --no-tie-embedding", "train: unknown flag --no-tie-embedding (did you mean --no-tie-embeddings?)"},
      {"train --zzz=4", "train: unknown flag --zzz (shardlab train --help lists its flags)"},
      {"train --tp 2 3", "train: unexpected argument \"3\" (its options are --flags: shardlab train --help)"},
      {"train --tp 2 --tp 3", "--tp is given more than once: give it once"},
      {"train --tp", "--tp needs a value: an integer in [1, 1048576]"},
      {"train --lr", "--lr needs a value: a number in (0, 1000]"},
      {"train --model", "--model needs a value"},
      {"train --sp=yes", "--sp is an on/off flag and takes no value: write --sp alone to turn it on"},
      {"", "a subcommand is required (one of: collectives, p2p, profiles, train, verify, sweep, generate, serve; "
           "shardlab --help)"},
  });
}

TEST(CliBadInput, CollectivesAndP2pFlags) {
  run_table({
      {"collectives --proto LL129", "--proto: unknown protocol \"LL129\""},
      {"collectives --proto LL128 --profile a100-pcie",
       "--proto LL128: not used on profile a100-pcie's links of 8 ranks (one of: auto, LL, Simple)"},
      {"collectives --proto plain", "--proto plain: not used on profile a100-nvlink's links of 8 ranks (one of: auto, LL, LL128, Simple)"},
      {"collectives --proto ''", "--proto: unknown protocol \"\""},
      {"collectives --ranks 0", "--ranks 0: must be between 1 and 32"},
      {"collectives --ranks -1", "--ranks -1: must be between 1 and 32"},
      {"collectives --ranks 33", "--ranks 33: must be between 1 and 32"},
      {"collectives --ranks abc", "--ranks"},
      {"collectives --min-bytes 0", "--min-bytes must be at least 1"},
      {"collectives --max-bytes 5G", "--max-bytes: at most 4GiB"},
      {"collectives --min-bytes 1e3", "--min-bytes: cannot parse size \"1e3\""},
      {"collectives --min-bytes 1MiB --max-bytes 1KiB", "--min-bytes 1048576 is above --max-bytes 1024"},
      {"collectives --op gather", "--op: unknown op \"gather\""},
      {"collectives --op barrier", "--op barrier: not measured here"},
      {"collectives --algo fastest", "--algo: unknown algorithm \"fastest\""},
      {"collectives --redop min", "--redop: unknown reduce op \"min\""},
      {"collectives --op all_gather --redop max", "--redop max: --op all_gather reduces nothing"},
      {"collectives --op all_to_all --redop sum", "--redop sum: --op all_to_all reduces nothing"},
      {"collectives --pace nan", "--pace: nan is not a finite number"},
      {"collectives --nodes 0", "--nodes: 0 is out of range"},
      {"collectives --ranks 8 --algo dbtree", "--algo dbtree: all_reduce on these 8 members: dbtree runs all_reduce"},
      {"collectives --profile {dir}", "is a directory, not a JSON file"},
      {"p2p --src -1", "--src -1: out of range"},
      {"p2p --dst 99", "--dst 99: out of range"},
      {"p2p --src 0 --dst 0", "--src and --dst are both 0"},
      {"p2p --min-bytes 0", "--min-bytes must be at least 1"},
      {"p2p --max-bytes 12parsecs", "--max-bytes: cannot parse size"},
      {"p2p --max-bytes 4GiB", "--max-bytes 4294967296: at most 1GiB for p2p"},
      {"p2p --pace -1", "--pace: -1 is out of range"},
      {"p2p --nodes -3", "--nodes: -3 is out of range"},
      {"profiles --frobnicate", "frobnicate"},
      {"profiles extra", "extra"},
      {"warp-drive", "unknown subcommand 'warp-drive'"},
      {"train --model nano --frobnicate", "frobnicate"},
      {"train --model nano --steps", "--steps"},
      {"train --model nano --steps 1 --steps 2", "--steps"},
      {"verify --model nano --steps 1 extra", "extra"},
  });
}

}  // namespace
}  // namespace shardlab
