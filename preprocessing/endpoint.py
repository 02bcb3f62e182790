"""SPARQL endpoints for entity substitution and negative sampling (MCWQ paper, §3.2).

Two kinds behind one interface (`Endpoint`: `select`, `ask`, `labels`):

* `OxigraphEndpoint`: an embedded `pyoxigraph` store, loaded from N-Triples or from the CoDEx TSV
  files (`{train,valid,test}.txt`: `Qs<TAB>Pp<TAB>Qo`), the offline default. CoDEx's
  `entity2types.json` (entity -> types, CoDEx takes them from Wikidata's instance-of) is loaded as
  `wdt:P31` triples; `types.{lang}.json` / `relations.{lang}.json` labels as `rdfs:label`.
  CoDEx has no labels for most entities: `labels` then returns only those it has.
  With `timeout_s`, queries run in a forked worker process that is killed when a query runs longer.
* `RemoteEndpoint`: any SPARQL 1.1 HTTP endpoint (SPARQL 1.1 Protocol, POST with a form-encoded
  `query`, JSON results) through `urllib.request`, by default the Wikidata Query Service, with a
  custom User-Agent, a timeout on the whole request, retries with exponential backoff on HTTP 429
  and 5xx (waiting at least what `Retry-After` asks, RFC 9110 §10.2.3) and a minimum interval
  between requests.

Both raise `QueryTimeout` (an `EndpointError`) when a query takes longer than `timeout_s`; it is
not retried. `CachedEndpoint` wraps either one and keeps every answer in an append-only JSONL file
(`preprocessing.cache`), so a killed run resumes without repeating a request; a timed-out query is
recorded as `{"timed_out_after_s": T}` and not re-run by a later run unless asked
(`retry_timeouts=True`).

Command lines that query a store (`preprocessing.migrate`, `mcwq_t5x.evaluate`) define the remote
endpoint's flags with `add_endpoint_arguments` and build the store they name with
`endpoint_from_arguments` (the embedded one through `embedded_store`).

Results are plain JSON-able values: `select` returns a list of {variable: term} rows where a
Wikidata entity is written `wd:Q42`, a property `wdt:P57`, any other IRI `<…>` and a literal its
lexical form.
"""

from __future__ import annotations

import abc
import argparse
import http.client
import json
import logging
import multiprocessing
import pathlib
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterable, Sequence

from preprocessing import retry
from preprocessing.cache import JsonlCache, make_key

WD = "http://www.wikidata.org/entity/"
WDT = "http://www.wikidata.org/prop/direct/"
RDFS_LABEL = "http://www.w3.org/2000/01/rdf-schema#label"
PREFIXES = (f"PREFIX wd: <{WD}>\nPREFIX wdt: <{WDT}>\n"
            "PREFIX rdfs: <http://www.w3.org/2000/01/rdf-schema#>\n")
WDQS_URL = "https://query.wikidata.org/sparql"
DEFAULT_USER_AGENT = "mcwq-t5x-preprocessing/0.1 (https://github.com/coastalcph/seq2sparql; research use)"
# Defaults of `RemoteEndpoint` and of the command-line flags of `add_endpoint_arguments`.
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_MIN_INTERVAL_S = 1.0
DEFAULT_MAX_RETRY_AFTER_S = 600.0

QID_RE = re.compile(r"^Q[1-9][0-9]{0,11}$")
PID_RE = re.compile(r"^P[1-9][0-9]{0,11}$")
LANG_RE = re.compile(r"^[a-z]{2,3}(-[A-Za-z0-9]{1,8})*$")

_log = logging.getLogger(__name__)


class EndpointError(RuntimeError):
  """A query failed for good (after retries, or a non-retryable error)."""


class QueryTimeout(EndpointError):
  """A query did not finish within the endpoint's `timeout_s` (not retried).

  Attributes:
    timeout_s: the time limit it ran into, in seconds.
  """

  def __init__(self, message: str, timeout_s: float):
    super().__init__(message)
    self.timeout_s = timeout_s


# A 429/503 whose Retry-After exceeds the client's maximum: the run should stop (see `retry`).
RetryAfterTooLong = retry.RetryAfterTooLong


