"""Errors raise the exception of their kind, with the line the CLI prints."""
import numpy as np
import pytest

import shardlab
from shardlab.commands import _flag_args

from conftest import cli_error

# (kwargs of train, the exception, the CLI's exit code for it: cli/main.cc)
CASES = [
    (dict(model="tiny", steps=1, tp=3), shardlab.ConfigError, 2),
    (dict(model="tiny", steps=1, no_such_flag=1), shardlab.ConfigError, 2),
    (dict(model="tiny", steps=0), shardlab.ConfigError, 2),
    (dict(model="tiny", steps=1, memory="2MiB"), shardlab.OutOfMemory, 2),  # the preflight's estimate
    (dict(model="tiny", steps=1, memory="22MiB"), shardlab.OutOfMemory, 2),  # a device's arena, in the run
    (dict(model="tiny", steps=3, dp=2, fault="dead:1:step=1"), shardlab.DeviceFailure, 3),
]


@pytest.mark.parametrize("kwargs,exception,exit_code", CASES, ids=[c[1].__name__ + str(i) for i, c in enumerate(CASES)])
def test_error_maps_to_exception_with_cli_message(shardlab_bin, kwargs, exception, exit_code):
    with pytest.raises(exception) as info:
        shardlab.train(**kwargs)
    code, line = cli_error(_flag_args("train", kwargs))
    assert code == exit_code
    assert str(info.value) == line
    assert type(info.value) is exception and isinstance(info.value, shardlab.Error)


def test_deadlock_in_a_python_program_is_a_deadlock_error():
    def program(dev):  # everyone waits for a message from its left neighbour; nobody sends
        dev.recv((dev.rank - 1) % dev.world_size)

    with pytest.raises(shardlab.DeadlockError) as info:
        shardlab.Cluster(devices=4).run(program)
    assert "deadlock" in str(info.value) and info.value.rank == -1


def test_python_exception_on_a_device_is_a_run_error_naming_it():
    def program(dev):
        if dev.rank == 2:
            raise ValueError("bad shard")
        dev.recv((dev.rank + 1) % dev.world_size)  # torn down when device 2 fails

    with pytest.raises(shardlab.RunError) as info:
        shardlab.Cluster(devices=4).run(program)
    assert info.value.rank == 2
    assert str(info.value).startswith("device 2: ValueError: bad shard")


def test_a_mismatched_message_size_in_a_collective_is_reported():
    def program(dev):
        dev.all_reduce(np.ones(8 if dev.rank else 16, np.float32), algo="ring")

    with pytest.raises(shardlab.RunError):
        shardlab.Cluster(devices=2).run(program)


def test_a_cluster_larger_than_its_profile_is_a_config_error():
    with pytest.raises(shardlab.ConfigError) as info:
        shardlab.Cluster("a100-nvlink", devices=16, nodes=1).run(lambda dev: None)
    assert str(info.value) == "16 devices requested but profile a100-nvlink has 8 (1 node x 8)"


@pytest.mark.parametrize("kwargs, message", [
    ({"devices": "8"}, "devices='8': must be an integer (devices: 0 for every device)"),
    ({"devices": 10**12}, "devices=1000000000000: must be an integer (devices: 0 for every device)"),
    ({"devices": 2.0}, "devices=2.0: must be an integer (devices: 0 for every device)"),
    ({"devices": True}, "devices=True: must be an integer (devices: 0 for every device)"),
    ({"nodes": "2"}, "nodes='2': must be an integer (devices: 0 for every device)"),
    ({"profile": 42}, "profile=42: a built-in name or a FILE.json path"),
    ({"precision": 3}, "precision=3: fp32 or bf16"),
    ({"trace": "yes"}, "trace='yes': True or False"),
])
def test_a_cluster_argument_of_the_wrong_type_is_a_config_error(kwargs, message):
    # The native call would raise pybind11's TypeError ("incompatible function
    # arguments"): the constructor names the argument instead.
    with pytest.raises(shardlab.ConfigError) as info:
        shardlab.Cluster(**kwargs).run(lambda dev: None)
    assert str(info.value) == message


def test_running_something_other_than_a_function_is_a_config_error():
    with pytest.raises(shardlab.ConfigError) as info:
        shardlab.Cluster(devices=2).run(42)
    assert str(info.value) == "run(42): a function of one argument, the device"


