// Hardware profiles: what one modeled machine looks like.
//
// A profile gives the cluster shape (nodes x devices per node), each device's
// compute and memory figures, and one link class per level of the hierarchy
// (intra-node: NVLink or PCIe; inter-node: InfiniBand). GB/s always means 1e9
// bytes per second, per direction.
//
// The JSON form (`shardlab profiles --json`). Required: name, nodes,
// devices_per_node, device.{peak_tflops.{fp32,bf16[,fp8]}, mem_bandwidth_GBps,
// memory_GiB, launch_overhead_us}, links.{intra,inter}.{latency_us,
// bandwidth_GBps}. Optional, the calibration (absent: the plain roofline and
// plain links, as in files written before it; the default in parentheses):
//   device.compute_efficiency    share of peak of non-GEMM flops (1)
//   device.mem_efficiency        achieved share of HBM bandwidth (1)
//   device.layernorm_rate.{fwd, bwd}
//                                the LayerNorm kernels' share of that rate
//                                (1: a one-pass kernel, e.g. apex's
//                                FastLayerNorm or Transformer Engine's;
//                                DeviceSpec::layernorm_fwd_rate)
//   device.collective_launch_us  fixed start of every collective (0)
//   device.gemm.{sm_count, tiles: [[m, n], ...], max_efficiency.{fp32, bf16[, fp8]}}
//                                GEMM tile and wave quantization (off)
//   links.<class>.packet.{header_bytes, sm_payload_bytes, copy_payload_bytes}
//                                packet headers on the wire (none)
//   links.inter.proxy_us         NCCL's network proxy: the CPU time to post one
//                                network send (src/graph/tuning.cc
//                                getNetOverhead: 1 us on Intel hosts, 2 on
//                                AMD), added to the hop latency of every
//                                node-crossing message of a collective, three
//                                times under Simple (NCCL: "netOverhead *= 3");
//                                plain sends keep links.inter.latency_us (0)
//   nics                         the node's NICs, each the list of local GPU
//                                indices near it: [[0], [1], ...] (one NIC per
//                                GPU, the default) or [[0, 1], [2, 3], ...] (a
//                                NIC shared by two GPUs). Every GPU is near
//                                exactly one NIC; each NIC runs at
//                                links.inter's rate (its rail).
//   pcie                         the PCIe tree of a node whose GPUs talk over
//                                PCIe (links.intra is then each GPU's own x16
//                                link): {"switches": [[0, 1], [2, 3], ...] (the
//                                local GPUs behind each switch), "sockets":
//                                [[0, 1], [2, 3]] (the switches on each CPU
//                                socket), "uplink_GBps" (a switch's link to
//                                its root complex, per direction),
//                                "inter_socket_GBps" (the link between the
//                                sockets, per direction)}. Absent: a crossbar.
//   fabric                       the cluster's switch fabric, a fat-tree or
//                                Clos ("tiers", bottom up: [{"name", "nodes"
//                                (nodes below one switch group of the tier;
//                                not on the top tier, which spans the
//                                cluster), "hop_latency_us" (one pass through
//                                one of its switches), "oversubscription" (its
//                                switches' downlink : uplink bandwidth, >= 1;
//                                optional, 1; 1 on the top tier)}, ...]).
//                                links.inter is a message inside one leaf (one
//                                switch); a message whose nodes first share
//                                tier t > 0 adds the switches it passes beyond
//                                that leaf's, h_0 + 2(h_1 + ... + h_{t-1}) + h_t,
//                                and runs at most at its NIC share divided by
//                                the oversubscription of every tier below t.
//                                Absent: one leaf (every message at links.inter).
//   protocols                    NCCL's protocols as its tuning model sees them
//                                (graph/tuning.cc), each of "LL", "LL128",
//                                "Simple": {"base_latency_us" (a collective's
//                                start), "intra"/"inter": {"hop_latency_us"
//                                (a message's latency), "bw_share" (its share
//                                of the link's rate, in [0, 1]; 0: the protocol
//                                is not used over that link)}}. Absent: no
//                                protocols (a collective's messages move as
//                                plain sends, on the links' latency and rate).
// The built-in values and their public sources: profile_builtin.cc, README "Cost model".
//
// Thread safety: a HardwareProfile is plain data, read-only during a run;
// every device thread of a cluster reads the same one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/time.h"

