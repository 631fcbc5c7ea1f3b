"""Shared helpers: the `shardlab` tool next to the module, and the host fields
(wall-clock measurements, different on every run) left out of comparisons."""
import json
import os
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("SHARDLAB_BIN", os.path.join(REPO, "build", "bin", "shardlab"))


def without_host_fields(value):
    """`value` without the keys host_* and wall_s, at any depth."""
    if isinstance(value, dict):
        return {k: without_host_fields(v) for k, v in value.items() if not (k.startswith("host_") or k == "wall_s")}
    if isinstance(value, list):
        return [without_host_fields(v) for v in value]
    return value


def cli_json(args):
    """`shardlab ARGS` (ending in --json): its exit code and its JSON value."""
    p = subprocess.run([BIN] + args, capture_output=True, text=True, check=False)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def cli_error(args):
    """`shardlab ARGS` that fails: its exit code and its error line (without "shardlab: error: ")."""
    p = subprocess.run([BIN] + args, capture_output=True, text=True, check=False)
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("shardlab: error: "), p.stderr
    return p.returncode, line[len("shardlab: error: "):]


@pytest.fixture(scope="session")
def shardlab_bin():
    assert os.access(BIN, os.X_OK), f"{BIN}: build it first (make python)"
    return BIN
