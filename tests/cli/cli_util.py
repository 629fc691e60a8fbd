"""Helpers the CLI test scripts share (standard library only): running the kiln binary and
writing float32 .npy files."""
import struct
import subprocess
import sys


def make_run(kiln):
    """run(*args, ok=True): the kiln binary with args; exits the test when ok and it failed."""
    def run(*args, ok=True):
        p = subprocess.run([kiln, *args], capture_output=True, text=True)
        if ok and p.returncode != 0:
            sys.exit(f"kiln {' '.join(args)} exited with {p.returncode}:\n{p.stdout}{p.stderr}")
        return p
    return run


def write_npy(path, shape, values):
    """A float32 .npy of `shape` holding `values` (row-major)."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({', '.join(map(str, shape))},), }}"
    header += " " * (-(len(header) + 11) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack(f"<{len(values)}f", *values))
