// `shardlab train`: train the GPT on the virtual cluster.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/train_flags.h"
#include "collectives/mesh.h"
#include "model/io/synthetic.h"
#include "model/train/trainer.h"
#include "runtime/errors.h"
#include "runtime/transport.h"
#include "runtime/units.h"

namespace shardlab::cli {
namespace {

// A progress bar on a terminal; a plain line every tenth of the run otherwise.
class Progress {
 public:
  Progress(int steps, int64_t tokens_per_step, bool quiet, bool phantom)
      : steps_(steps), tokens_(tokens_per_step), tty_(isatty(STDERR_FILENO)), quiet_(quiet),
        phantom_(phantom), start_(std::chrono::steady_clock::now()), last_(start_) {}

  void operator()(const train::StepRecord& r) {
    if (quiet_) return;
    const int done = r.step + 1;
    if (first_ < 0) first_ = r.step;  // a resumed run starts later
    const double tok_s = r.wall_s > 0 ? double(tokens_) * (done - first_) / r.wall_s : 0;
    const double ms = to_seconds(r.virtual_end) / done * 1e3;
    const std::string loss = phantom_ ? "phantom" : fmt::format("loss {:.4f}", r.loss);
    if (tty_) {
      const int width = 30, filled = width * done / steps_;
      fmt::print(stderr, "\r[{:#<{}}{:.<{}}] step {}/{} {} | {:.3f} ms/step virtual | {:.0f} tok/s host\033[K",
                 "", filled, "", width - filled, done, steps_, loss, ms, tok_s);
      if (done == steps_) fmt::print(stderr, "\n");
      std::fflush(stderr);
    } else if (done == 1 || done == steps_ || done % std::max(1, steps_ / 10) == 0) {
      fmt::print(stderr, "step {:>5}/{} {} lr {:.2e} | {:.3f} ms/step virtual | {:.0f} tok/s host\n",
                 done, steps_, loss, r.lr, ms, tok_s);
    }
  }

  // Inside a step (long phantom runs): at most one line per second.
  void operator()(const train::ProgressEvent& e) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    const double wall = std::chrono::duration<double>(now - start_).count();
    const std::string where = e.total > 0 ? fmt::format(" {}/{} actions", e.done, e.total) : "";
    const Transport* t = process_transport();  // under mpirun the threads are spread over the processes
    const std::string over = t ? fmt::format(" over {} processes", t->processes()) : "";
    fmt::print(stderr, "{}step {}/{}: {}{} on device 0 ({} device threads{}), {:.1f} s wall{}", tty_ ? "\r" : "",
               e.step + 1, e.steps, e.phase, where, e.devices, over, wall, tty_ ? "\033[K" : "\n");
    std::fflush(stderr);
  }