namespace shardlab {

enum class LinkClass : uint8_t { kIntra = 0, kInter = 1 };
inline constexpr int kNumLinkClasses = 2;

// Who moves a message's bytes. NCCL's kernels (collectives, and the
// pipeline's send/recv) store from the SMs; cudaMemcpy between peers (what
// OSU's osu_bw and p2pBandwidthLatencyTest measure) uses the copy engines,
// which send larger packets.
// A collective's messages carry the engine of its protocol (kLL, kLL128,
// kSimple: SM stores, with the protocol's latency and rate, Link::latency_of).
enum class Engine : uint8_t { kSm = 0, kCopy = 1, kLL = 2, kLL128 = 3, kSimple = 4 };

// NCCL's protocols: LL stores 8-byte lines of 4 data bytes and a 4-byte flag
// (least latency, least bandwidth), LL128 128-byte lines with 8 flag bytes,
// Simple large chunks behind memory fences (most latency, full bandwidth).
enum class Protocol : uint8_t { kLL = 0, kLL128 = 1, kSimple = 2 };
inline constexpr int kNumProtocols = 3;
inline Engine protocol_engine(Protocol p) { return static_cast<Engine>(2 + static_cast<int>(p)); }
// The protocol an engine carries; -1 for kSm and kCopy (plain sends).
inline int engine_protocol(Engine e) { return static_cast<int>(e) >= 2 ? static_cast<int>(e) - 2 : -1; }
const char* protocol_name(Protocol p);  // "LL", "LL128", "Simple"

// One protocol in NCCL's tuning model (graph/tuning.cc): baseLat, hwLat per
// hop and the share of the link's bandwidth it reaches, per link class.
struct ProtocolSpec {
  double base_latency_us = 0;                       // a collective's start
  double hop_latency_us[kNumLinkClasses] = {0, 0};  // a message's latency, intra / inter
  double bw_share[kNumLinkClasses] = {1, 1};        // of the link's rate; 0: not used there
  bool usable(LinkClass c) const { return bw_share[static_cast<int>(c)] > 0; }
};

struct LinkSpec {
  double latency_us = 0;      // one-way, first byte
  double bandwidth_GBps = 0;  // per direction, line rate of the data
  // Packets: a message of S bytes is cut into packets of at most `payload`
  // bytes, each carrying `packet_header_bytes` more on the wire, so it
  // occupies the link for S + ceil(S / payload) * header bytes. payload 0:
  // no packet overhead (JSON "links.<class>.packet": optional).
  int packet_header_bytes = 0;
  int sm_payload_bytes = 0;    // Engine::kSm
  int copy_payload_bytes = 0;  // Engine::kCopy
  // links.inter only: the network proxy's post of one send (the header above;
  // Link::proto_latency_delta carries it, make_link).
  double proxy_us = 0;
  // links.intra only: NVLink SHARP (NVLS) on the node's NVSwitches, the share
  // of the link's rate its all_reduce reaches (NCCL's nvlsEfficiency, src/
  // graph/tuning.cc: Hopper 0.85, Blackwell 0.74); 0: no NVLS (Algo::kNvls).
  double nvls_efficiency = 0;
  // Derived, exact integers used by the link model.
  Time latency() const { return us_to_time(latency_us); }
  uint64_t bytes_per_second() const;
};

// cuBLAS-like GEMM efficiency (runtime/cost_model.h). sm_count 0: off, every
// flop at compute_efficiency (the plain roofline).
struct GemmTile {
  int m = 0;  // output tile rows
  int n = 0;  // output tile columns
  friend bool operator==(const GemmTile&, const GemmTile&) = default;
};
struct GemmSpec {
  int sm_count = 0;                  // thread blocks running at once: one output tile per SM
  std::vector<GemmTile> tiles;       // the tile shapes the library picks from, largest first
  double max_efficiency_fp32 = 1.0;  // achieved share of peak, whole tiles and waves
  double max_efficiency_bf16 = 1.0;
  double max_efficiency_fp8 = 1.0;   // FP8 GEMMs (Precision::kFp8)
};

// The fused attention kernel (FlashAttention, cuDNN) as published for this
// GPU: TFLOP/s by sequence length at head dim 128 in BF16, counted as
// FlashAttention's benchmarks count them (forward 4·s²·d per head, halved
// when causal; backward 2.5x the forward). Between two lengths a rate is
// interpolated linearly in log2(s); outside them it is the nearest one's.
// The causal backward is not published: it is the non-causal backward
// times the forward's causal/non-causal ratio at that length. empty(): no
// figures, the kernel's GEMMs run at the GEMM model (cost_model.cc).
struct AttentionSpec {
  // Which kernel the figures are ("cudnn", "fa2", ...; JSON "kernel",
  // optional): --attention-kernel picks one of a profile's by this name.
  std::string kernel;
  std::vector<double> seq;         // sequence lengths, strictly increasing
  std::vector<double> fwd_causal;  // TFLOP/s of the causal forward
  std::vector<double> fwd;         // TFLOP/s of the forward without a mask
  std::vector<double> bwd;         // TFLOP/s of the backward without a mask
  bool empty() const { return seq.empty(); }
  double forward_tflops(double s, bool causal) const;
  double backward_tflops(double s, bool causal) const;
};

struct DeviceSpec {
  double peak_tflops_fp32 = 0;
  double peak_tflops_bf16 = 0;
  double mem_bandwidth_GBps = 0;
  double memory_GiB = 0;
  double launch_overhead_us = 0;
  double compute_efficiency = 1.0;  // achieved share of peak FLOP/s of non-GEMM flops, (0, 1]
  double mem_efficiency = 1.0;      // achieved share of HBM bandwidth (STREAM-like), (0, 1]
  // The LayerNorm kernels (OpCost::Pass::kLayerNorm*) move their bytes at
  // this share of mem_efficiency's rate, (0, 1]. 1: a one-pass kernel that
  // streams like the others (apex's FastLayerNorm, Transformer Engine's);
  // Megatron-LM 2021's (apex's older affine kernel) is slower (README "Cost
  // model"; model/train/calibration.cc sets it for the rows of that code).
  double layernorm_fwd_rate = 1.0, layernorm_bwd_rate = 1.0;
  // Fixed start of every collective: the kernel launch, before the
  // protocol's own start (ProtocolSpec::base_latency_us) where there are protocols.
  double collective_launch_us = 0;
  GemmSpec gemm;
  double peak_tflops_fp8 = 0;  // dense FP8 tensor-core peak; 0: no FP8 (Ampere)
  AttentionSpec attention;      // JSON "device.attention" (optional): the kernel runs charge
  // Other fused attention kernels with published figures for this GPU, each
  // named (JSON "device.attention_kernels", optional): the software stack
  // decides which one runs (Transformer Engine picks cuDNN's on Hopper unless
  // NVTE_FUSED_ATTN=0 sends it to FlashAttention-2), so a run names it with
  // --attention-kernel (select_attention_kernel).
  std::vector<AttentionSpec> attention_kernels;
  // The named kernels a run may pick: the charged one first, then the
  // others by name ("cudnn", "fa2", "fa3" on H100); empty without names.
  std::vector<std::string> attention_kernel_names() const;
};

// A node's PCIe tree ("pcie"): which links a message between two GPUs of a
// node crosses. GPUs behind one switch talk through it alone; GPUs behind
// different switches of a socket cross both switches' uplinks (up, then
// down) through the root complex; GPUs on different sockets also cross the
// inter-socket link in that direction. Every GPU is behind exactly one
// switch, every switch on exactly one socket. empty(): no tree (a crossbar).
struct PcieTopology {
  std::vector<std::vector<int>> switches;  // local GPU indices behind each switch
  std::vector<std::vector<int>> sockets;   // switch indices on each CPU socket
  double uplink_GBps = 0;                  // switch <-> root complex, per direction
  double inter_socket_GBps = 0;            // socket <-> socket, per direction
  bool empty() const { return switches.empty(); }
  int switch_of(int local_gpu) const;
  int socket_of_switch(int sw) const;
};

// One switch tier of the cluster fabric (profile "fabric"), bottom up: the
// leaves (ToR or rail switches), then the spines of a pod, then the
// aggregation layer above the pods.
struct FabricTier {
  std::string name;              // "leaf", "pod", ...: for output only
  int nodes = 0;                 // nodes below one switch group of this tier; 0 on the top tier (the cluster)
  double hop_latency_us = 0;     // one pass through one of its switches
  double oversubscription = 1;   // its switches' downlink : uplink bandwidth (>= 1; 1 on the top tier)
  friend bool operator==(const FabricTier&, const FabricTier&) = default;
};

// The cluster fabric: a fat-tree or Clos of tiers. Nodes n and m first share
// the tier t whose domains (blocks of tiers[t].nodes consecutive nodes; the
// top tier: all) hold both. A rail-optimized fabric (a leaf per rail) is
// described the same way, a leaf's nodes being the nodes whose NICs of one
// rail it joins: the model sends every node-crossing message on one rail, as
// NCCL's rings, trees and PXN do, so rails never meet above a leaf.
// empty(): no fabric (one leaf, every message at links.inter).
struct ClusterFabric {
  std::vector<FabricTier> tiers;
  bool empty() const { return tiers.empty(); }
  // The lowest tier whose domain holds both nodes (0 when they share a leaf or
  // there is no fabric).
  int common_tier(int node_a, int node_b) const;
  // The latency a message whose nodes first share tier t adds to links.inter
  // (which passes one leaf switch): the switches it passes beyond that one,
  // h_0 + 2(h_1 + ... + h_{t-1}) + h_t for t > 0, in picoseconds (each
  // hop_latency_us rounded to a picosecond first, so sums are exact).
  Time extra_latency(int tier) const;
  // The product of the oversubscription of every tier below t: the share
  // 1/r of its NIC rate a message crossing tier t gets when every host below
  // the oversubscribed uplinks sends through them at once (a worst-case
  // static share).
  double oversubscription_below(int tier) const;
  // One line for output: "rack (2 nodes, 1 us/hop) / pod (384 nodes, 1 us/hop, 7:1 up) / aggregation (1 us/hop)".
  std::string describe() const;
  // The tier's name, or "tier t" when it has none.
  std::string tier_name(int tier) const;
};

// The most devices a cluster may have (a profile's nodes x devices_per_node,
// --nodes, --dp x --tp x --pp): far beyond any run, well inside int.
inline constexpr int64_t kMaxDevices = int64_t{1} << 20;

struct HardwareProfile {
  std::string name;
  std::string description;
  int nodes = 1;
  int devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra;
  LinkSpec inter;
  // NICs per node, each the local GPU indices near it; empty: one per GPU.
  std::vector<std::vector<int>> nics;
  // The PCIe tree inside a node (empty: a crossbar of links.intra).
  PcieTopology pcie;
  // NCCL's protocols, indexed by Protocol; empty: none (plain sends).
  std::vector<ProtocolSpec> protocols;
  // The switch fabric between nodes (empty: one leaf).
  ClusterFabric fabric;

