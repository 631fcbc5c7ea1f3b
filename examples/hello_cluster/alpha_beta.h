// The alpha-beta model of one uncontended message, from a profile's link
// numbers, in integer picoseconds as the emulator charges time (fabric.h):
//
//   t = α + w,  w = ceil(W · 1e12 / β) ps,  W = S + ceil(S / P) · H
//
// for S payload bytes cut into packets of P bytes with H header bytes each
// (NCCL's SM engine, Device::send's default), β the bandwidth in bytes per
// second and α the latency rounded to the nearest picosecond. Written out
// from the profile's datasheet numbers, independently of the link model, so
// the examples that compare against it can fail. custom_collective uses it too.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/profile.h"
#include "runtime/time.h"

namespace hello {

struct AlphaBeta {
  shardlab::Time alpha = 0;  // latency
  shardlab::Time w = 0;      // wire time: the bytes and their packet headers over the bandwidth
  shardlab::Time total() const { return alpha + w; }
};

inline AlphaBeta alpha_beta(const shardlab::LinkSpec& link, uint64_t bytes) {
  __extension__ using u128 = unsigned __int128;  // W · 1e12 overflows 64 bits above 18 MB
  const auto payload = uint64_t(link.sm_payload_bytes);
  const uint64_t packets = payload == 0 ? 0 : (bytes + payload - 1) / payload;
  const u128 wire = bytes + packets * uint64_t(link.packet_header_bytes);
  const auto bps = u128(std::llround(link.bandwidth_GBps * 1e9));
  const u128 ps = (wire * 1'000'000'000'000ull + bps - 1) / bps;
  return {shardlab::Time(std::llround(link.latency_us * 1e6)), shardlab::Time(ps)};
}

}  // namespace hello
