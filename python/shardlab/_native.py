"""Finds the C++ half, _shardlab, which `make python` builds into build/python."""
import os
import sys

try:
    import _shardlab as native  # on sys.path: PYTHONPATH, or the .pth `make python` writes
except ImportError:
    _build = os.path.join(os.path.dirname(__file__), "..", "..", "build", "python")
    sys.path.append(os.path.abspath(_build))
    try:
        import _shardlab as native
    except ImportError as e:
        raise ImportError(
            "shardlab: the C++ module _shardlab is not built: run `make python` in the repository "
            "(it builds build/python/_shardlab*.so for /usr/bin/python3)") from e

__all__ = ["native"]
