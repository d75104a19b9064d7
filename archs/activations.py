"""Activation memory: what autograd keeps for backward in one micro-batch, per family, written
out from the models' code (archs/), and its peak with and without activation checkpointing.

Notation: n = batch x seq tokens; d the model's width; a = 2 bytes under autocast (bf16, fp16),
4 in fp32; lin(k) = what the k Linear layers reading one norm's output keep: that fp32 tensor
once (4nd), or under autocast a bf16 copy each (2nd k). LN = 4nd + 8n (LayerNorm keeps its
input, mean and rstd); RMS = 8nd + 4n (F.rms_norm, which autograd takes apart as
x * rsqrt(mean(x^2) + eps) * w, keeps x, x * rsqrt(...) and rsqrt). The residual stream is fp32
under autocast too (the embedding is fp32; fp32 + bf16 is fp32), so every norm's input is 4nd.

Per layer (derivation: each term is a tensor an op saves, named at its line below):

    GPT-NeoX    LN + 8n + 2 lin(1) + a n (5d + 2d [rotary] + 2 d_ff) + 2a n rot + 4n H
                (qkv's output 3d, whole as v is a view of it; q and k rotated 2d; attention's
                output d; heads merged d; rotary's cos and sin, rot wide; logsumexp fp32 per
                head; fc_in's output and GELU's, d_ff each)
    MoE         2 RMS + lin(2) + a n (3d + 3 kv) + 2a n hd + 4n H + lin(1) + router + experts
                (q rotated d, k rotated kv, the kv projection's output 2 kv, attention's output
                and heads merged 2d; kv = key/value heads x hd); router = 8nE + 28nk + 8n
                (fp32 logits and softmax, top-k indices and weights, the dispatch permutation);
                experts, fp32/fp16 (a matmul per expert) a nk (2d + 4f) + 2a E d f + 4nk (the
                token copies d, gate-up 2f, SiLU f, product f, output d; gate and up weights
                concatenated); bf16 (grouped GEMMs over R = nk + 7E rows rounded up to 8)
                4nkd + 2R (d + 4f) + 10nk. A Mamba layer ("M") has the Mamba mixer instead of
                attention; Mixture-of-Depths layers run on floor(c seq) tokens a row, plus
                lin(2) over all n (router, predictor) and 8 (c n) d + 24n (gate, blend);
                with documents its slots are floor(c seq) + doc_starts' width a row (mod_slots).
    Mamba       RMS + mixer; mixer with inner I = expand d, H heads of P, state N, G groups,
                conv width K, Q = min(chunk, seq), c = ceil(seq / Q), n' = batch c Q, w = I + 2GN:
                lin(1) + a n (I + w + H) + lin(I)
                (in_proj's input, its output u, out_proj's input: archs/mamba.py's LeanMix keeps
                u alone of what lies between). Its backward makes that again, one layer at a
                time ("remade"): taps(w) + 8n w + 8n H + [n' > n] 4n' (I + H + 2GN)
                + [documents] n' Q + (4 + a) n' H Q + 4n' G Q + 2a n' G N + (4 + 2a) n' I
                + (4 + a) batch c H P N + a n' I + 8n' H + (12 + 2a) n I
                + 8n' H Q + 8 batch c H P N
                (the convolution's masked taps and output, SiLU's; dt and softplus(dt); chunks
                padded; the same-document mask; the decays L and C B^T * L; C B^T and its
                operands; dt x, its operand copy and dt x * decay (B and C are read per
                group, never copied over its heads); the carried states and their stack; the
                carried state's output; the decays to the chunk's end and from its start;
                the gated RMSNorm: y, silu(z), its fp32 input, normalized input and output;
                the gradients of L and the states)
    Resonance   2 LN + 3 lin(1) + 2a n d + taps(d) + 8nd + a nd + FFT + 2a n d_ff
                (in's output u and gate; the short convolution's taps and output, the long
                one's output; SiLU(gate); FFT = r (16nd + 16 seq d) + 8 batch d: the padded
                inputs, their spectra (complex64), the kernel's padded copy and spectrum, one
                per FFT length, counted as one; r = 1 without documents, else FFT_GROWTH: each
                document's FFT is fft_size(2m) long, 1.2x 2m on average)
    taps(w)     with documents a w sum_{j < K} batch (seq - j) (each masked tap is a copy), else 0
    weights     under autocast, without FSDP: 2 bytes per matrix, expert and router parameter
                (autocast's bf16 copy, kept by the matmul; FSDP's bf16 policy makes none)

The loss (longpack.archs.layers.chunked_cross_entropy): the final norm (LN, MoE's RMS) and its output
(4nd); the log-probabilities (4nV + 9n) when all of the micro-batch's fp32 logits are within
LOGITS_BUDGET_BYTES, at their making the logits beside them (a nV) and under autocast their
fp32 copy (4nV); past the budget nothing is kept and a chunk of CE_CHUNK tokens is made again in
backward, (4 + a + 4 [autocast]) x CE_CHUNK x V at its peak. MoE's multi-token heads each add
2nd [autocast] + a nd + 8n and their own loss.

Peak. Without activation checkpointing, the end of the forward: every layer + the weight copies
+ the final norm + the loss, kept and its transient; or, where larger, a Mamba layer's backward:
the layers before it, their weight copies, what it keeps then (its input, in_proj's input and
output), its remade tensors and its input's gradient (`widest`). With it (each block's recompute in
backward, training/step.py's models): each layer keeps its input only (4nd; 2nd under FSDP's
bf16 policy, which casts each block's input), and the peak is the larger of the loss's moment
(every input, the final norm, the loss; under autocast every weight copy, held by autocast's
cache until the forward ends) and a block's backward (every input, one layer recomputed with
its weight copies, or at its Mamba mixer's backward its remade tensors, and the widest
gradient its backward makes: `widest`). Plus the micro-batch
(input ids and targets) and the positions, int64: 24n.

Checked on the CPU (tests/test_memory_plan.py), every family, fp32 and bf16, with and without
documents: the formula is within 2% of the bytes of the tensors autograd saves (up to 8% over
where SDPA without documents returns heads already laid out (batch, seq, heads, hd), so merging
them is a view the formula counts as a copy), and within 1% of the peak torch.profiler measures
without checkpointing, 15% with it (the gradients allocated by then set apart: the plan counts
them whole). Not counted: allocator fragmentation and the CUDA context (~0.5-1 GiB on a GPU),
torch.compile's changes (Inductor's partitioner usually keeps less), kernels that save less on
CUDA (a fused RMSNorm keeps no normalized copy): the GPU issue measures them.
"""