  int total_devices() const { return nodes * devices_per_node; }
  int node_of(int rank) const { return rank / devices_per_node; }
  int nic_count() const { return nics.empty() ? devices_per_node : static_cast<int>(nics.size()); }
  // The NIC (rail) the device `rank` sends and receives on across nodes.
  int nic_of(int rank) const;
  // How many GPUs of a node share that NIC (each gets its share of the rate).
  int nic_sharers(int rank) const;
  const LinkSpec& link(LinkClass c) const { return c == LinkClass::kIntra ? intra : inter; }
  uint64_t memory_bytes() const;
};

// NCCL's tuning-model protocols for a node whose GPUs talk over NVLink, or
// over PCIe (`pcie_intra`: LL128 is not used there, as NCCL enables it only
// on NVLink). Values and sources: profile_protocols.cc.
std::vector<ProtocolSpec> nccl_protocols(bool pcie_intra);

// The built-in profiles, in a stable order.
const std::vector<HardwareProfile>& builtin_profiles();

// A built-in name or a path to a JSON file (anything ending in ".json" or
// containing '/'). Throws ConfigError with one line naming the problem.
HardwareProfile load_profile(std::string_view name_or_path);

// Makes the fused attention kernel named `kernel` (one of
// device.attention_kernels) the one runs charge, the previous one going to
// the alternatives; "" or the current kernel's name: unchanged. Throws
// ConfigError (one line, the kernels the profile has) for any other name.
void select_attention_kernel(HardwareProfile& p, std::string_view kernel);

// JSON <-> profile, in the shape `shardlab profiles --json` prints.
nlohmann::json profile_to_json(const HardwareProfile& p);
HardwareProfile profile_from_json(const nlohmann::json& j, std::string_view origin);

}  // namespace shardlab
