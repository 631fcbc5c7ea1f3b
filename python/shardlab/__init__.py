"""shardlab: a GPU training cluster emulated on CPU threads, from Python.

    import shardlab
    r = shardlab.train(model="tiny", steps=3, tp=2)
    print(r.summary)          # the summary of `shardlab train --json`
    r.steps                   # a pandas DataFrame of the step records

The functions are the `shardlab` tool's commands, keyword arguments its flags
(shardlab.commands). shardlab.Cluster runs a Python function per virtual
device (shardlab.cluster). Debian's python3 packages (numpy, pandas,
matplotlib) import under /usr/bin/python3.
"""
from .cluster import Cluster, ClusterRun
from .commands import collectives, generate, p2p, profiles, run, serve, sweep, train, verify
from .errors import ConfigError, DeadlockError, DeviceFailure, Error, OutOfMemory, RunError
from .report import Report, Result, Sweep, Table, plot_timeline, read_trace
from . import labs

__all__ = [
    "Cluster", "ClusterRun", "ConfigError", "DeadlockError", "DeviceFailure", "Error", "OutOfMemory", "Report",
    "Result", "RunError", "Sweep", "Table", "collectives", "generate", "p2p", "plot_timeline", "profiles",
    "labs", "read_trace", "run", "serve", "sweep", "train", "verify",
]
