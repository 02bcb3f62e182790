"""The HTTP transport of every remote client: SPARQL endpoints (`stores.remote`, MCWQ paper §3.2),
machine translation (`preprocessing.translate`, §4.1) and chat completions (`prompting.client`).

`Transport.post` sends a form (`application/x-www-form-urlencoded`) or a body of bytes (JSON)
through a `requests.Session` under one policy: a deadline on each attempt as a whole (`timeout_s`; `DeadlineExceeded`, not
retried); at most `max_retries` retries on network errors, HTTP 429/500/502/503/504 and answers a
caller marks `retryable`, after an exponential backoff or at least the answer's `Retry-After` (RFC
9110 §10.2.3; more than `max_retry_after_s` raises `RetryAfterTooLong`); a minimum interval between
request starts (`min_interval_s`); redirects 301/302/303/307/308 followed by POSTing the same form
(at most `MAX_REDIRECTS` hops; an `Authorization` header is not sent to another host, as `requests`
does). Thread-safe: the attempts of all threads are paced together and
a `Retry-After` the transport gave up on holds them all; each thread has its own session.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import email.utils
import http.client
import logging
import math
import re
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, Mapping

import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.exceptions

REDIRECT_STATUSES = (301, 302, 303, 307, 308)
RETRY_STATUSES = (429, 500, 502, 503, 504)
MAX_REDIRECTS = 5
DEFAULT_MAX_RETRY_AFTER_S = 600.0
DEFAULT_BACKOFF_S = 1.0
DEFAULT_MAX_BACKOFF_S = 120.0

_DELAY_SECONDS_RE = re.compile(r"[0-9]+")  # RFC 9110 §10.2.3: delay-seconds = 1*DIGIT

_log = logging.getLogger(__name__)


class TransportError(RuntimeError):
  """A request failed for good: a network error after the last retry, a retried status after the
  last retry, a redirect without `Location` or too many of them, or a request that could not be
  sent (a malformed URL). The message begins with the URL."""


class HTTPStatusError(TransportError):
  """An answer whose status is neither 2xx, a redirect, nor retried (e.g. 400, 403, 404).

  Attributes:
    response: the answer (`Response`).
  """

  def __init__(self, response: "Response"):
    super().__init__(f"{response.url}: HTTP {response.status}: {body_head(response.body)}")
    self.response = response


class DeadlineExceeded(TransportError):
  """An attempt's answer was not complete within the transport's `timeout_s` (not retried).

  Attributes:
    timeout_s: the deadline it ran into, in seconds.
  """

  def __init__(self, message: str, timeout_s: float):
    super().__init__(message)
    self.timeout_s = timeout_s


class RetryAfterTooLong(RuntimeError):
  """The server asks to wait (`Retry-After`) longer than the client is configured to wait.

  Deliberately not a per-request error (not a `TransportError`): the service is rate-limiting the
  client as a whole, so a caller should stop rather than go on with the next request.

  Attributes:
    wait_s: the wait the server asks for, in seconds.
    max_s: the configured maximum wait, in seconds.
  """

  def __init__(self, message: str, wait_s: float, max_s: float):
    super().__init__(message)
    self.wait_s = wait_s
    self.max_s = max_s


def pace(last: float, min_interval_s: float, sleep: Callable[[float], None] = time.sleep) -> float:
  """`time.monotonic()` at this request's start (the next `last`), after sleeping until
  `min_interval_s` have passed since `last` (0.0 before the first)."""
  wait = last + min_interval_s - time.monotonic()
  if wait > 0:
    sleep(wait)
  return time.monotonic()


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
  """Seconds a `Retry-After` value asks for (RFC 9110 §10.2.3), 0.0 for a past date, None when
  absent or malformed ("1.5", "-3", "soon").

  Delay-seconds ("120") or an HTTP-date in any RFC 9110 §5.6.7 form (IMF-fixdate, RFC 850,
  asctime; `email.utils`), against `now` (POSIX seconds, default `time.time()`).
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
                retry_after: str | None,
                max_s: float = math.inf,
                now: float | None = None) -> float:
  """Seconds to wait before a retry: `max(min(backoff_s, max_s), Retry-After)`.

  `retry_after` is the header or None (unparseable counts as absent); `max_s` is the longest wait
  accepted (s); `now` is POSIX seconds for an HTTP-date (default `time.time()`).

  Raises:
    RetryAfterTooLong: the server asks for more than `max_s`.
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


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
  """How every remote client of the project retries and paces its requests (`Transport`,
  `prompting.client.ChatClient`); times in seconds.

  Attributes:
    max_retries: retries after a retryable failure.
    backoff_s: the backoff before the first retry; doubles after each failure.
    max_backoff_s: cap of the backoff (not of a wait the server asks for).
    max_retry_after_s: the longest `Retry-After` accepted (see `RetryAfterTooLong`).
    min_interval_s: minimum time between the starts of two requests (`pace`).

  Raises:
    ValueError: `max_retries` is negative.
  """
  max_retries: int
  backoff_s: float = DEFAULT_BACKOFF_S
  max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
  max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S
  min_interval_s: float = 0.0

  def __post_init__(self):
    if self.max_retries < 0:
      raise ValueError(f"max_retries must not be negative, got {self.max_retries!r}")

  def backoff(self, failures: int) -> float:
    """The backoff after `failures` failures in a row: 0 for none, then `backoff_s` doubling
    after each one, at most `max_backoff_s`."""
    return 0.0 if failures <= 0 else min(self.max_backoff_s, self.backoff_s * 2**(failures - 1))

  def delay(self, failures: int, retry_after: str | None, now: float | None = None) -> float:
    """`retry_delay` of `backoff(failures)` and the answer's `Retry-After` (or None), at most
    `max_retry_after_s`; `now` as `retry_delay`'s. Raises RetryAfterTooLong."""
    return retry_delay(self.backoff(failures), retry_after, self.max_retry_after_s, now)


