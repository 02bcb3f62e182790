"""Remote SPARQL 1.1 endpoints over HTTP (default: the Wikidata Query Service).

Each query is a POST (SPARQL 1.1 Protocol §2.1.2: form-encoded `query`, JSON results,
https://www.w3.org/TR/sparql11-protocol/) through `mcwq_t5x.stores.transport`, the transport of
every remote client: a deadline on each attempt as a whole, retries with exponential backoff on
HTTP 429, 500, 502, 503, 504 and network errors (waiting at least what `Retry-After` asks, RFC 9110
§10.2.3), redirects followed by re-sending the query, and a minimum interval between requests. An
answer that is not SPARQL 1.1 Query Results JSON (an error object, an HTML page) raises
`EndpointError` (`parse_results`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from mcwq_t5x.stores import transport
from mcwq_t5x.stores.endpoint import PREFIXES, Endpoint, EndpointError, QueryTimeout, compact

WDQS_URL = "https://query.wikidata.org/sparql"
DEFAULT_USER_AGENT = "mcwq-t5x-preprocessing/0.1 (https://github.com/coastalcph/seq2sparql; research use)"
# Defaults of `RemoteEndpoint` and of the command-line flags of `mcwq_t5x.stores.flags`.
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_MIN_INTERVAL_S = 1.0


def parse_results(url: str, body: bytes, form: str) -> dict[str, Any]:
  """The decoded SPARQL 1.1 Query Results JSON (W3C, 2013) of `body`: `form` "select" (`head`,
  `results.bindings`) or "ask" (`boolean`).

  EndpointError naming `url` and the body's head: not UTF-8 JSON (an HTML page), an error object,
  or what `form` needs missing.
  """
  problem = ""
  try:
    res = json.loads(body.decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    res, problem = None, f"not JSON ({e})"
  if problem:
    pass
  elif not isinstance(res, dict):
    problem = f"a JSON {type(res).__name__}, not an object"
  elif "error" in res:
    problem = "an error object"
  elif form == "select":
    results = res.get("results")
    bindings = results.get("bindings") if isinstance(results, dict) else None
    if not isinstance(res.get("head"), dict):
      problem = "no 'head' object"
    elif not isinstance(bindings, list):
      problem = "no 'results.bindings' list"
    elif not all(
        isinstance(b, dict) and all(
            isinstance(v, dict) and isinstance(v.get("value"), str)
            for v in b.values())
        for b in bindings):
      problem = "a binding that is not {variable: {\"type\": ..., \"value\": ...}}"
  elif not isinstance(res.get("boolean"), bool):
    problem = "no boolean 'boolean'"
  if problem:
    raise EndpointError(f"{url}: the answer is not SPARQL JSON results of an {form.upper()} query "
                        f"({problem}); it begins {transport.body_head(body)}")
  return res


class RemoteEndpoint(Endpoint):
  """A SPARQL 1.1 HTTP endpoint (default: the Wikidata Query Service), through
  `transport.Transport`.

  Arguments are the transport's (seconds throughout): `timeout_s` bounds one attempt as a whole
  (`QueryTimeout`, not retried); `max_retries` after HTTP 429/500/502/503/504 and connection or
  read errors, with backoff `backoff_s` doubling to `max_backoff_s`; `min_interval_s` between
  requests; a `Retry-After` over `max_retry_after_s` raises `transport.RetryAfterTooLong` (not an
  `EndpointError`, so a run stops). `user_agent`: WDQS requires a descriptive one. Anything but
  SPARQL JSON results (a 200 with an error object, an HTML page), an unretried HTTP error,
  redirect trouble or failure after the last retry raises `EndpointError`, never an answer (so
  `CachedEndpoint` never keeps it). `num_requests` counts attempts. ValueError: `timeout_s` <= 0.
  """

  def __init__(self,
               url: str = WDQS_URL,
               user_agent: str = DEFAULT_USER_AGENT,
               timeout_s: float = DEFAULT_TIMEOUT_S,
               max_retries: int = DEFAULT_MAX_RETRIES,
               backoff_s: float = transport.DEFAULT_BACKOFF_S,
               max_backoff_s: float = transport.DEFAULT_MAX_BACKOFF_S,
               min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
               sleep: Callable[[float], None] = time.sleep,
               max_retry_after_s: float = transport.DEFAULT_MAX_RETRY_AFTER_S,
               clock: Callable[[], float] = time.time):
    self.url = url
    self.transport = transport.Transport(
        timeout_s=timeout_s,
        max_retries=max_retries,
        backoff_s=backoff_s,
        max_backoff_s=max_backoff_s,
        min_interval_s=min_interval_s,
        max_retry_after_s=max_retry_after_s,
        user_agent=user_agent,
        sleep=sleep,
        clock=clock)

  @property
  def user_agent(self) -> str | None:
    return self.transport.user_agent

  @property
  def timeout_s(self) -> float:
    return self.transport.timeout_s

  @property
  def max_retries(self) -> int:
    return self.transport.policy.max_retries

  @property
  def min_interval_s(self) -> float:
    return self.transport.policy.min_interval_s

  @property
  def max_retry_after_s(self) -> float:
    return self.transport.policy.max_retry_after_s

  @property
  def num_requests(self) -> int:
    return self.transport.num_requests

  def close(self) -> None:
    """Closes the kept-alive connections (a later query opens new ones)."""
    self.transport.close()

  def _request(self, query: str, form: str) -> dict[str, Any]:
    """Sends a query and returns its checked SPARQL JSON results."""
    try:
      response = self.transport.post(
          self.url,
          data={"query": PREFIXES + query},
          headers={"Accept": "application/sparql-results+json"})
    except transport.DeadlineExceeded as e:
      raise QueryTimeout(f"{e} for query:\n{query}", e.timeout_s) from e
    except transport.HTTPStatusError as e:
      raise EndpointError(f"{e}\nquery:\n{query}") from e
    except transport.TransportError as e:
      raise EndpointError(str(e)) from e
    return parse_results(response.url, response.body, form)

  def select(self, query: str) -> list[dict[str, str]]:
    res = self._request(query, "select")
    return [{
        k: compact(v["value"]) if v.get("type") == "uri" else v["value"] for k, v in b.items()
    } for b in res["results"]["bindings"]]

  def ask(self, query: str) -> bool:
    return self._request(query, "ask")["boolean"]
