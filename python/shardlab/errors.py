"""The exceptions the commands and the cluster raise.

Each carries the one-line message the `shardlab` tool prints after
"shardlab: error: " (flag names included: "--tp 3: ..."), and maps as the
tool maps its exit codes (cli/main.cc): ConfigError and OutOfMemory are the
user's input (exit 2), DeviceFailure an injected fault (exit 3), the other
RunErrors a failed run (exit 1).
"""


class Error(Exception):
    """Anything shardlab raises."""


class ConfigError(Error, ValueError):
    """Bad input: an unknown keyword, a value out of range, a bad file."""


class OutOfMemory(ConfigError):
    """A device runs out of memory: its arena could not hold an allocation, or the
    preflight found the run cannot fit; `rank` is the device when a run found it.
    A ConfigError too (the tool's exit code 2: the input asks for too much)."""

    def __init__(self, message, rank=-1):
        super().__init__(message)
        self.rank = rank


class RunError(Error):
    """A run failed: `rank` is the first failing device (-1: none), `cause`
    the library's RunCause ("program", "folding", ...)."""

    def __init__(self, message, rank=-1, cause="program"):
        super().__init__(message)
        self.rank = rank
        self.cause = cause


class DeadlockError(RunError):
    """Every live device waits for a message no device will send."""


class DeviceFailure(RunError):
    """An injected fault (fault=...) killed a device or downed a link."""


_KINDS = {
    "config": ConfigError,
    "out_of_memory": OutOfMemory,
    "deadlock": DeadlockError,
    "device_failure": DeviceFailure,
    "run": RunError,
}


def from_outcome(outcome):
    """The exception of a failed _shardlab outcome (python/run_thread.h)."""
    kind, message = outcome["error"], outcome["message"]
    if kind == "cancelled":  # cancelled without a KeyboardInterrupt: another thread's
        return KeyboardInterrupt(message)
    cls = _KINDS[kind]
    if cls is ConfigError:
        return cls(message)
    if cls is OutOfMemory:
        return cls(message, outcome["rank"])
    return cls(message, outcome["rank"], outcome["cause"] or "program")
