#!/usr/bin/env python3
"""package.input_dtype_cli: `kiln compile --input-dtype bfloat16` end to end, through the CLI.

Two packages of the zoo's vfe in bfloat16 (autocast), one taking its input in float32, one in
bfloat16 (Note [Inputs in a half dtype] in src/compiler/compile.cc). `kiln explain` says which
dtype each takes and the bfloat16 one has one launch fewer (the input's conversion). `kiln run`
of both on a float32 .npy whose values are bfloat16 numbers gives the same output bytes; on a
file of other float32 values the bfloat16 package says it rounded them (numpy has no bfloat16).
An --input-dtype that is not a float dtype exits non-zero naming the option and writes nothing.

Usage: package_input_dtype.py <path to kiln>
"""
import os
import random
import re
import struct
import sys
import tempfile

from cli_util import make_run, write_npy

KILN = sys.argv[1]
run = make_run(KILN)


def to_bf16_value(x):
    """x rounded to bfloat16 (to nearest, ties to even), as a float32 value."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def output_bytes(d, package, x_path):
    o = os.path.join(d, "out-" + os.path.basename(package) + "-" + os.path.basename(x_path))
    p = run("run", package, "--input", f"x={x_path}", "--output", o)
    (name,) = os.listdir(o)
    with open(os.path.join(o, name), "rb") as f:
        return f.read(), p.stderr


def main():
    rng = random.Random(36)
    with tempfile.TemporaryDirectory(prefix="kiln-input-dtype-cli-") as d:
        f32, bf16 = os.path.join(d, "f32in.kiln"), os.path.join(d, "bf16in.kiln")
        run("compile", "vfe", "--dtype", "bf16", "-o", f32)
        run("compile", "vfe", "--dtype", "bf16", "--input-dtype", "bf16", "-o", bf16)
        ex32, ex16 = run("explain", f32).stdout, run("explain", bf16).stdout
        if not re.search(r"^inputs x float32 \[1,3,224,224\]", ex32, re.M):
            sys.exit(f"the float32-input package's explain:\n{ex32}")
        if not re.search(r"^inputs x bfloat16 \[1,3,224,224\]", ex16, re.M):
            sys.exit(f"the bfloat16-input package's explain:\n{ex16}")
        n32 = int(re.search(r"^launches \((\d+)\)", ex32, re.M).group(1))
        n16 = int(re.search(r"^launches \((\d+)\)", ex16, re.M).group(1))
        if n16 != n32 - 1:
            sys.exit(f"launches: {n32} with a float32 input, {n16} with bfloat16 (expected one fewer)")

        n = 3 * 224 * 224
        exact = [to_bf16_value(rng.gauss(0, 1)) for _ in range(n)]
        if len(set(exact)) < 100:
            sys.exit("the input has fewer than 100 distinct values")
        exact_path = os.path.join(d, "exact.npy")
        write_npy(exact_path, [1, 3, 224, 224], exact)
        a, _ = output_bytes(d, f32, exact_path)
        b, note = output_bytes(d, bf16, exact_path)
        if a != b:
            sys.exit("on bfloat16 values the two packages' outputs differ")
        if "rounded to bfloat16" not in note:
            sys.exit(f"kiln run did not say it rounded the float32 file: {note!r}")
        body = a[-4 * 64 * 56 * 56:]
        vals = struct.unpack(f"<{len(body) // 4}f", body)
        if max(abs(v) for v in vals) == 0 or any(v != v for v in vals):
            sys.exit("the output is all zeros or has NaN: nothing compared")
        print(f"bfloat16 values: {len(a)} output bytes equal; launches {n32} -> {n16}")

        bad = os.path.join(d, "bad.kiln")
        p = run("compile", "vfe", "--input-dtype", "int8", "-o", bad, ok=False)
        if p.returncode == 0 or "--input-dtype" not in p.stderr or os.path.exists(bad):
            sys.exit(f"--input-dtype int8: exit {p.returncode}, {p.stderr!r}, wrote {os.path.exists(bad)}")
        print(p.stderr.strip().splitlines()[0])


if __name__ == "__main__":
    main()
