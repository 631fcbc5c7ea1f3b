"""Step-level progress: the library's run loop reports each finished step
(runtime/progress.h) and the package shows it (a tqdm bar, else a line on
stderr). A run of N steps reports N events, in order, with the step
records' losses and virtual times (from the run's own report)."""
import json
import sys
import types

import pytest

import shardlab
from shardlab import commands
from shardlab._native import native

STEPS = 5


def test_a_run_of_n_steps_reports_n_steps_in_order():
    events = []
    outcome = native.run_command(["train", "--model=tiny", f"--steps={STEPS}", "--json"], None,
                                 lambda *e: events.append(e))
    assert not outcome["error"], outcome["message"]
    records = shardlab.Report(json.loads(outcome["json"])).steps
    assert [e[0] for e in events] == list(range(STEPS))
    assert all(e[1] == STEPS for e in events)
    assert [e[2] for e in events] == list(records["virtual_time_s"])
    assert [e[3] for e in events] == list(records["loss"])
    # No observer is left behind: a run without one reports to nobody.
    assert not native.run_command(["train", "--model=tiny", "--steps=1", "--json"])["error"]


def test_an_exception_in_the_step_callback_cancels_the_run():
    def fail(*_):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        native.run_command(["train", "--model=tiny", "--steps=50", "--json"], None, fail)
    assert not native.run_command(["train", "--model=tiny", "--steps=1", "--json"])["error"]  # not left cancelled


def test_without_tqdm_one_line_on_stderr_counts_the_steps(monkeypatch, capfd):
    monkeypatch.setattr(commands._Progress, "AFTER_S", 0.0)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    r = shardlab.train(model="tiny", steps=STEPS)
    err = capfd.readouterr().err
    shown = [part for part in err.split("\r") if part.startswith("shardlab train: step")]
    assert [s.split(",")[0] for s in shown] == [f"shardlab train: step {k}/{STEPS}" for k in range(1, STEPS + 1)]
    assert [s.split(", ")[1] for s in shown] == [f"loss {loss:.4f}" for loss in r.steps["loss"]]
    assert err.endswith("\n")  # the line is ended


def test_with_tqdm_a_bar_of_the_steps(monkeypatch):
    bars = []

    class FakeTqdm:
        def __init__(self, desc, total=None, **kwargs):
            self.desc, self.total, self.n, self.closed, self.postfix = desc, total, 0, False, {}
            bars.append(self)

        def update(self, n):
            self.n += n

        def set_postfix(self, **kwargs):
            self.postfix = kwargs

        def close(self):
            self.closed = True

    fake = types.ModuleType("tqdm.auto")
    fake.tqdm = FakeTqdm
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", fake)
    monkeypatch.setattr(commands._Progress, "AFTER_S", 0.0)
    r = shardlab.train(model="tiny", steps=STEPS)
    steps = [b for b in bars if b.total is not None]
    assert len(steps) == 1 and steps[0].desc == "shardlab train"
    assert (steps[0].n, steps[0].total, steps[0].closed) == (STEPS, STEPS, True)
    assert steps[0].postfix["loss"] == f"{r.steps['loss'].iloc[-1]:.4f}"