def check_qid(qid: str) -> str:
  """Returns `qid` if it is a Wikidata item id `Q123`, else raises ValueError (no injection)."""
  if not isinstance(qid, str) or not QID_RE.match(qid):
    raise ValueError(f"not a Wikidata item id: {qid!r}")
  return qid


def check_pid(pid: str) -> str:
  """Returns `pid` if it is a Wikidata property id `P123`, else raises ValueError."""
  if not isinstance(pid, str) or not PID_RE.match(pid):
    raise ValueError(f"not a Wikidata property id: {pid!r}")
  return pid


def compact(iri: str) -> str:
  """`http://www.wikidata.org/entity/Q42` -> `wd:Q42` (other IRIs -> `<iri>`)."""
  if iri.startswith(WD):
    return "wd:" + iri[len(WD):]
  if iri.startswith(WDT):
    return "wdt:" + iri[len(WDT):]
  return f"<{iri}>"


class Endpoint(abc.ABC):
  """A SPARQL endpoint answering the queries of the migration (Wikidata vocabulary)."""

  @abc.abstractmethod
  def select(self, query: str) -> list[dict[str, str]]:
    """Runs a SELECT query (without PREFIX lines; `wd:`, `wdt:`, `rdfs:` are declared).

    Returns:
      Rows {variable name (no '?'): term}; unbound variables are absent from a row.

    Raises:
      EndpointError: the query failed.
    """

  @abc.abstractmethod
  def ask(self, query: str) -> bool:
    """Runs an ASK query (prefixes as for `select`). Raises EndpointError on failure."""

  def predicates(self) -> set[str] | None:
    """The `wdt:P…` properties that have triples, when cheaply known (None = unknown).

    A query using a property without triples has no solutions; the embedded store knows its
    properties, which saves running such queries (CoDEx lacks many MCWQ properties).
    """
    counts = self.predicate_counts()
    return None if counts is None else set(counts)

  def predicate_counts(self) -> dict[str, int] | None:
    """Number of triples of each `wdt:P…` property, when cheaply known (None = unknown).

    Used to order the triple patterns of generated queries (most selective first): pyoxigraph
    joins in the written order, and a bad order turns a 1 ms query into minutes.
    """
    return None

  def labels(self, qids: Sequence[str], language: str = "en") -> dict[str, str]:
    """Labels of Wikidata items in `language` ({} entries for items without one).

    Raises:
      ValueError: an id is not `Q…` or the language code is malformed (nothing is sent).
    """
    out: dict[str, str] = {}
    qids = sorted({check_qid(q) for q in qids})
    if not LANG_RE.match(language):
      raise ValueError(f"bad language code {language!r}")
    for i in range(0, len(qids), 200):
      chunk = qids[i:i + 200]
      values = " ".join(f"wd:{q}" for q in chunk)
      rows = self.select(f"SELECT ?e ?l WHERE {{ VALUES ?e {{ {values} }} ?e rdfs:label ?l . "
                         f"FILTER ( lang(?l) = \"{language}\" ) }}")
      for r in rows:
        if "l" in r and r.get("e", "").startswith("wd:"):
          out.setdefault(r["e"][3:], r["l"])
    return out


def _evaluate(store: Any, text: str) -> list[dict[str, str]] | bool:
  """Runs a query on a pyoxigraph store and materialises the answer (SELECT rows, ASK bool).

  Raises:
    SyntaxError, ValueError, OSError: from pyoxigraph (bad query, store failure), or ValueError for
      a CONSTRUCT/DESCRIBE query.
  """
  import pyoxigraph  # pylint: disable=g-import-not-at-top
  res = store.query(text)
  if isinstance(res, pyoxigraph.QueryBoolean):
    return bool(res)
  if not isinstance(res, pyoxigraph.QuerySolutions):
    raise ValueError("only SELECT and ASK queries are supported")
  names = [v.value for v in res.variables]
  rows = []
  for sol in res:  # the evaluation happens here, solution by solution
    row = {}
    for n in names:
      t = sol[n]
      if t is None:
        continue
      row[n] = compact(t.value) if isinstance(t, pyoxigraph.NamedNode) else t.value
    rows.append(row)
  return rows


