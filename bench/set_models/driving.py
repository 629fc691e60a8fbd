"""Models of a driving stack's classes, written for bench/model_set.py's `broad` set (random
weights; the seeds are set by scripts/export_models.py's build_model).

Every function here is referenced by an Entry of bench/model_set.py; this file's content is part
of those models' export stamps (editing it re-exports them).
"""
from __future__ import annotations


# ---- driving-stack models written for the set -------------------------------------------------
# Sizes: small enough for 2 cores, shaped like the real networks (PointPillars, BEVFormer's
# spatial cross-attention, DCN-style sampling, GRU/LSTM motion forecasting, BEVFusion's fuser).

PP_GRID = 128        # BEV grid (cells per side) of pointpillars
PP_PILLARS = 3000    # non-empty pillars
PP_POINTS = 32       # points per pillar
PP_FEATURES = 9      # x y z r, offsets to the pillar's points' mean, offsets to its centre
SCATTER_GRID = 256
SCATTER_PILLARS = 6000


def _pillar_net(channels=64):
    """PointPillars' pillar feature net: per-point linear + BatchNorm1d + ReLU, max over points."""
    import torch

    class PillarFeatureNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(PP_FEATURES, channels, bias=False)
            self.norm = torch.nn.BatchNorm1d(channels, eps=1e-3, momentum=0.01)

        def forward(self, points):                       # [B, P, N, F]
            b, p, n, _ = points.shape
            x = self.linear(points)                      # [B, P, N, C]
            x = self.norm(x.reshape(b * p * n, -1)).reshape(b, p, n, -1)
            return torch.relu(x).amax(dim=2)             # [B, P, C]
    return PillarFeatureNet()


def _scatter_to_bev(features, indices, grid):
    """Pillar features [B, P, C] into a BEV canvas [B, C, grid, grid] at flat cell `indices`
    [B, P] (scatter_add: padded pillars all add into their cell, as the detector's do)."""
    import torch
    b, p, c = features.shape
    canvas = features.new_zeros(b, c, grid * grid)
    idx = indices.unsqueeze(1).expand(b, c, p)
    canvas = canvas.scatter_add(2, idx, features.transpose(1, 2))
    return canvas.reshape(b, c, grid, grid)


def pointpillars():
    """A PointPillars-style detector: pillar feature net, scatter into the BEV grid, the
    three-block 2D backbone (strides 2, 4, 8), upsampling by ConvTranspose2d (1x1 stride 1,
    2x2 stride 2, 4x4 stride 4) to stride 2, concat, and the SSD heads (class, box, direction)."""
    import torch
    from torch import nn

    def block(cin, cout, layers, stride):
        mods = [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout, eps=1e-3),
                nn.ReLU()]
        for _ in range(layers):
            mods += [nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout, eps=1e-3),
                     nn.ReLU()]
        return nn.Sequential(*mods)

    def up(cin, cout, k):
        return nn.Sequential(nn.ConvTranspose2d(cin, cout, k, stride=k, bias=False),
                             nn.BatchNorm2d(cout, eps=1e-3), nn.ReLU())

    class PointPillars(nn.Module):
        def __init__(self, anchors=2, classes=3):
            super().__init__()
            self.pfn = _pillar_net(64)
            self.blocks = nn.ModuleList([block(64, 64, 3, 2), block(64, 128, 5, 2),
                                         block(128, 256, 5, 2)])
            self.ups = nn.ModuleList([up(64, 128, 1), up(128, 128, 2), up(256, 128, 4)])
            self.cls = nn.Conv2d(384, anchors * classes, 1)
            self.box = nn.Conv2d(384, anchors * 7, 1)
            self.dir = nn.Conv2d(384, anchors * 2, 1)

        def forward(self, pillars, coords):
            x = _scatter_to_bev(self.pfn(pillars), coords, PP_GRID)
            ups = []
            for blk, upm in zip(self.blocks, self.ups):
                x = blk(x)
                ups.append(upm(x))
            x = torch.cat(ups, dim=1)
            return self.cls(x), self.box(x), self.dir(x)
    return PointPillars()


def pillar_inputs(gen, batch, pillars, grid):
    """Pillars [batch, pillars, points, features] N(0, 1) and their flat BEV cells [batch,
    pillars]: distinct cells per sample (as a voxelizer's), in random order."""
    import torch
    pts = torch.randn(batch, pillars, PP_POINTS, PP_FEATURES, generator=gen)
    coords = torch.stack([torch.randperm(grid * grid, generator=gen)[:pillars]
                          for _ in range(batch)])
    return pts, coords


