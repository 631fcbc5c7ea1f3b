"""The matplotlib views draw what the results hold (Agg backend, no display)."""
import matplotlib

matplotlib.use("Agg")

import shardlab  # noqa: E402


def test_plot_timeline_draws_every_device_and_stream_of_the_trace():
    r = shardlab.train(model="tiny", steps=1, pp=2, micro_batches=2, trace=True)
    rows = r.trace.groupby(["device", "stream"]).ngroups
    ax = r.plot_timeline()
    assert len(ax.get_yticklabels()) == rows
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == len(r.trace)


def test_sweep_plot_draws_a_line_per_value_of_the_other_axis():
    s = shardlab.sweep({"tp": [1, 2], "pp": [1, 2]}, model="tiny", steps=1, jobs=1)
    ax = s.plot("virtual_step_s")
    assert len(ax.get_lines()) == 2
    for line in ax.get_lines():
        assert len(line.get_xdata()) == 2
