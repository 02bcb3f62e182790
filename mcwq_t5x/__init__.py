"""mcwq-t5x: MCWQ (Cui et al., TACL 2022) as SeqIO tasks, a lean T5X-style mT5 engine, evaluation.

The modules at this level are what users type (`python -m mcwq_t5x.train|eval|infer|score|report|
export_hf|inspect_task|divergence|rir|best_checkpoint|prompt`) and what they share (gin handling,
the console); the library lives in wings, each with its own import rule (ARCHITECTURE.md,
checked by `tests/test_architecture.py`): `engine/` (JAX and Flax only), `data/`,
`checkpointing/`, `evaluation/`, `stores/`, `prompting/`.
"""
