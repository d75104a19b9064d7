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
a block processes. Each row's chosen tokens, in order, go through the block as a row of a fixed
number of slots (`mod_slots`: at most floor(c x T) + one per document in training, T at
inference), the slots past them a document of their own that the block's outputs leave
unused and its expert statistics leave out: the shapes depend on the rows' sizes only, never on
which tokens were chosen, so nothing is read to the host (generation's cache, which keeps only
the chosen tokens, reads their number). No Python loop runs over rows or tokens.
"""

import math
from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn as nn
import torch.nn.functional as F

from .documents import Documents
from .layers import (
    Rotary,
    StackedLM,
    attention,
    cached_attention,
    chunked_cross_entropy,
    param_roles,
    positions,
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

    def forward(self, x, pos, doc_starts, cache: dict | None = None, real=None):
        """`real` (B, T) bool: the tokens the experts' statistics count (a depth-routed
        block's unused slots are not); None: all."""
        x = x + self.mixer(self.norm1(x), pos, doc_starts, cache)
        y, stats = self.experts(self.norm2(x), doc_starts, real)
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
        docs = Documents.of(doc_starts, T)
        score = self.router(x)[..., 0]  # (B, T)
        guess = self.predictor(x.detach())[..., 0]
        doc = document_ids(docs, B, T, x.device)
        stats = {}
        if self.training:
            chosen = top_share_per_document(score, doc, pos, self.capacity)
            stats["mod_predictor"] = F.binary_cross_entropy_with_logits(guess, chosen.float())
        else:
            chosen = guess > 0  # each token decides from its own state: causal
        # generation's cache keeps the chosen tokens only: their number, read (one row)
        slots = int(chosen.sum()) if cache is not None else mod_slots(self.capacity, T, docs,
                                                                      self.training)
        if slots:
            idx, real = chosen_first(chosen, slots)  # (B, slots) each
            rows = idx[..., None].expand(B, slots, d)
            x_in = x.gather(1, rows)
            # on meta (archs/flops.py counts rows of one document) nothing to count documents by
            inner = None if x.is_meta or cache is not None else routed_documents(
                docs, chosen, real, self.capacity if self.training else None)
            y, stats_in = self.block(x_in, pos.gather(1, idx), inner, cache, real)
            gate = torch.sigmoid(score.gather(1, idx))[..., None]
            out = torch.where(real[..., None], x_in + gate * (y - x_in), x_in)
            # a new tensor of x's shape, not a view: FSDP2 hooks a block's output, and a view's
            # hook would be lost to an in-place op after it
            x = x.scatter(1, rows, out)
            # no token chosen anywhere (the predictor may choose none): the statistics of a
            # block that did not run, decided on the device
            ran = real.any()
            stats.update({k: torch.where(ran, v, NOT_RUN[k]) for k, v in stats_in.items()})
        for k, v in NOT_RUN.items():
            stats.setdefault(k, x.new_full((), v))
        return x, stats


NOT_RUN = {"balance": 1.0, "z": 0.0, "dropped": 0.0}  # a depth-routed block's, when it did not run


def mod_slots(share: float, T: int, docs: Documents | None, training: bool) -> int:
    """How many slots a depth-routed block gives each row of T tokens: in training every
    document of n tokens sends max(1, floor(share x n)), which over a row's documents is at most
    floor(share x T) + one per document (doc_starts' width bounds their number); exactly
    max(1, floor(share x T)) for a row of one document. At inference the predictor may choose
    any number: T."""
    if not training:
        return T
    if docs is None:
        return max(1, math.floor(share * T))
    return min(T, math.floor(share * T) + docs.starts.shape[1])


def chosen_first(chosen: torch.Tensor, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """idx (B, slots): each row's chosen positions in order, then its unchosen ones; real
    (B, slots): which slots hold a chosen token. A sort, not nonzero: static shapes."""
    T = chosen.shape[1]
    t = torch.arange(T, device=chosen.device)
    idx = torch.where(chosen, t, t + T).argsort(1)[:, :slots]
    real = torch.arange(slots, device=chosen.device) < chosen.sum(1, keepdim=True)
    return idx, real


def routed_documents(docs: Documents | None, chosen: torch.Tensor, real: torch.Tensor,
                     share: float | None) -> Documents | None:
    """The documents of the slots (B, S) of chosen_first: each row's documents' chosen tokens
    in turn, then the unused slots as one more document. Made on the device with static
    shapes; in training (`share` given) each document's count is its quota, so the spans are
    told on the host from the rows' own spans, without reading the device."""
    B, S = real.shape
    if docs is None and share is not None:
        return None  # one document per row, whose quota fills every slot
    seg = torch.zeros_like(chosen, dtype=torch.long) if docs is None else docs.segments()
    width = 1 if docs is None else docs.starts.shape[1]
    valid = torch.ones(B, 1, dtype=torch.bool, device=real.device) if docs is None else \
        docs.starts >= 0
    count = torch.zeros(B, width, dtype=torch.long, device=real.device).scatter_add_(
        1, seg, chosen.long())  # each document's chosen tokens
    starts = torch.where(valid, count.cumsum(1) - count, -1)
    used = real.sum(1, keepdim=True)
    starts = torch.cat([starts, starts.new_full((B, 1), -1)], 1).scatter(
        1, valid.sum(1, keepdim=True), torch.where(used < S, used, -1))  # the unused slots
    spans = None
    if share is not None and docs is not None:
        def spans():
            return [quota_spans(row, share, S) for row in docs.spans()]
    return Documents(starts, S, spans)


def quota_spans(row: list[tuple[int, int]], share: float, slots: int) -> list[tuple[int, int]]:
    """The slots' spans of a row whose documents are `row` in training: each document's quota
    max(1, floor(share x n)) (top_share_per_document's, in the same float64 arithmetic), then
    the unused slots."""
    ends = list(accumulate(max(1, math.floor(share * (hi - lo))) for lo, hi in row))
    spans = list(zip([0] + ends[:-1], ends))
    return spans + [(ends[-1], slots)] if ends[-1] < slots else spans


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
        docs = Documents.of(doc_starts, T)  # once per forward: every layer reads the same
        pos = positions(None, B, T, input_ids.device) if docs is None else docs.positions()
        x = self.embed(input_ids)
        stats = []
        for block in self.blocks:
            if self.cfg.checkpointing and self.training:
                x, s = torch.utils.checkpoint.checkpoint(block, x, pos, docs,
                                                         use_reentrant=False)
            else:
                x, s = block(x, pos, docs)
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
        doc_starts = Documents.of(doc_starts, input_ids.shape[1])  # the heads' targets' too
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


def mtp_targets(input_ids: torch.Tensor, doc_starts, j: int) -> torch.Tensor:
    """Targets of the head that predicts token t + 1 + j at position t: -100 past the row's end
    and wherever token t + 1 + j belongs to another document than token t."""
    B, T = input_ids.shape
    out = torch.full_like(input_ids, -100)
    if T <= j + 1:
        return out
    out[:, : T - 1 - j] = input_ids[:, 1 + j:]
    if doc_starts is not None:
        seg = Documents.of(doc_starts, T).segments()
        crosses = seg[:, : T - 1 - j] != seg[:, 1 + j:]
        out[:, : T - 1 - j].masked_fill_(crosses, -100)  # not a boolean index: no nonzero
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
