"""Zoo models of scripts/export_models.py, for the sets exported with static shapes.

The zoo exports convnext_tiny and bert_base with a dynamic batch dim; Kiln cannot import those
files (a Range whose limit is a symbolic size: docs/benchmarks.md, the broad set). The set keeps
those entries (their failure is a row) and adds these static-shape twins, built by the zoo's own
constructor and example inputs, so that the architectures are measured too.
"""
from __future__ import annotations


def _em():
    import model_set
    return model_set.export_models()


def zoo_model(name):
    """The zoo's module `name` (export_models' constructor; build_model seeds it)."""
    return _em()._constructor(name)()


def zoo_inputs(gen, batch, name):
    """The zoo's example inputs of `name`, drawn from `gen` as build_model does."""
    em = _em()
    if name == "bert_base":
        return em._bert_inputs(gen, batch)
    import torch
    return (torch.randn(batch, 3, 224, 224, generator=gen, dtype=torch.float32),)
