#!/usr/bin/env python3
"""Benchmark sets: named lists of models that bench/compare.py runs with `--set NAME`.

    python3 bench/model_set.py list [--set broad]             # the set's models, one a line
    python3 bench/model_set.py export [--set broad] [names]   # export them (cached), report
    python3 bench/model_set.py check [names]                  # build and run in torch only

The set `broad` (issue #17): torchvision classification models, torchvision detection and
segmentation backbones and heads, Hugging Face encoders and a small decoder, and models of a
driving stack's classes written here (a PointPillars-style detector, multi-scale deformable
attention, deformable sampling, GRU/LSTM trajectory predictors, a BEV fusion block). Every model
has random weights (fixed seeds; no downloads) and batch-1 example inputs at modest resolutions
(224 for classification; smaller grids for the dense models) so that the set runs on 2 cores.

The models are defined in bench/set_models/ (public.py: torchvision and Hugging Face builders;
driving.py: the driving-stack models); ENTRIES below names each one with its builder, example
inputs and ONNX input/output names. Nothing here exports or caches by itself: each model is
registered with scripts/export_models.py (register_model), whose build_model/export do the
seeding, the re-drawing of constant tensors (_randomize_constant_tensors), the export, the ONNX
Runtime reference outputs and the stamp (which also hashes the model's definition file and its
entry's settings, so editing one driving model re-exports the driving models only). The sets'
exports live in their own folder, <cache>/models/sets (set_out_dir()), apart from the zoo's.

Entries whose name is a zoo model of export_models.py (resnet18, bert_base, ...) use the zoo's
definition as it is. A model that fails to export stays in the set: compare.py reports it as a
row with the exporter's error.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

if HERE not in sys.path:
    sys.path.insert(0, HERE)
from set_models import driving, public, zoo_static  # noqa: E402

SEQ_BERT = 128   # the zoo's bert_base uses export_models.BERT_SEQ_LEN (128) too
SEQ_GPT2 = 64


def export_models():
    """scripts/export_models.py as a module (KILN_EXPORT_MODELS_DIR may point elsewhere, as
    for compare.py)."""
    d = os.environ.get("KILN_EXPORT_MODELS_DIR") or os.path.join(ROOT, "scripts")
    if d not in sys.path:
        sys.path.insert(0, d)
    import export_models as em  # noqa: E402
    return em


# ---- the sets ---------------------------------------------------------------------------------

class Spec:
    """fn(*args, **kwargs) with a stable text (module.function + arguments) for the stamp."""

    def __init__(self, fn, *args, **kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, *pre):
        return self.fn(*pre, *self.args, **self.kwargs)

    @property
    def source(self):
        return sys.modules[self.fn.__module__].__file__

    def __repr__(self):
        args = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in sorted(self.kwargs.items())]
        return f"{self.fn.__module__}.{self.fn.__qualname__}({', '.join(args)})"


class Entry:
    """One model of a set: build() -> nn.Module and inputs(gen, batch) -> tuple of tensors (Spec),
    or both None for a zoo model of export_models.py (its own definition and inputs)."""

    def __init__(self, name, group, build=None, inputs=None, ins=None, outs=None, note=""):
        self.name, self.group, self.build, self.inputs = name, group, build, inputs
        self.ins, self.outs, self.note = ins, outs, note

    @property
    def zoo(self):
        return self.build is None

    def key(self):
        """The entry's settings as text (part of its export stamp)."""
        return f"{self.name}: {self.build!r} on {self.inputs!r} -> {self.ins} {self.outs}"


def _cls(name, size=224, note="", **kw):
    return Entry(name, "classification", Spec(public.classifier, name, **kw),
                 Spec(public.image, size), ["x"], ["logits"],
                 note=note or f"torchvision, {size}x{size}")


def _zoo(name, group, note):
    return Entry(name, group, note=note)


