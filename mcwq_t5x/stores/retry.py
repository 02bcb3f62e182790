"""Request pacing and retry delays shared by the remote clients (SPARQL endpoints, MT).

Used by `mcwq_t5x.stores.endpoint.RemoteEndpoint` (SPARQL 1.1 over HTTP, MCWQ paper §3.2; through its
urllib3 `Retry`) and `preprocessing.translate.GoogleBackend` (Cloud Translation REST v2, §4.1):
both keep a minimum interval between requests and, on HTTP 429/5xx, wait at least what the
server's `Retry-After` asks (RFC 9110 §10.2.3, in both its delay-seconds and HTTP-date forms),
else an exponentially growing backoff.

Plain Python, no TensorFlow.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import re
import time
from typing import Callable, Optional

_DELAY_SECONDS_RE = re.compile(r"[0-9]+")  # RFC 9110 §10.2.3: delay-seconds = 1*DIGIT


class RetryAfterTooLong(RuntimeError):
  """The server asks to wait (`Retry-After`) longer than the client is configured to wait.

  Deliberately not a per-request error: the service is rate-limiting the client as a whole, so a
  caller should stop rather than go on with the next request.

  Attributes:
    wait_s: the wait the server asks for, in seconds.
    max_s: the configured maximum wait, in seconds.
  """

  def __init__(self, message: str, wait_s: float, max_s: float):
    super().__init__(message)
    self.wait_s = wait_s
    self.max_s = max_s


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


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
  """Seconds to wait that a `Retry-After` header value asks for (RFC 9110 §10.2.3).

  Args:
    value: the header value: delay-seconds ("120", a non-negative integer) or an HTTP-date in any
      of the three forms RFC 9110 §5.6.7 makes recipients accept (IMF-fixdate
      "Wed, 21 Oct 2015 07:28:00 GMT", RFC 850, asctime; parsed by `email.utils`), or None.
    now: the current time as POSIX seconds, for the HTTP-date form (default `time.time()`).

  Returns:
    The delay in seconds (0.0 for a date in the past), or None when `value` is absent or is
    neither form (e.g. "1.5", "-3", "soon").
  """
  if value is None:
    return None
  value = value.strip()
  if _DELAY_SECONDS_RE.fullmatch(value):
    return float(int(value))
  try:
    when = email.utils.parsedate_to_datetime(value)
  except (TypeError, ValueError, IndexError, OverflowError):
    return None
  if when is None:  # older Pythons return None instead of raising
    return None
  if when.tzinfo is None:  # "-0000" or the asctime form: HTTP-dates are always UTC (GMT)
    when = when.replace(tzinfo=datetime.timezone.utc)
  return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_delay(backoff_s: float,
                retry_after: Optional[str],
                max_s: float = math.inf,
                now: Optional[float] = None) -> float:
  """Seconds to wait before retrying a failed request.

  Args:
    backoff_s: the current exponential-backoff delay, in seconds.
    retry_after: the response's `Retry-After` header, or None (see `parse_retry_after`; an
      unparseable value counts as absent).
    max_s: the longest wait the caller accepts, in seconds: the backoff is capped at it, and a
      server asking for more is an error.
    now: the current time as POSIX seconds, for an HTTP-date `retry_after` (default `time.time()`).

  Returns:
    `max(backoff_s, server's delay)`, i.e. at least what the server asks; `min(backoff_s, max_s)`
    when it asks nothing.

  Raises:
    RetryAfterTooLong: the server's delay exceeds `max_s`.
  """
  wait_s = min(backoff_s, max_s)
  asked = parse_retry_after(retry_after, now)
  if asked is not None:
    if asked > max_s:
      raise RetryAfterTooLong(
          f"the server asks to wait {asked:.0f} s (Retry-After: "
          f"{retry_after}), more than the maximum of {max_s:g} s", asked, max_s)
    wait_s = max(wait_s, asked)
  return wait_s