import math
from dataclasses import dataclass, field

from longpack import archs
from longpack.archs.layers import LOGITS_BUDGET_BYTES

CE_CHUNK = 4096  # tokens per chunk of longpack.archs.layers.chunked_cross_entropy (its default)
CAST_ROLES = ("matrix", "experts", "router")  # weights autocast copies to bf16 in a matmul


@dataclass(frozen=True)
class Tokens:
    """A micro-batch: `batch` rows of `seq` tokens, `a` bytes an autocast activation (bf16 when
    `bf16`, which MoE's grouped GEMMs need), whether documents are masked, and `doc_width` the
    batch's doc_starts width (its most documents in a row; a compiled run's: seq), which a
    depth-routed block adds to its slots (0: not counted)."""
    batch: int
    seq: int
    a: int = 4
    docs: bool = True
    bf16: bool = False
    doc_width: int = 0

    @property
    def n(self) -> int:
        return self.batch * self.seq

    def lin_in(self, width: int, consumers: int = 1) -> int:
        """What the Linear layers reading one fp32 tensor of `width` keep: the tensor itself
        in fp32, one bf16 copy each under autocast."""
        return 4 * self.n * width if self.a == 4 else consumers * self.a * self.n * width

    def taps(self, width: int, kernel: int) -> int:
        """A short causal convolution's masked taps (with documents): a copy each."""
        if not self.docs:
            return 0
        return self.a * width * sum(self.batch * (self.seq - j)
                                    for j in range(1, min(kernel, self.seq)))


def layer_norm(t: Tokens, d: int) -> int:
    return 4 * t.n * d + 8 * t.n  # input, mean and rstd


def rms_norm(t: Tokens, d: int) -> int:
    return 8 * t.n * d + 4 * t.n  # input, normalized input, rstd


