#!/usr/bin/python3
"""Checks which folder may include which (docs/architecture.md, "Include rules").

Reads the ```include-rules block of the architecture document and every
quoted #include of the tree's C++ sources. Prints one line per violation:
a file including a layer its layer may not use, a file or an include the
rules do not cover, or a known violation that no longer exists (so the
list cannot go stale).

Usage: check_includes.py [--root DIR] [--rules FILE]
  --root   the source tree (default: the folder above this script's)
  --rules  the Markdown file holding the block (default: ROOT/docs/architecture.md)
Exit status: 0 clean, 1 violations, 2 usage or rules errors.
"""
import argparse
import fnmatch
import os
import re
import sys

SOURCE_EXTS = (".h", ".hpp", ".cc", ".cpp")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
FENCE = "```include-rules"


class RulesError(Exception):
    pass


class Rules:
    def __init__(self):
        self.units = []        # (name, [patterns]) in declaration order: the first match wins
        self.allowed = {}      # unit -> the units it names after "->"
        self.search = [""]     # folders (relative to root) quoted includes resolve against
        self.known = {}        # (file, header) -> line of the rules file

    def unit_of(self, path):
        for name, patterns in self.units:
            for p in patterns:
                if p.endswith("/**"):
                    if path.startswith(p[:-2]):
                        return name
                elif p.endswith("/"):
                    if os.path.dirname(path) + "/" == p:
                        return name
                elif fnmatch.fnmatchcase(path, p) and path.count("/") == p.count("/"):
                    return name
        return None

    def reachable(self, unit):
        """The units `unit` may include: itself and, transitively, those it names."""
        seen, todo = {unit}, [unit]
        while todo:
            for nxt in self.allowed.get(todo.pop(), []):
                if nxt == "*":
                    return None  # anything
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen


def parse_rules(path, shown):
    """The rules of the block in `path`; messages name it `shown`."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise RulesError(f"{shown}: {e.strerror}")
    starts = [i for i, l in enumerate(lines) if l.strip() == FENCE]
    if len(starts) != 1:
        raise RulesError(f"{shown}: expected one {FENCE} block, found {len(starts)}")
    rules = Rules()
    i = starts[0] + 1
    while i < len(lines) and lines[i].strip() != "```":
        where = f"{shown}:{i + 1}"
        text = lines[i].split("#", 1)[0].split()
        i += 1
        if not text:
            continue
        if text[0] == "unit" and len(text) >= 3:
            if any(text[1] == n for n, _ in rules.units):
                raise RulesError(f"{where}: unit {text[1]} declared twice")
            rules.units.append((text[1], text[2:]))
        elif text[0] == "search" and len(text) >= 2:
            rules.search += [d.rstrip("/") + "/" for d in text[1:]]
        elif text[0] == "known" and len(text) == 4 and text[2] == "->":
            if (text[1], text[3]) in rules.known:
                raise RulesError(f"{where}: known violation listed twice")
            rules.known[(text[1], text[3])] = where
        elif len(text) >= 2 and text[1] == "->":
            if text[0] in rules.allowed:
                raise RulesError(f"{where}: a second rule for {text[0]}")
            rules.allowed[text[0]] = text[2:]
        else:
            raise RulesError(f"{where}: cannot parse: {' '.join(text)}")
    if i == len(lines):
        raise RulesError(f"{shown}: the {FENCE} block is not closed")
    names = {n for n, _ in rules.units}
    for unit, targets in rules.allowed.items():
        for t in [unit] + targets:
            if t != "*" and t not in names:
                raise RulesError(f"{shown}: rule names an undeclared unit: {t}")
    for name in names - rules.allowed.keys():
        raise RulesError(f"{shown}: unit {name} has no rule (write `{name} ->` for none)")
    for unit in rules.allowed:  # layers, not a knot: no unit may reach one that reaches it
        reach = rules.reachable(unit)
        for other in (reach or set()) - {unit}:
            back = rules.reachable(other)
            if back is None or unit in back:
                raise RulesError(f"{shown}: the rules form a cycle: {unit} and {other}")
    return rules


def sources(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith((".", "build")))
        for name in sorted(files):
            if name.endswith(SOURCE_EXTS):
                yield os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")


def resolve(root, rules, src, header):
    """The tree path a quoted include names, as the compiler finds it, or None."""
    for base in [os.path.dirname(src) + "/"] + rules.search[1:] + [""]:
        cand = os.path.normpath(os.path.join(base, header)).replace(os.sep, "/")
        if not cand.startswith("../") and os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def check(root, rules):
    problems, seen_known = [], set()
    for src in sources(root):
        unit = rules.unit_of(src)
        if unit is None:
            problems.append(f"{src}:1: no unit of the include rules holds this file")
            continue
        reach = rules.reachable(unit)
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                header = resolve(root, rules, src, m.group(1))
                if header is None:
                    problems.append(f"{src}:{n}: include not found in the tree ({m.group(1)})")
                    continue
                target = rules.unit_of(header)
                if reach is None or target in reach:
                    continue
                if (src, header) in rules.known:
                    seen_known.add((src, header))
                    continue
                problems.append(f"{src}:{n}: {unit} may not include {target or 'an unlisted file'} ({header})")
    for (src, header), where in rules.known.items():
        if (src, header) not in seen_known:
            problems.append(f"{where}: known violation no longer exists: {src} -> {header} "
                            "(remove it from the list)")
    return problems


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--rules")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.root):
        print(f"check_includes: no such folder: {args.root}", file=sys.stderr)
        return 2
    try:
        path = args.rules or os.path.join(args.root, "docs", "architecture.md")
        shown = os.path.relpath(path, args.root)
        rules = parse_rules(path, path if shown.startswith("..") else shown)
    except RulesError as e:
        print(f"check_includes: {e}", file=sys.stderr)
        return 2
    problems = check(args.root, rules)
    for p in problems:
        print(p)
    if problems:
        print(f"check_includes: {len(problems)} violation(s) of the include rules "
              "(docs/architecture.md, \"Include rules\")", file=sys.stderr)
        return 1
    print(f"check_includes: ok ({len(rules.known)} known violations listed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
