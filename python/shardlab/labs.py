"""The labs' notebooks (labs/NN-*/lab.ipynb) grade with the labs' own graders.

An answers lab (1, 3, 6, 7, 8): grade(N, answers) writes the answers in the
answers.txt form and runs build/bin/lab_NN on them, the program `make lab-N`
runs (labs/README.md). The graders are built with the rest of the tree
(`make build`, or `make lab-N` once).

A code lab (2, 4, 5): grade(N, name=function, ...) hands the learner's
Python functions to the checks `make lab-N` runs on the C++ exercise
(labs/NN-*/grader.h, linked into the module): one grader for both forms.
    lab 2: ring_all_reduce(dev, data)
    lab 4: column_parallel_forward(dev, out, inp, weight, bias),
           column_parallel_backward(dev, dinp, dweight, dbias, dout, inp, weight),
           row_parallel_forward and row_parallel_backward (the same arguments)
    lab 5: gpipe(pp, micro_batches), one_f_one_b(pp, micro_batches)
`dev` is a shardlab.Cluster device (isend, recv, all_reduce over the lab's
group); the arrays are views of the grader's buffers, valid during the call.
"""
import json
import os
import subprocess
import tempfile

from . import errors
from ._native import native

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

TODO = None  # an answer still to give: the grader stops at it

# Lab 5's building blocks and lab 2's chunks, from the C++ the exercises use.
Action, ActionKind = native.Action, native.ActionKind
forward_actions, backward_actions, chunk_range = native.forward_actions, native.backward_actions, native.chunk_range

# The functions each code lab grades, in the grader's order.
CODE_LABS = {
    2: ("ring_all_reduce",),
    4: ("column_parallel_forward", "column_parallel_backward", "row_parallel_forward", "row_parallel_backward"),
    5: ("gpipe", "one_f_one_b"),
}


def grader(lab):
    """The path of lab `lab`'s grader."""
    bin_dir = os.path.dirname(os.environ.get("SHARDLAB_BIN", os.path.join(REPO, "build", "bin", "shardlab")))
    path = os.path.join(bin_dir, f"lab_{lab:02d}")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{path}: build the grader first: make lab-{lab} (or make build)")
    return path


def read_answers(path):
    """An answers.txt file as a dict, in its order (comments and TODO as None)."""
    answers = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                key, value = (s.strip() for s in line.split("=", 1))
                answers[key] = None if value == "TODO" else value
    return answers


def _verdict(lab, code, report, stderr=""):
    """Prints the grader's report; raises AssertionError with its first FAIL line unless it passed."""
    print(report, end="")
    if code != 0:
        fails = [line.strip() for line in (report + stderr).splitlines() if "FAIL" in line or "error" in line]
        raise AssertionError(fails[0] if fails else f"lab {lab}: the grader exited {code}")
    return report


def _grade_code(lab, functions):
    names = CODE_LABS[lab]
    if set(functions) != set(names):
        raise TypeError(f"lab {lab} grades {', '.join(names)}: got {', '.join(functions) or 'nothing'}")
    outcome = getattr(native, f"grade_lab_{lab:02d}")(**functions)
    if outcome["error"]:
        raise errors.from_outcome(outcome)
    return _verdict(lab, outcome["code"], json.loads(outcome["json"])["report"])


def grade(lab, answers=None, **functions):
    """Grades lab `lab`: an answers lab on `answers` ({key: value}), a code lab
    on its functions (grade(2, ring_all_reduce=f)). Prints the grader's report
    and raises AssertionError with its FAIL line unless it ends `lab N: PASS`."""
    if lab in CODE_LABS:
        return _grade_code(lab, functions)
    with tempfile.TemporaryDirectory(prefix="shardlab-lab-") as tmp:
        path = os.path.join(tmp, "answers.txt")
        with open(path, "w") as f:
            f.writelines(f"{k} = {'TODO' if v is None else v}\n" for k, v in answers.items())
        p = subprocess.run([grader(lab), path], capture_output=True, text=True, check=False)
    return _verdict(lab, p.returncode, p.stdout, p.stderr)