def pillar_scatter():
    """PointPillars' encoder alone: pillar feature net + scatter into a 256x256 BEV canvas."""
    import torch

    class PillarScatter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pfn = _pillar_net(64)

        def forward(self, pillars, coords):
            return _scatter_to_bev(self.pfn(pillars), coords, SCATTER_GRID)
    return PillarScatter()


MSDA_QUERIES = 50 * 50                      # a 50x50 BEV query grid (BEVFormer-tiny)
MSDA_LEVELS = [(32, 32), (16, 16), (8, 8), (4, 4)]
MSDA_DIM, MSDA_HEADS, MSDA_POINTS = 256, 8, 4


def msda_block():
    """A BEVFormer-style multi-scale deformable attention layer: queries predict sampling offsets
    and softmax weights per head, level and point; each level's projected values are sampled by
    grid_sample at reference point + offset; weighted sum, output projection, residual +
    LayerNorm, then an FFN."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    C, H, L, P = MSDA_DIM, MSDA_HEADS, len(MSDA_LEVELS), MSDA_POINTS

    class MSDeformAttnBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.offsets = nn.Linear(C, H * L * P * 2)
            self.weights = nn.Linear(C, H * L * P)
            self.value = nn.Linear(C, C)
            self.proj = nn.Linear(C, C)
            self.norm1 = nn.LayerNorm(C)
            self.ffn = nn.Sequential(nn.Linear(C, 2 * C), nn.ReLU(), nn.Linear(2 * C, C))
            self.norm2 = nn.LayerNorm(C)

        def forward(self, query, ref, v0, v1, v2, v3):  # query [B,Q,C], ref [B,Q,2] in [0,1]
            b, q, _ = query.shape
            off = self.offsets(query).view(b, q, H, L, P, 2)
            w = self.weights(query).view(b, q, H, L * P).softmax(-1).view(b, q, H, L, P)
            out = None
            for lvl, v in enumerate((v0, v1, v2, v3)):
                hh, ww = v.shape[-2:]
                val = self.value(v.flatten(2).transpose(1, 2))            # [B, HW, C]
                val = val.view(b, hh * ww, H, C // H).permute(0, 2, 3, 1)
                val = val.reshape(b * H, C // H, hh, ww)
                scale = torch.tensor([ww, hh], dtype=query.dtype)
                loc = ref[:, :, None, None, :] + off[:, :, :, lvl] / scale  # [B,Q,H,P,2]
                grid = (2 * loc - 1).permute(0, 2, 1, 3, 4).reshape(b * H, q, P, 2)
                s = F.grid_sample(val, grid, mode="bilinear", padding_mode="zeros",
                                  align_corners=False)                     # [B*H, C/H, Q, P]
                wl = w[:, :, :, lvl].permute(0, 2, 1, 3).reshape(b * H, 1, q, P)
                term = (s * wl).sum(-1)                                    # [B*H, C/H, Q]
                out = term if out is None else out + term
            out = out.view(b, C, q).transpose(1, 2)
            x = self.norm1(query + self.proj(out))
            return self.norm2(x + self.ffn(x))
    return MSDeformAttnBlock()


def msda_inputs(gen, batch):
    import torch
    query = torch.randn(batch, MSDA_QUERIES, MSDA_DIM, generator=gen)
    ref = torch.rand(batch, MSDA_QUERIES, 2, generator=gen)
    values = [torch.randn(batch, MSDA_DIM, h, w, generator=gen) for h, w in MSDA_LEVELS]
    return (query, ref, *values)


def deform_sampling():
    """A deformable-convolution-style block: a 3x3 conv predicts K=9 (dx, dy) offsets and
    modulation weights per pixel; the features are sampled with grid_sample at each shifted
    position, weighted, summed, and mixed by a 1x1 conv (+ residual)."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    K = 9

    class DeformSampling(nn.Module):
        def __init__(self, c=64):
            super().__init__()
            self.offset = nn.Conv2d(c, 2 * K, 3, padding=1)
            self.mask = nn.Conv2d(c, K, 3, padding=1)
            self.mix = nn.Conv2d(c * K, c, 1)
            self.norm = nn.BatchNorm2d(c)

        def forward(self, x):                         # [B, C, H, W]
            b, c, h, w = x.shape
            off = self.offset(x).view(b, K, 2, h, w)
            m = torch.sigmoid(self.mask(x))           # [B, K, H, W]
            ys = torch.linspace(-1.0, 1.0, h)
            xs = torch.linspace(-1.0, 1.0, w)
            base = torch.stack([xs.view(1, w).expand(h, w), ys.view(h, 1).expand(h, w)], -1)
            samples = []
            for k in range(K):
                grid = base + off[:, k].permute(0, 2, 3, 1) * (2.0 / w)  # [B, H, W, 2]
                s = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                                  align_corners=True)
                samples.append(s * m[:, k:k + 1])
            y = self.mix(torch.cat(samples, dim=1))
            return torch.relu(self.norm(y) + x)
    return DeformSampling()