def _serve(store: Any, conn: Any, parent_end: Any) -> None:
  """Worker-process loop of `OxigraphEndpoint`: query text in, ("ok"|"error", answer) out."""
  parent_end.close()  # else the worker never sees EOF when the parent closes its end
  while True:
    try:
      text = conn.recv()
    except (EOFError, OSError):
      return
    try:
      answer: tuple[str, Any] = ("ok", _evaluate(store, text))
    except (SyntaxError, ValueError, OSError) as e:
      answer = ("error", f"{type(e).__name__}: {e}")
    conn.send(answer)


class OxigraphEndpoint(Endpoint):
  """Embedded pyoxigraph store (in memory).

  A pyoxigraph query cannot be interrupted, so with `timeout_s` every query runs in a worker
  process forked from this one (it sees the store copy-on-write, without copying it); a query
  that runs longer than `timeout_s` gets its worker killed (CPU and memory freed), is logged and
  counted in `num_timeouts`, and raises `QueryTimeout`; the next query forks a fresh worker. Loading
  data stops the worker, so the next one sees it. Needs the `fork` start method (Linux, macOS).

  Args:
    store: a `pyoxigraph.Store`; default a new empty in-memory store.
    timeout_s: bound of one query's evaluation (including reading all its solutions), in seconds;
      None runs queries in this process without a bound.

  Raises:
    ValueError: `timeout_s` is not positive, or the platform cannot fork.
  """

  def __init__(self, store: Any = None, timeout_s: float | None = None):
    import pyoxigraph  # pylint: disable=g-import-not-at-top
    if timeout_s is not None:
      if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
      if "fork" not in multiprocessing.get_all_start_methods():
        raise ValueError("OxigraphEndpoint(timeout_s=...) needs the 'fork' start method")
    self._ox = pyoxigraph
    self.store = store if store is not None else pyoxigraph.Store()
    self.timeout_s = timeout_s
    self.num_queries = 0
    self.num_timeouts = 0
    self._predicates: dict[str, int] | None = None
    self._worker: Any = None
    self._conn: Any = None

  def load_ntriples(self, path: str | pathlib.Path) -> None:
    """Adds an N-Triples file (Wikidata IRIs expected) to the store."""
    self.store.bulk_load(path=str(path), format=self._ox.RdfFormat.N_TRIPLES)
    self._predicates = None
    self.close()

  def load_codex(
      self,
      codex_dir: str | pathlib.Path,
      languages: Iterable[str] = ("en",),
      parts: Iterable[str] = ("train", "valid", "test")
  ) -> dict[str, int]:
    """Loads a CoDEx folder (see module docstring).

    Returns:
      Counts {"triples", "types", "labels"} loaded.

    Raises:
      ValueError: `FILE:LINE: problem` for a malformed TSV line or id.
    """
    codex_dir = pathlib.Path(codex_dir)
    lines: list[str] = []
    counts = {"triples": 0, "types": 0, "labels": 0}
    for part in parts:
      path = codex_dir / f"{part}.txt"
      if not path.exists():
        continue
      with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
          fields = line.rstrip("\n").split("\t")
          if fields == [""]:
            continue
          if (len(fields) != 3 or not QID_RE.match(fields[0]) or not PID_RE.match(fields[1]) or
              not QID_RE.match(fields[2])):
            raise ValueError(f"{path}:{n}: expected 'Q<TAB>P<TAB>Q', got {line.strip()!r}")
          lines.append(f"<{WD}{fields[0]}> <{WDT}{fields[1]}> <{WD}{fields[2]}> .")
          counts["triples"] += 1
    types_path = codex_dir / "entity2types.json"
    if types_path.exists():
      for e, ts in json.loads(types_path.read_text(encoding="utf-8")).items():
        if not QID_RE.match(e):
          raise ValueError(f"{types_path}: bad entity id {e!r}")
        for t in ts:
          if not QID_RE.match(t):
            raise ValueError(f"{types_path}: bad type id {t!r} of {e}")
          lines.append(f"<{WD}{e}> <{WDT}P31> <{WD}{t}> .")
          counts["types"] += 1
    for lang in languages:
      for name in ("types", "entities"):
        path = codex_dir / f"{name}.{lang}.json"
        if not path.exists():
          continue
        for e, info in json.loads(path.read_text(encoding="utf-8")).items():
          label = info.get("label") if isinstance(info, dict) else None
          if QID_RE.match(e) and isinstance(label, str) and label:
            lines.append(f"<{WD}{e}> <{RDFS_LABEL}> {json.dumps(label)}@{lang} .")
            counts["labels"] += 1
    self.store.bulk_load(
        input="\n".join(lines).encode("utf-8"), format=self._ox.RdfFormat.N_TRIPLES)
    self._predicates = None
    self.close()
    return counts

  def predicate_counts(self) -> dict[str, int] | None:
    if self._predicates is None:
      rows = self.select("SELECT ?p (COUNT(*) AS ?n) WHERE { ?s ?p ?o } GROUP BY ?p")
      self._predicates = {r["p"]: int(r["n"]) for r in rows if r.get("p", "").startswith("wdt:")}
    return self._predicates

  def close(self) -> None:
    """Stops the worker process, if any (the next query with `timeout_s` starts a new one)."""
    worker, conn = self._worker, self._conn
    self._worker = self._conn = None
    if worker is None:
      return
    conn.close()  # the worker sees EOF and exits
    worker.join(timeout=1.0)
    if worker.is_alive():
      worker.kill()
      worker.join()

  def _kill_worker(self) -> None:
    worker, conn = self._worker, self._conn
    self._worker = self._conn = None
    if worker is not None:
      worker.kill()
      worker.join()
      conn.close()

  def _in_worker(self, text: str, query: str) -> list[dict[str, str]] | bool:
    if self._worker is None or not self._worker.is_alive():
      self._kill_worker()
      ctx = multiprocessing.get_context("fork")
      conn, child_end = ctx.Pipe()
      worker = ctx.Process(
          target=_serve, args=(self.store, child_end, conn), name="oxigraph-query", daemon=True)
      worker.start()
      child_end.close()
      self._worker, self._conn = worker, conn
    start = time.monotonic()
    try:
      self._conn.send(text)
      done = self._conn.poll(self.timeout_s)
      status, value = self._conn.recv() if done else (None, None)
    except (EOFError, OSError) as e:  # the worker died (e.g. killed for memory)
      self._kill_worker()
      raise EndpointError(f"query worker process died: {e!r}\n{query}") from e
    except BaseException:  # e.g. KeyboardInterrupt: its answer must not become the next one's
      self._kill_worker()
      raise
    if not done:
      self._kill_worker()
      self.num_timeouts += 1
      _log.warning("query timed out after %.1f s (limit %g s); its worker process was killed:\n%s",
                   time.monotonic() - start, self.timeout_s, query)
      raise QueryTimeout(f"query timed out after {self.timeout_s:g} s:\n{query}", self.timeout_s)
    if status != "ok":
      raise EndpointError(f"query failed: {value}\n{query}")
    return value

  def _run(self, query: str) -> list[dict[str, str]] | bool:
    self.num_queries += 1
    text = PREFIXES + query
    if self.timeout_s is not None:
      return self._in_worker(text, query)
    try:
      return _evaluate(self.store, text)
    except (SyntaxError, ValueError, OSError) as e:
      raise EndpointError(f"query failed: {e}\n{query}") from e

  def select(self, query: str) -> list[dict[str, str]]:
    rows = self._run(query)
    if not isinstance(rows, list):
      raise EndpointError(f"not a SELECT query:\n{query}")
    return rows

  def ask(self, query: str) -> bool:
    answer = self._run(query)
    if not isinstance(answer, bool):
      raise EndpointError(f"not an ASK query:\n{query}")
    return answer


