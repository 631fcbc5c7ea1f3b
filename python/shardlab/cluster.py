"""The low-level API: a Python function per virtual device.

    def ring(dev):                      # runs on every device's own thread
        x = np.full(1024, dev.rank, np.float32)
        dev.isend((dev.rank + 1) % dev.world_size, x)
        y = dev.recv((dev.rank - 1) % dev.world_size)
        dev.compute(flops=2 * y.size, bytes=8 * y.size)   # Python work costs what you charge

    run = shardlab.Cluster("a100-nvlink", devices=8).run(ring)
    run.devices                         # end times per device (picoseconds and seconds)

A device (_shardlab.Device) has two streams, "compute" and "comm" (the
default of transfers), each a virtual clock: isend(dst, array, tag=0) sends
eagerly and returns when its last byte left (ps); wait_until(t) makes a
stream wait for a time; recv(src, tag=0) blocks until the message is there
and returns it as a float32 array, its stream waiting for its virtual
arrival; compute(flops=, bytes=) charges a kernel by the profile's cost
model; all_reduce(array, op="sum", algo="auto", proto="auto") is the
library's collective over every device (proto: "LL", "LL128", "Simple",
NCCL's protocols, or "plain", plain sends as isend's); launch(n) charges
NCCL's kernel launch of a collective over n devices. The GIL is released while a device waits, so the
devices interleave; a device waiting for a message nobody sends is a
DeadlockError.
"""
import json
import os

from . import errors
from ._native import native
from .report import Result, plot_timeline, trace_frame


class ClusterRun(Result):
    """What Cluster.run returns: per-device end times, the makespan, the trace (trace=True)."""

    @property
    def makespan_ps(self):
        return self.json["makespan_ps"]

    @property
    def end_ps(self):
        """Each device's end (its latest stream), in picoseconds, by rank."""
        return [d["end_ps"] for d in self.json["devices"]]

    @property
    def devices(self):
        import pandas
        return pandas.DataFrame(self.json["devices"]).set_index("rank")

    @property
    def trace(self):
        t = self.json.get("trace")
        return trace_frame(t["traceEvents"]) if t else None

    def plot_timeline(self, ax=None, devices=None):
        if self.trace is None:
            raise ValueError("no trace: build the Cluster with trace=True")
        return plot_timeline(self.trace, ax=ax, devices=devices)


class Cluster:
    """`devices` virtual GPUs of hardware profile `profile` (a built-in name or FILE.json);
    devices=0: every device of the profile (its nodes x devices per node)."""

    def __init__(self, profile="a100-nvlink", devices=8, nodes=None, precision="fp32", trace=False):
        # Checked here, so that a wrong type is the ConfigError every other bad
        # input is (the native call would raise pybind11's TypeError); the
        # ranges are the cluster's to check (devices above the profile's, nodes 0).
        for name, value in (("devices", devices), ("nodes", nodes)):
            if value is None and name == "nodes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**31:
                raise errors.ConfigError(f"{name}={value!r}: must be an integer (devices: 0 for every device)")
        if not isinstance(profile, (str, os.PathLike)):
            raise errors.ConfigError(f"profile={profile!r}: a built-in name or a FILE.json path")
        if not isinstance(precision, str):
            raise errors.ConfigError(f"precision={precision!r}: fp32 or bf16")
        if not isinstance(trace, bool):
            raise errors.ConfigError(f"trace={trace!r}: True or False")
        self.profile, self.devices, self.nodes = os.fspath(profile), devices, nodes
        self.precision, self.trace = precision, trace

    def run(self, fn):
        """Calls fn(dev) on every device's thread; returns a ClusterRun. A Python exception
        in fn is the run's RunError (the first device's), naming the device."""
        if not callable(fn):
            raise errors.ConfigError(f"run({fn!r}): a function of one argument, the device")
        outcome = native.run_cluster(self.profile, self.devices, self.nodes, self.precision, self.trace, fn)
        if outcome["error"]:
            raise errors.from_outcome(outcome)
        return ClusterRun(json.loads(outcome["json"]))
