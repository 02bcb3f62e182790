"""SPARQL stores: the embedded pyoxigraph one and remote SPARQL 1.1 endpoints, behind one interface.

Execution accuracy (`mcwq_t5x.evaluation.execution`) runs queries on them; the dataset-creation pipeline
(`preprocessing.substitute`, `preprocessing.migrate`: entity substitution and negative sampling,
MCWQ paper §3.2) uses them too.

Two kinds behind one interface (`Endpoint`: `select`, `ask`, `labels`):

* `OxigraphEndpoint`: an embedded `pyoxigraph` store, loaded from N-Triples or from the CoDEx TSV
  files (`{train,valid,test}.txt`: `Qs<TAB>Pp<TAB>Qo`), the offline default. CoDEx's
  `entity2types.json` (entity -> types, CoDEx takes them from Wikidata's instance-of) is loaded as
  `wdt:P31` triples; `types.{lang}.json` / `relations.{lang}.json` labels as `rdfs:label`.
  CoDEx has no labels for most entities: `labels` then returns only those it has.
  With `timeout_s`, queries run in a forked worker process that is killed when a query runs longer.
* `RemoteEndpoint`: any SPARQL 1.1 HTTP endpoint (SPARQL 1.1 Protocol, POST with a form-encoded
  `query`, JSON results) through `requests`, by default the Wikidata Query Service, with a
  custom User-Agent, a timeout on each whole request attempt, retries by urllib3's `Retry` with
  exponential backoff on HTTP 429, 500, 502, 503, 504 and network errors (waiting at least what
  `Retry-After` asks, RFC 9110 §10.2.3), redirects followed by re-sending the query, and a
  minimum interval between requests. An answer that is not SPARQL JSON results (an error object,
  an HTML page) raises `EndpointError`.

Both raise `QueryTimeout` (an `EndpointError`) when a query takes longer than `timeout_s`; it is
not retried. `CachedEndpoint` wraps either one and keeps every answer in an append-only JSONL file
(`mcwq_t5x.stores.jsonl_cache`), so a killed run resumes without repeating a request; errors are never
kept, except that a timed-out query is recorded as `{"timed_out_after_s": T}` and not re-run by a
later run unless asked (`retry_timeouts=True`).

Command lines that query a store (`preprocessing.migrate`, `mcwq_t5x.evaluation.score`) define the remote
endpoint's flags with `add_endpoint_arguments` and build the store they name with
`endpoint_from_arguments` (the embedded one through `embedded_store`).

Results are plain JSON-able values: `select` returns a list of {variable: term} rows where a
Wikidata entity is written `wd:Q42`, a property `wdt:P57`, any other IRI `<…>` and a literal its
lexical form. `order_triples` orders a query's triple patterns for the embedded store's joins.
"""

from __future__ import annotations

import abc
import argparse
import http.client
import itertools
import json
import logging
import multiprocessing
import pathlib
import re
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable, Sequence

import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.exceptions
import urllib3.util

from mcwq_t5x.stores.jsonl_cache import JsonlCache, make_key
from mcwq_t5x.stores import retry

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