def _shutdown(sock: socket.socket) -> None:
  """Shuts a socket down at the OS level (a read blocked on it in another thread returns)."""
  try:
    # socket.socket's, also for an SSLSocket: its own shutdown would drop the TLS state under
    # the thread reading it.
    socket.socket.shutdown(sock, socket.SHUT_RDWR)
  except OSError:
    pass  # already closed


class _Deadline:
  """Bounds one HTTP request as a whole: once `timeout_s` has passed, shuts its socket down.

  A socket timeout only bounds each read (a server sending a byte every half second never trips
  it); shutting the socket down from a timer thread ends any blocked read or write at once.

  Use: `with deadline:` around the request, then `deadline.cut` after an answer (the timer shut
  the connection: the answer may be truncated) or `deadline.timed_out()` after a failure.
  """

  def __init__(self, timeout_s: float):
    self.timeout_s = timeout_s
    self._start = 0.0
    self.cut = False
    self._expired = False
    self._done = False
    self._socks: list[socket.socket] = []
    self._lock = threading.Lock()
    self._timer = threading.Timer(timeout_s, self._expire)
    self._timer.daemon = True

  def __enter__(self) -> "_Deadline":
    self._start = time.monotonic()
    self._timer.start()
    return self

  def __exit__(self, *exc: Any) -> None:
    self._timer.cancel()
    with self._lock:
      self._done = True  # the sockets may be closed (and their numbers reused) from now on

  def _expire(self) -> None:
    with self._lock:
      if self._done:
        return
      self._expired = True
      self.cut = bool(self._socks)
      for sock in self._socks:
        _shutdown(sock)

  def add(self, sock: socket.socket) -> None:
    """Registers a connected socket; raises TimeoutError if connecting alone took all the time."""
    with self._lock:
      if self._expired:
        raise TimeoutError(f"connecting took longer than {self.timeout_s:g} s")
      self._socks.append(sock)

  def timed_out(self) -> bool:
    """Whether the time ran out once connected (the query was sent, its answer is incomplete).

    The timer or, on a loaded machine, a per-read socket timeout may notice it first.
    """
    with self._lock:
      return self.cut or (bool(self._socks) and time.monotonic() - self._start >= self.timeout_s)


