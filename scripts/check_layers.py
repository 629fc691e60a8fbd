#!/usr/bin/env python3
"""Checks every #include under src/ against the layer table the build defines.

    python3 scripts/check_layers.py build/layers.json [--src src]

The table (written by cmake/KilnLayers.cmake from the kiln_layer() calls in CMakeLists.txt) gives
each layer its folders and the layers it may use. A file belongs to the layer whose folder is
the longest prefix of its path; it may include headers of its own layer's folders and of the
layers it may use, plus system/third-party headers (<...>, or "..." paths that start with no
Kiln folder). Reports every violation as `file:line: layer 'a' includes "x/y.h" of layer 'b'`
and every source file that belongs to no layer; exits 1 if there is any.
"""
import argparse
import json
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table")
    ap.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "..", "src"))
    args = ap.parse_args(argv)
    with open(args.table) as f:
        layers = json.load(f)["layers"]
    if not layers:
        print(f"{args.table}: no layers", file=sys.stderr)
        return 1
    dir_layer = {}
    for name, spec in layers.items():
        for d in spec["dirs"]:
            dir_layer[d.rstrip("/")] = name

    def layer_of(path):  # path relative to src/
        best = None
        for d, name in dir_layer.items():
            if path == d or path.startswith(d + "/"):
                if best is None or len(d) > len(best[0]):
                    best = (d, name)
        return best[1] if best else None

    top_dirs = {d.split("/")[0] for d in dir_layer}
    problems = []
    checked = 0
    for root, _, files in os.walk(args.src):
        for fn in sorted(files):
            if not fn.endswith((".h", ".cc", ".cu", ".def", ".inc")):
                continue
            full = os.path.join(root, fn)
            rel = os.path.relpath(full, args.src).replace(os.sep, "/")
            own = layer_of(rel)
            if own is None:
                problems.append(f"src/{rel}: belongs to no layer (add its folder to a kiln_layer())")
                continue
            allowed = {own, *layers[own]["may_use"]}
            with open(full, errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc.split("/")[0] not in top_dirs:
                        continue  # a system or third-party header
                    target = layer_of(inc)
                    checked += 1
                    if target is None:
                        problems.append(f"src/{rel}:{lineno}: includes \"{inc}\", which is in no layer")
                    elif target not in allowed:
                        problems.append(
                            f"src/{rel}:{lineno}: layer '{own}' includes \"{inc}\" of layer "
                            f"'{target}', which it may not use (it may use: "
                            f"{', '.join(sorted(layers[own]['may_use'])) or 'nothing'})")
    for p in problems:
        print(p)
    print(f"check_layers: {checked} includes of Kiln headers checked in {len(layers)} layers, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
