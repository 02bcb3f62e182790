"""In-context learning on MCWQ with large language models.

`selection` picks demonstrations (random, similar = BM25, cover = Levy et al. ACL 2023's greedy
word/bigram cover, oracle_compounds = an ORACLE covering the gold query's compounds);
`prompt_format` renders a prompt and reads a query out of a response (reasoning dropped);
`client` sends chat completions to an OpenAI-compatible server through the stores' HTTP transport
(a deadline per attempt, its retry policy) with a crash-safe request cache. The main is
`mcwq_t5x.prompt`.

Imports: this wing imports `mcwq_t5x.data` and `mcwq_t5x.stores` only, and never JAX, Flax,
TensorFlow or SeqIO (the prompting main starts fast on a machine without them).
"""