class _DeadlineConnectionMixin:
  """Registers the connection's socket with a `_Deadline` once it is connected."""

  def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self._deadline = deadline

  def connect(self) -> None:
    super().connect()
    self._deadline.add(self.sock)


class _DeadlineHTTPConnection(_DeadlineConnectionMixin, http.client.HTTPConnection):
  """`http.client.HTTPConnection` whose socket a `_Deadline` can cut."""


class _DeadlineHTTPSConnection(_DeadlineConnectionMixin, http.client.HTTPSConnection):
  """`http.client.HTTPSConnection` whose socket a `_Deadline` can cut."""


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
  """Opens `http:` URLs with `_DeadlineHTTPConnection`."""

  def __init__(self, deadline: _Deadline):
    super().__init__()
    self._deadline = deadline

  def http_open(self, req: urllib.request.Request) -> Any:
    return self.do_open(_DeadlineHTTPConnection, req, deadline=self._deadline)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
  """Opens `https:` URLs with `_DeadlineHTTPSConnection` (default TLS context and checks)."""

  def __init__(self, deadline: _Deadline):
    super().__init__()
    self._deadline = deadline

  def https_open(self, req: urllib.request.Request) -> Any:
    return self.do_open(
        _DeadlineHTTPSConnection, req, context=self._context, deadline=self._deadline)


