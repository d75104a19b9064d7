"""Text from a trained model: `zoo generate RUN --prompt TEXT`.

    ids = generate(model, prompt_ids, max_new=50, temperature=0.8, top_k=50, top_p=0.95, seed=0)

Greedy when temperature is 0 (the default), else sampling from softmax(logits / temperature)
restricted to the top_k most likely tokens and to the smallest set whose probability reaches
top_p, with a torch.Generator seeded by `seed` (the same seed, the same text). Generation stops
after max_new tokens or at `eos_id`. A model with an incremental form (`new_cache()` and
`decode(ids, cache)`: the key/value caches of GPT-NeoX and of dropless MoE, Mamba's recurrent
state) runs the prompt once and then one token per step; the others (resonance,
capacity-bound MoE) run the whole sequence again for each new token, the same logits at O(L)
more cost.

`stream` yields the same tokens one by one and `TextStream` turns them into text as it becomes
whole, so `zoo generate` prints as it goes; `context` bounds prompt + new tokens where memory
or time grows with the sequence (every family but Mamba's constant-size state).
"""

from collections.abc import Iterator

import torch

from longpack import archs


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None,
               top_p: float | None, generator: torch.Generator) -> int:
    """One token from the logits of the last position (vocab,)."""
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the tokens until the running total reaches top_p (the one crossing it included)
        drop = torch.cumsum(sorted_probs, -1) - sorted_probs >= top_p
        probs = probs.scatter(0, order[drop], 0.0)
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(model, prompt: list[int], max_new: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             eos_id: int | None = None, allowed: torch.Tensor | None = None) -> list[int]:
    """The tokens after `prompt` (not including it); only ids where `allowed` (a bool per id of
    the tokenizer: the model's vocabulary may be padded past it, or the tokenizer have holes)."""
    return list(stream(model, prompt, max_new, temperature, top_k, top_p, seed, eos_id, allowed))


@torch.no_grad()
def stream(model, prompt: list[int], max_new: int, temperature: float = 0.0,
           top_k: int | None = None, top_p: float | None = None, seed: int = 0,
           eos_id: int | None = None, allowed: torch.Tensor | None = None) -> Iterator[int]:
    """`generate`'s tokens one at a time, as each is chosen (what `zoo generate` prints as it
    goes). Memory: the model's cache (or, without one, the sequence so far), not the output."""
    if not prompt:
        raise ValueError("an empty prompt: a model continues at least one token")
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt], dtype=torch.long)
    cache = model.new_cache() if hasattr(model, "new_cache") else None
    cached = cache is not None
    step_input = ids
    for _ in range(max_new):
        logits = model.decode(step_input, cache) if cached else model(ids)
        last = logits[0, -1]
        if allowed is not None:
            mask = torch.zeros_like(last, dtype=torch.bool)
            mask[:len(allowed)] = allowed[:len(last)]
            last = last.masked_fill(~mask, float("-inf"))
        token = next_token(last, temperature, top_k, top_p, generator)
        yield token
        if token == eos_id:
            return
        step_input = torch.tensor([[token]], dtype=torch.long)
        if not cached:  # the cache holds what came before; else the model reads it all again
            ids = torch.cat([ids, step_input], 1)


def context(model, trained_seq: int | None) -> int | None:
    """The most tokens (prompt and new ones) generation runs to: the longer of the model's
    max_seq and the samples it trained on, for every family whose cost grows with the sequence
    (attention's key/value cache; resonance and capacity-bound MoE run it all again per
    token); None for Mamba, whose recurrent state has one size however long the text."""
    if isinstance(model, archs.mamba.Mamba):
        return None
    return max(model.cfg.max_seq, trained_seq or 0)


class TextStream:
    """Token ids in, text out as soon as it is whole: a token may end inside a character (a
    byte-level BPE splits UTF-8), and some decoders join pieces with spaces that depend on the
    token before, so each piece is the decoding of the ids since a recent offset minus that of
    the ids before it, held back while it ends in an unfinished character (U+FFFD). Joined,
    the pieces are tokenizer.decode(all ids)."""

    def __init__(self, decode):
        self.decode, self.ids, self.start, self.shown = decode, [], 0, 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self.decode(self.ids[self.start:self.shown])
        text = self.decode(self.ids[self.start:])
        if text.endswith("\ufffd") or len(text) <= len(before):
            return ""
        self.start, self.shown = self.shown, len(self.ids)
        return text[len(before):]

    def flush(self) -> str:
        """What is held back at the end (an unfinished character, as the tokenizer decodes it)."""
        before = self.decode(self.ids[self.start:self.shown])
        return self.decode(self.ids[self.start:])[len(before):]