ENTRIES = [
    # torchvision classification, 224x224 unless said
    _zoo("resnet18", "classification", "zoo model (export_models.py), 224x224"),
    _zoo("resnet50", "classification", "zoo model, 224x224"),
    _cls("resnext50_32x4d"),
    _cls("wide_resnet50_2"),
    _cls("alexnet"),
    _cls("mobilenet_v2"),
    _zoo("mobilenet_v3_small", "classification", "zoo model, 224x224"),
    _cls("mobilenet_v3_large"),
    _zoo("efficientnet_b0", "classification", "zoo model, 224x224"),
    _cls("efficientnet_v2_s"),
    _cls("regnet_x_400mf"),
    _cls("regnet_y_400mf"),
    _cls("regnet_y_1_6gf"),
    _cls("shufflenet_v2_x1_0"),
    _cls("squeezenet1_1"),
    _cls("mnasnet1_0"),
    _cls("densenet121"),
    _cls("googlenet", aux_logits=False, init_weights=True),
    _cls("inception_v3", size=299, note="torchvision, 299x299", aux_logits=False,
         init_weights=True),
    _zoo("convnext_tiny", "classification", "zoo model, 224x224, the zoo's dynamic-batch export"),
    Entry("convnext_tiny_static", "classification", Spec(zoo_static.zoo_model, "convnext_tiny"),
          Spec(zoo_static.zoo_inputs, "convnext_tiny"), ["x"], ["logits"],
          note="the zoo's convnext_tiny, exported with static shapes"),
    _zoo("vit_b_16", "classification", "zoo model, 224x224"),
    _cls("vit_b_32"),
    _cls("swin_t"),
    _cls("swin_v2_t", size=256, note="torchvision, 256x256"),
    _cls("maxvit_t"),
    # torchvision detection / segmentation
    Entry("fcn_resnet50", "segmentation", Spec(public.segmentation, "fcn_resnet50"),
          Spec(public.image, 128), ["x"], ["out"],
          note="FCN head on a dilated ResNet-50 (output stride 8), 128x128, 21 classes"),
    Entry("deeplabv3_mobilenet_v3_large", "segmentation",
          Spec(public.segmentation, "deeplabv3_mobilenet_v3_large"), Spec(public.image, 224),
          ["x"], ["out"], note="DeepLabV3 (ASPP) head on MobileNetV3-Large, 224x224"),
    Entry("lraspp_mobilenet_v3_large", "segmentation",
          Spec(public.segmentation, "lraspp_mobilenet_v3_large"), Spec(public.image, 224),
          ["x"], ["out"], note="LR-ASPP head on MobileNetV3-Large, 224x224"),
    Entry("ssdlite320_backbone_head", "detection", Spec(public.ssdlite_backbone_head),
          Spec(public.image, 320), ["x"], ["cls_logits", "bbox_regression"],
          note="SSDlite320-MobileNetV3 backbone + heads (no anchors/NMS), 320x320"),
    Entry("ssdlite320_full", "detection", Spec(public.ssdlite_full), Spec(public.image, 320),
          ["x"], ["boxes", "scores", "labels"],
          note="the whole SSDlite320 detector: transform, heads, box decoding, NMS"),
    Entry("fasterrcnn_fpn_backbone", "detection", Spec(public.fpn_backbone),
          Spec(public.image, 224), ["x"], ["p2", "p3", "p4", "p5", "pool"],
          note="Faster R-CNN's ResNet-50 + FPN backbone, 224x224, 5 levels"),
    # Hugging Face
    _zoo("bert_base", "transformer", "zoo model: BERT-base, sequence 128 + padding mask, the "
         "zoo's dynamic-batch export"),
    Entry("bert_base_static", "transformer", Spec(zoo_static.zoo_model, "bert_base"),
          Spec(zoo_static.zoo_inputs, "bert_base"), ["input_ids", "attention_mask"],
          ["last_hidden_state", "pooler_output"],
          note="the zoo's bert_base, exported with static shapes"),
    Entry("distilbert_base", "transformer", Spec(public.distilbert),
          Spec(public.tokens, SEQ_BERT, 30522, True), ["input_ids", "attention_mask"],
          ["last_hidden_state"], note=f"DistilBERT-base sizes, sequence {SEQ_BERT} + padding mask"),
    Entry("gpt2_6l", "transformer", Spec(public.gpt2), Spec(public.tokens, SEQ_GPT2, 50257, False),
          ["input_ids"], ["logits"],
          note=f"GPT-2 LM, distilgpt2 sizes (6 layers, 768), fixed sequence {SEQ_GPT2}, no cache"),
    # driving stack, written for the set (bench/set_models/driving.py)
    Entry("pointpillars", "driving", Spec(driving.pointpillars),
          Spec(driving.pillar_inputs, driving.PP_PILLARS, driving.PP_GRID), ["pillars", "coords"],
          ["cls", "box", "dir"],
          note=f"{driving.PP_PILLARS} pillars x {driving.PP_POINTS} points, "
               f"{driving.PP_GRID}x{driving.PP_GRID} BEV grid, ConvTranspose2d upsampling"),
    Entry("pillar_scatter", "driving", Spec(driving.pillar_scatter),
          Spec(driving.pillar_inputs, driving.SCATTER_PILLARS, driving.SCATTER_GRID),
          ["pillars", "coords"], ["bev"],
          note=f"pillar feature net + scatter_add into a {driving.SCATTER_GRID}x"
               f"{driving.SCATTER_GRID}x64 canvas"),
    Entry("msda_bev", "driving", Spec(driving.msda_block), Spec(driving.msda_inputs),
          ["query", "ref", "v0", "v1", "v2", "v3"], ["out"],
          note=f"multi-scale deformable attention: {driving.MSDA_QUERIES} BEV queries, 4 levels "
               "32..4, 8 heads x 4 points (grid_sample)"),
    Entry("deform_sampling", "driving", Spec(driving.deform_sampling),
          Spec(public.image, 64, channels=64), ["x"], ["y"],
          note="DCN-style: conv-predicted offsets, 9 grid_samples, modulation, 1x1 mix; 64x64x64"),
    Entry("gru_trajectory", "driving", Spec(driving.gru_trajectory), Spec(driving.traj_inputs),
          ["history"], ["trajectory"],
          note=f"{driving.TRAJ_AGENTS} agents x {driving.TRAJ_HISTORY} steps, GRU encoder, "
               f"{driving.TRAJ_HORIZON}-step GRUCell rollout"),
    Entry("lstm_trajectory", "driving", Spec(driving.lstm_trajectory), Spec(driving.traj_inputs),
          ["history"], ["trajectories", "mode_probs"],
          note=f"{driving.TRAJ_AGENTS} agents, LSTM encoder, agent attention, "
               f"{driving.TRAJ_MODES} modes"),
    Entry("bev_fusion", "driving", Spec(driving.bev_fusion), Spec(driving.bev_inputs),
          ["camera_bev", "lidar_bev"], ["fused"],
          note=f"camera {driving.BEV_CAM}ch + lidar {driving.BEV_LIDAR}ch (upsampled) on a "
               f"{driving.BEV_GRID}x{driving.BEV_GRID} BEV grid, SE attention"),
]
_BY_NAME = {e.name: e for e in ENTRIES}
assert len(_BY_NAME) == len(ENTRIES), "duplicate names in ENTRIES"