def body_head(body: bytes, n: int = 200) -> str:
  """The first `n` bytes of an answer, decoded for a message (quoted, `…` when cut)."""
  return repr(body[:n].decode("utf-8", "replace") + ("…" if len(body) > n else ""))


@dataclasses.dataclass(frozen=True)
class Response:
  """A complete answer: `url` (the last redirect hop), `status`, `headers` (case-insensitive),
  `body` (bytes as received)."""
  url: str
  status: int
  headers: Mapping[str, str]
  body: bytes


def _shutdown(sock: socket.socket) -> None:
  """Shuts a socket down at the OS level (a read blocked on it in another thread returns)."""
  try:
    # socket.socket's, also for an SSLSocket: its own shutdown would drop the TLS state under
    # the thread reading it.
    socket.socket.shutdown(sock, socket.SHUT_RDWR)
  except OSError:
    pass  # already closed


class _Deadline:
  """Bounds one attempt as a whole: once `timeout_s` has passed, shuts its socket down.

  `start()` starts the timer; the connection hands its socket over (`watch`) before reading the
  answer; `finish()` stops the timer once the answer is read or the attempt failed. Then `cut`
  says that the timer shut the socket (the answer may be truncated) and `timed_out()` that the
  time ran out after the request was sent.
  """

  def __init__(self, timeout_s: float):
    self.timeout_s = timeout_s
    self.cut = False
    self._start = 0.0
    self._sock: socket.socket | None = None
    self._expired = False
    self._done = False
    self._lock = threading.Lock()
    self._timer = threading.Timer(timeout_s, self._expire)
    self._timer.daemon = True

  def start(self) -> None:
    self._start = time.monotonic()
    self._timer.start()

  def finish(self) -> None:
    self._timer.cancel()
    with self._lock:
      self._done = True  # the socket may be reused or closed (its number reused) from now on

  def _expire(self) -> None:
    with self._lock:
      if self._done:
        return
      self._expired = True
      if self._sock is not None:
        self.cut = True
        _shutdown(self._sock)

  def watch(self, sock: Any) -> None:
    """Takes the socket of the attempt, about to read the answer.

    Raises:
      TimeoutError: connecting and sending alone took all the time (urllib3 reports it as a read
        timeout: a network error, retried).
    """
    with self._lock:
      if self._expired:
        raise TimeoutError(f"connecting and sending took longer than {self.timeout_s:g} s")
      if isinstance(sock, socket.socket):  # not urllib3's SSLTransport (TLS in TLS to a proxy)
        self._sock = sock

  def timed_out(self) -> bool:
    """Whether the time ran out once the socket was watched (the request was sent, its answer is
    incomplete). The timer or, on a loaded machine, the per-read socket timeout may notice it
    first."""
    with self._lock:
      return self.cut or (self._sock is not None and
                          time.monotonic() - self._start >= self.timeout_s)


