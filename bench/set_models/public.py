"""Builders and example inputs of the public models of bench/model_set.py's sets: torchvision
classification, detection and segmentation, and Hugging Face transformers, all from code with
random weights (weights=None, weights_backbone=None, configs built in code: no downloads).

Every function here is referenced by an Entry of bench/model_set.py; this file's content is part
of those models' export stamps (editing it re-exports them).
"""
from __future__ import annotations

# ---- example inputs ---------------------------------------------------------------------------

def image(gen, batch, size, channels=3):
    """N(0, 1) images [batch, channels, size, size]."""
    import torch
    return (torch.randn(batch, channels, size, size, generator=gen),)


def tokens(gen, batch, seq, vocab, with_mask):
    """Token ids [batch, seq] (and a padding mask: a random tail of padding, masked out)."""
    import torch
    ids = torch.randint(1000, vocab, (batch, seq), generator=gen, dtype=torch.int64)
    if not with_mask:
        return (ids,)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for b in range(batch):
        length = seq // 2 + int(torch.randint(0, seq // 2, (1,), generator=gen))
        ids[b, length:] = 0
        mask[b, length:] = 0
    return ids, mask


# ---- torchvision ------------------------------------------------------------------------------

def classifier(fn, **kw):
    """torchvision.models.<fn>(weights=None, **kw)."""
    import torchvision
    return getattr(torchvision.models, fn)(weights=None, **kw)


def segmentation(fn):
    """A torchvision segmentation model (backbone + head, no aux head): returns the 'out' map."""
    import torch
    import torchvision

    class Seg(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = getattr(torchvision.models.segmentation, fn)(
                weights=None, weights_backbone=None, num_classes=21, aux_loss=False)

        def forward(self, x):
            return self.m(x)["out"]
    return Seg()


def ssdlite_backbone_head():
    """SSDlite320-MobileNetV3-Large's backbone (with its extra layers) and its classification
    and box-regression heads: the network without anchors and box decoding / NMS."""
    import torch
    import torchvision

    class SSDLiteHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
                weights=None, weights_backbone=None, num_classes=91)
            self.backbone, self.head = m.backbone, m.head

        def forward(self, x):
            feats = list(self.backbone(x).values())
            out = self.head(feats)
            return out["cls_logits"], out["bbox_regression"]
    return SSDLiteHead()


def ssdlite_full():
    """The whole SSDlite320 detector (transform, anchors, decoding, NMS): boxes, scores, labels."""
    import torch
    import torchvision

    class SSDLite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
                weights=None, weights_backbone=None, num_classes=91)

        def forward(self, x):
            det = self.m(list(x))[0]
            return det["boxes"], det["scores"], det["labels"]
    return SSDLite()


def fpn_backbone():
    """Faster R-CNN's ResNet-50 + FPN backbone: 5 feature levels."""
    import torch
    import torchvision

    class FPN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torchvision.models.detection.fasterrcnn_resnet50_fpn(
                weights=None, weights_backbone=None, trainable_backbone_layers=5).backbone

        def forward(self, x):
            return tuple(self.backbone(x).values())
    return FPN()


# ---- Hugging Face -----------------------------------------------------------------------------

def distilbert():
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    class DistilBert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = DistilBertModel(DistilBertConfig())  # distilbert-base sizes, from code

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return DistilBert()


def gpt2():
    """A GPT-2 with distilgpt2's sizes (6 layers, hidden 768) and its LM head, one fixed-length
    sequence, no KV cache: logits for every position."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    class GPT2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = GPT2LMHeadModel(GPT2Config(n_layer=6, n_positions=1024))

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits
    return GPT2()
