"""mcwq-t5x: MCWQ (Cui et al., TACL 2022) as SeqIO tasks, a lean T5X-style mT5 engine, evaluation.

The modules at this level are what users type (`python -m mcwq_t5x.train|eval|infer|score|report|
export_hf|inspect_task|divergence|rir|best_checkpoint`) and gin handling (`gin_utils`); each
command of a library module has that module's name in its wing. The library lives in wings,
each with its own import rule (ARCHITECTURE.md; `tests/test_architecture.py` checks them):

* `engine/`: the network, model, decoding, trainer and partitioning (JAX and Flax only);
* `data/`: MCWQ files, RIR and SPARQL, vocabularies, the SeqIO -> numpy pipeline, DBCA;
* `checkpointing/`: checkpoint formats, loading, saving, run records, the Hugging Face export;
* `evaluation/`: predictions, metrics, scoring, execution accuracy, the paper's report;
* `stores/`: SPARQL stores, the HTTP transport and retry policy of every remote client, caches.
"""