class RemoteEndpoint(Endpoint):
  """A SPARQL 1.1 HTTP endpoint (default: the Wikidata Query Service).

  Each query is one POST (SPARQL 1.1 Protocol §2.1.2: form-encoded `query`, JSON results,
  https://www.w3.org/TR/sparql11-protocol/) through `urllib.request`, so proxies set in the
  environment are used.

  Args:
    url: endpoint URL.
    user_agent: sent as User-Agent (WDQS requires a descriptive one).
    timeout_s: bound of one request as a whole (connecting, sending, waiting, reading the whole
      answer), in seconds. A request whose answer is not complete by then raises `QueryTimeout`
      and is not retried; connecting alone taking that long is a retryable network error.
    max_retries: retries after a retryable failure (HTTP 429, 5xx, connection errors).
    backoff_s: first backoff, in seconds; doubles after each retry, up to `max_backoff_s`.
    max_backoff_s: cap of the backoff, in seconds (not of a wait the server asks for).
    min_interval_s: minimum time between two requests (rate limit; 1.0 = one request a second).
    sleep: injectable for tests.
    max_retry_after_s: the longest wait the server may ask for (`Retry-After`, both the
      delay-seconds and the HTTP-date form, RFC 9110 §10.2.3), in seconds; a longer one raises
      `RetryAfterTooLong` at once instead of retrying.
    clock: the wall clock (POSIX seconds) an HTTP-date `Retry-After` is compared to; injectable.

  Waits are at least what the server asks: after giving up on a query that got a `Retry-After`,
  the next request still waits for the rest of that time.

  `select` and `ask` raise `QueryTimeout` (see `timeout_s`), `EndpointError` for an HTTP error
  other than 429/5xx or after the last retry, and `RetryAfterTooLong` (not an `EndpointError`, so
  that a run stops) as described at `max_retry_after_s`.

  Raises:
    ValueError: `timeout_s` is not positive.
  """

  def __init__(self,
               url: str = WDQS_URL,
               user_agent: str = DEFAULT_USER_AGENT,
               timeout_s: float = DEFAULT_TIMEOUT_S,
               max_retries: int = DEFAULT_MAX_RETRIES,
               backoff_s: float = 1.0,
               max_backoff_s: float = 120.0,
               min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
               sleep: Callable[[float], None] = time.sleep,
               max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S,
               clock: Callable[[], float] = time.time):
    if not timeout_s > 0:
      raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    self.url = url
    self.user_agent = user_agent
    self.timeout_s = timeout_s
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self.max_backoff_s = max_backoff_s
    self.max_retry_after_s = max_retry_after_s
    self.min_interval_s = min_interval_s
    self._sleep = sleep
    self._clock = clock
    self._last = 0.0
    self._hold_until = 0.0  # time.monotonic() before which the server asked us not to come back
    self.num_requests = 0

  def _post(self, query: str) -> tuple[int, Any, bytes]:
    """One POST, bounded as a whole by `timeout_s`.

    Returns:
      (HTTP status, headers, body) of the answer, whatever the status.

    Raises:
      QueryTimeout: the answer was not complete within `timeout_s`.
      OSError, http.client.HTTPException: network failures.
    """
    deadline = _Deadline(self.timeout_s)
    opener = urllib.request.build_opener(
        _DeadlineHTTPHandler(deadline), _DeadlineHTTPSHandler(deadline))
    req = urllib.request.Request(
        self.url,
        data=urllib.parse.urlencode({
            "query": PREFIXES + query
        }).encode("utf-8"),
        headers={
            "User-Agent": self.user_agent,
            "Accept": "application/sparql-results+json",
            "Content-Type": "application/x-www-form-urlencoded"
        },
        method="POST")
    try:
      with deadline:
        try:
          with opener.open(req, timeout=self.timeout_s) as resp:
            answer = (resp.status, resp.headers, resp.read())
        except urllib.error.HTTPError as e:
          try:
            answer = (e.code, e.headers, e.read())
          finally:
            e.close()
    except (OSError, http.client.HTTPException) as e:
      if deadline.timed_out():
        raise QueryTimeout(
            f"{self.url}: no complete answer within {self.timeout_s:g} s "
            f"for query:\n{query}", self.timeout_s) from e
      raise
    if deadline.cut:  # e.g. an answer without Content-Length cut short
      raise QueryTimeout(
          f"{self.url}: no complete answer within {self.timeout_s:g} s "
          f"for query:\n{query}", self.timeout_s)
    return answer

  def _request(self, query: str) -> dict[str, Any]:
    delay = self.backoff_s
    for attempt in range(self.max_retries + 1):
      hold = self._hold_until - time.monotonic()
      if hold > 0:
        self._sleep(hold)
      self._last = retry.pace(self._last, self.min_interval_s, self._sleep)
      self.num_requests += 1
      retry_after = None
      cause: Exception | None = None
      try:
        status, headers, body = self._post(query)
      except (OSError, http.client.HTTPException) as e:
        err, cause = f"{type(e).__name__}: {e}", e
      else:
        if status == 200:
          try:
            return json.loads(body.decode("utf-8"))
          except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise EndpointError(f"{self.url}: answer is not SPARQL JSON results ({e}): "
                                f"{body[:200]!r}") from e
        if status != 429 and status < 500:
          raise EndpointError(f"{self.url}: HTTP {status}: "
                              f"{body[:300].decode('utf-8', 'replace')}\nquery:\n{query}")
        retry_after = headers.get("Retry-After") if headers else None
        err = f"HTTP {status}"
      now = self._clock()
      try:
        wait_s = retry.retry_delay(delay, retry_after, self.max_retry_after_s, now=now)
      except retry.RetryAfterTooLong as e:
        raise retry.RetryAfterTooLong(
            f"{self.url}: {err}: {e}; stopping rather than retrying "
            "(raise max_retry_after_s to wait that long)", e.wait_s, e.max_s) from e
      if attempt == self.max_retries:
        asked = retry.parse_retry_after(retry_after, now)
        if asked:
          self._hold_until = time.monotonic() + asked
        raise EndpointError(f"{self.url}: giving up after {attempt + 1} attempts: {err}") from cause
      _log.warning("%s: %s; retrying in %.1fs", self.url, err, wait_s)
      self._sleep(wait_s)
      delay = min(delay * 2, self.max_backoff_s)
    raise AssertionError("unreachable")

  def select(self, query: str) -> list[dict[str, str]]:
    res = self._request(query)
    rows = []
    for b in res.get("results", {}).get("bindings", []):
      rows.append({
          k: compact(v["value"]) if v.get("type") == "uri" else v["value"] for k, v in b.items()
      })
    return rows

  def ask(self, query: str) -> bool:
    res = self._request(query)
    if "boolean" not in res:
      raise EndpointError(f"{self.url}: ASK answer without 'boolean': {str(res)[:200]}")
    return bool(res["boolean"])


