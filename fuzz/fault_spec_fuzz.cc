// The fault-spec parser (runtime/fault.h), as --fault reads it. Each line of
// the input is one spec; an input starting with '[' is a fault file instead
// (--fault @FILE.json, read through an in-memory file). Accepted faults must
// be within their documented ranges, read back the same from their own text,
// and leave a link finite when applied.
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "runtime/errors.h"
#include "runtime/fault.h"

namespace {

using shardlab::Fault;
using shardlab::FaultKind;
using shardlab::fuzz::finding;

void check_ranges(const Fault& f) {
  const bool link = f.kind == FaultKind::kSlowLink || f.kind == FaultKind::kLinkDown;
  if (f.device < 0 || (link ? (f.peer < 0 || f.peer == f.device) : f.peer != -1)) finding("bad device numbers");
  if (!(f.bandwidth >= 1e-6 && f.bandwidth <= 1)) finding("bandwidth factor out of range");
  if (!(f.latency_us >= 0 && f.latency_us <= 1e6)) finding("latency out of range");
  if (!(f.compute >= 1 && f.compute <= 1000)) finding("compute factor out of range");
  if (f.step < 0 || f.step > 1'000'000) finding("step out of range");
  if (f.kind == FaultKind::kMemory && f.capacity_bytes == 0 && !(f.capacity_fraction > 0 && f.capacity_fraction <= 1))
    finding("memory fault without a capacity");
}

void check_fault(const Fault& f) {
  check_ranges(f);
  const Fault again = shardlab::parse_fault(f.spec);  // must not throw
  if (again.kind != f.kind || again.device != f.device || again.peer != f.peer || again.bandwidth != f.bandwidth ||
      again.latency_us != f.latency_us || again.compute != f.compute || again.step != f.step ||
      again.capacity_bytes != f.capacity_bytes || again.capacity_fraction != f.capacity_fraction)
    finding("a spec reads back differently");
  // Applied to a fast link, from its own step on: the link stays usable.
  const shardlab::FaultPlan plan({f}, 1 << 20);
  const shardlab::Link base{shardlab::LinkClass::kInter, 5'000'000, 900'000'000'000, 0, {0, 0}};
  const shardlab::Link l = plan.apply(base, f.device, f.peer < 0 ? f.device + 1 : f.peer, f.step);
  if (l.bytes_per_second < 1 || l.bytes_per_second > base.bytes_per_second || l.latency < base.latency)
    finding("an applied fault made a link faster or unusable");
  if (plan.compute_scale(f.device, f.step) < 1) finding("a straggler got faster");
  if (plan.capacity(f.device, uint64_t{80} << 30) > (uint64_t{80} << 30)) finding("memory pressure added memory");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static shardlab::fuzz::MemFile file;
  const std::string text(shardlab::fuzz::as_text(data, size));
  std::vector<std::string> args;
  if (text.starts_with('[')) {
    args.push_back("@" + file.write(data, size));
  } else {
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
      args.push_back(text.substr(start, nl - start));
    args.push_back(text.substr(start));
  }
  try {
    for (const Fault& f : shardlab::parse_faults(args)) check_fault(f);
  } catch (const shardlab::ConfigError&) {
    // Not a fault spec: the expected outcome, one line naming it.
  }
  return 0;
}
