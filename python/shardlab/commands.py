"""The commands of the `shardlab` tool as functions.

A keyword argument is the flag of the same name (`micro_batches=4` is
`--micro-batches 4`, `sp=True` is `--sp`, `prefetch=False` is
`--no-prefetch`, a list repeats the flag); the
tool's own flag tables parse and check them (python/bindings.cc), so the
names, defaults and errors are the tool's (`shardlab train --help`). Each
function returns the value `shardlab CMD --json` prints, wrapped with
pandas views.
"""
import functools
import json
import os
import sys
import tempfile
import time

from . import errors
from ._native import native
from .report import Report, Result, Sweep, Table, read_trace


@functools.lru_cache(maxsize=None)
def _flag_kinds(command):
    """{"--sp": True, "--no-prefetch": False, "--tp": None, ...}: the tool's own table (python/bindings.cc)."""
    try:
        return dict(native.flag_kinds(command))
    except Exception:  # not a command: the tool says so when it parses
        return {}


def _is_bool(value):
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool too


def _flag_args(command, kwargs):
    """The tool's arguments for keyword arguments. A switch takes True or
    False: False is its negation where the tool has one (`prefetch=False` is
    `--no-prefetch`, `tie_embeddings=False` is `--no-tie-embeddings`), else
    the default (nothing passed); a flag with a value refuses a bool; None is
    the default."""
    kinds = _flag_kinds(command)
    args = [command]
    for name, value in kwargs.items():
        if name == "json":
            raise errors.ConfigError("json: every result is the --json value already")
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        kind = kinds.get(flag, "unknown")  # unknown: the tool's parser names it
        if kind is True or kind is False:  # a switch, or a switch's negation
            if not _is_bool(value):
                raise errors.ConfigError(f"{name}={value!r}: {flag} is a switch: True or False")
            if bool(value):
                args.append(flag)
                continue
            # False: the opposite switch where there is one, else the default.
            opposite = "--no-" + flag[2:] if kind else "--" + flag[len("--no-"):]
            if kinds.get(opposite) is (not kind):
                args.append(opposite)
            continue
        if kind is None and _is_bool(value):
            raise errors.ConfigError(f"{name}={value!r}: {flag} takes a value, not True or False")
        if value is True:
            args.append(flag)
        elif value is False:
            continue
        elif isinstance(value, (list, tuple)):
            args += [f"{flag}={v}" for v in value]
        else:
            args.append(f"{flag}={value}")
    return args + ["--json"]


class _Progress:
    """A run longer than a few seconds shows its progress: the steps done, as
    the library's run loop reports each finished one (runtime/progress.h), or
    before the first step (or for a command without steps) the seconds it has
    run; a tqdm bar when tqdm is installed, else one line on stderr rewritten
    in place. (The commands' own progress is their text output, which --json
    turns off; the `shardlab` tool itself is unchanged.)"""

    AFTER_S = 3.0

    def __init__(self, command):
        self.command, self.start = command, time.monotonic()
        self.bar, self.kind, self.line = None, None, False  # a tqdm bar and what it counts; a stderr line shown

    def _due(self):
        return time.monotonic() - self.start >= self.AFTER_S

    def _bar(self, kind, **kwargs):
        """The tqdm bar counting `kind` ("seconds" or "steps"), made on first use; None without tqdm."""
        if self.kind != kind:
            if self.bar:
                self.bar.close()
            self.bar, self.kind = None, kind
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(desc=f"shardlab {self.command}", **kwargs)
            except ImportError:
                pass
        return self.bar

    def _print(self, text):
        print(f"\rshardlab {self.command}: {text}", end="", file=sys.stderr, flush=True)
        self.line = True

    def __call__(self, seconds):
        """About once a second while the run has reported no step."""
        if self.kind == "steps" or not self._due():
            return
        bar = self._bar("seconds", unit="s", bar_format="{desc}: {elapsed} running")
        if bar:
            bar.update(seconds - bar.n)
        else:
            self._print(f"running, {seconds:.0f} s")

    def step(self, step, steps, virtual_s, loss):
        """Each finished step, in order (step 0-based)."""
        if not self._due():
            return
        bar = self._bar("steps", total=steps, unit="step")
        if bar:
            bar.update(step + 1 - bar.n)
            bar.set_postfix(loss=f"{loss:.4f}", virtual=f"{virtual_s:.3f} s")
        else:
            self._print(f"step {step + 1}/{steps}, loss {loss:.4f}, virtual {virtual_s:.6f} s")

    def close(self):
        if self.bar:
            self.bar.close()
        elif self.line:
            print(file=sys.stderr)