# The deadline of the attempt the current thread (or task) is sending: `_WatchedConnection`s are
# created and called by urllib3, which has no parameter to pass it through.
_DEADLINE: contextvars.ContextVar[_Deadline | None] = contextvars.ContextVar(
    "mcwq_t5x_stores_transport_deadline", default=None)


# why the deadline shuts the socket down: `requests`' `timeout=(connect, read)` and urllib3's
# `Timeout(total=...)` bound each socket operation, not an attempt ("if a server streams one byte
# every fifteen seconds, a timeout of 20 seconds will not trigger", urllib3's `Timeout` docs), and
# urllib3 has no public way to reach the socket before the headers arrive. So `getresponse` hands
# the socket to the running attempt's `_Deadline` (a `ContextVar`), plugged in through
# `ConnectionCls`, `pool_classes_by_scheme` and `HTTPAdapter.init_poolmanager`/`proxy_manager_for`.
# SOCKS proxies keep urllib3's classes: there the per-read timeout bounds an attempt.
class _WatchedConnection:
  """Adds to a urllib3 connection: hand the socket to the running attempt's deadline before reading
  the answer (the status line, headers and body are all read from it)."""

  def getresponse(self, *args: Any, **kwargs: Any) -> Any:
    deadline = _DEADLINE.get()
    if deadline is not None and self.sock is not None:  # type: ignore[attr-defined]
      deadline.watch(self.sock)  # type: ignore[attr-defined]
    return super().getresponse(*args, **kwargs)  # type: ignore[misc]


class _WatchedHTTPConnection(_WatchedConnection, urllib3.connection.HTTPConnection):
  pass


class _WatchedHTTPSConnection(_WatchedConnection, urllib3.connection.HTTPSConnection):
  pass  # urllib3's default TLS context and certificate checks


class _WatchedHTTPConnectionPool(urllib3.HTTPConnectionPool):
  ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSConnectionPool(urllib3.HTTPSConnectionPool):
  ConnectionCls = _WatchedHTTPSConnection


_POOLS = {"http": _WatchedHTTPConnectionPool, "https": _WatchedHTTPSConnectionPool}


class _WatchedAdapter(requests.adapters.HTTPAdapter):
  """`requests`' adapter (one attempt per request) whose connections, direct or through an HTTP
  proxy, a `_Deadline` can cut."""

  def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
    super().init_poolmanager(*args, **kwargs)
    self.poolmanager.pool_classes_by_scheme = _POOLS

  def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
    manager = super().proxy_manager_for(proxy, **kwargs)
    if not proxy.lower().startswith("socks"):
      manager.pool_classes_by_scheme = _POOLS
    return manager


# What a failed attempt raises (`requests.RequestException` is an `OSError`).
_FAILURES = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)
# The `requests` errors of the network (retried); its others are of the request (a malformed URL,
# a missing scheme: nothing was sent) and are not.
_NETWORK_ERRORS = (requests.ConnectionError, requests.Timeout,
                   requests.exceptions.ChunkedEncodingError)


def _origin(url: str) -> tuple[str, str]:
  """(scheme, host:port) of `url`, lower case."""
  parts = urllib.parse.urlsplit(url)
  return parts.scheme.lower(), parts.netloc.lower()


def _describe(error: BaseException) -> str:
  """`NewConnectionError: ...` for a `requests` error wrapping urllib3's `MaxRetryError`."""
  inner = error.args[0] if error.args else None
  if isinstance(inner, urllib3.exceptions.MaxRetryError) and inner.reason is not None:
    error = inner.reason
  return f"{type(error).__name__}: {error}"