 private:
  int steps_;
  int64_t tokens_;
  bool tty_;
  bool quiet_;
  bool phantom_;
  int first_ = -1;  // the first step this run took
  std::chrono::steady_clock::time_point start_, last_;
};

// Peak memory by kind of the device with the highest peak, against its capacity.
void print_memory(const nlohmann::json& report) {
  const nlohmann::json* worst = nullptr;
  for (const auto& d : report["devices"])
    if (!worst || d["peak_bytes"].get<uint64_t>() > (*worst)["peak_bytes"].get<uint64_t>()) worst = &d;
  if (!worst) return;
  const auto& k = (*worst)["peak_bytes_by_kind"];
  std::string kinds;
  for (const auto& [name, bytes] : k.items())
    if (bytes.get<uint64_t>() > 0) kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", name, format_bytes(bytes.get<uint64_t>()));
  fmt::print("memory: device {} ({}) peaks at {} of its {}: {}\n", (*worst)["rank"].get<int>(),
             (*worst)["name"].get<std::string>(), format_bytes((*worst)["peak_bytes"].get<uint64_t>()),
             format_bytes((*worst)["capacity_bytes"].get<uint64_t>()), kinds);
}

// What a phantom MoE run assumes (its routing) and how its tokens travel.
std::string moe_phantom_note(const train::TrainOptions& o) {
  std::string note = o.phantom_zipf > 0 ? fmt::format("; MoE routing assumed Zipf-skewed (s = {:g})", o.phantom_zipf)
                                        : "; MoE routing assumed uniform (a token's experts spread over its groups)";
  if (o.parallel.ep > 1)
    note += o.parallel.moe_dispatcher == parallel::MoeDispatcher::kDeepEp
                ? "; tokens move by DeepEP's dispatcher (once to each node)"
                : "; tokens move by Megatron's all-to-all dispatcher (a row per token and expert)";
  return note;
}

void print_summary(const train::TrainOptions& o, const Cluster& cluster, const train::TrainResult& r,
                   const nlohmann::json& report) {
  const auto& s = report["summary"];
  fmt::print("model: {} ({} parameters), {}batch {} x {} tokens\n", o.model.to_string(), r.n_params,
             o.phantom ? "" : "data " + o.data + ", ", o.model.batch_size, o.model.block_size);
  if (o.model.vocab_padded()) fmt::print("{}\n", model::vocab_padding_note(o.model, o.parallel.tp));
  if (!r.resumed_from.empty()) fmt::print("resumed from {}\n", r.resumed_from);
  if (o.phantom) {
    fmt::print("phantom run: shapes only, every kernel, collective, transfer and allocation timed, no "
               "arithmetic (losses not computed, gradient clipping assumed on)\n{}{}\n",
               r.folded, o.model.is_moe() ? moe_phantom_note(o) : "");
  } else {
    fmt::print("loss: {:.4f} at step 0 -> {:.4f} at step {}", r.steps.front().loss, r.steps.back().loss,
               r.steps.size() - 1);
    if (r.best_loss) fmt::print(" (best achievable on this data: {:.4f})", *r.best_loss);
    fmt::print("\n");
    for (const std::string& line : train::replica_lines(o, r)) fmt::print("{}\n", line);
  }
  // Fusions other than the default are named (the report's config.parallel.fusions has them always).
  const std::string fusions = o.parallel.fusions == model::KernelFusions{}
                                  ? ""
                                  : ", fused: " + model::to_string(o.parallel.fusions);
  fmt::print("virtual step time on {} ({}, {} attention{}{}): {:.3f} ms, MFU {:.1f}% ({:.1f} TFLOP/s per GPU), "
             "every kernel's FLOPs {:.1f} TFLOP/s per GPU (HFU {:.1f}%)\n",
             cluster.profile().name, precision_name(cluster.options().precision),
             report["config"]["attention"].get<std::string>(),
             report["config"].contains("attention_kernel")
                 ? ": " + report["config"]["attention_kernel"].get<std::string>()
                 : std::string(),
             fusions,
             s["virtual_step_s"].get<double>() * 1e3, s["mfu"].get<double>() * 100,
             s["model_tflops_per_gpu"].get<double>(), s["hardware_tflops_per_gpu"].get<double>(),
             s["hfu"].get<double>() * 100);
  print_memory(report);
  fmt::print("host: {:.0f} tokens/s ({:.2f} s in the loop)\n", s["host_tokens_per_s"].get<double>(), r.loop_wall_s);
  print_device_table(report);
  if (o.parallel.pp > 1) {
    const collectives::DeviceMesh mesh(o.parallel.mesh_shape());
    const std::string timeline = train::format_pipeline_timeline(r, mesh.group_ranks(0, "pp"));
    fmt::print("step {} of the pipeline of GPU 0 ({}; F forward, B backward{}, . idle):\n{}", r.first_step,
               parallel::schedule_name(o.parallel.schedule),
               parallel::splits_backward(o.parallel.schedule) ? ", W weight gradient" : "", timeline);
  }
}

int run_train(TrainFlags& f) {
  HardwareProfile profile = f.profile();
  const train::TrainOptions o = f.options();
  const ClusterOptions copts = f.cluster_options();
  check_outputs({{"--save", f.opts.save_path}, {"--report", f.report}, {"--trace", f.common.trace}});
  Cluster cluster(profile, copts);
  Progress progress(o.steps, int64_t(o.model.batch_size) * o.model.block_size, f.common.json,
                    o.phantom);
  train::TrainOptions run = o;
  run.save_path.clear();  // written below with the other files: all of them or none
  train::TrainResult r = train::train(
      cluster, run, [&](const train::StepRecord& s) { progress(s); },
      [&](const train::ProgressEvent& e) { progress(e); });
  nlohmann::json report = train::report_json(o, cluster, r);
  if (leader_process())  // across processes (runtime/transport.h): one set of files
    write_outputs({{"--save", f.opts.save_path, f.opts.save_path.empty() ? "" : train::checkpoint_bytes(o, r)},
                   {"--report", f.report, f.report.empty() ? "" : report.dump(2) + "\n"},
                   {"--trace", f.common.trace,
                    f.common.trace.empty() ? ""
                                           : chrome_trace_json(r.run.traces, fmt::format("shardlab train {}",
                                                                                         o.model.to_string()))}});
  if (f.common.json) {
    print_json(report);
  } else {
    print_summary(o, cluster, r, report);
  }
  // The copies that must end bit-identical: a difference is a failed check,
  // the last line and exit status 1.
  if (const std::string failure = train::replica_failure(r); !failure.empty()) {
    fmt::print(f.common.json ? stderr : stdout, "{}\n", failure);
    return 1;
  }
  return 0;
}

}  // namespace

