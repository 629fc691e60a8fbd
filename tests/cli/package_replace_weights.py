#!/usr/bin/env python3
"""package.replace_weights_cli: `kiln package --replace-weights` end to end, through the CLI.

`kiln compile mlp` writes a package; `kiln explain` lists its source parameters; new weights
(random, written here as safetensors with the standard library only) go in with `kiln package
--replace-weights`; `kiln run` of the new package on a fresh input gives what this script
computes from the new weights itself (Linear 10->50, ReLU, Linear 50->1, in float64). Errors:
a weights file with a missing, an unexpected and a wrong-shape tensor (all three in one
message), a truncated weights file and an input that is not a package each exit non-zero with
a message naming the place, and write no output file.

Usage: package_replace_weights.py <path to kiln>
"""
import json
import math
import os
import random
import re
import struct
import sys
import tempfile

from cli_util import make_run, write_npy

KILN = sys.argv[1]
run = make_run(KILN)


def write_safetensors(path, tensors):  # tensors: [(name, shape, [floats])], float32
    header, data = {}, b""
    for name, shape, values in tensors:
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)




def read_npy(path):
    with open(path, "rb") as f:
        b = f.read()
    assert b[:6] == b"\x93NUMPY", path
    n = struct.unpack("<H", b[8:10])[0]
    header = b[10:10 + n].decode()
    assert "'<f4'" in header, header
    body = b[10 + n:]
    return list(struct.unpack(f"<{len(body) // 4}f", body))


def main():
    rng = random.Random(1234)
    with tempfile.TemporaryDirectory(prefix="kiln-replace-weights-cli-") as d:
        pkg, out = os.path.join(d, "mlp.kiln"), os.path.join(d, "new.kiln")
        run("compile", "mlp", "--seed", "1", "-o", pkg)

        # The parameters the package takes, as `kiln explain` lists them.
        text = run("explain", pkg).stdout
        params = re.findall(r"^  (\S+) float32 \[([0-9,]+)\]$",
                            text.split("source parameters", 1)[1].split("launches", 1)[0], re.M)
        shapes = {name: [int(x) for x in dims.split(",")] for name, dims in params}
        if shapes != {"0.weight": [50, 10], "0.bias": [50], "2.weight": [1, 50], "2.bias": [1]}:
            sys.exit(f"kiln explain lists these source parameters: {shapes}\n{text}")

        weights = {n: [rng.uniform(-0.5, 0.5) for _ in range(math.prod(s))] for n, s in shapes.items()}
        w_path = os.path.join(d, "new.safetensors")
        write_safetensors(w_path, [(n, shapes[n], weights[n]) for n in shapes])
        p = run("package", "--replace-weights", pkg, w_path, "-o", out)
        if "4 parameters" not in p.stdout:
            sys.exit(f"unexpected report: {p.stdout}")
        print(p.stdout.strip())

        x = [rng.uniform(-1, 1) for _ in range(10)]
        x_path = os.path.join(d, "x.npy")
        write_npy(x_path, [1, 10], x)
        x32 = list(struct.unpack("<10f", struct.pack("<10f", *x)))
        w0, b0, w2, b2 = (weights[n] for n in ("0.weight", "0.bias", "2.weight", "2.bias"))
        hidden = [max(0.0, b0[j] + sum(w0[j * 10 + i] * x32[i] for i in range(10))) for j in range(50)]
        want = b2[0] + sum(w2[j] * hidden[j] for j in range(50))

        def output_of(package):
            o = os.path.join(d, "out-" + os.path.basename(package))
            # The package names its input and output as the zoo model does (x -> y).
            run("run", package, "--input", f"x={x_path}", "--output", o)
            (name,) = os.listdir(o)
            if name != "y.npy":
                sys.exit(f"the package's output is named {name}, the model's is y")
            return read_npy(os.path.join(o, name))

        (got,) = output_of(out)
        (old,) = output_of(pkg)
        if not (math.isfinite(got) and want != 0):
            sys.exit(f"output {got}, reference {want}: nothing to compare")
        if abs(got - want) > 1e-5 * max(1.0, abs(want)):
            sys.exit(f"the new package computes {got}, the new weights give {want}")
        if abs(old - want) <= 1e-3 * max(1.0, abs(want)):
            sys.exit(f"the old package computes {old}, as the new weights do: nothing tested")
        print(f"new package: {got:.7g} (reference {want:.7g}); old package: {old:.7g}")

        def expect_error(args, parts, output):
            p = run(*args, ok=False)
            if p.returncode == 0:
                sys.exit(f"kiln {' '.join(args)} succeeded; expected an error")
            for part in parts:
                if part not in p.stderr:
                    sys.exit(f"kiln {' '.join(args)}: no '{part}' in its error:\n{p.stderr}")
            if os.path.exists(output):
                sys.exit(f"kiln {' '.join(args)} failed but wrote {output}")
            print(p.stderr.strip().splitlines()[0])

        bad = os.path.join(d, "bad.safetensors")
        write_safetensors(bad, [("0.weight", [50, 11], [0.0] * 550), ("0.bias", [50], [0.0] * 50),
                                ("2.weight", [1, 50], [0.0] * 50), ("extra", [3], [0.0] * 3)])
        bad_out = os.path.join(d, "bad.kiln")
        expect_error(["package", "--replace-weights", pkg, bad, "-o", bad_out],
                     ["bad.safetensors", "missing: 2.bias float32[1]", "unexpected: extra float32[3]",
                      "wrong shape: 0.weight: expected [50, 10], found [50, 11]"], bad_out)
        cut = os.path.join(d, "cut.safetensors")
        with open(w_path, "rb") as f, open(cut, "wb") as g:
            g.write(f.read()[:100])
        expect_error(["package", "--replace-weights", pkg, cut, "-o", bad_out], ["cut.safetensors"], bad_out)
        notes = os.path.join(d, "notes.kiln")
        with open(notes, "w") as f:
            f.write("not a package; " * 10)
        expect_error(["package", "--replace-weights", notes, w_path, "-o", bad_out],
                     ["notes.kiln", "not a Kiln package"], bad_out)
        expect_error(["package", "--replace-weights", pkg, "-o", bad_out], ["replace-weights"], bad_out)


if __name__ == "__main__":
    main()
