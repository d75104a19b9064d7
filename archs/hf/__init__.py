"""A model in Hugging Face transformers' forms, and back; models only, never a run:
transformers' own classes' layouts (native.py: GPT-NeoX as GPTNeoXForCausalLM, Mamba as
Mamba2ForCausalLM) and the modeling code shipped for the families transformers has no class for
(hf_remote.py ships modeling_longpack.py and configuration_longpack.py, copied as they are,
never imported here); a folder's files (hf_folder.py: weights, tokenizer, modes, staging); a
transformers folder read back as a model (hf_import.py). What a run adds (its tokenizer, its
card) is longpack.zoo's."""
