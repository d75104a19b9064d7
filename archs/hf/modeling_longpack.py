"""A longpack model in transformers: `AutoModelForCausalLM.from_pretrained(DIR,
trust_remote_code=True)` on a folder `zoo export --to hf` wrote.

Shipped as is into every exported folder of a family transformers has no class for (MoE and
its hybrids, resonance; Mamba is transformers' own Mamba2ForCausalLM). It is not a second copy
of any model: the folder also holds
archs' own model files (layers.py, limits.py, mamba.py, moe.py, moe_experts.py, resonance.py),
unchanged, which import each other relatively, so transformers copies them next to this file;
`LongpackForCausalLM` only wraps the family's model (`self.model`, its weights under their
archs names after "model."). Nothing of longpack needs to be installed.

forward(input_ids, attention_mask=None, past_key_values=None, labels=None) -> logits
(B, T, vocab) as archs' model gives them:
- no padding (attention_mask None or all ones): the family's forward on the whole batch;
- padding (any layout): each row's real tokens alone, as one document, and logits 0 at the
  padded places. Document boundaries are not needed at inference: a row is one document.
- `labels`: transformers' shifted next-token loss (-100 ignored).

Generation (`generate`, GenerationMixin): a family with an incremental form (archs'
`new_cache()` and `decode(ids, cache)`: the key/value caches of MoE, and the recurrent state
of a hybrid's Mamba layers) gets a `LongpackCache`, one archs cache per row: the
prompt runs once, then one token a step. Resonance and capacity-bound MoE (new_cache() is None)
run the whole sequence again each step (the same logits, more work).
"""

from dataclasses import fields

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_longpack import CONFIG_NAMES, LongpackConfig

# transformers copies a local folder's code into its module cache only as far as the file it
# loads imports it directly (a hub repository's also through the files' own imports), so every
# archs file the families import is named here too
from .documents import Documents  # noqa: F401
from .layers import StackedLM  # noqa: F401
from .limits import check_fields  # noqa: F401
from .mamba import MambaMixer  # noqa: F401
from .moe import MoE, MoEConfig
from .moe_experts import Experts  # noqa: F401
from .resonance import Resonance, ResonanceConfig

FAMILIES = {"moe": (MoEConfig, MoE), "resonance": (ResonanceConfig, Resonance)}


class LongpackCache:
    """Generation's state: the family's own cache (archs' `new_cache()`) for each row of the
    batch, and how many columns of input_ids it has taken in (padding included)."""

    def __init__(self, model, batch: int):
        self.rows = [model.new_cache() for _ in range(batch)]
        self.seen = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row i continues row beam_idx[i]. archs' caches replace their tensors
        rather than write into them, so copies of the lists and dicts are enough."""
        self.rows = [_copied(self.rows[int(i)]) for i in beam_idx]


def _copied(state):
    if isinstance(state, dict):
        return {k: _copied(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_copied(v) for v in state]
    return state


class LongpackForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = LongpackConfig
    base_model_prefix = "model"
    _tied_weights_keys = ["model.head.weight"]  # where a family ties it (tie_word_embeddings)
    _no_split_modules = ["Block", "DepthRouted"]
    _is_stateful = True  # its own cache, not transformers' DynamicCache

    def __init__(self, config: LongpackConfig):
        super().__init__(config)
        family_config, family_model = FAMILIES[config.family]
        stored = {f.name: CONFIG_NAMES.get(f.name, f.name) for f in fields(family_config)}
        settings = {name: getattr(config, key) for name, key in stored.items()
                    if hasattr(config, key)}
        self.model = family_model(family_config(**{**settings, "checkpointing": False}))
        self.decodes = hasattr(self.model, "new_cache") and self.model.new_cache() is not None
        self.post_init()

    def _init_weights(self, module):
        """archs' constructors initialize their own weights; transformers' scheme would
        overwrite them (from_pretrained loads every weight anyway)."""

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.head

    def set_output_embeddings(self, value):
        self.model.head = value

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                past_key_values: LongpackCache | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, return_dict: bool | None = None, **kwargs):
        if past_key_values is not None:
            logits = self._decode(input_ids, attention_mask, past_key_values)
        elif attention_mask is None or bool(attention_mask.all()):
            logits = self.model(input_ids)
        else:
            logits = self._rows(input_ids, attention_mask)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   labels[:, 1:].flatten().to(logits.device), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=past_key_values)

    def _rows(self, input_ids, attention_mask):
        """Each row's real tokens on their own; logits 0 where the row is padded."""
        logits = self._zeros(*input_ids.shape)
        for b, keep in enumerate(attention_mask.bool()):
            if keep.any():
                logits[b, keep] = self.model(input_ids[b, keep][None])[0]
        return logits

    def _decode(self, input_ids, attention_mask, cache: LongpackCache):
        """The new columns' logits, each row through its own archs cache (its real tokens:
        the attention mask's last T columns)."""
        T = input_ids.shape[1]
        logits = self._zeros(*input_ids.shape)
        keep = (torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None
                else attention_mask[:, -T:].bool())
        for b, row_cache in enumerate(cache.rows):
            if keep[b].any():
                logits[b, keep[b]] = self.model.decode(input_ids[b, keep[b]][None], row_cache)[0]
        cache.seen += T
        return logits

    def _zeros(self, batch: int, seq: int) -> torch.Tensor:
        head = self.model.head.weight
        return head.new_zeros(batch, seq, head.shape[0])

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None,
                                      use_cache=None, **kwargs):
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if past_key_values is not None:  # it holds every column before these
            input_ids = input_ids[:, past_key_values.seen:]
        elif use_cache and self.decodes:  # the first step: a fresh cache takes the prompt
            past_key_values = LongpackCache(self.model, input_ids.shape[0])
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "past_key_values": past_key_values}
