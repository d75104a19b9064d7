"""GPT-NeoX (Black et al. 2022): LayerNorm, GELU MLP, rotary on a fraction of each head,
parallel residual (x + attn(ln1(x)) + mlp(ln2(x))), untied input and output embeddings.

Parameters per layer: qkv 3d^2 + 3d, attention out d^2 + d, MLP 2*d*f + f + d, two LayerNorms
4d; plus embeddings 2*V*d and the final LayerNorm 2d. For neox-1.2b (d 2048, 24 layers, f 8192,
V 50257) that is 50.36 M per layer and 1.414 B in all (1.209 B without the embeddings): the
"45.1 M per layer" of the seed configuration leaves out part of the MLP.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import Rotary, StackedLM, attention, cached_attention
from .limits import EPS, FLAG, FRACTION, SIZE, STD, VOCAB, Range, check_fields


@dataclass(frozen=True)
class GPTNeoXConfig:
    vocab_size: int = 50257
    d_model: int = 2048
    n_layers: int = 24
    n_heads: int = 16
    d_ff: int = 8192
    max_seq: int = 2048  # the context the preset is meant for (rotary itself has no limit)
    rotary_pct: float = 0.25  # fraction of each head's features that rotary rotates
    rotary_base: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    checkpointing: bool = False  # recompute each block in backward (activation checkpointing)

    def __post_init__(self):  # each field's range: archs/limits.py
        check_fields(self, vocab_size=VOCAB, d_model=SIZE, n_layers=SIZE, n_heads=SIZE, d_ff=SIZE,
                     max_seq=SIZE, rotary_pct=FRACTION,
                     rotary_base=Range(1, low_open=True, why="10000 is usual"),
                     norm_eps=EPS, init_std=STD, checkpointing=FLAG)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")

    @property
    def repeated(self) -> dict[str, int]:
        """Fields that count identical modules, each with the period of its pattern: the size
        grows linearly along them (archs.footprint extrapolates it)."""
        return {"n_layers": 1}


class Attention(nn.Module):
    def __init__(self, cfg: GPTNeoXConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        rot = int(self.head_dim * cfg.rotary_pct) // 2 * 2
        self.rotary = Rotary(rot, cfg.rotary_base) if rot else None

    def forward(self, x, pos, doc_starts, cache: dict | None = None):
        """`cache`: this layer's keys and values of the tokens before x (generation: {} at
        first); x's are appended, and x attends to them and causally to itself."""
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        # qkv: (3, B, nh, T, hs); q and k rotate together, in one pass
        qk, v = qkv[:2], qkv[2]
        if self.rotary is not None:
            qk = self.rotary(qk, pos)
        if cache is None:
            y = attention(qk[0], qk[1], v, doc_starts)  # (B, nh, T, hs)
        else:
            y = cached_attention(qk[0], qk[1], v, cache)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTNeoXConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc_out = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x, pos, doc_starts, cache: dict | None = None):
        mlp = self.fc_out(F.gelu(self.fc_in(self.ln2(x))))
        return x + self.attn(self.ln1(x), pos, doc_starts, cache) + mlp


class GPTNeoX(StackedLM):
    PARAM_ROLES = (  # each parameter's optimizer role (longpack.archs.layers.OPTIMIZER_ROLES), by name
        ("embed.weight", "embedding"),
        ("head.weight", "head"),
        ("ln_f.*", "norm"), ("blocks.*.ln1.*", "norm"), ("blocks.*.ln2.*", "norm"),
        ("blocks.*.bias", "bias"),
        ("blocks.*.attn.qkv.weight", "matrix"), ("blocks.*.attn.out.weight", "matrix"),
        ("blocks.*.fc_in.weight", "matrix"), ("blocks.*.fc_out.weight", "matrix"),
    )

    def __init__(self, cfg: GPTNeoXConfig):
        super().__init__(cfg, Block)
        self.apply(self._init)
        # Scaled residual init (GPT-2): each residual branch's last projection gets
        # std / sqrt(2 * n_layers), so the residual stream's variance does not grow with depth.
        for block in self.blocks:
            for proj in (block.attn.out, block.fc_out):
                nn.init.normal_(proj.weight, std=cfg.init_std / math.sqrt(2 * cfg.n_layers))

    def _init(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def new_cache(self) -> list[dict]:
        """An empty key/value cache for `decode`: one dict per layer."""
        return [{} for _ in self.blocks]

    def decode(self, input_ids, cache: list[dict]):
        """Logits (B, T, vocab) of tokens that follow those `cache` holds (one dict per layer,
        empty at first, filled here): generation's incremental forward, the same logits as the
        full forward over all the tokens (one document)."""
        past = cache[0]["k"].shape[2] if cache[0] else 0
        T = input_ids.shape[1]
        pos = torch.arange(past, past + T, device=input_ids.device).expand(input_ids.shape[0], T)
        x = self.embed(input_ids)
        for block, layer_cache in zip(self.blocks, cache):
            x = block(x, pos, None, layer_cache)
        return self.head(self.ln_f(x))


PRESETS = {
    "neox-tiny": dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq=256),
    "neox-125m": dict(d_model=768, n_layers=12, n_heads=12, d_ff=3072),
    "neox-350m": dict(d_model=1024, n_layers=24, n_heads=16, d_ff=4096),
    "neox-1.2b": dict(d_model=2048, n_layers=24, n_heads=16, d_ff=8192, max_seq=2048),
}
