"""Results: the JSON value of a command with pandas views and matplotlib plots.

pandas and matplotlib are imported when a view or a plot is asked for, so
`import shardlab` and `.json` work without them.
"""
import json

STREAMS = {0: "compute", 1: "comm", 2: "pipeline", 3: "tp-comm", 4: "cp-comm"}


def _pandas():
    import pandas  # python3-pandas (make python-deps)
    return pandas


def _pyplot():
    import matplotlib.pyplot as plt  # python3-matplotlib (make python-deps); headless: Agg
    return plt


class Summary(dict):
    """A dict that prints one `name: value` per line."""

    def __str__(self):
        width = max((len(k) for k in self), default=0)
        return "\n".join(f"{k:<{width}}  {v:.6g}" if isinstance(v, float) else f"{k:<{width}}  {v}"
                         for k, v in self.items())


class Result:
    """A command's --json value: `.json`, and `result["key"]` for its fields."""

    def __init__(self, value, passed=True):
        self.json = value
        self.passed = passed

    def __getitem__(self, key):
        return self.json[key]

    def __contains__(self, key):
        return key in self.json

    def keys(self):
        return self.json.keys()

    @property
    def summary(self):
        return Summary(self.json.get("summary", {}))

    def __repr__(self):
        return f"<shardlab {type(self).__name__}: {', '.join(self.json)}>"


class Table(Result):
    """A result whose `key` holds one row per item; `.table` is a DataFrame (nested fields flattened)."""

    def __init__(self, value, key, passed=True):
        super().__init__(value, passed)
        self._key = key

    @property
    def table(self):
        return _pandas().json_normalize(self.json[self._key])


class Report(Result):
    """`shardlab train`'s report: summary, per-device table, memory by kind, steps, timeline."""

    def __init__(self, value, trace=None, passed=True):
        super().__init__(value, passed)
        self.trace = trace  # a DataFrame of trace events (train(trace=True)), or None

    @property
    def steps(self):
        """One row per step: loss, lr, grad norm, virtual time (step records)."""
        return _pandas().DataFrame(self.json["steps"]).set_index("step")

    @property
    def devices(self):
        """One row per device: mesh position, compute, exposed comm and idle time, peak memory."""
        rows = [{k: v for k, v in d.items() if not isinstance(v, dict)} for d in self.json["devices"]]
        return _pandas().DataFrame(rows).set_index("rank")

    @property
    def memory(self):
        """Peak bytes by kind (param, grad, master, optimizer, activation, ...), one row per device."""
        rows = {d["rank"]: d["peak_bytes_by_kind"] for d in self.json["devices"]}
        return _pandas().DataFrame.from_dict(rows, orient="index").rename_axis("rank")

    def plot_timeline(self, ax=None, devices=None):
        """The trace's events per device and stream against virtual time (train(trace=True))."""
        if self.trace is None:
            raise ValueError("no trace: run with trace=True to plot the timeline")
        return plot_timeline(self.trace, ax=ax, devices=devices)


class Sweep(Result):
    """`shardlab sweep`: `.points` has one row per point: its settings, metrics and error."""

    @property
    def points(self):
        rows = []
        for p in self.json["points"]:
            row = dict(p["config"])
            row.update(p.get("metrics", {}))
            row["error"] = p.get("error")
            rows.append(row)
        return _pandas().DataFrame(rows)

    def plot(self, metric=None, x=None, ax=None, logy=False):
        """`metric` (default: the first) against axis `x` (default: the first; an axis
        setting several flags is plotted against its first), one line per setting of
        the other axes; failed points are left out."""
        plt = _pyplot()
        metric = metric or self.json["metrics"][0]
        flags = {a["name"]: a["flags"] for a in self.json["axes"]}
        x = x or self.json["axes"][0]["name"]
        x_col = flags[x][0] if x in flags else x
        others = [f for name, fs in flags.items() if name != x for f in fs]
        df = self.points[self.points["error"].isna()]
        if ax is None:
            _, ax = plt.subplots()
        by = others[0] if len(others) == 1 else others
        groups = df.groupby(by, sort=False) if others else [((), df)]
        for key, g in groups:
            key = key if isinstance(key, tuple) else (key,)
            label = ", ".join(f"{f}={v}" for f, v in zip(others, key)) or metric
            try:
                xs = _pandas().to_numeric(g[x_col])
            except ValueError:  # profile names and other words: one tick each
                xs = g[x_col]
            ax.plot(xs, g[metric], marker="o", label=label)
        ax.set_xlabel(x_col)
        ax.set_ylabel(metric)
        if logy:
            ax.set_yscale("log")
        if others:
            ax.legend()
        return ax


def read_trace(path):
    """A Chrome trace file (--trace) as a DataFrame: device, stream, name, start_us, dur_us."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return trace_frame(events)


def trace_frame(events):
    rows = [{"device": e["pid"], "stream": STREAMS.get(e["tid"], str(e["tid"])), "name": e["name"],
             "start_us": e["ts"], "dur_us": e["dur"]} for e in events if e.get("ph") == "X"]
    return _pandas().DataFrame(rows, columns=["device", "stream", "name", "start_us", "dur_us"])


def plot_timeline(trace, ax=None, devices=None):
    """One row per device and stream, a bar per event, coloured by its name's first word."""
    plt = _pyplot()
    if devices is not None:
        trace = trace[trace["device"].isin(devices)]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.4 * max(2, trace.groupby(["device", "stream"]).ngroups)))
    rows = sorted(trace.groupby(["device", "stream"]).groups)
    kinds = sorted({n.split(".")[0].split(" ")[0] for n in trace["name"]})
    colours = {k: plt.cm.tab20(i % 20) for i, k in enumerate(kinds)}
    for y, (dev, stream) in enumerate(rows):
        ev = trace[(trace["device"] == dev) & (trace["stream"] == stream)]
        ax.broken_barh(list(zip(ev["start_us"], ev["dur_us"])), (y - 0.4, 0.8),
                       facecolors=[colours[n.split(".")[0].split(" ")[0]] for n in ev["name"]])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"GPU {d} {s}" for d, s in rows])
    ax.invert_yaxis()
    ax.set_xlabel("virtual time (us)")
    return ax
