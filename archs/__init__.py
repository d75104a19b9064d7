"""longpack's model zoo (issue 4): GPT-NeoX, MoE and the resonance FFT model, by name."""
