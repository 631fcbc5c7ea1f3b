"""The labs' notebooks (labs/NN-*/lab.ipynb) grade with the labs' own graders:
grade(N, answers) writes the answers in the answers.txt form and runs
build/bin/lab_NN on them, the program `make lab-N` runs (labs/README.md).
The graders are built with the rest of the tree (`make build`, or
`make lab-N` once)."""
import os
import subprocess
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

TODO = None  # an answer still to give: the grader stops at it


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


def grade(lab, answers):
    """Runs lab `lab`'s grader on `answers` ({key: value}); prints its report and
    raises AssertionError with its FAIL line unless it ends with `lab N: PASS`."""
    with tempfile.TemporaryDirectory(prefix="shardlab-lab-") as tmp:
        path = os.path.join(tmp, "answers.txt")
        with open(path, "w") as f:
            f.writelines(f"{k} = {'TODO' if v is None else v}\n" for k, v in answers.items())
        p = subprocess.run([grader(lab), path], capture_output=True, text=True, check=False)
    print(p.stdout, end="")
    if p.returncode != 0:
        fails = [line for line in (p.stdout + p.stderr).splitlines() if "FAIL" in line or "error" in line]
        raise AssertionError(fails[0] if fails else f"lab {lab}: the grader exited {p.returncode}")
    return p.stdout