SETS = {
    "broad": [e.name for e in ENTRIES],
    # A quick subset for trying the machinery (a few cheap models of different groups).
    "smoke": ["squeezenet1_1", "lraspp_mobilenet_v3_large", "gru_trajectory", "bev_fusion"],
}


def entry(name):
    if name not in _BY_NAME:
        raise ValueError(f"unknown set model '{name}' (known: {', '.join(_BY_NAME)})")
    return _BY_NAME[name]


def set_models(set_name):
    if set_name not in SETS:
        raise ValueError(f"unknown set '{set_name}' (known: {', '.join(SETS)})")
    return list(SETS[set_name])


def set_out_dir(em=None):
    """Where the sets' exports live: <export_models' folder>/sets (apart from the zoo's)."""
    em = em or export_models()
    return os.path.join(em.default_out_dir(), "sets")


def register(em=None):
    """Registers every non-zoo entry with export_models (idempotent); returns the module."""
    em = em or export_models()
    for e in ENTRIES:
        if e.zoo or e.name in getattr(em, "_REGISTERED", {}):
            continue
        em.register_model(e.name, e.build, e.inputs, e.ins, e.outs,
                          sorted({e.build.source, e.inputs.source}), key=e.key(),
                          dynamic_batch=False)
    return em


# ---- command line -----------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["list", "export", "check"])
    ap.add_argument("names", nargs="*", help="models (default: the whole set)")
    ap.add_argument("--set", default="broad", help=f"one of {', '.join(SETS)} (default broad)")
    ap.add_argument("--out", default=None, help="export folder (default: set_out_dir())")
    ap.add_argument("--force", action="store_true", help="export even when the stamp is current")
    a = ap.parse_args(argv)
    names = a.names or set_models(a.set)
    for n in names:
        entry(n)
    if a.command == "list":
        for n in names:
            e = entry(n)
            print(f"{n:30s} {e.group:15s} {e.note}")
        return 0
    em = register()
    failed = 0
    for n in names:
        t0 = time.perf_counter()
        try:
            if a.command == "export":
                out = a.out or set_out_dir(em)
                cached = not a.force and em.is_current(n, out)
                em.export(n, out_dir=out, force=a.force)
                info = em.stamp_info(n, out)
                how = "cached" if cached else info["exporter"]
                what = f"{info['onnx_nodes']} nodes, torch vs ORT {max(info['torch_vs_ort_max_abs_diff'].values()):.2g} ({how})"
            else:
                import torch
                module, inputs = em.build_model(n)
                with torch.no_grad():
                    out = module(*inputs)
                outs = out if isinstance(out, (tuple, list)) else (out,)
                what = ", ".join(str(list(o.shape)) for o in outs)
        except Exception as e:  # noqa: BLE001 -- report and go on
            msg = str(e).strip().splitlines()
            print(f"{n:30s} FAILED: {type(e).__name__}: {' | '.join(msg[:4])}", flush=True)
            failed += 1
            continue
        print(f"{n:30s} {time.perf_counter() - t0:7.1f} s  {what}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