def run(command, **kwargs):
    """Runs `shardlab COMMAND --flags... --json`; returns (exit code, its JSON value)."""
    progress = _Progress(command) if command != "sweep" else None  # a sweep prints its own
    try:
        outcome = native.run_command(_flag_args(command, kwargs), progress, progress.step if progress else None)
    finally:
        if progress:
            progress.close()
    if outcome["error"]:
        raise errors.from_outcome(outcome)
    value = json.loads(outcome["json"]) if outcome["json"] is not None else None
    return outcome["code"], value


def _with_trace(command, kwargs):
    """Runs with trace=True turned into a temporary --trace file, read back as events."""
    if kwargs.get("trace") is not True:
        code, value = run(command, **kwargs)
        return code, value, None
    with tempfile.TemporaryDirectory(prefix="shardlab-") as tmp:
        path = os.path.join(tmp, "trace.json")
        code, value = run(command, **{**kwargs, "trace": path})
        return code, value, read_trace(path)


def train(**kwargs):
    """`shardlab train`: a Report (summary, devices, memory, steps; trace=True for plot_timeline).
    `.passed` is the tool's exit code 0: False when the data-parallel copies of
    the parameters end apart (`report["replicas"]`)."""
    code, value, trace = _with_trace("train", kwargs)
    return Report(value, trace, passed=code == 0)


def verify(**kwargs):
    """`shardlab verify`: the comparison; `.passed` is the tool's exit code 0."""
    code, value = run("verify", **kwargs)
    return Result(value, passed=code == 0)


def collectives(**kwargs):
    """`shardlab collectives`: the nccl-tests table, one row per size (`.table`)."""
    code, value = run("collectives", **kwargs)
    return Table(value, "rows", passed=code == 0)


def p2p(**kwargs):
    """`shardlab p2p`: point-to-point bandwidth between two devices."""
    _, value = run("p2p", **kwargs)
    return Result(value)


def sweep(vary, out=None, **kwargs):
    """`shardlab sweep`: `vary` is {"tp": [1, 2, 4]} (axes in order) or the
    tool's strings ["tp=1,2,4"]; the points as a DataFrame (`.points`)."""
    if isinstance(vary, dict):
        vary = [f"{name}={','.join(str(v) for v in values)}" for name, values in vary.items()]
    elif isinstance(vary, str):
        vary = [vary]
    if out is not None:
        return Sweep(run("sweep", vary=vary, out=out, **kwargs)[1])
    with tempfile.TemporaryDirectory(prefix="shardlab-sweep-") as tmp:
        return Sweep(run("sweep", vary=vary, out=tmp, **kwargs)[1])


def generate(**kwargs):
    """`shardlab generate`: tokens, TTFT, TPOT and the KV cache per device."""
    _, value = run("generate", **kwargs)
    return Result(value)


def serve(**kwargs):
    """`shardlab serve`: the serving simulation's summary (latency percentiles, throughput)."""
    _, value = run("serve", **kwargs)
    return Result(value)


def profiles():
    """The built-in hardware profiles (`shardlab profiles --json`), one row each."""
    return Table({"profiles": run("profiles")[1]}, "profiles")