def order_triples(triples: list[tuple[str, str, str]],
                  counts: dict[str, int] | None) -> list[tuple[str, str, str]]:
  """Greedy join order: next the triple with the smallest estimated cardinality.

  Estimate = triples of the predicate (sum over `|` alternatives; 10^6 when unknown), times 0.01
  when one end is a constant or already bound, times 10^-4 when both are. The answer set does
  not depend on the order (a conjunctive query); only the embedded store's speed does.
  """
  if counts is None:
    return triples
  left = list(triples)
  bound: set[str] = set()
  out = []

  def est(t: tuple[str, str, str]) -> float:
    n = sum(counts.get(p, 0) for p in t[1].split("|")) if counts else 10**6
    b = sum(1 for x in (t[0], t[2]) if not x.startswith("?") or x in bound)
    return n * (1.0, 0.01, 1e-4)[b]

  while left:
    best = min(left, key=est)
    left.remove(best)
    out.append(best)
    bound.update(x for x in (best[0], best[2]) if x.startswith("?"))
  return out


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
  """Bounds one HTTP request attempt as a whole: once `timeout_s` has passed, shuts its socket down.

  A socket timeout only bounds each read (a server sending a byte every half second never trips
  it); shutting the socket down from a timer thread ends any blocked read or write at once.

  Use: `with deadline:` around the attempt, then `deadline.cut` after an answer (the timer shut
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
      if all(s is not sock for s in self._socks):
        self._socks.append(sock)

  def timed_out(self) -> bool:
    """Whether the time ran out once connected (the query was sent, its answer is incomplete).

    The timer or, on a loaded machine, a per-read socket timeout may notice it first.
    """
    with self._lock:
      return self.cut or (bool(self._socks) and time.monotonic() - self._start >= self.timeout_s)


# The `_Attempts` of the request the current thread is sending (read by the connections and by
# `_Retry`, which `requests` and urllib3 create and call without a way to pass it).
_ACTIVE = threading.local()


def _active() -> "_Attempts | None":
  return getattr(_ACTIVE, "attempts", None)


class _Attempts:
  """The attempts of one query's POSTs (the first one, urllib3's retries, redirect hops).

  Each attempt is bounded by its own `_Deadline`: a connection begins an attempt when it connects
  or sends a request (`begin`, a no-op while one is running) and registers its socket; `_Retry`
  ends it before urllib3 decides on a retry, and `RemoteEndpoint._post` once the body is read.

  Attributes:
    count: attempts begun.
    url: where the current hop is sent.
  """

  def __init__(self, endpoint: "RemoteEndpoint", query: str):
    self.endpoint = endpoint
    self.query = query
    self.url = endpoint.url
    self.count = 0
    self._deadline: _Deadline | None = None

  def begin(self) -> None:
    if self._deadline is None:
      self.count += 1
      self.endpoint.num_requests += 1
      self._deadline = _Deadline(self.endpoint.timeout_s).__enter__()

  def add(self, sock: socket.socket) -> None:
    if self._deadline is not None:
      self._deadline.add(sock)

  def end(self) -> "_Deadline | None":
    """Ends the running attempt (cancels its timer); returns its deadline (None when none ran)."""
    deadline, self._deadline = self._deadline, None
    if deadline is not None:
      deadline.__exit__(None, None, None)
    return deadline

  def timeout(self) -> QueryTimeout:
    timeout_s = self.endpoint.timeout_s
    return QueryTimeout(
        f"{self.url}: no complete answer within {timeout_s:g} s for query:\n{self.query}",
        timeout_s)


class _DeadlineConnectionMixin:
  """Begins an attempt of the active request (`_Attempts`) and registers the socket with it."""

  def connect(self) -> None:
    attempts = _active()
    if attempts is not None:
      attempts.begin()
    super().connect()  # type: ignore[misc]
    if attempts is not None:
      attempts.add(self.sock)  # type: ignore[attr-defined]

  def request(self, *args: Any, **kwargs: Any) -> None:
    attempts = _active()
    if attempts is not None:
      attempts.begin()
      if self.sock is not None:  # type: ignore[attr-defined]  # a kept-alive connection
        attempts.add(self.sock)  # type: ignore[attr-defined]
    super().request(*args, **kwargs)  # type: ignore[misc]


class _DeadlineHTTPConnection(_DeadlineConnectionMixin, urllib3.connection.HTTPConnection):
  """urllib3's `HTTPConnection` whose socket a `_Deadline` can cut."""


class _DeadlineHTTPSConnection(_DeadlineConnectionMixin, urllib3.connection.HTTPSConnection):
  """urllib3's `HTTPSConnection` (default TLS context and checks) whose socket a `_Deadline` can
  cut."""


