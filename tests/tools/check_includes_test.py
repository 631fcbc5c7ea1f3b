#!/usr/bin/python3
"""tools/check_includes.py on a copy of the tree: clean, then with planted faults.

Usage: check_includes_test.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = None


def copy_tree(dest):
    """The sources and docs/architecture.md of ROOT, nothing built."""
    def ignore(d, names):
        return [n for n in names if n.startswith((".", "build"))
                or (os.path.isfile(os.path.join(d, n)) and not n.endswith((".h", ".hpp", ".cc", ".cpp", ".md")))]
    shutil.copytree(ROOT, dest, ignore=ignore)


class CheckIncludes(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check_includes_")
        self.tree = os.path.join(self.tmp, "src")
        copy_tree(self.tree)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def run_check(self, *extra):
        script = os.path.join(ROOT, "tools", "check_includes.py")
        return subprocess.run([sys.executable, script, "--root", self.tree, *extra],
                              capture_output=True, text=True)

    def write(self, rel, text):
        with open(os.path.join(self.tree, rel), "w") as f:
            f.write(text)

    def edit(self, rel, old, new):
        path = os.path.join(self.tree, rel)
        with open(path) as f:
            text = f.read()
        self.assertIn(old, text)
        with open(path, "w") as f:
            f.write(text.replace(old, new, 1))

    def test_copy_is_clean(self):
        r = self.run_check()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_planted_violation_fails(self):
        self.write("runtime/planted.cc", '#include <vector>\n#include "model/kernels.h"\n')
        r = self.run_check()
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stdout.splitlines(),
                         ["runtime/planted.cc:2: runtime may not include model (model/kernels.h)"])

    def test_sibling_parallelism_fails(self):
        self.write("model/parallel/pipeline/planted.h", '#include "model/parallel/tensor/mappings.h"\n')
        r = self.run_check()
        self.assertEqual(r.returncode, 1)
        self.assertIn("model/parallel/pipeline/planted.h:1: pipeline may not include tensor "
                      "(model/parallel/tensor/mappings.h)", r.stdout)

    def test_stale_known_violation_fails(self):
        # A known line for an include no file has (runtime/device.h uses no model header).
        self.edit("docs/architecture.md", "\nruntime           ->\n",
                  "\nruntime           ->\nknown runtime/device.h -> model/kernels.h\n")
        r = self.run_check()
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("known violation no longer exists: runtime/device.h -> model/kernels.h", r.stdout)
        self.assertEqual(len(r.stdout.splitlines()), 1, r.stdout)

    def test_file_outside_every_unit_fails(self):
        os.mkdir(os.path.join(self.tree, "engine"))
        self.write("engine/sink.h", '#include "runtime/tensor.h"\n')
        r = self.run_check()
        self.assertEqual(r.returncode, 1)
        self.assertIn("engine/sink.h:1: no unit of the include rules holds this file", r.stdout)

    def test_rule_cycle_is_a_usage_error(self):
        self.edit("docs/architecture.md", "\nruntime           ->\n", "\nruntime           -> serve\n")
        r = self.run_check()
        self.assertEqual(r.returncode, 2)
        self.assertIn("cycle", r.stderr)

    def test_missing_rules_is_a_usage_error(self):
        r = self.run_check("--rules", os.path.join(self.tree, "README.md"))
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    ROOT = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
