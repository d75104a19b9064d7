"""MoE: a decoder with grouped-query attention and top-k routed SwiGLU experts.

Routing (top_k routed SwiGLU experts, dropless by default, or capacity-bound with
`capacity_factor`) and the auxiliary losses: archs/moe_experts.py.

Multi-token prediction (`n_pred_tokens` > 1): head j predicts token t + 1 + j from position t
through its own projection and the shared unembedding; its target is ignored (-100) wherever
token t + 1 + j is in another document than token t, so no target crosses a document boundary.

Mixture-of-Depths (`mod_capacity` = c, on every second block): a router scores each token and
only floor(c * n) (at least 1) of the n tokens of each document (a whole row without doc_starts)
go through the block (attention among those tokens, still per document, then the experts); the
rest skip it on the residual. The block's output is scaled by sigmoid(score) so the router
learns. Training picks each document's top scores, which is not causal within the document (a
token's fate depends on later tokens of its document) but never looks at another document.
Generation stays causal through a small learned predictor that sees only the token's own hidden
state: it is trained (BCE, on detached inputs, part of `aux`) to tell whether the token would be
among its document's top scores, and in eval mode (`model.eval()`) it alone decides which tokens
a block processes. The chosen tokens of all rows go through the block as one sequence whose
documents are the rows' documents, so no Python loop runs over rows or tokens.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import (
    Rotary,
    StackedLM,
    attention,
    cached_attention,
    chunked_cross_entropy,
    param_roles,
    positions,
    segment_ids,
)
from .limits import CHUNK, COEF, EPS, FLAG, SIZE, STD, VOCAB, Letters, Range, check_fields
from .mamba import MambaMixer
from .moe_experts import Experts, document_ids, document_lengths

EXPERTS_WIDE = 11  # a layer's experts together, in units of d_model, when d_expert is not given


@dataclass(frozen=True)
class MoEConfig:
    vocab_size: int = 50257
    d_model: int = 1024
    n_layers: int = 16
    n_heads: int = 16
    n_kv_heads: int = 4  # grouped-query attention: n_heads / n_kv_heads queries share a k/v head
    n_experts: int = 8
    top_k: int = 2
    d_expert: int | None = None  # SwiGLU hidden width of one expert; None: `expert_width`
    capacity_factor: float | None = None  # None = dropless; a number: slots per document, above
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 1e-3
    n_pred_tokens: int = 1  # 1 = next token only; k > 1 adds k - 1 multi-token heads
    mtp_loss_coef: float = 0.3
    mod_capacity: float | None = None  # Mixture-of-Depths on every second block: share of tokens
    mod_loss_coef: float = 0.1  # weight of the MoD predictor's BCE loss
    rotary_base: float = 10000.0
    max_seq: int = 4096
    norm_eps: float = 1e-5
    init_std: float = 0.02
    checkpointing: bool = False
    # Hybrids: each layer's token mixer, "A" (attention) or "M" (Mamba, archs/mamba.py), one
    # letter per layer (a shorter pattern repeats), or attention_every=K: attention on every
    # K-th layer, Mamba on the others. Neither: attention throughout.
    layers: str | None = None
    attention_every: int | None = None
    ssm_state: int = 128  # the Mamba layers' N, inner width factor, head width, groups, ...
    ssm_expand: int = 2
    ssm_head_dim: int = 64
    ssm_groups: int = 1
    ssm_conv: int = 4
    ssm_chunk: int = 64

    @property
    def expert_width(self) -> int:
        """d_expert, or, when it is not given, a width that follows d_model and n_experts: a
        layer's experts together EXPERTS_WIDE x d_model wide (four SwiGLU MLPs of the usual
        2.75 x d_model), split evenly among them and rounded up to a multiple of 64. More
        experts are finer ones (DeepSeekMoE's segmentation), not more parameters: 8 experts
        are 1.375 x d_model each (top 2: one MLP's width a token), 16 at d_model 2048 are 1,408."""
        if self.d_expert is not None:
            return self.d_expert
        return -(-EXPERTS_WIDE * self.d_model // (64 * self.n_experts)) * 64

    @property
    def derived(self) -> list[str]:
        """The sizes the config chose for the user, each with its rule (the dry run says them)."""
        if self.d_expert is not None:
            return []
        return [f"d_expert {self.expert_width:,}: not given, so {EXPERTS_WIDE} x d_model "
                f"{self.d_model:,} / n_experts {self.n_experts}, rounded up to a multiple of 64 "
                "(give d_expert to size the experts)"]

    @property
    def mixers(self) -> str:
        """Each layer's token mixer, "A" or "M"."""
        if self.attention_every:
            return "".join("MA"[(i + 1) % self.attention_every == 0] for i in range(self.n_layers))
        pattern = self.layers or "A"
        return pattern * (self.n_layers // len(pattern))

    def uses(self, mixer: str) -> bool:
        """Whether some layer's mixer is `mixer` ("A" or "M"), without listing the layers."""
        if self.attention_every:  # attention on layers K, 2K, ...; Mamba on the others
            return self.attention_every <= self.n_layers if mixer == "A" else (
                self.attention_every > 1)
        return mixer in (self.layers or "A")

    def __post_init__(self):  # each field's range: archs/limits.py
        check_fields(
            self, vocab_size=VOCAB, d_model=SIZE, n_layers=SIZE, n_heads=SIZE, n_kv_heads=SIZE,
            n_experts=SIZE, top_k=SIZE, d_expert=SIZE, capacity_factor=Range(0, low_open=True),
            aux_loss_coef=COEF, z_loss_coef=COEF, n_pred_tokens=SIZE, mtp_loss_coef=COEF,
            mod_capacity=Range(0, 1, low_open=True), mod_loss_coef=COEF,
            rotary_base=Range(1, low_open=True, why="10000 is usual"), max_seq=SIZE,
            norm_eps=EPS, init_std=STD, checkpointing=FLAG,
            layers=Letters("AM", "one letter per layer, A (attention) or M (Mamba)"),
            attention_every=SIZE, ssm_state=SIZE, ssm_expand=SIZE, ssm_head_dim=SIZE,
            ssm_groups=SIZE, ssm_conv=SIZE, ssm_chunk=CHUNK)
        if self.layers is not None:
            if self.n_layers % len(self.layers):
                raise ValueError(f"layers {self.layers!r}: its length must divide n_layers "
                                 f"({self.n_layers}; a shorter pattern repeats)")
            if self.attention_every is not None:
                raise ValueError("give layers or attention_every, not both")
        if self.uses("M") and (self.ssm_expand * self.d_model) % (
                self.ssm_head_dim * self.ssm_groups):
            raise ValueError(f"the Mamba layers' width ssm_expand x d_model "
                             f"({self.ssm_expand * self.d_model}) must divide into heads of "
                             f"ssm_head_dim ({self.ssm_head_dim}) x ssm_groups")
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError("d_model must divide by n_heads and n_heads by n_kv_heads")
        if self.uses("A") and self.d_model // self.n_heads % 2:
            raise ValueError(f"the attention heads' width d_model / n_heads "
                             f"({self.d_model // self.n_heads}) must be even: rotary turns "
                             "feature pairs")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be in 1..n_experts ({self.n_experts})")

    @property
    def repeated(self) -> dict[str, int]:
        """Fields that count identical modules, each with the period of its pattern
        (archs.footprint extrapolates the size along them): the layers repeat with their
        mixers' pattern and, under Mixture-of-Depths, every second one is depth-routed."""
        pattern = len(self.layers) if self.layers else self.attention_every or 1
        return {"n_layers": math.lcm(pattern, 2 if self.mod_capacity is not None else 1),
                "n_pred_tokens": 1}


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):  # weight * x / sqrt(mean(x^2) + eps), one fused kernel
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.nh, self.nkv = cfg.n_heads, cfg.n_kv_heads
        self.hd = cfg.d_model // cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.kv = nn.Linear(cfg.d_model, 2 * self.nkv * self.hd, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rotary = Rotary(self.hd, cfg.rotary_base)

    def forward(self, x, pos, doc_starts, cache: dict | None = None):
        """`cache`: generation's keys and values so far (longpack.archs.layers.cached_attention)."""
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.nh, self.hd).transpose(1, 2)  # (B, nh, T, hd)
        k, v = self.kv(x).view(B, T, 2, self.nkv, self.hd).permute(2, 0, 3, 1, 4)  # (B, nkv, T, hd)
        cos, sin = self.rotary.tables(pos, q.dtype)  # once for q and k
        q, k = self.rotary.rotate(q, cos, sin), self.rotary.rotate(k, cos, sin)
        y = attention(q, k, v, doc_starts) if cache is None else cached_attention(q, k, v, cache)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: MoEConfig, mixer: str = "A"):
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        if mixer == "A":
            self.attn = Attention(cfg)
        else:
            self.ssm = MambaMixer(cfg.d_model, cfg.ssm_state, cfg.ssm_expand, cfg.ssm_head_dim,
                                  cfg.ssm_groups, cfg.ssm_conv, cfg.ssm_chunk, cfg.norm_eps)
        self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.experts = Experts(cfg)

    @property
    def mixer(self) -> nn.Module:
        return self.attn if hasattr(self, "attn") else self.ssm

    def forward(self, x, pos, doc_starts, cache: dict | None = None):
        x = x + self.mixer(self.norm1(x), pos, doc_starts, cache)
        y, stats = self.experts(self.norm2(x), doc_starts)
        return x + y, stats


class DepthRouted(nn.Module):
    """A Block that only a share of the tokens goes through (Mixture-of-Depths, see above)."""

    # archs/flops.py: floor(capacity x length) tokens pass, no polynomial in the row's length
    flops_seq_period = None

    def __init__(self, cfg: MoEConfig, mixer: str = "A"):
        super().__init__()
        self.capacity = cfg.mod_capacity
        self.block = Block(cfg, mixer)
        self.router = nn.Linear(cfg.d_model, 1, bias=False)
        self.predictor = nn.Linear(cfg.d_model, 1)  # causal stand-in for the top-k at inference

    def forward(self, x, pos, doc_starts, cache: dict | None = None):
        """`cache` (generation, eval mode, one row): the keys and values of the tokens this
        block chose so far; the ones it chooses now attend to them."""
        B, T, d = x.shape
        score = self.router(x)[..., 0]  # (B, T)
        guess = self.predictor(x.detach())[..., 0]
        doc = document_ids(doc_starts, B, T, x.device)
        stats = {}
        if self.training:
            chosen = top_share_per_document(score, doc, pos, self.capacity)
            stats["mod_predictor"] = F.binary_cross_entropy_with_logits(guess, chosen.float())
        else:
            chosen = guess > 0  # each token decides from its own state: causal
        flat = x.reshape(B * T, d)
        if flat.is_meta:  # no scores to choose by: archs/flops.py counts rows of one document
            idx = torch.arange(B * max(1, math.floor(self.capacity * T)), device=x.device)
        else:
            idx = chosen.reshape(-1).nonzero()[:, 0]  # (K,) the chosen tokens, row by row
        if len(idx):
            # One sequence of every row's chosen tokens; its documents are the rows' documents.
            doc = doc.reshape(-1)[idx]
            new_doc = torch.ones_like(doc, dtype=torch.bool)
            new_doc[1:] = doc[1:] != doc[:-1]
            # (1, documents); None on meta: one document (its rows are, above)
            starts = None if flat.is_meta else new_doc.nonzero()[:, 0][None]
            x_in = flat[idx]
            y, stats_in = self.block(x_in[None], pos.reshape(-1)[idx][None], starts, cache)
            gate = torch.sigmoid(score.reshape(-1)[idx])[:, None]
            # a new tensor of x's shape, not a view of a flat one: FSDP2 hooks a block's output,
            # and a view's hook would be lost to an in-place op after it
            x = x.index_put((idx // T, idx % T), x_in + gate * (y[0] - x_in))
            stats.update(stats_in)
        stats.setdefault("balance", x.new_ones(()))
        stats.setdefault("z", x.new_zeros(()))
        stats.setdefault("dropped", x.new_zeros(()))
        return x, stats


def top_share_per_document(score: torch.Tensor, doc: torch.Tensor, pos: torch.Tensor,
                           share: float) -> torch.Tensor:
    """[B, T] bool: the floor(share * n) (at least 1) highest scores of each document of n
    tokens. Sorting each row by score, then stably by document, lists every document's tokens
    from the best down, from the document's own start offset (t - pos[t]) on."""
    B, T = score.shape
    by_score = score.argsort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, doc.gather(1, by_score).argsort(dim=1, stable=True))  # (B, T)
    quota = torch.floor(share * document_lengths(doc).double()).clamp(min=1)
    slot = torch.arange(T, device=score.device).expand(B, T)
    start = (slot - pos).gather(1, order)  # start offset of the document of each listed token
    chosen = torch.zeros_like(score, dtype=torch.bool)
    return chosen.scatter_(1, order, slot - start < quota.gather(1, order))


class MoE(nn.Module):
    PARAM_ROLES = (  # each parameter's optimizer role (longpack.archs.layers.OPTIMIZER_ROLES), by name
        ("embed.weight", "embedding"),
        ("head.weight", "head"),
        ("norm_f.weight", "norm"), ("blocks.*.norm1.weight", "norm"),
        ("blocks.*.norm2.weight", "norm"),
        ("blocks.*.router.weight", "router"), ("blocks.*.predictor.weight", "router"),
        ("blocks.*.predictor.bias", "bias"),
        ("blocks.*.attn.q.weight", "matrix"), ("blocks.*.attn.kv.weight", "matrix"),
        ("blocks.*.attn.out.weight", "matrix"), ("mtp.*.weight", "matrix"),
        ("blocks.*.ssm.in_proj.weight", "matrix"), ("blocks.*.ssm.out_proj.weight", "matrix"),
        ("blocks.*.ssm.norm", "norm"), ("blocks.*.ssm.conv.*", "kernel"),
        ("blocks.*.ssm.A_log", "kernel"), ("blocks.*.ssm.D", "kernel"),
        ("blocks.*.ssm.dt_bias", "kernel"),
        ("blocks.*.experts.w_gate", "experts"), ("blocks.*.experts.w_up", "experts"),
        ("blocks.*.experts.w_down", "experts"),
    )

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(
            DepthRouted(cfg, mixer) if cfg.mod_capacity is not None and i % 2 else
            Block(cfg, mixer) for i, mixer in enumerate(cfg.mixers))
        self.norm_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.mtp = nn.ModuleList(nn.Linear(cfg.d_model, cfg.d_model, bias=False)
                                 for _ in range(cfg.n_pred_tokens - 1))
        std, deep = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=std)
        for block in self.blocks:  # scaled residual init on each branch's last projection
            block = block.block if isinstance(block, DepthRouted) else block
            out = block.attn.out if hasattr(block, "attn") else block.ssm.out_proj
            nn.init.normal_(out.weight, std=deep)
            nn.init.normal_(block.experts.w_gate, std=std)
            nn.init.normal_(block.experts.w_up, std=std)
            nn.init.normal_(block.experts.w_down, std=deep)

    def hidden(self, input_ids, doc_starts=None):
        B, T = input_ids.shape
        pos = positions(doc_starts, B, T, input_ids.device)
        x = self.embed(input_ids)
        stats = []
        for block in self.blocks:
            if self.cfg.checkpointing and self.training:
                x, s = torch.utils.checkpoint.checkpoint(block, x, pos, doc_starts,
                                                         use_reentrant=False)
            else:
                x, s = block(x, pos, doc_starts)
            stats.append(s)
        return self.norm_f(x), stats

    def forward(self, input_ids, doc_starts=None):
        return self.head(self.hidden(input_ids, doc_starts)[0])

    def new_cache(self) -> list[dict] | None:
        """An empty key/value cache for `decode`; None with capacity-bound routing, where a
        token's expert slots depend on its document's final length (generate recomputes)."""
        if self.cfg.capacity_factor is not None:
            return None
        return [{"seen": 0} for _ in self.blocks]

    def decode(self, input_ids, cache: list[dict]):
        """Logits (1, T, vocab) of tokens that follow those `cache` holds (eval mode, one
        document): generation's incremental forward, equal to the full forward's logits.
        A depth-routed block caches only the tokens its predictor chose."""
        T = input_ids.shape[1]
        seen = cache[0]["seen"]
        pos = torch.arange(seen, seen + T, device=input_ids.device)[None]
        x = self.embed(input_ids)
        for block, layer_cache in zip(self.blocks, cache):
            layer_cache["seen"] = seen + T
            x, _ = block(x, pos, None, layer_cache.setdefault("kv", {}))
        return self.head(self.norm_f(x))

    def loss(self, input_ids, targets, doc_starts=None) -> dict:
        cfg = self.cfg
        h, stats = self.hidden(input_ids, doc_starts)
        ce = chunked_cross_entropy(h, self.head.weight, targets)
        balance = torch.stack([s["balance"] for s in stats]).mean()
        z = torch.stack([s["z"] for s in stats]).mean()
        aux = cfg.aux_loss_coef * balance + cfg.z_loss_coef * z
        out = {"ce": ce, "balance": balance, "z_loss": z,
               "dropped": torch.stack([s["dropped"] for s in stats]).mean()}
        mod = [s["mod_predictor"] for s in stats if "mod_predictor" in s]
        if mod:
            out["mod_predictor"] = torch.stack(mod).mean()
            aux = aux + cfg.mod_loss_coef * out["mod_predictor"]
        mtp = [chunked_cross_entropy(proj(h), self.head.weight,
                                     mtp_targets(input_ids, doc_starts, j + 1))
               for j, proj in enumerate(self.mtp)]
        if mtp:
            out["mtp"] = torch.stack(mtp).mean()
            aux = aux + cfg.mtp_loss_coef * out["mtp"]
        out["aux"], out["loss"] = aux, ce + aux
        return out

    def param_roles(self) -> dict[str, str]:
        return param_roles(self, self.PARAM_ROLES)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def active_params(self) -> int:
        """Parameters one token uses: all but the experts it is not routed to."""
        c = self.cfg
        expert = 3 * c.d_model * c.expert_width
        return self.num_params() - c.n_layers * (c.n_experts - c.top_k) * expert

    flops_per_token = StackedLM.flops_per_token  # the one measurement: archs/flops.py


def mtp_targets(input_ids: torch.Tensor, doc_starts: torch.Tensor | None, j: int) -> torch.Tensor:
    """Targets of the head that predicts token t + 1 + j at position t: -100 past the row's end
    and wherever token t + 1 + j belongs to another document than token t."""
    B, T = input_ids.shape
    out = torch.full_like(input_ids, -100)
    if T <= j + 1:
        return out
    out[:, : T - 1 - j] = input_ids[:, 1 + j:]
    if doc_starts is not None:
        seg = segment_ids(doc_starts, T)
        crosses = seg[:, : T - 1 - j] != seg[:, 1 + j:]
        out[:, : T - 1 - j][crosses] = -100
    return out


# Sized to the stated totals (500M / 1B / 1.5B / 5B); `python -m longpack.archs` prints total and active.
PRESETS = {
    "moe-tiny": dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                     n_experts=4, top_k=2, d_expert=128, max_seq=256),
    "moe-500m": dict(d_model=1024, n_layers=12, n_heads=16, n_kv_heads=4, n_experts=8,
                     top_k=2, d_expert=1216),
    "moe-1b": dict(d_model=1536, n_layers=16, n_heads=16, n_kv_heads=4, n_experts=8, top_k=2,
                   d_expert=1280),
    "moe-1.5b": dict(d_model=1536, n_layers=20, n_heads=16, n_kv_heads=4, n_experts=8,
                     top_k=2, d_expert=1664),
    "moe-5b": dict(d_model=2048, n_layers=24, n_heads=16, n_kv_heads=4, n_experts=16,
                   top_k=2, d_expert=1920),
    # Hybrids: Mamba layers with attention on every 4th (the 5B design: GQA, MoE, Mamba; add
    # --model-arg mod_capacity=0.5 for its Mixture-of-Depths); experts narrowed to stay at 5B
    "hybrid-tiny": dict(vocab_size=512, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2,
                        n_experts=4, top_k=2, d_expert=128, max_seq=256, layers="MA",
                        ssm_state=16, ssm_head_dim=16, ssm_chunk=16),
    "hybrid-5b": dict(d_model=2048, n_layers=24, n_heads=16, n_kv_heads=4, n_experts=16,
                      top_k=2, d_expert=1792, attention_every=4),
}
