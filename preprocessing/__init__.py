"""CFQ -> Wikidata dataset creation of MCWQ (Cui et al., TACL 2022, §3–4).

Modules (each has a command line where it makes sense; see their docstrings):

* `cfq`: reading CFQ records, parsing their Freebase SPARQL, recovering `sparqlPatternModEntities`.
* `derive_mapping`: derives the Freebase -> Wikidata mapping by aligning CFQ with MCWQ (§3.1).
* `mapping`: the curated mapping (`data/property_mapping.json`) and query migration (§3.1).
* `substitute`: entity substitution and verified negative sampling (§3.2).
* `migrate`: the pipeline command line, writing the release formats.
* `translate`: MT backends (file, Hugging Face, Google REST v2) with caching (§4.1).
* `gold`: gold-set sampling from the MCD test intersection and BLEU (§4.2–4.3).
* `stats`: Table 3 statistics and the complexity histogram (§3.4).
* `make_splits`: MCD splits by DBCA (Keysers et al. 2020; `mcwq_t5x.data.divergence`) and random splits
  of equal sizes, for any release.

The SPARQL stores (embedded pyoxigraph, remote endpoints, the answer cache) are the library's
(`mcwq_t5x.stores`), with `mcwq_t5x.stores.jsonl_cache` (the crash-safe JSONL cache also used for
translations) and `mcwq_t5x.stores.transport` (the HTTP transport and retry policy, also used by
the Google MT client). The library never imports this package.

Nothing here imports TensorFlow.
"""
