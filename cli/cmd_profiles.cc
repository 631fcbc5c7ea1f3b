// `shardlab profiles`: the built-in hardware profiles.
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "runtime/log.h"

namespace shardlab::cli {

void add_profiles_command(CLI::App& app) {
  auto* sub = app.add_subcommand("profiles", "List the built-in hardware profiles");
  auto json = std::make_shared<bool>(false);
  sub->add_flag("--json", *json, "Print a JSON list (the shape --profile FILE.json accepts)");
  set_action(sub, [json] {
    if (*json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& p : builtin_profiles()) list.push_back(profile_to_json(p));
      print_json(list);
      return 0;
    }
    // inter: per NIC; NICs: per node (profile "nics").
    fmt::print("{:<16} {:>5} {:>5} {:>9} {:>9} {:>8} {:>7}  {:>17}  {:>17} {:>4}\n", "name", "nodes",
               "gpus", "fp32 TF/s", "bf16 TF/s", "HBM GB/s", "mem GiB", "intra us / GB/s",
               "inter us / GB/s", "NICs");
    for (const auto& p : builtin_profiles()) {
      fmt::print("{:<16} {:>5} {:>5} {:>9.1f} {:>9.1f} {:>8.0f} {:>7.0f}  {:>7.2f} / {:>7.1f}  {:>7.2f} / {:>7.1f} {:>4}\n",
                 p.name, p.nodes, p.devices_per_node, p.device.peak_tflops_fp32,
                 p.device.peak_tflops_bf16, p.device.mem_bandwidth_GBps, p.device.memory_GiB,
                 p.intra.latency_us, p.intra.bandwidth_GBps, p.inter.latency_us,
                 p.inter.bandwidth_GBps, p.nic_count());
    }
    for (const auto& p : builtin_profiles()) {
      fmt::print("  {}: {}\n", p.name, p.description);
      if (!p.fabric.empty()) fmt::print("    fabric: {}\n", p.fabric.describe());
      if (const auto names = p.device.attention_kernel_names(); !names.empty())  // --attention-kernel's choices
        fmt::print("    fused attention kernels (--attention-kernel): {} (default){}{}\n", names.front(),
                   names.size() > 1 ? ", " : "", fmt::join(names.begin() + 1, names.end(), ", "));
    }
    return 0;
  });
}

}  // namespace shardlab::cli
