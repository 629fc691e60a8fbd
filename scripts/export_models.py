#!/usr/bin/env python3
"""Exports Kiln's reference models to ONNX, with fixed inputs and ONNX Runtime's outputs on them.

    python scripts/export_models.py [--out DIR] [--force] [names...]

Each model is built from code with fixed-seed random weights (no downloads: torchvision
`weights=None`, transformers `BertConfig()` with bert-base sizes, HF_HUB_OFFLINE=1), put in eval
mode and exported with torch.onnx.export (the dynamo exporter; the TorchScript exporter when the
dynamo one fails for a model) at opset OPSET, batch 1, float32, with the batch dim named "batch"
where the exporter allows. Into DIR (default $KILN_CACHE_DIR/models, else ~/.cache/kiln/models)
go, per model NAME:

    NAME.onnx                the model (weights inside the file: every model is < 2 GiB)
    NAME.in.INPUT.npy        fixed random inputs (seeded)
    NAME.ort.OUTPUT.npy      ONNX Runtime's outputs on those inputs (intra-op threads: the
                             machine's cores, as `kiln run` uses)
    NAME.json                the stamp (script hash + package versions + opset), the exporter
                             used, export seconds, parameter count, input/output names, and the
                             PyTorch-vs-ORT max difference (a sanity check of the export)

A model whose files exist and whose stamp matches is not exported again (once per machine).
Files are written to a temporary folder in DIR and renamed into place, the stamp last, so an
interrupted export leaves no stamp and is redone.

Random parameters that torchvision/transformers initialize to constants (BatchNorm running
statistics, norm weights and biases, ViT's zero-initialized head and class token, ConvNeXt's
1e-6 layer scales) are re-drawn, so that no part of a model computes on zeros or identities.

Python API (used by the benchmarks): MODELS, build_model(name) -> (module, example_inputs),
export(name, out_dir=None, force=False) -> path of NAME.onnx, model_files(name, out_dir) -> dict,
register_model(...): models defined elsewhere (bench/model_set.py's benchmark sets) go through
the same build, export, stamp and cache path; their stamps also hash the file defining them.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

MODELS = [
    "mlp",
    "vfe",
    "resnet18",
    "resnet50",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_b_16",
    "bert_base",
    "det_nms",
]
OPSET = 18
SEED = 0
BERT_SEQ_LEN = 128
# Stamps name these packages' versions: a change in any of them re-exports.
STAMP_PACKAGES = ["torch", "torchvision", "transformers", "onnx", "onnxruntime", "onnxscript",
                  "numpy"]


def default_out_dir() -> str:
    cache = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                              "kiln")
    return os.path.join(cache, "models")


# ---- building -----------------------------------------------------------------------------------

def _randomize_constant_tensors(module, seed: int) -> None:
    """Re-draws every floating parameter or buffer whose elements are all equal.

    Positive constants (norm scales, running variances, layer scales) become U(0.5, 1.5);
    others (zero biases, running means, zero-initialized heads and tokens) become N(0, 0.05).
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 7919)
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    with torch.no_grad():
        for _, t in tensors:
            if not t.is_floating_point() or t.numel() < 2:
                continue
            flat = t.reshape(-1)
            if not bool((flat == flat[0]).all()):
                continue
            if float(flat[0]) > 0:
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=gen) * 0.05)


def _bert_module():
    import torch
    from transformers import BertConfig, BertModel

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(BertConfig())  # bert-base sizes, from code (no hub access)

        def forward(self, input_ids, attention_mask):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    return Bert()


def _bert_inputs(gen, batch: int = 1):
    import torch

    ids = torch.randint(1000, 30522, (batch, BERT_SEQ_LEN), generator=gen, dtype=torch.int64)
    mask = torch.ones(batch, BERT_SEQ_LEN, dtype=torch.int64)
    for b in range(batch):
        # [CLS] first; a random tail of [PAD] (0) with the mask 0 there, as Kiln's zoo does.
        length = BERT_SEQ_LEN // 2 + int(torch.randint(0, BERT_SEQ_LEN // 2, (1,), generator=gen))
        ids[b, 0] = 101
        ids[b, length:] = 0
        mask[b, length:] = 0
    return ids, mask


