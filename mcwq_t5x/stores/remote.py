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
  """Decodes an answer body that must be SPARQL 1.1 Query Results JSON (W3C, 2013).

  Args:
    url: where it came from (for the message).
    body: the raw body.
    form: "select" (needs `head` and `results.bindings`, a list of {variable: {"type", "value"}})
      or "ask" (needs a boolean `boolean`).

  Returns:
    The decoded object.

  Raises:
    EndpointError: the body is not UTF-8 JSON (an HTML page, say), is an error object
      (`{"error": ...}`), or lacks what `form` needs; the message names `url` and the head of
      the body.
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
  """A SPARQL 1.1 HTTP endpoint (default: the Wikidata Query Service).

  The answer must be SPARQL JSON results (`parse_results`): anything else, such as a status 200
  with an error object or an HTML page, raises `EndpointError` and is never returned as an answer
  (so `mcwq_t5x.stores.cache.CachedEndpoint` never keeps it).

  Args:
    url: endpoint URL.
    user_agent: sent as User-Agent (WDQS requires a descriptive one).
    timeout_s: bound of one request attempt as a whole (connecting, sending, waiting, reading the
      whole answer), in seconds. An attempt whose answer is not complete by then raises
      `QueryTimeout` and is not retried; connecting alone taking that long is a retryable network
      error.
    max_retries: retries after a retryable failure (HTTP 429, 500, 502, 503, 504, connection and
      read errors).
    backoff_s: first backoff, in seconds; doubles after each retry, up to `max_backoff_s`.
    max_backoff_s: cap of the backoff, in seconds (not of a wait the server asks for).
    min_interval_s: minimum time between two requests (rate limit; 1.0 = one request a second).
    sleep: injectable for tests.
    max_retry_after_s: the longest wait the server may ask for (`Retry-After`, both the
      delay-seconds and the HTTP-date form), in seconds; a longer one raises
      `transport.RetryAfterTooLong` at once instead of retrying.
    clock: the wall clock (POSIX seconds) an HTTP-date `Retry-After` is compared to; injectable.

  Waits are at least what the server asks: after giving up on a query that got a `Retry-After`,
  the next request still waits for the rest of that time.

  `select` and `ask` raise `QueryTimeout` (see `timeout_s`); `EndpointError` for an answer that is
  not SPARQL JSON results, an HTTP error other than the retried ones, a redirect without
  `Location` or more than `transport.MAX_REDIRECTS` of them, or a network failure or retried
  answer after the last retry; and `transport.RetryAfterTooLong` (not an `EndpointError`, so that
  a run stops) as described at `max_retry_after_s`.

  Attributes:
    url: the endpoint URL.
    transport: the `transport.Transport` (its settings are the arguments above).
    num_requests: HTTP request attempts sent (retries and redirect hops included).

  Raises:
    ValueError: `timeout_s` is not positive.
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
