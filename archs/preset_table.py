"""The presets as a text table (`python -m longpack.archs`, `zoo list`, `train --list-models`):
name, family, vocabulary, total and active parameters, GFLOPs/token."""

import math


def gflops(flops: float) -> str:
    """Three significant digits at least two decimals: 9.69, 0.00414 (not 0.00)."""
    g = flops / 1e9
    decimals = max(2, 2 - math.floor(math.log10(g))) if g > 0 else 2
    return f"{g:,.{decimals}f}"


def presets_table(models: list[dict]) -> str:
    from longpack.archs import LIST_SEQ  # archs/__init__ imports this module

    seq = models[0]["seq"] if models else LIST_SEQ
    lines = [f"{'name':<18}{'family':<11}{'vocab':>8}{'parameters':>15}{'active':>15}"
             f"{f'GFLOPs/token @{seq}':>21}"]
    for m in models:
        lines.append(f"{m['name']:<18}{m['family']:<11}{m['vocab_size']:>8,}{m['params']:>15,}"
                     f"{m['active_params']:>15,}{gflops(m['flops_per_token']):>21}")
    return "\n".join(lines)
