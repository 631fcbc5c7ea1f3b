"""Every lab notebook (labs/NN-*/lab.ipynb) executes headless (`jupyter
nbconvert --execute`) with the reference answers (labs/solutions/NN-*/answers.txt)
in its answers cell and passes the lab's grader; on its skeleton answers its
grading cell fails. The seed notebooks (labs/seeds) execute and their checks hold."""
import glob
import os
import subprocess
import sys

import nbformat
import pytest

from conftest import REPO

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "labs", "*", "lab.ipynb")))


def execute(nb, path):
    """Writes `nb` to `path` and runs `jupyter nbconvert --execute` on it: (exit code, output)."""
    nbformat.write(nb, path)
    # The kernel runs in the notebook's folder: the package by its absolute path.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                        "--ExecutePreprocessor.timeout=600", path], capture_output=True, text=True, check=False, env=env)
    return p.returncode, p.stderr, nbformat.read(path, as_version=4)


def tagged(nb, tag):
    cells = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"one cell tagged {tag}"
    return cells[0]


def outputs(cell):
    return "".join(o.get("text", "") + "".join(o.get("traceback", [])) for o in cell.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(os.path.dirname(p)) for p in NOTEBOOKS])
def test_notebook_passes_with_the_reference_answers(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    lab = os.path.basename(os.path.dirname(path))
    solution = os.path.join(REPO, "labs", "solutions", lab, "answers.txt")
    tagged(nb, "answers").source = f"answers = shardlab.labs.read_answers({solution!r})"
    code, err, done = execute(nb, str(tmp_path / "lab.ipynb"))
    assert code == 0, err[-3000:]
    assert f"lab {int(lab[:2])}: PASS" in outputs(tagged(done, "grade"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(os.path.dirname(p)) for p in NOTEBOOKS])
def test_notebook_grading_fails_on_the_skeleton(path, capsys):
    # The setup, the untouched answers and the grading cell, run here as the
    # kernel would run them (a kernel per notebook is the other test's cost).
    nb = nbformat.read(path, as_version=4)
    namespace = {}
    for cell in (nb.cells[1], tagged(nb, "answers")):
        exec(cell.source, namespace)  # noqa: S102 (the repository's own notebook)
    with pytest.raises(AssertionError, match="still TODO"):
        exec(tagged(nb, "grade").source, namespace)  # noqa: S102

SEEDS = sorted(glob.glob(os.path.join(REPO, "labs", "seeds", "*.ipynb")))


@pytest.mark.parametrize("path", SEEDS, ids=[os.path.basename(p) for p in SEEDS])
def test_seed_notebook_executes_and_its_checks_hold(path, tmp_path):
    code, err, _ = execute(nbformat.read(path, as_version=4), str(tmp_path / "seed.ipynb"))
    assert code == 0, err[-3000:]
