"""Text from a trained model: `zoo generate RUN --prompt TEXT`.

    ids = generate(model, prompt_ids, max_new=50, temperature=0.8, top_k=50, top_p=0.95, seed=0)

Greedy when temperature is 0 (the default), else sampling from softmax(logits / temperature)
restricted to the top_k most likely tokens and to the smallest set whose probability reaches
top_p, with a torch.Generator seeded by `seed` (the same seed, the same text). Generation stops
after max_new tokens or at `eos_id`. A model with an incremental form (`new_cache()` and
`decode(ids, cache)`: the key/value caches of GPT-NeoX and of dropless MoE) runs the prompt once
and then one token per step; the others (resonance, capacity-bound MoE) run the whole sequence
again for each new token, the same logits at O(L) more cost.
"""

import torch


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


@torch.no_grad()
def generate(model, prompt: list[int], max_new: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             eos_id: int | None = None, allowed: torch.Tensor | None = None) -> list[int]:
    """The tokens after `prompt` (not including it); only ids where `allowed` (a bool per id of
    the tokenizer: the model's vocabulary may be padded past it, or the tokenizer have holes)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt], dtype=torch.long)
    out: list[int] = []
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
        out.append(token)
        if token == eos_id:
            break
        step_input = torch.tensor([[token]], dtype=torch.long)
        ids = torch.cat([ids, step_input], 1)
    return out
