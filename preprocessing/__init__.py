"""CFQ -> Wikidata dataset creation of MCWQ (Cui et al., TACL 2022, §3–4).

`cfq` (CFQ records and Freebase SPARQL), `derive_mapping` and `mapping` (the property mapping and
query migration, §3.1), `substitute` (entity substitution and verified negatives, §3.2),
`migrate` (the pipeline command, writing a release), `translate` (MT backends with caching,
§4.1), `gold` (gold-set sampling and BLEU, §4.2–4.3), `stats` (Table 3, §3.4), `make_splits`
(MCD splits by DBCA, Keysers et al. 2020, and random splits, for any release). SPARQL stores,
the JSONL cache and the HTTP transport are the library's (`mcwq_t5x.stores`); the library never
imports this package. Nothing here imports TensorFlow.
"""