# Input and output names per model (ONNX graph names, also the .npy file names).
_IMAGE = (["x"], ["logits"])
_SIGNATURES = {
    "mlp": (["x"], ["y"]),
    "vfe": (["x"], ["features"]),
    "resnet18": _IMAGE,
    "resnet50": _IMAGE,
    "mobilenet_v3_small": _IMAGE,
    "efficientnet_b0": _IMAGE,
    "convnext_tiny": _IMAGE,
    "vit_b_16": _IMAGE,
    "bert_base": (["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"]),
    "det_nms": (["x"], ["boxes", "scores", "labels"]),
}
assert list(_SIGNATURES) == MODELS
# Zoo models exported with static shapes only: det_nms's anchors are one image's.
_STATIC = {"det_nms"}


# Models registered by other files (register_model): name -> {constructor, example_inputs,
# inputs, outputs, source}. A registered name never shadows a zoo name.
_REGISTERED: dict = {}


def register_model(name: str, constructor, example_inputs, inputs, outputs, source,
                   key: str = "", dynamic_batch: bool = True) -> None:
    """Adds a model to this script's registry: build_model/export/model_files then take `name`.

    constructor()                  -> torch.nn.Module (random weights; seeded by build_model)
    example_inputs(gen, batch)     -> tuple of tensors (gen: a seeded torch.Generator)
    inputs, outputs                the ONNX graph's input and output names
    source                         the file(s) defining the model: their content is in the stamp
    key                            a text describing the model's settings (in the stamp too)
    dynamic_batch                  False: export with static shapes only (no batch-2 trace)
    """
    if name in _SIGNATURES:
        raise ValueError(f"'{name}' is a zoo model of scripts/export_models.py; register another name")
    _REGISTERED[name] = {"constructor": constructor, "example_inputs": example_inputs,
                         "inputs": list(inputs), "outputs": list(outputs),
                         "source": [os.path.abspath(p) for p in
                                    ([source] if isinstance(source, str) else source)],
                         "key": key, "dynamic_batch": dynamic_batch}


def known_models():
    """The zoo's models, then the registered ones."""
    return MODELS + [n for n in _REGISTERED if n not in MODELS]


def _check_name(name: str) -> None:
    if name not in _SIGNATURES and name not in _REGISTERED:
        raise ValueError(f"unknown model '{name}' (available: {', '.join(known_models())})")