def add_endpoint_arguments(parser: Any,
                           embedded_timeout: bool = False,
                           max_retry_after: bool = False) -> None:
  """Defines the command-line flags of a `RemoteEndpoint` (see `remote_endpoint_from_arguments`).

  The flags: `--url`, `--user-agent`, `--timeout`, `--retries`, `--rate` and, if asked,
  `--max-retry-after`. A flag of two words is accepted with `-` and with `_` (`--user-agent`,
  `--user_agent`); both set the same attribute (`args.user_agent`).

  Args:
    parser: an `argparse.ArgumentParser`, or an argument group of one.
    embedded_timeout: `--timeout` also bounds the queries of the embedded store (its help says
      so); otherwise it is documented as remote only.
    max_retry_after: also define `--max-retry-after` (otherwise the `RemoteEndpoint` default,
      `DEFAULT_MAX_RETRY_AFTER_S`, is used).

  Returns:
    None; the flags are added to `parser`.

  Raises:
    argparse.ArgumentError: `parser` already has one of these flags.
  """
  parser.add_argument("--url", default=WDQS_URL, help="remote SPARQL endpoint URL")
  parser.add_argument(
      "--user-agent",
      "--user_agent",
      dest="user_agent",
      default=DEFAULT_USER_AGENT,
      help="remote: User-Agent header of the requests")
  parser.add_argument(
      "--timeout",
      type=float,
      default=DEFAULT_TIMEOUT_S,
      help=("bound of one query, remote (whole request) or embedded (s)"
            if embedded_timeout else "remote: request timeout (s)"))
  parser.add_argument(
      "--retries",
      type=int,
      default=DEFAULT_MAX_RETRIES,
      help="remote: retries on 429/5xx/connection errors")
  if max_retry_after:
    parser.add_argument(
        "--max-retry-after",
        "--max_retry_after",
        dest="max_retry_after",
        type=float,
        default=DEFAULT_MAX_RETRY_AFTER_S,
        help="longest Retry-After wait accepted from the remote endpoint (s); a longer "
        "one stops the run")
  parser.add_argument(
      "--rate",
      type=float,
      default=DEFAULT_MIN_INTERVAL_S,
      help="remote: minimum seconds between requests")


def remote_endpoint_from_arguments(args: argparse.Namespace) -> RemoteEndpoint:
  """Builds the `RemoteEndpoint` that the flags of `add_endpoint_arguments` describe.

  Args:
    args: parsed command line with `url`, `user_agent`, `timeout`, `retries`, `rate` and,
      optionally, `max_retry_after` (absent: `DEFAULT_MAX_RETRY_AFTER_S`).

  Returns:
    The endpoint (no request is sent yet).

  Raises:
    ValueError: `--timeout` is not positive.
  """
  return RemoteEndpoint(
      url=args.url,
      user_agent=args.user_agent,
      timeout_s=args.timeout,
      max_retries=args.retries,
      min_interval_s=args.rate,
      max_retry_after_s=getattr(args, "max_retry_after", DEFAULT_MAX_RETRY_AFTER_S))


