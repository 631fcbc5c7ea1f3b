"""The code labs (2, 4, 5) grade a notebook's Python functions with the C++
graders' own checks (labs/NN-*/grader.h, linked into the module): the Python
reference solution gets, line for line, the report the C++ reference solution
gets from build/bin/lab_NN_solution (lab 4's measured max |diff| aside, numpy's
float32 GEMMs round differently from the C++ kernels), and wrong Python
functions fail the checks the C++ ones fail."""
import os
import re
import subprocess

import numpy as np
import pytest

import shardlab
from shardlab import labs
from conftest import BIN, REPO

SOLUTIONS = {2: "02-ring-allreduce/ring_allreduce.py", 4: "04-tensor-parallel/tp_linear.py",
             5: "05-pipeline-schedules/schedules.py"}


def solution(lab):
    """The reference Python functions of lab `lab` (labs/solutions), as the notebook defines them."""
    namespace = {"chunk_range": labs.chunk_range, "forward_actions": labs.forward_actions,
                 "backward_actions": labs.backward_actions}
    with open(os.path.join(REPO, "labs", "solutions", SOLUTIONS[lab])) as f:
        exec(f.read(), namespace)  # noqa: S102 (the repository's own solution)
    return {name: namespace[name] for name in labs.CODE_LABS[lab]}


def cxx_report(lab):
    p = subprocess.run([os.path.join(os.path.dirname(BIN), f"lab_{lab:02d}_solution")], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def without_max_diff(report):
    return re.sub(r"max \|diff\| [0-9.e+-]+", "max |diff| X", report)


@pytest.mark.parametrize("lab", [2, 4, 5])
def test_python_solution_gets_the_cxx_solutions_report(lab, capsys):
    report = labs.grade(lab, **solution(lab))
    want = cxx_report(lab)
    assert f"lab {lab}: PASS" in report
    if lab == 4:  # measured differences: both within the grader's 1e-4
        report, want = without_max_diff(report), without_max_diff(want)
    assert report.splitlines() == want.splitlines()


def test_lab_2_a_correct_but_naive_all_reduce_fails_the_time_check(capsys):
    # Every device sends its whole buffer to every other: exact sums, but for
    # n=2 one message of S (a + S/B) instead of the ring's 2(a + S/(2B)).
    def naive(dev, data):
        others = [r for r in range(dev.world_size) if r != dev.rank]
        for r in others:
            dev.isend(r, data, 0)
        data += sum(dev.recv(r, 0) for r in others)

    with pytest.raises(AssertionError, match=r"FAIL n=2: time is 2\(n-1\)\(a \+ S/\(nB\)\) = 4\.080 us: took"):
        labs.grade(2, ring_all_reduce=naive)


def test_lab_4_a_nan_in_a_gradient_fails_as_in_cxx(capsys):
    fns = solution(4)
    column_backward = fns["column_parallel_backward"]

    def with_nan(dev, dinp, dweight, dbias, dout, inp, weight):
        column_backward(dev, dinp, dweight, dbias, dout, inp, weight)
        dbias[0] = np.nan

    fns["column_parallel_backward"] = with_nan
    with pytest.raises(AssertionError, match="rank [01] dbias: max [|]diff[|] inf .*: it holds NaN or Inf"):
        labs.grade(4, **fns)


def test_lab_4_an_extra_all_reduce_fails_the_communication_check(capsys):
    fns = solution(4)

    def forward_with_all_reduce(dev, out, inp, weight, bias):  # right values, one collective too many
        out[:] = inp @ weight.T + bias
        dev.all_reduce(np.zeros(out.shape, np.float32))

    fns["column_parallel_forward"] = forward_with_all_reduce
    with pytest.raises(AssertionError, match="column_parallel_forward communicated for [0-9.]+ us, want 0.000 us"):
        labs.grade(4, **fns)


def test_lab_5_a_deadlocking_schedule_fails_the_validator(capsys):
    fns = solution(5)

    def backwards_first(pp, m):  # every rank waits for a gradient first: no rank can start
        return [sum((labs.backward_actions(pp, r, mb) + labs.forward_actions(pp, r, mb) for mb in range(m)), [])
                for r in range(pp)]

    fns["one_f_one_b"] = backwards_first
    with pytest.raises(AssertionError, match="FAIL 1f1b pp=1 M=1: valid"):
        labs.grade(5, **fns)


def test_a_python_error_in_a_device_function_is_a_failed_check(capsys):
    def broken(dev, data):
        raise ValueError("my bug")

    with pytest.raises(AssertionError, match="FAIL n=2 count=1001: every member holds the exact sum: .*my bug"):
        labs.grade(2, ring_all_reduce=broken)


def test_the_wrong_functions_are_a_type_error():
    with pytest.raises(TypeError, match="lab 5 grades gpipe, one_f_one_b: got gpipe"):
        labs.grade(5, gpipe=lambda pp, m: [])