class _DeadlineHTTPPool(urllib3.HTTPConnectionPool):
  ConnectionCls = _DeadlineHTTPConnection


class _DeadlineHTTPSPool(urllib3.HTTPSConnectionPool):
  ConnectionCls = _DeadlineHTTPSConnection


_POOLS = {"http": _DeadlineHTTPPool, "https": _DeadlineHTTPSPool}


class _DeadlineAdapter(requests.adapters.HTTPAdapter):
  """A `requests` transport whose connections (direct or through an HTTP proxy) are deadline-cut.

  A SOCKS proxy's connections are not: there only the per-read timeout bounds a request.
  """

  def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
    super().init_poolmanager(*args, **kwargs)
    self.poolmanager.pool_classes_by_scheme = _POOLS

  def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
    manager = super().proxy_manager_for(proxy, **kwargs)
    if not proxy.lower().startswith("socks"):
      manager.pool_classes_by_scheme = _POOLS
    return manager


class _Retry(urllib3.util.Retry):
  """urllib3's `Retry` with the endpoint's timing (see `RemoteEndpoint`).

  urllib3 decides what is retried (`status_forcelist`, `allowed_methods`, connection and read
  errors) and counts the retries; this subclass changes only when, and how long, it waits:
  the backoff is `backoff_factor` after the first failure and doubles after each one (capped at
  `backoff_max`); a `Retry-After` (429, 503) is read with `retry.parse_retry_after` against the
  endpoint's clock and waited in full, at least the backoff; one longer than the endpoint's
  `max_retry_after_s` raises `RetryAfterTooLong`; the wait goes through the endpoint's `sleep`
  and keeps its minimum interval between requests. A failed attempt whose deadline had run out
  raises `QueryTimeout` instead of being retried.
  """

  RETRY_AFTER_STATUS_CODES = frozenset({429, 503})

  def get_backoff_time(self) -> float:
    failures = len(
        list(itertools.takewhile(lambda h: h.redirect_location is None, reversed(self.history))))
    if failures == 0:
      return 0.0
    return float(min(self.backoff_max, self.backoff_factor * 2**(failures - 1)))

  def increment(self,
                method: Any = None,
                url: Any = None,
                response: Any = None,
                error: Any = None,
                _pool: Any = None,
                _stacktrace: Any = None) -> "_Retry":
    attempts = _active()
    if attempts is not None:
      deadline = attempts.end()
      if error is not None and deadline is not None and deadline.timed_out():
        raise attempts.timeout() from error
    return super().increment(method, url, response, error, _pool, _stacktrace)

  def sleep(self, response: Any = None) -> None:
    attempts = _active()
    if attempts is None:
      super().sleep(response)
      return
    last = self.history[-1] if self.history else None
    if last is not None and last.status:
      err = f"HTTP {last.status}"
    elif last is not None and last.error is not None:
      err = f"{type(last.error).__name__}: {last.error}"
    else:
      err = "failed"
    retry_after = response.headers.get("Retry-After") if response is not None else None
    attempts.endpoint._wait_before_retry(  # pylint: disable=protected-access
        attempts.url, err, self.get_backoff_time(), retry_after)


REDIRECT_STATUSES = (301, 302, 303, 307, 308)
RETRY_STATUSES = (429, 500, 502, 503, 504)
MAX_REDIRECTS = 5


def _body_head(body: bytes, n: int = 200) -> str:
  """The first `n` bytes of an answer, decoded for a message (quoted, `…` when cut)."""
  return repr(body[:n].decode("utf-8", "replace") + ("…" if len(body) > n else ""))


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
                        f"({problem}); it begins {_body_head(body)}")
  return res