def embedded_store(codex: str | pathlib.Path | None = None,
                   ntriples: Iterable[str | pathlib.Path] = (),
                   timeout_s: float | None = None,
                   allow_empty: bool = False) -> OxigraphEndpoint:
  """Builds the embedded pyoxigraph store from a CoDEx folder and/or N-Triples files.

  The one place both commands that query a store (`preprocessing.migrate` and
  `mcwq_t5x.evaluate --execute`) build their embedded store; `endpoint_from_arguments` picks it or
  the remote one from a command line.

  Args:
    codex: a CoDEx folder (`{train,valid,test}.txt`, `entity2types.json`; see `load_codex`), e.g.
      `../shared/wikidata/codex-m`; None or "" for none.
    ntriples: N-Triples files with Wikidata IRIs.
    timeout_s: bound of one query in seconds (`OxigraphEndpoint`); None = unbounded.
    allow_empty: accept a store with neither (`migrate --codex ''`: nothing is found).

  Returns:
    The loaded store.

  Raises:
    ValueError: neither `codex` nor `ntriples` (unless `allow_empty`), a malformed CoDEx line
      (`FILE:LINE: ...`), or a bad `timeout_s`.
    FileNotFoundError: a missing CoDEx `train.txt` or N-Triples file.
  """
  ntriples = list(ntriples or ())
  if not codex and not ntriples and not allow_empty:
    raise ValueError("the embedded store needs --codex DIR or --ntriples FILE")
  store = OxigraphEndpoint(timeout_s=timeout_s)
  if codex:
    if not pathlib.Path(codex, "train.txt").is_file():
      raise FileNotFoundError(f"{pathlib.Path(codex, 'train.txt')}: no such file "
                              "(expected a CoDEx folder)")
    _log.info("loaded CoDEx %s: %s", codex, store.load_codex(codex))
  for path in ntriples:
    if not pathlib.Path(path).is_file():
      raise FileNotFoundError(f"{path}: no such file")
    store.load_ntriples(path)
  return store


def endpoint_from_arguments(args: argparse.Namespace,
                            embedded_timeout: bool = False,
                            allow_empty: bool = False) -> Endpoint:
  """The store a command line names: `--endpoint remote` or the embedded one.

  Args:
    args: parsed command line with `endpoint` ("remote" or "oxigraph"), `codex`, `ntriples` and
      the flags of `add_endpoint_arguments`.
    embedded_timeout: `--timeout` also bounds the embedded store's queries (as
      `add_endpoint_arguments(embedded_timeout=True)` documents it).
    allow_empty: see `embedded_store`.

  Returns:
    `remote_endpoint_from_arguments(args)` or `embedded_store(...)` (not cached: wrap it in
    `CachedEndpoint`).

  Raises:
    ValueError, FileNotFoundError: see `embedded_store` and `remote_endpoint_from_arguments`.
  """
  if args.endpoint == "remote":
    return remote_endpoint_from_arguments(args)
  return embedded_store(
      args.codex or None,
      args.ntriples or (),
      timeout_s=args.timeout if embedded_timeout else None,
      allow_empty=allow_empty)


TIMED_OUT = "timed_out_after_s"  # cache value {TIMED_OUT: seconds} of a query that timed out


class CachedEndpoint(Endpoint):
  """Caches another endpoint's answers on disk (append-only JSONL, flushed per answer).

  A query that raised `QueryTimeout` is recorded as `{"timed_out_after_s": T}`; asked again (in
  this run or a later one on the same file), it raises `QueryTimeout` without running, unless
  `retry_timeouts` is set, when it runs again (and its new answer or timeout replaces the record).

  Args:
    inner: the endpoint asked on a cache miss.
    path: the cache file; None keeps the cache in memory.
    retry_timeouts: re-run queries recorded as timed out.

  Attributes:
    hits, misses: counts for the report (a recorded timeout that is not re-run is a hit).
    timeouts: queries that raised `QueryTimeout` (fresh or recorded).
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