def _constructor(name: str):
    """A function building the torch module `name`."""
    import torch
    import torchvision

    tv = torchvision.models

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(10, 50), torch.nn.ReLU(), torch.nn.Linear(50, 1))

    def vfe():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False),
            torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
            torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1))

    class TinyDetector(torch.nn.Module):
        """A detector's post-processing, whose output sizes depend on values (Note
        [Data-dependent tails] in src/frontends/onnx/importer.h): a conv backbone, class and box
        heads over a 16x16 grid of anchors, then a score threshold (NonZero), top-k and
        class-aware NMS (torchvision's batched_nms). Scores are continuous (no ties between
        anchors), so any correct implementation keeps the same boxes in the same order."""

        def __init__(self, classes=5):
            super().__init__()
            self.classes = classes
            self.backbone = torch.nn.Sequential(
                torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.ReLU(),
                torch.nn.Conv2d(16, 32, 3, 2, 1), torch.nn.ReLU())
            self.cls = torch.nn.Conv2d(32, classes, 3, 1, 1)
            self.box = torch.nn.Conv2d(32, 4, 3, 1, 1)
            ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
            self.register_buffer("centers", torch.stack([xs, ys], -1).reshape(-1, 2) * 4 + 2,
                                 persistent=False)

        def forward(self, x):
            f = self.backbone(x)
            scores = torch.sigmoid(self.cls(f)).permute(0, 2, 3, 1).reshape(-1, self.classes)
            d = self.box(f).permute(0, 2, 3, 1).reshape(-1, 4)
            c = self.centers + d[:, :2] * 2
            wh = torch.exp(d[:, 2:].clamp(max=2)) * 6
            boxes = torch.cat([c - wh / 2, c + wh / 2], 1)
            flat = scores.reshape(-1)
            keep = torch.nonzero(flat > 0.45).squeeze(1)
            s, order = flat[keep].topk(min(60, keep.shape[0]))
            keep = keep[order]
            b = boxes[keep // self.classes]
            labels = keep % self.classes
            sel = torchvision.ops.batched_nms(b, s, labels, 0.4)[:30]
            return b[sel], s[sel], labels[sel]

    _check_name(name)
    if name in _REGISTERED:
        return _REGISTERED[name]["constructor"]
    return {
        "mlp": mlp,
        "vfe": vfe,
        "resnet18": lambda: tv.resnet18(weights=None),
        "resnet50": lambda: tv.resnet50(weights=None),
        "mobilenet_v3_small": lambda: tv.mobilenet_v3_small(weights=None),
        "efficientnet_b0": lambda: tv.efficientnet_b0(weights=None),
        "convnext_tiny": lambda: tv.convnext_tiny(weights=None),
        "vit_b_16": lambda: tv.vit_b_16(weights=None),
        "bert_base": _bert_module,
        "det_nms": TinyDetector,
    }[name]


def _example_inputs(name: str, batch: int, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    if name in _REGISTERED:
        return tuple(_REGISTERED[name]["example_inputs"](gen, batch))
    if name == "bert_base":
        return _bert_inputs(gen, batch)
    shape = (batch, 10) if name == "mlp" else (batch, 3, 64, 64) if name == "det_nms" else (batch, 3, 224, 224)
    return (torch.randn(shape, generator=gen, dtype=torch.float32),)


def build_model(name: str, batch: int = 1, seed: int = SEED):
    """The model `name` in eval mode with fixed-seed random weights, and example inputs of
    batch size `batch` (fixed-seed random: images N(0, 1); BERT token ids and a padding mask)."""
    import torch

    ctor = _constructor(name)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = ctor()
    _randomize_constant_tensors(module, seed)
    module.eval()
    return module, _example_inputs(name, batch, seed)


def input_names(name: str):
    _check_name(name)
    return list(_REGISTERED[name]["inputs"] if name in _REGISTERED else _SIGNATURES[name][0])


def output_names(name: str):
    _check_name(name)
    return list(_REGISTERED[name]["outputs"] if name in _REGISTERED else _SIGNATURES[name][1])


# ---- stamps and files -----------------------------------------------------------------------

def _versions():
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in STAMP_PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def stamp(name: str | None = None) -> str:
    """Script content hash + package versions + opset (+ for a registered model, the content of
    the files defining it and its key): a model re-exports when one changes."""
    h = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(f.read())
    if name in _REGISTERED:
        for path in _REGISTERED[name]["source"]:
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(_REGISTERED[name]["key"].encode())
    h.update(json.dumps({"versions": _versions(), "opset": OPSET, "seed": SEED},
                        sort_keys=True).encode())
    return h.hexdigest()[:16]


def _sanitize(s: str) -> str:
    # As `kiln run --output` names its files: characters other than [A-Za-z0-9_.-] become '_'.
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in s)


def model_files(name: str, out_dir: str | None = None) -> dict:
    """Paths of a model's files: {'onnx', 'stamp', 'inputs': {name: path}, 'ort': {name: path}}."""
    out_dir = out_dir or default_out_dir()
    return {
        "onnx": os.path.join(out_dir, f"{name}.onnx"),
        "stamp": os.path.join(out_dir, f"{name}.json"),
        "inputs": {i: os.path.join(out_dir, f"{name}.in.{_sanitize(i)}.npy")
                   for i in input_names(name)},
        "ort": {o: os.path.join(out_dir, f"{name}.ort.{_sanitize(o)}.npy")
                for o in output_names(name)},
    }


def is_current(name: str, out_dir: str | None = None) -> bool:
    files = model_files(name, out_dir)
    try:
        with open(files["stamp"]) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False
    paths = [files["onnx"], *files["inputs"].values(), *files["ort"].values()]
    paths += [os.path.join(os.path.dirname(files["onnx"]), p) for p in info.get("external_data", [])]
    return info.get("stamp") == stamp(name) and all(os.path.isfile(p) for p in paths)


def stamp_info(name: str, out_dir: str | None = None) -> dict:
    with open(model_files(name, out_dir)["stamp"]) as f:
        return json.load(f)


# ---- exporting ----------------------------------------------------------------------------

def _export_onnx(module, inputs, ins, outs, path: str, dynamic_batch: bool = True):
    """Exports with the dynamo exporter (dynamic batch dim "batch" where it allows; else
    static), falling back to the TorchScript exporter. Returns (exporter, dynamic_batch, errors).
    dynamic_batch=False tries the static exports only."""
    import torch

    errors = []
    # torch.export specializes dims of size 1, so the dynamic-batch export traces batch 2.
    batch_dim = torch.export.Dim("batch", min=1, max=1024)
    attempts = [("dynamo", True), ("dynamo", False), ("torchscript", True), ("torchscript", False)]
    if not dynamic_batch:
        attempts = [a for a in attempts if not a[1]]
    for exporter, dynamic in attempts:
        try:
            # The exporters print progress on stdout; keep it for the error message only.
            log = io.StringIO()
            with warnings.catch_warnings(), contextlib.redirect_stdout(log):
                warnings.simplefilter("ignore")
                if exporter == "dynamo":
                    args = inputs
                    kw = {}
                    if dynamic:
                        args = tuple(torch.cat([t, t], 0) for t in inputs)
                        kw["dynamic_shapes"] = {n: {0: batch_dim} for n in _forward_arg_names(
                            module, len(inputs))}
                    prog = torch.onnx.export(module, args, dynamo=True, opset_version=OPSET,
                                             input_names=ins, output_names=outs,
                                             external_data=False, optimize=True, **kw)
                    prog.save(path, external_data=False)
                else:
                    kw = {}
                    if dynamic:
                        kw["dynamic_axes"] = {n: {0: "batch"} for n in ins + outs}
                    torch.onnx.export(module, inputs, path, dynamo=False, opset_version=OPSET,
                                      input_names=ins, output_names=outs,
                                      do_constant_folding=True, **kw)
            _check_exported(path, ins, outs)
            return exporter, dynamic, errors
        except Exception as e:  # noqa: BLE001 -- any exporter failure moves to the next attempt
            tail = " | ".join(log.getvalue().strip().splitlines()[-3:])
            errors.append(f"{exporter}{' (dynamic batch)' if dynamic else ''}: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                          + (f" (exporter log: {tail})" if tail else ""))
            if os.path.exists(path):
                os.remove(path)
    raise RuntimeError("every exporter failed:\n  " + "\n  ".join(errors))


def _forward_arg_names(module, n: int):
    import inspect

    params = list(inspect.signature(module.forward).parameters)
    return params[:n]


def _check_exported(path: str, ins, outs) -> None:
    import onnx

    m = onnx.load(path, load_external_data=False)
    got_in = [i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}]
    got_out = [o.name for o in m.graph.output]
    if got_in != list(ins) or got_out != list(outs):
        raise RuntimeError(f"exported names {got_in} -> {got_out}, expected {ins} -> {outs}")
    opset = [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")]
    if opset != [OPSET]:
        raise RuntimeError(f"exported opset {opset}, expected {OPSET}")


def _ort_run(path: str, feeds: dict, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _save_npy(path: str, array) -> None:
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)


def export(name: str, out_dir: str | None = None, force: bool = False) -> str:
    """Exports `name` into out_dir (unless its stamp is current) and returns NAME.onnx's path."""
    import torch

    out_dir = out_dir or default_out_dir()
    os.makedirs(out_dir, exist_ok=True)
    files = model_files(name, out_dir)
    if not force and is_current(name, out_dir):
        return files["onnx"]
    # A registered model whose export failed under the current stamp fails again at once with
    # the recorded reason (every exporter would be tried again otherwise); --force retries.
    failed_marker = os.path.join(out_dir, f"{name}.failed.json")
    if name in _REGISTERED and not force:
        try:
            with open(failed_marker) as f:
                failed = json.load(f)
            if failed.get("stamp") == stamp(name):
                raise RuntimeError(failed["error"] + f"\n(recorded in {failed_marker}; "
                                   "export with force=True to try again)")
        except (OSError, ValueError):
            pass

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    ins, outs = input_names(name), output_names(name)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir)
    try:
        t0 = time.perf_counter()
        module, inputs = build_model(name)
        tmp_onnx = os.path.join(tmp, os.path.basename(files["onnx"]))
        try:
            exporter, dynamic, errors = _export_onnx(
                module, inputs, ins, outs, tmp_onnx,
                _REGISTERED[name]["dynamic_batch"] if name in _REGISTERED else name not in _STATIC)
        except RuntimeError as e:
            if name in _REGISTERED:
                with open(failed_marker, "w") as f:
                    json.dump({"stamp": stamp(name), "error": str(e)}, f, indent=1)
            raise
        export_s = time.perf_counter() - t0

        feeds = {n: t.numpy() for n, t in zip(ins, inputs)}
        ort_out = _ort_run(tmp_onnx, feeds, threads)
        with torch.no_grad():
            torch_out = module(*inputs)
        if isinstance(torch_out, torch.Tensor):
            torch_out = (torch_out,)
        torch_vs_ort = [float(np.max(np.abs(t.numpy().astype(np.float64) - o.astype(np.float64))))
                        for t, o in zip(torch_out, ort_out)]

        for n, a in feeds.items():
            _save_npy(os.path.join(tmp, os.path.basename(files["inputs"][n])), a)
        for n, a in zip(outs, ort_out):
            _save_npy(os.path.join(tmp, os.path.basename(files["ort"][n])), a)

        import onnx

        m = onnx.load(tmp_onnx, load_external_data=False)
        external = sorted({e.value for t in m.graph.initializer for e in t.external_data
                           if e.key == "location"})
        info = {
            "name": name,
            "stamp": stamp(name),
            "versions": _versions(),
            "opset": OPSET,
            "seed": SEED,
            "exporter": exporter,
            "dynamic_batch": dynamic,
            "exporter_errors": errors,
            "export_s": round(export_s, 3),
            "params": int(sum(p.numel() for p in module.parameters())),
            "onnx_nodes": len(m.graph.node),
            "onnx_op_types": sorted({n.op_type for n in m.graph.node}),
            "inputs": {n: {"shape": list(a.shape), "dtype": str(a.dtype)} for n, a in feeds.items()},
            "outputs": {n: {"shape": list(a.shape), "dtype": str(a.dtype),
                            "max_abs": float(np.max(np.abs(a)))} for n, a in zip(outs, ort_out)},
            "torch_vs_ort_max_abs_diff": dict(zip(outs, torch_vs_ort)),
            "ort_threads": threads,
            "external_data": external,
        }
        # Into place: data files, then the model, then the stamp (its presence marks completion).
        if os.path.exists(files["stamp"]):
            os.remove(files["stamp"])
        for f in sorted(os.listdir(tmp), key=lambda f: (f.endswith(".onnx"), f)):
            os.replace(os.path.join(tmp, f), os.path.join(out_dir, f))
        tmp_stamp = files["stamp"] + f".tmp{os.getpid()}"
        with open(tmp_stamp, "w") as f:
            json.dump(info, f, indent=1, sort_keys=True)
        os.replace(tmp_stamp, files["stamp"])
        return files["onnx"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"models (default: all: {' '.join(MODELS)})")
    ap.add_argument("--out", default=None, help=f"output folder (default {default_out_dir()})")
    ap.add_argument("--force", action="store_true", help="export even when the stamp is current")
    a = ap.parse_args(argv)
    names = a.names or MODELS
    for n in names:
        if n not in MODELS:
            ap.error(f"unknown model '{n}' (available: {', '.join(MODELS)})")
    failed = 0
    for n in names:
        t0 = time.perf_counter()
        cached = not a.force and is_current(n, a.out)
        try:
            path = export(n, a.out, force=a.force)
        except Exception as e:  # noqa: BLE001 -- report and continue with the other models
            print(f"{n}: FAILED: {e}", file=sys.stderr)
            failed += 1
            continue
        info = stamp_info(n, a.out)
        how = "cached" if cached else f"{info['exporter']}{', dynamic batch' if info['dynamic_batch'] else ''}"
        print(f"{n:20s} {path}  {time.perf_counter() - t0:7.2f} s  ({how})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
