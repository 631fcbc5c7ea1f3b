#!/usr/bin/python3
"""tools/check_doc_paths.py fails on planted stale citations and passes the
forms the documents use: a file, a folder, a stem (runtime/fiber,
cli/cmd_*.cc, cli/field_flags.{h,cc}, labs/NN-*), another project's path
and a test with its case.

  check_doc_paths_test.py ROOT
"""
import os
import subprocess
import sys
import tempfile

GOOD = """\
model/engine/fold.h and tests/collectives/ and runtime/fiber, cli/cmd_*.cc,
cli/field_flags.{h,cc}, labs/NN-*/lab.ipynb; Megatron-LM's examples/sc21/run_table_1.sh;
`Failures.EachErrorKindIsItsCause` and FoldingChangesNothing.FoldedEqualsUnfolded/pp2_dp2.
"""
STALE = [
    ("model/train/no_such_file.cc", "model/train/no_such_file.cc: no such file or folder"),
    ("tests/nowhere/", "tests/nowhere/: no such file or folder"),
    ("`Failures.NoSuchTest`", "Failures.NoSuchTest: no such test"),
]


def check(root, text):
    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as doc:
        doc.write(text)
    try:
        tool = os.path.join(root, "tools", "check_doc_paths.py")
        return subprocess.run([sys.executable, tool, "--root", root, doc.name], capture_output=True, text=True)
    finally:
        os.unlink(doc.name)


def main():
    root = sys.argv[1]
    failures = []
    r = check(root, GOOD)
    if r.returncode != 0:
        failures.append(f"the good citations were refused:\n{r.stdout}{r.stderr}")
    for cited, expected in STALE:
        r = check(root, GOOD + f"Stale: {cited}.\n")
        if r.returncode != 1 or expected not in r.stdout:
            failures.append(f"{cited}: exit {r.returncode}, expected 1 and '{expected}':\n{r.stdout}{r.stderr}")
    for f in failures:
        print(f)
    print(f"check_doc_paths_test: {1 + len(STALE) - len(failures)} of {1 + len(STALE)} cases as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