def attention(t: Tokens, d: int, heads: int, kv_heads: int, rot: int, merged_qkv: bool) -> int:
    """q, k, v, output, logsumexp, rotary tables, heads merged (module docstring)."""
    n, a, hd = t.n, t.a, d // heads
    kv = kv_heads * hd
    if merged_qkv:  # GPT-NeoX: one projection; q and k rotated together (a new tensor)
        b = a * n * 3 * d + (a * n * 2 * d if rot else 0)
    else:  # MoE: q (rotated, new), kv projection (v a view of it), k rotated (new)
        b = a * n * d + a * n * kv + a * n * 2 * kv
    return b + 2 * a * n * rot + a * n * d + 4 * n * heads + a * n * d


def neox_block(c, t: Tokens) -> int:
    hd = c.d_model // c.n_heads
    rot = int(hd * c.rotary_pct) // 2 * 2
    d, n = c.d_model, t.n
    return (layer_norm(t, d) + 8 * n + t.lin_in(d) * 2  # ln1, ln2 (one input); their outputs
            + attention(t, d, c.n_heads, c.n_heads, rot, merged_qkv=True)
            + 2 * t.a * n * c.d_ff)  # fc_in's output, GELU's


def experts(c, t: Tokens) -> int:
    n, d, E, k, f = t.n, c.d_model, c.n_experts, c.top_k, c.expert_width
    nk = n * k
    router = 8 * n * E + 12 * nk + 8 * n + 16 * nk  # logits, softmax, top-k, weights, permutation
    if t.bf16 and d % 8 == 0 and f % 8 == 0:  # grouped GEMMs over padded rows
        rows = (nk + 7 * E + 7) // 8 * 8
        mlp = 2 * nk * d + 2 * rows * (d + 4 * f) + 8 * nk + 2 * nk * d + 2 * nk
    else:  # one matmul per expert, the gate and up weights concatenated
        mlp = t.a * nk * (2 * d + 4 * f) + t.a * E * d * 2 * f + 4 * nk
    return router + mlp