def test_a_cluster_of_zero_devices_is_every_device_of_the_profile():
    run = shardlab.Cluster("a100-nvlink", devices=0, nodes=1).run(lambda dev: None)
    assert len(run.end_ps) == 8


@pytest.mark.parametrize("call, message", [
    (lambda dev: dev.isend(-1, np.ones(4, np.float32)), "dst=-1: another device's rank (0..1, not this device's 0)"),
    (lambda dev: dev.isend(9, np.ones(4, np.float32)), "dst=9: another device's rank (0..1, not this device's 0)"),
    (lambda dev: dev.isend(0, np.ones(4, np.float32)), "dst=0: another device's rank (0..1, not this device's 0)"),
    (lambda dev: dev.recv(0), "src=0: another device's rank (0..1, not this device's 0)"),
    (lambda dev: dev.compute(flops=-1.0), "compute: flops=-1: a finite number >= 0"),
    (lambda dev: dev.compute(flops=float("nan")), "compute: flops=nan: a finite number >= 0"),
    (lambda dev: dev.compute(bytes=float("inf")), "compute: bytes=inf: a finite number >= 0"),
    (lambda dev: dev.compute(flops=1e300), "a kernel of 1e+300 FLOPs and 0 bytes would take"),
    (lambda dev: dev.wait_until(-5), "wait_until: time_ps=-5: a time in [0, 1e18] ps"),
    (lambda dev: dev.wait_until(2**63 - 1), "wait_until: time_ps=9223372036854775807: a time in [0, 1e18] ps"),
    (lambda dev: dev.launch(0), "launch: group_size=0: at least 1"),
    # Arrays travel as float32: None was a NaN, complex lost its imaginary
    # part, an int64 past 2^24 was rounded, all silently.
    (lambda dev: dev.all_reduce(None), "all_reduce: array=None: a numeric array"),
    (lambda dev: dev.isend(1, None), "isend: array=None: a numeric array"),
    (lambda dev: dev.all_reduce("abc"), "all_reduce: array: a real numeric array, not dtype <U3"),
    (lambda dev: dev.all_reduce(np.ones(3, complex)), "all_reduce: array: a real numeric array, not dtype complex128"),
    (lambda dev: dev.all_reduce(np.array([1, None], dtype=object)),
     "all_reduce: array: a real numeric array, not dtype object"),
    (lambda dev: dev.isend(1, np.array([7, (1 << 24) + 1])),
     "isend: array: int64 value 16777217 is not exact in float32, the devices' dtype (integers up to 2^24 are)"),
    (lambda dev: dev.all_reduce(np.array([2**64 - 1], np.uint64)),
     "all_reduce: array: uint64 value 18446744073709551615 is not exact in float32"),
])
def test_a_bad_argument_to_a_device_is_a_run_error_naming_it(call, message):
    # These aborted the process (an internal check on the peer) or gave
    # silent garbage (NaN FLOPs took no time; 1e300 FLOPs overflowed the
    # clock to 0).
    def program(dev):
        if dev.rank == 0:
            call(dev)

    with pytest.raises(shardlab.RunError) as info:
        shardlab.Cluster(devices=2).run(program)
    assert info.value.rank == 0
    assert str(info.value).splitlines()[0].startswith("device 0: RuntimeError: " + message), str(info.value)


def test_arrays_of_other_real_dtypes_travel_as_float32():
    # float64 rounds (as torch's .float()); integers and bools exact in float32 convert.
    out = {}

    def program(dev):
        out[dev.rank] = (dev.all_reduce(np.array([0.1, 1 << 24], np.float64)),
                         dev.all_reduce(np.array([-5, 7], np.int8) * (dev.rank + 1)),
                         dev.all_reduce(np.array([True, False])),
                         dev.all_reduce(np.array([1 << 40], np.int64)),
                         dev.all_reduce([1.5, 2.5]))

    shardlab.Cluster(devices=2).run(program)
    f64, i8, b, big, lst = out[1]
    assert all(a.dtype == np.float32 for a in out[1])
    assert f64.tolist() == [np.float32(0.1) * 2, 2.0 * (1 << 24)]
    assert i8.tolist() == [-15.0, 21.0] and b.tolist() == [2.0, 0.0]
    assert big.tolist() == [2.0 * (1 << 40)] and lst.tolist() == [3.0, 5.0]