class RemoteEndpoint(Endpoint):
  """A SPARQL 1.1 HTTP endpoint (default: the Wikidata Query Service).

  Each query is a POST (SPARQL 1.1 Protocol §2.1.2: form-encoded `query`, JSON results,
  https://www.w3.org/TR/sparql11-protocol/) through `requests` (proxies set in the environment are
  used; connections are kept alive), retried by urllib3's `Retry` on HTTP 429, 500, 502, 503, 504
  and on connection and read errors (see `_Retry` for the waits).

  A redirect (301, 302, 303, 307, 308) is followed by POSTing the same query to its `Location`
  (at most `MAX_REDIRECTS` hops, each logged; after a 301 or 308 later queries go there
  directly), e.g. from http://query.wikidata.org/sparql to https. The answer must be SPARQL JSON
  results (`parse_results`): anything else, such as a status 200 with an error object or an HTML
  page, raises `EndpointError` and is never returned as an answer (so `CachedEndpoint` never
  keeps it).

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
      delay-seconds and the HTTP-date form, RFC 9110 §10.2.3), in seconds; a longer one raises
      `RetryAfterTooLong` at once instead of retrying.
    clock: the wall clock (POSIX seconds) an HTTP-date `Retry-After` is compared to; injectable.

  Waits are at least what the server asks: after giving up on a query that got a `Retry-After`,
  the next request still waits for the rest of that time.

  `select` and `ask` raise `QueryTimeout` (see `timeout_s`); `EndpointError` for an answer that is
  not SPARQL JSON results, an HTTP error other than the retried ones, a redirect without
  `Location` or more than `MAX_REDIRECTS` of them, a connection lost while reading the answer,
  or after the last retry; and `RetryAfterTooLong` (not an `EndpointError`, so that a run stops)
  as described at `max_retry_after_s`.

  Attributes:
    num_requests: HTTP request attempts sent (retries and redirect hops included).

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
    self._moved: dict[str, str] = {}  # url -> where a permanent redirect (301, 308) sent it
    self.num_requests = 0
    adapter = _DeadlineAdapter(
        max_retries=_Retry(
            total=max_retries,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=frozenset({"GET", "POST"}),
            backoff_factor=backoff_s,
            backoff_max=max_backoff_s,
            respect_retry_after_header=True,
            raise_on_status=False,
            raise_on_redirect=False))
    self._session = requests.Session()
    self._session.mount("http://", adapter)
    self._session.mount("https://", adapter)

  def close(self) -> None:
    """Closes the kept-alive connections (a later query opens new ones)."""
    self._session.close()

  def _wait_before_retry(self, url: str, err: str, backoff_s: float,
                         retry_after: str | None) -> None:
    """Sleeps before a retry: at least `backoff_s` and what `retry_after` asks (see `_Retry`).

    Raises:
      RetryAfterTooLong: the server asks for more than `max_retry_after_s`.
    """
    try:
      wait_s = retry.retry_delay(backoff_s, retry_after, self.max_retry_after_s, now=self._clock())
    except retry.RetryAfterTooLong as e:
      raise retry.RetryAfterTooLong(
          f"{url}: {err}: {e}; stopping rather than retrying "
          "(raise max_retry_after_s to wait that long)", e.wait_s, e.max_s) from e
    _log.warning("%s: %s; retrying in %.1f s", url, err, wait_s)
    self._sleep(wait_s)
    self._last = retry.pace(self._last, self.min_interval_s, self._sleep)

  def _post(self, attempts: _Attempts) -> tuple[int, Any, bytes]:
    """POSTs the query to `attempts.url` with urllib3's retries, each attempt bounded by
    `timeout_s`, without following redirects.

    Returns:
      (HTTP status, headers, body) of the last answer: one that is not retried, or the last
      retryable one when the retries are used up.

    Raises:
      QueryTimeout: an attempt's answer was not complete within `timeout_s`.
      RetryAfterTooLong: see `max_retry_after_s`.
      EndpointError: a network failure after the last retry, or one while reading the answer.
    """
    url, query = attempts.url, attempts.query
    _ACTIVE.attempts = attempts
    try:
      try:
        resp = self._session.post(
            url,
            data={"query": PREFIXES + query},
            headers={
                "User-Agent": self.user_agent,
                "Accept": "application/sparql-results+json"
            },
            timeout=(self.timeout_s, self.timeout_s),
            stream=True,
            allow_redirects=False)
      except requests.RequestException as e:
        last = e.args[0] if e.args else None
        reason = last.reason if isinstance(last, urllib3.exceptions.MaxRetryError) else e
        if not attempts.count:  # e.g. a malformed URL: nothing was sent
          raise EndpointError(f"{url}: {type(e).__name__}: {e}") from e
        raise EndpointError(f"{url}: giving up after {attempts.count} attempts: "
                            f"{type(reason).__name__}: {reason}") from e
      try:
        body = resp.content
      except (requests.RequestException, urllib3.exceptions.HTTPError, OSError,
              http.client.HTTPException) as e:
        deadline = attempts.end()
        if deadline is not None and deadline.timed_out():
          raise attempts.timeout() from e
        raise EndpointError(f"{url}: the connection failed while reading the answer: "
                            f"{type(e).__name__}: {e}") from e
      finally:
        resp.close()
      deadline = attempts.end()
      if deadline is not None and deadline.cut:  # e.g. an answer without Content-Length cut short
        raise attempts.timeout()
      return resp.status_code, resp.headers, body
    finally:
      attempts.end()
      _ACTIVE.attempts = None

  def _request(self, query: str, form: str) -> dict[str, Any]:
    """Sends a query (following redirects) and returns its checked SPARQL JSON results."""
    attempts = _Attempts(self, query)
    url = self._moved.get(self.url, self.url)
    for _ in range(MAX_REDIRECTS + 1):
      hold = self._hold_until - time.monotonic()
      if hold > 0:
        self._sleep(hold)
      self._last = retry.pace(self._last, self.min_interval_s, self._sleep)
      attempts.url = url
      status, headers, body = self._post(attempts)
      if status in REDIRECT_STATUSES:
        location = headers.get("Location")
        if not location:
          raise EndpointError(f"{url}: HTTP {status} redirect without a Location header; "
                              "the query was not answered")
        new_url = urllib.parse.urljoin(url, location)
        permanent = status in (301, 308)
        _log.warning("%s: HTTP %d redirect to %s; sending the query there (POST)%s", url, status,
                     new_url, "; later queries go there directly" if permanent else "")
        if permanent:
          self._moved[self.url] = new_url
        url = new_url
        continue
      if 200 <= status < 300:
        return parse_results(url, body, form)
      if status in RETRY_STATUSES:
        retry_after = headers.get("Retry-After")
        now = self._clock()
        try:
          retry.retry_delay(0.0, retry_after, self.max_retry_after_s, now=now)
        except retry.RetryAfterTooLong as e:
          raise retry.RetryAfterTooLong(
              f"{url}: HTTP {status}: {e}; stopping rather than retrying "
              "(raise max_retry_after_s to wait that long)", e.wait_s, e.max_s) from e
        asked = retry.parse_retry_after(retry_after, now)
        if asked:
          self._hold_until = time.monotonic() + asked
        raise EndpointError(f"{url}: giving up after {attempts.count} attempts: HTTP {status}")
      raise EndpointError(f"{url}: HTTP {status}: "
                          f"{body[:300].decode('utf-8', 'replace')}\nquery:\n{query}")
    raise EndpointError(f"{self.url}: more than {MAX_REDIRECTS} redirects (the last to {url}); "
                        "the query was not answered")

  def select(self, query: str) -> list[dict[str, str]]:
    res = self._request(query, "select")
    return [{
        k: compact(v["value"]) if v.get("type") == "uri" else v["value"] for k, v in b.items()
    } for b in res["results"]["bindings"]]

  def ask(self, query: str) -> bool:
    return self._request(query, "ask")["boolean"]


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
  `mcwq_t5x.score --execute`) build their embedded store; `endpoint_from_arguments` picks it or
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
