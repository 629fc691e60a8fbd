#!/usr/bin/env bash
# Writes the package loader's fuzz seeds (tests/fuzz/corpus/package/), in the two forms
# package_fuzz.cc reads: a byte 0 then a whole package (mlp: loop kernels, with a kernels.cpu
# section), and a byte 1 then [u32 manifest length][manifest][weights] (vfe: oneDNN launches).
#   make_package_seeds.sh BUILD_DIR
set -euo pipefail
KILN="$1/kiln"
OUT="$(dirname "$0")/corpus/package"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$KILN" compile mlp -o "$WORK/mlp.kiln" >/dev/null
"$KILN" compile vfe -o "$WORK/vfe.kiln" >/dev/null
python3 - "$WORK" "$OUT" <<'PY'
import struct, sys
work, out = sys.argv[1], sys.argv[2]
def sections(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<I", b, 12)[0]
    res = {}
    for i in range(n):
        e = 64 + 80 * i
        name = b[e:e + 32].rstrip(b"\0").decode()
        off, size = struct.unpack_from("<QQ", b, e + 32)
        res[name] = b[off:off + size]
    return b, res
mlp, _ = sections(f"{work}/mlp.kiln")
open(f"{out}/mlp_whole.bin", "wb").write(b"\0" + mlp)
_, vfe = sections(f"{work}/vfe.kiln")
m = vfe["manifest"]
open(f"{out}/vfe_sections.bin", "wb").write(b"\1" + struct.pack("<I", len(m)) + m + vfe["weights"])
PY