# why `post` is its own retry loop, not `urllib3.util.Retry`: Retry sleeps with `time.sleep` and
# reads an HTTP-date against `time.time()` (tests would sleep for real), retries past
# `retry_after_max` instead of stopping, does not back off before the first retry, cannot see a
# body (Google's 403 `rateLimitExceeded`), keep an interval or remember a `Retry-After` after giving
# up, and would retry an attempt the deadline cut as a read error.
class Transport:
  """POSTs forms with the policy of the module docstring (times in seconds).

  `timeout_s`: one attempt as a whole, also `requests`' connect and read timeout (connecting alone
  that long is a retried network error); `backoff_s` doubles after each failure up to
  `max_backoff_s` (not a wait the server asks); `min_interval_s` between attempt starts; these,
  `max_retries` and `max_retry_after_s` form `policy` (a `RetryPolicy`); `retryable(response)`:
  extra answers to retry besides `RETRY_STATUSES`, returning what to report ("HTTP 403
  (rateLimitExceeded)") or None; `sleep`, `clock` injectable. `num_requests` counts attempts,
  retries and redirect hops included. Thread-safe (see the module docstring). ValueError:
  `timeout_s` <= 0, `max_retries` < 0.
  """

  def __init__(self,
               timeout_s: float,
               max_retries: int,
               backoff_s: float = DEFAULT_BACKOFF_S,
               max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
               min_interval_s: float = 0.0,
               max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S,
               user_agent: str | None = None,
               retryable: Callable[[Response], str | None] | None = None,
               sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.time):
    if not timeout_s > 0:
      raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    self.timeout_s = timeout_s
    self.policy = RetryPolicy(max_retries, backoff_s, max_backoff_s, max_retry_after_s,
                              min_interval_s)
    self.user_agent = user_agent
    self.num_requests = 0
    self._retryable = retryable
    self._sleep = sleep
    self._clock = clock
    self._last = 0.0
    self._hold_until = 0.0  # time.monotonic() before which the server asked us not to come back
    self._moved: dict[str, str] = {}  # url -> where a permanent redirect (301, 308) sent it
    self._pace_lock = threading.Lock()  # why: one interval between the starts of all threads
    self._local = threading.local()
    self._sessions: list[requests.Session] = []
    self._sessions_lock = threading.Lock()  # why: not the pace lock, held while a thread waits

  def _session(self) -> requests.Session:
    """This thread's session (`requests.Session` is not documented as thread-safe)."""
    session = getattr(self._local, "session", None)
    if session is None:
      session = requests.Session()
      adapter = _WatchedAdapter()
      session.mount("http://", adapter)
      session.mount("https://", adapter)
      self._local.session = session
      with self._sessions_lock:
        self._sessions.append(session)
    return session

  def close(self) -> None:
    """Closes the kept-alive connections of every thread (a later request opens new ones)."""
    with self._sessions_lock:
      for session in self._sessions:
        session.close()

  def post(self, url: str, data: Any, headers: Mapping[str, str] | None = None) -> Response:
    """POSTs `data` to `url` (a form: a dict, values may be lists; or bytes, sent as they are
    with the Content-Type `headers` give); returns the 2xx answer.

    Raises:
      DeadlineExceeded: an attempt's answer was not complete within `timeout_s`.
      HTTPStatusError: an answer that is not 2xx, a redirect or retried.
      RetryAfterTooLong: the server asks to wait longer than `max_retry_after_s`.
      TransportError: a network failure or retried answer after the last retry, a redirect
        without `Location` or more than `MAX_REDIRECTS`, or a request that cannot be sent.
    """
    headers = dict(headers or {})
    if self.user_agent is not None:
      headers["User-Agent"] = self.user_agent
    first = url
    url = self._moved.get(url, url)
    attempts = failures = redirects = 0
    while True:
      hold = self._hold_until - time.monotonic()
      if hold > 0:
        self._sleep(hold)
      with self._pace_lock:
        self._last = pace(self._last, self.policy.min_interval_s, self._sleep)
        self.num_requests += 1
      attempts += 1
      retry_after = None
      try:
        response = self._attempt(url, data, headers)
      except DeadlineExceeded:
        raise
      except requests.RequestException as e:
        if not isinstance(e, _NETWORK_ERRORS):
          raise TransportError(f"{url}: {type(e).__name__}: {e}") from e
        problem = _describe(e)
      except _FAILURES as e:
        problem = _describe(e)
      else:
        if response.status in REDIRECT_STATUSES:
          url = self._redirect(first, response)
          if _origin(url) != _origin(response.url):  # why: a key is for its own host only
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
          redirects += 1
          if redirects > MAX_REDIRECTS:
            raise TransportError(f"{first}: more than {MAX_REDIRECTS} redirects (the last to "
                                 f"{url}); the request was not answered")
          failures = 0
          continue
        if response.status in RETRY_STATUSES:
          problem = f"HTTP {response.status}"
        elif self._retryable is not None:
          problem = self._retryable(response)
        else:
          problem = None
        if problem is None:
          if 200 <= response.status < 300:
            return response
          raise HTTPStatusError(response)
        retry_after = response.headers.get("Retry-After")
      if failures >= self.policy.max_retries:
        if retry_after is not None:
          self._checked_delay(url, problem, 0, retry_after)
          asked = parse_retry_after(retry_after, self._clock())
          if asked:
            self._hold_until = time.monotonic() + asked
        raise TransportError(f"{url}: giving up after {attempts} attempts: {problem}")
      failures += 1
      wait_s = self._checked_delay(url, problem, failures, retry_after)
      _log.warning("%s: %s; retrying in %.1f s", url, problem, wait_s)
      self._sleep(wait_s)

  def _attempt(self, url: str, data: Any, headers: Mapping[str, str]) -> Response:
    """One POST, without retries or redirects, bounded by a `_Deadline`.

    Raises:
      DeadlineExceeded: the answer was not complete within `timeout_s`.
      requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException,
        OSError: the attempt failed otherwise.
    """
    deadline = _Deadline(self.timeout_s)
    token = _DEADLINE.set(deadline)
    deadline.start()
    try:
      try:
        resp = self._session().post(
            url,
            data=data,
            headers=headers,
            timeout=(self.timeout_s, self.timeout_s),
            stream=True,
            allow_redirects=False)
        try:
          body = resp.content
        finally:
          resp.close()
      finally:
        deadline.finish()
        _DEADLINE.reset(token)
    except _FAILURES as e:
      if deadline.timed_out():
        raise self._timeout(url) from e
      raise
    if deadline.cut:  # e.g. an answer without Content-Length, cut short
      raise self._timeout(url)
    return Response(url, resp.status_code, resp.headers, body)

  def _timeout(self, url: str) -> DeadlineExceeded:
    return DeadlineExceeded(f"{url}: no complete answer within {self.timeout_s:g} s",
                            self.timeout_s)

  def _redirect(self, first: str, response: Response) -> str:
    """Where a redirect sends the form next (remembered for `first` when permanent).

    Raises:
      TransportError: the redirect has no `Location`.
    """
    location = response.headers.get("Location")
    if not location:
      raise TransportError(f"{response.url}: HTTP {response.status} redirect without a Location "
                           "header; the request was not answered")
    url = urllib.parse.urljoin(response.url, location)
    permanent = response.status in (301, 308)
    _log.warning("%s: HTTP %d redirect to %s; sending the request there (POST)%s", response.url,
                 response.status, url, "; later requests go there directly" if permanent else "")
    if permanent:
      self._moved[first] = url
    return url

  def _checked_delay(self, url: str, problem: str, failures: int, retry_after: str | None) -> float:
    """`policy.delay` after `failures` failures (0: `Retry-After` alone), with this transport's
    clock.

    Raises:
      RetryAfterTooLong: naming `url` and `problem`.
    """
    try:
      return self.policy.delay(failures, retry_after, now=self._clock())
    except RetryAfterTooLong as e:
      raise RetryAfterTooLong(
          f"{url}: {problem}: {e}; stopping rather than retrying "
          "(raise max_retry_after_s to wait that long)", e.wait_s, e.max_s) from e