// Peak bytes by kind per device; master: the fp32 master weights of a bf16 model.
// Large clusters show one row per pipeline stage (its first device); --report has them all.
bool shown(const nlohmann::json& devices, const nlohmann::json& d) {
  return devices.size() <= 32 || (d["coords"]["tp"].get<int>() == 0 && d["coords"]["dp"].get<int>() == 0);
}

void print_memory_table(const nlohmann::json& devices) {
  fmt::print("{:>4}  {:>12} {:>12} {:>12} {:>12} {:>12}  (peak memory by kind)\n", "rank", "params", "grads",
             "master", "adam m+v", "activations");
  for (const auto& d : devices) {
    if (!shown(devices, d)) continue;
    const auto& k = d["peak_bytes_by_kind"];
    auto b = [&](const char* kind) { return format_bytes(k[kind].get<uint64_t>()); };
    fmt::print("{:>4}  {:>12} {:>12} {:>12} {:>12} {:>12}\n", d["rank"].get<int>(), b("param"), b("grad"),
               b("master"), b("optimizer"), b("activation"));
  }
}

void print_device_table(const nlohmann::json& report) {
  const auto& devices = report["devices"];
  const double steps = std::max<size_t>(1, report["steps"].size());
  const bool pipelined = report["config"]["parallel"]["pp"].get<int>() > 1;
  if (pipelined) {
    fmt::print("pipeline bubble: {:.1f}% of the forward-backward phase (mean over stages; schedule {}, {} micro-batches)\n",
               report["summary"]["bubble_fraction"].get<double>() * 100,
               report["config"]["parallel"]["schedule"].get<std::string>(), report["config"]["micro_batches"].get<int>());
  }
  fmt::print("{:>4}  {:<28} {:>11} {:>11} {:>9} {:>9} {:>12} {:>12}\n", "rank", "mesh position", "compute ms",
             "exposed ms", "idle ms", "fb idle", "peak memory", "activations");
  const bool per_stage = devices.size() > 32;
  for (const auto& d : devices) {
    if (!shown(devices, d)) continue;
    const auto& peaks = d["peak_bytes_by_kind"];
    fmt::print("{:>4}  {:<28} {:>11.3f} {:>11.3f} {:>9.3f} {:>8.1f}% {:>12} {:>12}\n", d["rank"].get<int>(),
               d["name"].get<std::string>(), d["compute_s"].get<double>() * 1e3 / steps,
               d["comm_s"].get<double>() * 1e3 / steps, d["idle_s"].get<double>() * 1e3 / steps,
               d["fwd_bwd"]["idle_fraction"].get<double>() * 100, format_bytes(d["peak_bytes"].get<uint64_t>()),
               format_bytes(peaks["activation"].get<uint64_t>()));
  }
  fmt::print("(per step; exposed = communication not hidden under compute; fb idle = compute idle share of the\n"
             " forward-backward phase, the stage's bubble){}\n",
             per_stage ? fmt::format(";\n {} devices: one row per pipeline stage, every device in --report", devices.size()) : "");
  print_memory_table(devices);
  // ZeRO-3's unit gathers, --overlap-param-gather's bucket gathers.
  for (const auto& [key, prefix, what] : {std::tuple{"fsdp", "ZeRO-3", "units"},
                                          std::tuple{"param_gather", "parameter all-gathers in the forward", "buckets"}}) {
    if (!devices[0].contains(key)) continue;
    const auto& f = devices[0][key];
    fmt::print("{}: device 0 gathers {:.0f} {} per step ({} modeled), {:.3f} ms per step of it exposed "
               "(the compute stream waiting for a gather){}\n",
               prefix, f["gathers"].get<double>() / steps, what,
               format_bytes(uint64_t(f["gathered_bytes"].get<double>() / steps)),
               f["gather_exposed_s"].get<double>() * 1e3 / steps,
               f.contains("reduce_scatters")
                   ? fmt::format("; it reduce-scatters {:.0f} gradient buckets per step (every micro-batch's)",
                                 f["reduce_scatters"].get<double>() / steps)
                   : "");
  }
  if (devices[0].contains("cp")) {
    const auto& c = devices[0]["cp"];
    fmt::print("context parallelism: device 0 sends {} of K/V per step around the ring, {:.3f} ms per step of the "
               "K/V exchange exposed (the compute stream waiting for it)\n",
               format_bytes(uint64_t(c["sent_bytes"].get<double>() / steps)), c["kv_exposed_s"].get<double>() * 1e3 / steps);
  }
  if (!report.contains("moe")) return;
  for (const auto& m : report["moe"]) {
    const auto& tokens = m["tokens_per_expert"].back();
    fmt::print("MoE block {}: tokens per expert at the last step [{}], max/mean {:.2f} (mean over steps {:.2f})\n",
               m["layer"].get<int>(), fmt::join(tokens.get<std::vector<int64_t>>(), " "),
               m["imbalance"].back().get<double>(),
               [&] {
                 double sum = 0;
                 for (const auto& x : m["imbalance"]) sum += x.get<double>();
                 return sum / double(m["imbalance"].size());
               }());
  }
  for (const auto& d : devices) {
    if (!d.contains("moe") || d["moe"]["a2a_sent_bytes"].get<uint64_t>() == 0) continue;
    fmt::print("device {} expert all-to-alls: {} sent ({} to other nodes), {} received per step, {:.3f} ms per step on "
               "the compute stream ({:.1f}% of the step)\n",
               d["rank"].get<int>(), format_bytes(uint64_t(d["moe"]["a2a_sent_bytes"].get<double>() / steps)),
               format_bytes(uint64_t(d["moe"]["a2a_internode_sent_bytes"].get<double>() / steps)),
               format_bytes(uint64_t(d["moe"]["a2a_recv_bytes"].get<double>() / steps)),
               d["moe"]["a2a_s"].get<double>() * 1e3 / steps, d["moe"]["a2a_share_of_step"].get<double>() * 100);
  }
}

void add_train_command(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "Train the GPT on the virtual cluster");
  auto f = std::make_shared<TrainFlags>();
  f->add(sub);
  f->add_checkpoint_flags(sub);
  sub->footer("Data: --data FILE.bin (nanoGPT uint16 tokens) or one of: " + model::synthetic_task_list() +
              "\nExit status: 0 on success, 1 when the data-parallel copies of the parameters end apart (they must "
              "be bit-identical), 2 on bad input, 3 when an injected --fault stopped the run.");
  set_action(sub, [f] { return run_train(*f); });
}

}  // namespace shardlab::cli
