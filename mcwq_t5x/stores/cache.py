"""`CachedEndpoint`: a SPARQL store whose answers are kept on disk, so that a killed run resumes
without repeating a request.

Every answer is appended to a JSONL file as it arrives (`mcwq_t5x.stores.jsonl_cache`); errors are
never kept, except that a timed-out query is recorded as `{"timed_out_after_s": T}` and not re-run
by a later run unless asked (`retry_timeouts=True`).
"""

from __future__ import annotations

import pathlib
from typing import Any, Callable

from mcwq_t5x.stores.endpoint import Endpoint, QueryTimeout
from mcwq_t5x.stores.jsonl_cache import JsonlCache, make_key

TIMED_OUT = "timed_out_after_s"  # cache value {TIMED_OUT: seconds} of a query that timed out


class CachedEndpoint(Endpoint):
  """Caches `inner`'s answers on disk (`path`, append-only JSONL flushed per answer; None: memory).

  A `QueryTimeout` is recorded as `{"timed_out_after_s": T}` and raises again without running,
  unless `retry_timeouts`. `hits` (a recorded timeout not re-run included), `misses`, `timeouts`.
  """

  def __init__(self,
               inner: Endpoint,
               path: str | pathlib.Path | None,
               retry_timeouts: bool = False):
    self.inner = inner
    self.cache = JsonlCache(path)
    self.retry_timeouts = retry_timeouts
    self.hits = 0
    self.misses = 0
    self.timeouts = 0

  def _get(self, kind: str, query: str, fn: Callable[[str], Any]) -> Any:
    key = make_key(kind, query)
    if key in self.cache:
      value = self.cache[key]
      if not (isinstance(value, dict) and TIMED_OUT in value):
        self.hits += 1
        return value
      if not self.retry_timeouts:
        self.hits += 1
        self.timeouts += 1
        raise QueryTimeout(
            f"recorded in the cache as timed out after {value[TIMED_OUT]:g} s, not "
            f"re-run (retry_timeouts=True re-runs it):\n{query}", value[TIMED_OUT])
    self.misses += 1
    try:
      value = fn(query)
    except QueryTimeout as e:
      self.timeouts += 1
      self.cache.put(key, {TIMED_OUT: e.timeout_s}, kind=kind, query=query)
      raise
    self.cache.put(key, value, kind=kind, query=query)
    return value

  def predicate_counts(self) -> dict[str, int] | None:
    return self.inner.predicate_counts()

  def select(self, query: str) -> list[dict[str, str]]:
    return self._get("select", query, self.inner.select)

  def ask(self, query: str) -> bool:
    return self._get("ask", query, self.inner.ask)
