"""SPARQL stores and the clients of remote services, one job a module:

* `endpoint`: the store interface (`Endpoint`), its errors, the Wikidata vocabulary and id checks;
* `oxigraph`: the embedded pyoxigraph store (and its query worker process);
* `remote`: remote SPARQL 1.1 endpoints over HTTP;
* `transport`: the HTTP transport and retry policy of every remote client (SPARQL and
  translation): deadline, retries, `Retry-After`, pacing, redirects;
* `cache`: a store whose answers are kept on disk; `jsonl_cache`: the crash-safe JSONL file it
  (and the translation cache) keeps them in;
* `flags`: the command-line flags that name a store.

Imports: other stores modules only; no JAX, TensorFlow or anything else of the project.
"""
