"""SPARQL stores (embedded Oxigraph, remote endpoints), the HTTP transport and retry policy shared
by every remote client (SPARQL and translation), and crash-safe JSONL caches.

Imports: other stores modules only; no JAX, TensorFlow or anything else of the project.
"""
