"""Request pacing and retry delays shared by the remote clients of the pipeline.

Used by `endpoint.RemoteEndpoint` (SPARQL 1.1 over HTTP, MCWQ paper §3.2) and
`translate.GoogleBackend` (Cloud Translation REST v2, §4.1): both keep a minimum interval between
requests and, on HTTP 429/5xx, wait for the server's `Retry-After` (RFC 9110 §10.2.3, in its
delay-seconds form) or else an exponentially growing backoff.

Plain Python, no TensorFlow.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional


def pace(last: float, min_interval_s: float, sleep: Callable[[float], None] = time.sleep) -> float:
  """Sleeps until `min_interval_s` seconds have passed since the previous request started.

  Args:
    last: `time.monotonic()` at the start of the previous request (0.0 before the first).
    min_interval_s: the minimum interval between request starts, in seconds.
    sleep: the sleep function (injectable for tests).

  Returns:
    `time.monotonic()` now, i.e. the start of this request (pass it as `last` next time).
  """
  wait = last + min_interval_s - time.monotonic()
  if wait > 0:
    sleep(wait)
  return time.monotonic()


def retry_delay(backoff_s: float, retry_after: Optional[str],
                max_s: float = math.inf) -> float:
  """Seconds to wait before retrying a failed request.

  Args:
    backoff_s: the current exponential-backoff delay, in seconds.
    retry_after: the response's `Retry-After` header, or None. Only the delay-seconds form
      ("120") is honoured; an HTTP date or junk falls back to `backoff_s`.
    max_s: upper bound on the result, in seconds.

  Returns:
    `float(retry_after)` when it is a number, else `backoff_s`; at most `max_s`.
  """
  wait_s = backoff_s
  if retry_after:
    try:
      wait_s = float(retry_after)
    except ValueError:
      pass
  return min(wait_s, max_s)
