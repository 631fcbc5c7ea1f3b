#!/usr/bin/python3
"""Checks that the repository paths the documents cite exist.

README.md, docs/architecture.md, bench/README.md and labs/README.md point a
reader at files (`model/engine/fold.h`, tests/collectives/rails_test.cc) and
at tests by name (`FoldingChangesNothing.FoldedEqualsUnfolded`). A path
whose first folder is one of the repository's own top-level folders must be
a file or folder of the tree; a `Suite.Name` of two CamelCase words
(a `/case` after it aside) must be a GoogleTest suite and test (TEST, TEST_F or TEST_P) of
tests/ or examples/. Paths of other projects (megatron/..., src/graph/...)
start elsewhere and are not checked.

  check_doc_paths.py [--root DIR] [DOC...]

Exit 0 when every citation resolves; else one line per stale one and exit 1.
"""
import argparse
import os
import re
import subprocess
import sys

DOCS = ["README.md", "docs/architecture.md", "bench/README.md", "labs/README.md"]
# Other projects' paths that begin with a folder name this tree also has
# (NVIDIA/Megatron-LM's examples/, NVIDIA/NeMo's and Megatron-Bridge's docs/):
# cited as sources, not files here.
EXTERNAL = ("examples/sc21/", "examples/training/", "docs/source/", "docs/performance-summary-archive.md")
TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./+-]*/[A-Za-z0-9_./+-]*")
TEST_NAME = re.compile(r"(?<![\w./])([A-Z][A-Za-z0-9]+)\.([A-Z][A-Za-z0-9_]+)(?![\w(])")
TEST_DEF = re.compile(r"\b(?:TEST|TEST_F|TEST_P)\(\s*([A-Za-z0-9_]+)\s*,\s*([A-Za-z0-9_]+)\s*\)")


def tracked(root):
    """The tree's files (git's list; outside a git checkout, the files on disk
    less the build folders) and every folder above them."""
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True)
    if out.returncode == 0:
        files = set(out.stdout.split())
    else:
        files = set()
        for here, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith(("build", "."))]
            files.update(os.path.relpath(os.path.join(here, n), root) for n in names)
    folders = set()
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            folders.add("/".join(parts[:i]))
    return files, folders


def defined_tests(root, files):
    tests = set()
    for f in files:
        if f.startswith(("tests/", "examples/", "labs/")) and f.endswith((".cc", ".h")):
            with open(os.path.join(root, f), encoding="utf-8", errors="replace") as src:
                tests.update(TEST_DEF.findall(src.read()))
    return tests


def stale_citations(root, doc, files, folders, tests):
    top = {f for f in folders if "/" not in f}
    with open(os.path.join(root, doc), encoding="utf-8") as f:
        text = f.read()
    stale = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for token in TOKEN.findall(line):
            path = token.rstrip(".,:;)")
            if path.split("/")[0] not in top or path.startswith(EXTERNAL):
                continue
            bare = path.rstrip("/")
            if bare in files or bare in folders:
                continue
            # A stem: runtime/fiber (its .h and .cc), cli/cmd_*.cc, cli/field_flags.{h,cc}, labs/NN-*.
            after = line[line.find(token) + len(token):][:1]
            stem = re.escape(bare.rstrip(".")).replace("NN", "[0-9][0-9]")  # labs/NN-*: a lab's number
            if any(re.match(stem + r"\.", f) for f in files) or (
                    after in ("*", "{") and any(re.match(stem, f) for f in files)):
                continue
            stale.append(f"{doc}:{lineno}: {path}: no such file or folder in the tree")
        for suite, name in TEST_NAME.findall(line):
            if (suite, name) not in tests:
                stale.append(f"{doc}:{lineno}: {suite}.{name}: no such test (TEST, TEST_F or TEST_P)")
    return stale


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("docs", nargs="*")
    args = parser.parse_args()
    files, folders = tracked(args.root)
    tests = defined_tests(args.root, files)
    stale = []
    for doc in args.docs or DOCS:
        stale += stale_citations(args.root, doc, files, folders, tests)
    for line in stale:
        print(line)
    if stale:
        print(f"check_doc_paths: {len(stale)} stale citation(s)", file=sys.stderr)
        return 1
    print(f"check_doc_paths: every cited path and test of {len(args.docs or DOCS)} documents exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