def mamba_mixer(t: Tokens, d: int, inner: int, heads: int, groups: int, head_dim: int,
                state: int, conv: int, chunk: int) -> tuple[int, int, int]:
    """(kept, made again, kept then): what a Mamba mixer keeps (archs/mamba.py's LeanMix:
    in_proj's input and output, out_proj's input); what LeanMix's backward makes again (the
    convolution, the scan's chunk internals, the gate and its norm: module docstring) and the
    gradients of the decays and chunk states it makes; what the mixer still keeps then."""
    B, T, a = t.batch, t.seq, t.a
    n, H, G, P, N = t.n, heads, groups, head_dim, state
    Q = min(chunk, T)
    c = -(-T // Q)
    padded = B * c * Q
    cd = inner + 2 * G * N
    u = a * n * (inner + cd + H)  # in_proj's output: z, x B C, dt
    kept = t.lin_in(d) + u + t.lin_in(inner)  # in_proj's input, u, out_proj's input
    then = kept - t.lin_in(inner)  # out_proj's backward has run
    b = t.taps(cd, conv) + 8 * n * cd  # masked taps; the convolution's output, SiLU's
    b += 8 * n * H  # dt + bias, softplus(dt)
    if padded != n:  # x, dt, B, C padded to whole chunks
        b += 4 * padded * (inner + H + 2 * G * N)
    b += padded * Q if t.docs else 0  # the same-document mask
    b += 4 * padded * H * Q + a * padded * H * Q  # L; C B^T * L (the matmul's operand)
    b += 4 * padded * G * Q + 2 * a * padded * G * N  # C B^T; its operands
    b += 4 * padded * inner + 2 * a * padded * inner  # dt x; as operand; dt x * decay
    b += (4 + a) * B * c * H * P * N  # carried states; stacked (operand)
    b += a * padded * inner + 8 * padded * H  # the carried state's output; decays
    b += 12 * n * inner + 2 * a * n * inner  # gated RMSNorm: fp32 in, normalized, out; y, silu(z)
    b += 8 * padded * H * Q + 8 * B * c * H * P * N  # gradients: decays, chunk states
    return kept, b, then


# With documents, archs/resonance.py runs each document's FFT at fft_size(2m), the smallest
# 2^a or 3 x 2^a at least 2m: 1.2x 2m over document lengths spread from 50 to 60,000 tokens
# (token-weighted, computed from fft_size; at most 4/3).
FFT_GROWTH = 1.2


def resonance_block(c, t: Tokens) -> int:
    n, d, a = t.n, c.d_model, t.a
    b = 2 * layer_norm(t, d) + 2 * t.lin_in(d)  # ln1, ln2 and their outputs
    b += 2 * a * n * d + t.taps(d, c.short_conv) + 4 * n * d  # in's output, taps, short conv
    r = FFT_GROWTH if t.docs else 1  # documents' FFTs: fft_size(2m) over 2m, on average
    b += round(r * (8 * n * d + 8 * n * d + 16 * t.seq * d)) + 8 * t.batch * d  # FFTs
    b += 4 * n * d + a * n * d + t.lin_in(d)  # the long convolution's output, SiLU(gate), out's in
    return b + 2 * a * n * c.ff


def blocks(model_cfg, t: Tokens) -> list[int]:
    """Bytes autograd keeps for each block of the model, in order."""
    return [kept for kept, _, _ in blocks_and_remade(model_cfg, t)]


def blocks_and_remade(model_cfg, t: Tokens) -> list[tuple[int, int, int]]:
    """(kept, made again in its backward, kept then) of each block, in order: a Mamba layer's
    LeanMix makes its internals again (mamba_mixer), other layers nothing."""
    c = model_cfg
    if isinstance(c, archs.gpt_neox.GPTNeoXConfig):
        return [(neox_block(c, t), 0, 0)] * c.n_layers
    if isinstance(c, archs.resonance.ResonanceConfig):
        return [(resonance_block(c, t), 0, 0)] * c.n_layers
    if isinstance(c, archs.mamba.MambaConfig):
        inner = c.expand * c.d_model
        kept, again, then = mamba_mixer(t, c.d_model, inner, inner // c.head_dim, c.n_groups,
                                        c.head_dim, c.d_state, c.conv_width, c.chunk)
        norm = rms_norm(t, c.d_model)
        return [(norm + kept, again, norm + then)] * c.n_layers
    out = []
    for i, mixer in enumerate(c.mixers):
        routed = c.mod_capacity is not None and i % 2
        tt = t if not routed else Tokens(t.batch, mod_slots(c.mod_capacity, t), t.a, t.docs,
                                         t.bf16)
        again = then = 0
        if mixer == "A":
            mix = tt.lin_in(c.d_model, 2) + attention(  # q and kv read norm1's output
                tt, c.d_model, c.n_heads, c.n_kv_heads, c.d_model // c.n_heads, merged_qkv=False)
        else:
            inner = c.ssm_expand * c.d_model
            mix, again, then = mamba_mixer(tt, c.d_model, inner, inner // c.ssm_head_dim,
                                           c.ssm_groups, c.ssm_head_dim, c.ssm_state,
                                           c.ssm_conv, c.ssm_chunk)
        b = 2 * rms_norm(tt, c.d_model) + mix + tt.lin_in(c.d_model) + experts(c, tt)
        if routed:  # router and predictor over every token, the gate and its blend
            b += t.lin_in(c.d_model, 2) + 8 * tt.n * c.d_model + 24 * t.n
        out.append((b, again, rms_norm(tt, c.d_model) + then))  # the experts' backward ran
    return out


def mod_slots(share: float, t: Tokens) -> int:
    """A depth-routed block's slots per row in training (archs/moe.py's mod_slots): floor(c
    seq), and with documents one more per doc_starts column, at most seq."""
    if t.docs and t.doc_width:
        return min(t.seq, math.floor(share * t.seq) + t.doc_width)
    return max(1, math.floor(share * t.seq))


def widest(model_cfg, t: Tokens) -> int:
    """The largest gradient a block's backward makes at once (its widest activation's, in the
    activation's dtype): what a recomputed block adds to its own tensors at its peak."""
    c, n, a = model_cfg, t.n, t.a
    if isinstance(c, archs.gpt_neox.GPTNeoXConfig):
        return a * n * max(c.d_ff, 3 * c.d_model)
    if isinstance(c, archs.resonance.ResonanceConfig):
        return a * n * max(c.ff, 2 * c.d_model)
    if isinstance(c, archs.mamba.MambaConfig):
        inner = c.expand * c.d_model
        return a * n * (2 * inner + 2 * c.n_groups * c.d_state + inner // c.head_dim)
    wide = a * n * c.top_k * 2 * c.expert_width
    if c.uses("M"):
        inner = c.ssm_expand * c.d_model
        wide = max(wide, a * n * (2 * inner + 2 * c.ssm_groups * c.ssm_state
                                  + inner // c.ssm_head_dim))
    return wide


def loss(t: Tokens, vocab: int, heads: int = 1) -> tuple[int, int]:
    """(kept, peak over kept) of the loss: its log-probabilities when all the fp32 logits fit
    the budget (kept), else a chunk's, made again in backward (the peak only); per head."""
    n = t.n
    per = 4 + t.a + (4 if t.a != 4 else 0)  # fp32 log-probabilities, logits, their fp32 copy
    if n * vocab * 4 <= LOGITS_BUDGET_BYTES:
        return heads * (4 * n * vocab + 9 * n), (per - 4) * n * vocab
    return heads * 9 * n, per * min(n, CE_CHUNK) * vocab


def loss_bytes(tokens: int, vocab: int, precision: str = "fp32") -> int:
    """The loss's log-probabilities and the logits it makes them from, at their peak: all of
    a micro-batch's within LOGITS_BUDGET_BYTES (fp32 logits), else one chunk's."""
    t = Tokens(1, tokens, 4 if precision == "fp32" else 2)
    kept, peak = loss(t, vocab)
    return kept - 9 * tokens + peak if tokens * vocab * 4 <= LOGITS_BUDGET_BYTES else peak


@dataclass(frozen=True)
class Activations:
    saved: int  # what autograd keeps at the end of the forward, without checkpointing
    peak: int  # the peak without activation checkpointing (saved + the loss's transient)
    checkpointed: int  # the peak with it
    inputs: int  # the micro-batch and positions, in both
    detail: dict = field(default_factory=dict)


def activations(model_cfg, batch: int, seq: int, precision: str = "fp32", docs: bool = True,
                mixed: bool = False, cast_numel: dict | None = None,
                doc_width: int = 0) -> Activations:
    """Activation bytes of one micro-batch (module docstring). `cast_numel`: {block: numel of
    its matrix, expert and router weights} (memory.block_numel(layout, CAST_ROLES)), whose bf16 copies
    autocast keeps, unless `mixed`: FSDP's MixedPrecisionPolicy, whose bf16 weights need no
    copy and which casts each block's input to bf16 (what checkpointing keeps of a block).
    `doc_width`: Tokens'."""
    c = model_cfg
    a = 4 if precision == "fp32" else 2
    casts = a == 2 and not mixed
    resid = 2 if mixed and a == 2 else 4  # a block's input, as checkpointing keeps it
    t = Tokens(batch, seq, a, docs, precision == "bf16", doc_width)
    n, d = t.n, c.d_model
    per_block, remade, then = zip(*blocks_and_remade(c, t))
    copies = {k: 2 * v for k, v in (cast_numel or {}).items()} if casts else {}
    root_copies = copies.pop(None, 0)
    block_copies = [copies.get(i, 0) for i in range(len(per_block))]
    heads = getattr(c, "n_pred_tokens", 1)
    rms = isinstance(c, (archs.moe.MoEConfig, archs.mamba.MambaConfig))  # Mamba-2's final norm
    final = rms_norm(t, d) if rms else layer_norm(t, d)
    final += 4 * n * d  # h, the head's input
    final += (heads - 1) * ((0 if a == 4 else a * n * d) + a * n * d + 8 * n)  # multi-token heads
    kept, transient = loss(t, c.vocab_size, heads)
    inputs = 16 * n + 8 * n  # input ids and targets; positions
    saved = sum(per_block) + sum(block_copies) + root_copies + final + kept
    # or a Mamba layer's backward (LeanMix): the blocks before it, its copies and what it
    # keeps then, its internals made again, and the gradient of its input
    remaking = [sum(per_block[:i]) + sum(block_copies[:i + 1]) + then[i] + r + widest(c, t)
                for i, r in enumerate(remade) if r]
    peak = inputs + max([saved + transient, *remaking])
    at_loss = len(per_block) * resid * n * d + final + kept + transient + root_copies + (
        sum(block_copies) if casts else 0)  # autocast's cache holds every copy to the end
    # (at a Mamba layer's LeanMix the weight copies of the layers after it are gone)
    one_block = max(max(b + w, h + r) for b, w, r, h in zip(per_block, block_copies, remade,
                                                            then))
    at_block = len(per_block) * resid * n * d + one_block + widest(c, t)
    detail = {"at_loss": at_loss, "at_block": at_block, "blocks": sum(per_block),
              "weight_copies": sum(block_copies) + root_copies, "loss": kept + transient,
              "final": final}
    return Activations(saved, peak, inputs + max(at_loss, at_block), inputs, detail)
