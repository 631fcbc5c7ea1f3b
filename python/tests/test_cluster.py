"""The low-level API: a ring all-reduce written in Python over dev.isend and
dev.recv takes, on every device, the virtual time of the library's C++ ring
(collectives/ring.cc) on plain sends (proto="plain": the links' own latency
and rate, as isend's, not one of NCCL's protocols) for the same sizes, and of
the closed form of
collectives/collectives.h: launch + 2(n-1)(a + w), w = ceil(S/n * 1e12 / B) ps
on one node with uniform links."""
import numpy as np
import pytest

import shardlab

N = 8


def python_ring_all_reduce(dev, x):
    """Reduce-scatter then all-gather around the ring, one chunk per step."""
    n, me = dev.world_size, dev.rank
    chunks = [c.copy() for c in np.split(x, n)]
    right, left = (me + 1) % n, (me - 1) % n
    dev.launch(n)  # NCCL's kernel launch, as the library charges it
    last_send = 0
    for k in range(n - 1):  # chunk c's sum travels from c+1 round to c
        last_send = max(last_send, dev.isend(right, chunks[(me - k - 1) % n], tag=0))
        c = (me - k - 2) % n
        chunks[c] += dev.recv(left, tag=0)
    for k in range(n - 1):
        last_send = max(last_send, dev.isend(right, chunks[(me - k) % n], tag=1))
        chunks[(me - k - 1) % n] = dev.recv(left, tag=1)
    dev.wait_until(last_send)  # the stream covers the last send leaving
    return np.concatenate(chunks)


def closed_form_ps(buffer_bytes):
    """launch + 2(n-1)(a + w) on a100-nvlink, from its profile: w is the wire time
    of one chunk with its packet headers (runtime/link_model.h)."""
    profile = next(p for p in shardlab.profiles().json["profiles"] if p["name"] == "a100-nvlink")
    link = profile["links"]["intra"]
    chunk = buffer_bytes // N
    packet = link.get("packet", {"header_bytes": 0, "sm_payload_bytes": 0})
    payload = packet["sm_payload_bytes"]
    wire = chunk + (-(-chunk // payload) * packet["header_bytes"] if payload else 0)
    bytes_per_s = round(link["bandwidth_GBps"] * 1e9)
    w = -(-wire * 10**12 // bytes_per_s)  # ceil, in integers
    a = round(link["latency_us"] * 1e6)
    launch = round(profile["device"]["collective_launch_us"] * 1e6)
    return launch + 2 * (N - 1) * (a + w)


def inputs(rank, count):
    return (np.arange(count, dtype=np.float32) % 7) + rank


@pytest.mark.parametrize("count", [8, 1024, 1 << 18])
def test_python_ring_takes_the_cpp_rings_virtual_time(count):
    results = {}

    def mine(dev):
        results[dev.rank] = python_ring_all_reduce(dev, inputs(dev.rank, count))

    def library(dev):
        dev.all_reduce(inputs(dev.rank, count), algo="ring", proto="plain")

    py_run = shardlab.Cluster("a100-nvlink", devices=N).run(mine)
    cpp_run = shardlab.Cluster("a100-nvlink", devices=N).run(library)
    assert py_run.end_ps == cpp_run.end_ps

    expected = closed_form_ps(count * 4)
    print(f"count {count}: python ring {py_run.makespan_ps} ps, C++ ring {cpp_run.makespan_ps} ps, "
          f"closed form {expected} ps")
    assert py_run.end_ps == [expected] * N

    want = sum(inputs(r, count) for r in range(N))  # small integers: exact in float32
    for r in range(N):
        assert np.array_equal(results[r], want)


def test_compute_charges_the_cost_model_and_python_work_is_free():
    def program(dev):
        sum(range(100000))  # Python work: no virtual time
        if dev.rank == 0:
            dev.compute(flops=1e12)

    run = shardlab.Cluster(devices=2).run(program)
    assert run.end_ps[1] == 0
    assert run.end_ps[0] > 0


def test_timeline_of_a_traced_run_has_the_ring_steps():
    run = shardlab.Cluster(devices=4, trace=True).run(lambda dev: python_ring_all_reduce(dev, inputs(dev.rank, 64)))
    t = run.trace
    assert set(t["device"]) == {0, 1, 2, 3}
    ax = run.plot_timeline()
    assert len(ax.get_yticks()) == t.groupby(["device", "stream"]).ngroups


def test_nvls_all_reduce_from_python_takes_the_switch_traffic_at_its_rate():
    """NVLink SHARP (collectives/nvls.cc) on a DGX H100 node, from Python: 2^20
    floats, each of the 2(n-1) messages a member sends charged ceil(count(n+1)
    / (2n(n-1))) elements at nvls_efficiency x the NVLink rate, under Simple:
    launch + Simple's base + 2 (Simple's NVLink hop + (n-1) w), by hand from the
    profile's JSON. A100 (no NVLink SHARP) refuses it with the error's line."""
    count = 1 << 20
    profile = next(p for p in shardlab.profiles().json["profiles"] if p["name"] == "h100-nvlink")
    link, simple = profile["links"]["intra"], profile["protocols"]["Simple"]
    x = -(-count * (N + 1) // (2 * N * (N - 1)))  # elements a message is charged
    wire = 4 * x + -(-4 * x // link["packet"]["sm_payload_bytes"]) * link["packet"]["header_bytes"]
    rate = int(round(link["bandwidth_GBps"] * 1e9) * link["nvls_efficiency"])
    w = -(-wire * 10**12 // rate)
    start = round((profile["device"]["collective_launch_us"] + simple["base_latency_us"]) * 1e6)
    expected = start + 2 * (round(simple["intra"]["hop_latency_us"] * 1e6) + (N - 1) * w)
    results = {}

    def program(dev):
        results[dev.rank] = dev.all_reduce(inputs(dev.rank, count), algo="nvls")

    run = shardlab.Cluster("h100-nvlink", devices=N).run(program)
    print(f"nvls all_reduce of {count} floats on 8 H100: {run.makespan_ps} ps, by hand {expected} ps")
    assert run.makespan_ps == expected
    want = sum(inputs(r, count) for r in range(N))
    for r in range(N):
        assert np.array_equal(results[r], want)
    with pytest.raises(Exception, match="NVLink SHARP"):
        shardlab.Cluster("a100-nvlink", devices=N).run(
            lambda dev: dev.all_reduce(inputs(dev.rank, 64), algo="nvls"))
