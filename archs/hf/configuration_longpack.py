"""The transformers configuration of a longpack model exported with `zoo export --to hf`.

This file is shipped as is into every exported folder of a family transformers has no class
for (MoE and its hybrids, resonance), next to modeling_longpack.py and archs' own model files;
it imports nothing of longpack. config.json holds `family` ("moe" or "resonance") and every
field of that family's config dataclass (archs/<family>.py) at its top
level (under CONFIG_NAMES' names where transformers reads a name as something else);
modeling_longpack.py rebuilds the dataclass from them. `max_position_embeddings` is the
context the model is meant for: the longer of its `max_seq` and the rows it trained on.
"""

from transformers import PretrainedConfig

# Fields stored under another name in config.json: transformers reads a top-level `top_k` as a
# generation setting (top-k sampling) and moves it to generation_config.json on save, so MoE's
# experts per token is stored under transformers' own MoE name.
CONFIG_NAMES = {"top_k": "num_experts_per_tok"}


class LongpackConfig(PretrainedConfig):
    model_type = "longpack"
    # transformers' usual names for the sizes every family has
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers"}

    def __init__(self, family: str = "moe", vocab_size: int = 50257, d_model: int = 64,
                 n_layers: int = 2, max_position_embeddings: int = 2048, use_cache: bool = True,
                 tie_word_embeddings: bool = False, **kwargs):
        # the family's other fields (n_heads, d_state, num_frequencies, ...) arrive in kwargs,
        # and PretrainedConfig keeps each as an attribute of the same name
        self.family = family
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.n_layers = n_layers
        self.max_position_embeddings = max_position_embeddings
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