TRAJ_AGENTS, TRAJ_HISTORY, TRAJ_HORIZON, TRAJ_MODES = 64, 20, 30, 6


def gru_trajectory():
    """A GRU trajectory predictor: per-agent history (x, y, vx, vy, heading, speed) -> embedding
    -> 2-layer GRU encoder -> a GRUCell decoder rolled out autoregressively for 30 steps."""
    import torch
    from torch import nn

    class GRUTrajectory(nn.Module):
        def __init__(self, hidden=128):
            super().__init__()
            self.embed = nn.Linear(6, 64)
            self.encoder = nn.GRU(64, hidden, num_layers=2, batch_first=True)
            self.cell = nn.GRUCell(2, hidden)
            self.step = nn.Linear(hidden, 2)

        def forward(self, history):                  # [A, T, 6]
            _, h = self.encoder(torch.relu(self.embed(history)))
            h = h[-1]
            pos = history[:, -1, :2]
            out = []
            for _ in range(TRAJ_HORIZON):
                h = self.cell(pos, h)
                pos = pos + self.step(h)
                out.append(pos)
            return torch.stack(out, dim=1)           # [A, horizon, 2]
    return GRUTrajectory()


def lstm_trajectory():
    """An LSTM motion-forecasting model: 2-layer LSTM history encoder, agent-to-agent multi-head
    self-attention (interaction), and a multi-modal MLP decoder (6 modes x 30 steps x 2 and
    mode logits)."""
    import torch
    from torch import nn

    class LSTMTrajectory(nn.Module):
        def __init__(self, hidden=128):
            super().__init__()
            self.embed = nn.Linear(6, 64)
            self.encoder = nn.LSTM(64, hidden, num_layers=2, batch_first=True)
            self.interact = nn.MultiheadAttention(hidden, 4, batch_first=True)
            self.norm = nn.LayerNorm(hidden)
            self.decoder = nn.Sequential(nn.Linear(hidden, 256), nn.ReLU(),
                                         nn.Linear(256, TRAJ_MODES * TRAJ_HORIZON * 2))
            self.mode_logits = nn.Linear(hidden, TRAJ_MODES)

        def forward(self, history):                  # [A, T, 6]
            _, (h, _) = self.encoder(torch.relu(self.embed(history)))
            a = h[-1].unsqueeze(0)                   # [1, A, hidden]: agents attend to agents
            att, _ = self.interact(a, a, a, need_weights=False)
            z = self.norm(a + att).squeeze(0)
            traj = self.decoder(z).view(-1, TRAJ_MODES, TRAJ_HORIZON, 2)
            return traj + history[:, -1, None, None, :2], self.mode_logits(z).softmax(-1)
    return LSTMTrajectory()


def traj_inputs(gen, batch):
    import torch
    # batch = scenes; agents of all scenes along dim 0
    return (torch.randn(batch * TRAJ_AGENTS, TRAJ_HISTORY, 6, generator=gen),)


BEV_GRID, BEV_CAM, BEV_LIDAR = 64, 64, 128


def bev_fusion():
    """A BEVFusion-style fuser: the lidar BEV map (at half resolution) upsampled bilinearly to
    the camera BEV grid, concatenated with the camera BEV features, a 3x3 conv + BN + ReLU,
    squeeze-and-excitation channel attention, and a residual 3x3 conv block."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class BEVFusion(nn.Module):
        def __init__(self, out=128):
            super().__init__()
            self.fuse = nn.Sequential(nn.Conv2d(BEV_CAM + BEV_LIDAR, out, 3, padding=1,
                                                bias=False), nn.BatchNorm2d(out), nn.ReLU())
            self.se = nn.Sequential(nn.Linear(out, out // 4), nn.ReLU(), nn.Linear(out // 4, out))
            self.refine = nn.Sequential(nn.Conv2d(out, out, 3, padding=1, bias=False),
                                        nn.BatchNorm2d(out), nn.ReLU())

        def forward(self, camera_bev, lidar_bev):
            lidar = F.interpolate(lidar_bev, size=camera_bev.shape[-2:], mode="bilinear",
                                  align_corners=False)
            x = self.fuse(torch.cat([camera_bev, lidar], dim=1))
            g = torch.sigmoid(self.se(x.mean(dim=(2, 3))))
            x = x * g[:, :, None, None]
            return x + self.refine(x)
    return BEVFusion()


def bev_inputs(gen, batch):
    import torch
    return (torch.randn(batch, BEV_CAM, BEV_GRID, BEV_GRID, generator=gen),
            torch.randn(batch, BEV_LIDAR, BEV_GRID // 2, BEV_GRID // 2, generator=gen))
