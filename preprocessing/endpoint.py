"""SPARQL endpoints for entity substitution and negative sampling (MCWQ paper, §3.2).

Two kinds behind one interface (`Endpoint`: `select`, `ask`, `labels`):

* `OxigraphEndpoint`: an embedded `pyoxigraph` store, loaded from N-Triples or from the CoDEx TSV
  files (`{train,valid,test}.txt`: `Qs<TAB>Pp<TAB>Qo`), the offline default. CoDEx's
  `entity2types.json` (entity -> types, CoDEx takes them from Wikidata's instance-of) is loaded as
  `wdt:P31` triples; `types.{lang}.json` / `relations.{lang}.json` labels as `rdfs:label`.
  CoDEx has no labels for most entities: `labels` then returns only those it has.
* `RemoteEndpoint`: any SPARQL 1.1 HTTP endpoint through SPARQLWrapper, by default the Wikidata
  Query Service, with a custom User-Agent, a timeout, retries with exponential backoff on HTTP 429
  and 5xx (honouring `Retry-After`) and a minimum interval between requests.

`CachedEndpoint` wraps either one and keeps every answer in an append-only JSONL file
(`preprocessing.cache`), so a killed run resumes without repeating a request.

Results are plain JSON-able values: `select` returns a list of {variable: term} rows where a
Wikidata entity is written `wd:Q42`, a property `wdt:P57`, any other IRI `<…>` and a literal its
lexical form.
"""

from __future__ import annotations

import abc
import json
import logging
import pathlib
import re
import time
import urllib.error
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

QID_RE = re.compile(r"^Q[1-9][0-9]{0,11}$")
PID_RE = re.compile(r"^P[1-9][0-9]{0,11}$")
LANG_RE = re.compile(r"^[a-z]{2,3}(-[A-Za-z0-9]{1,8})*$")

_log = logging.getLogger(__name__)


class EndpointError(RuntimeError):
  """A query failed for good (after retries, or a non-retryable error)."""


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


class OxigraphEndpoint(Endpoint):
  """Embedded pyoxigraph store (in memory).

  Args:
    store: a `pyoxigraph.Store`; default a new empty in-memory store.
  """

  def __init__(self, store: Any = None):
    import pyoxigraph  # pylint: disable=g-import-not-at-top
    self._ox = pyoxigraph
    self.store = store if store is not None else pyoxigraph.Store()
    self.num_queries = 0
    self._predicates: dict[str, int] | None = None

  def load_ntriples(self, path: str | pathlib.Path) -> None:
    """Adds an N-Triples file (Wikidata IRIs expected) to the store."""
    self.store.bulk_load(path=str(path), format=self._ox.RdfFormat.N_TRIPLES)
    self._predicates = None

  def load_codex(self, codex_dir: str | pathlib.Path, languages: Iterable[str] = ("en",),
                 parts: Iterable[str] = ("train", "valid", "test")) -> dict[str, int]:
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
          if (len(fields) != 3 or not QID_RE.match(fields[0]) or not PID_RE.match(fields[1])
              or not QID_RE.match(fields[2])):
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
    self.store.bulk_load(input="\n".join(lines).encode("utf-8"),
                         format=self._ox.RdfFormat.N_TRIPLES)
    self._predicates = None
    return counts

  def predicate_counts(self) -> dict[str, int] | None:
    if self._predicates is None:
      rows = self.select("SELECT ?p (COUNT(*) AS ?n) WHERE { ?s ?p ?o } GROUP BY ?p")
      self._predicates = {r["p"]: int(r["n"]) for r in rows if r.get("p", "").startswith("wdt:")}
    return self._predicates

  def _run(self, query: str) -> Any:
    self.num_queries += 1
    try:
      return self.store.query(PREFIXES + query)
    except (SyntaxError, ValueError, OSError) as e:
      raise EndpointError(f"query failed: {e}\n{query}") from e

  def select(self, query: str) -> list[dict[str, str]]:
    res = self._run(query)
    names = [v.value for v in res.variables]
    rows = []
    for sol in res:
      row = {}
      for n in names:
        t = sol[n]
        if t is None:
          continue
        row[n] = compact(t.value) if isinstance(t, self._ox.NamedNode) else t.value
      rows.append(row)
    return rows

  def ask(self, query: str) -> bool:
    return bool(self._run(query))


class RemoteEndpoint(Endpoint):
  """A SPARQL 1.1 HTTP endpoint through SPARQLWrapper (default: the Wikidata Query Service).

  Args:
    url: endpoint URL.
    user_agent: sent as User-Agent (WDQS requires a descriptive one).
    timeout_s: per-request timeout in seconds.
    max_retries: retries after a retryable failure (HTTP 429, 5xx, timeouts, connection errors).
    backoff_s: first backoff; doubles after each retry, unless the server sends `Retry-After`.
    max_backoff_s: cap of one wait.
    min_interval_s: minimum time between two requests (rate limit; 1.0 = one request a second).
    sleep: injectable for tests.
  """

  def __init__(self, url: str = WDQS_URL, user_agent: str = DEFAULT_USER_AGENT,
               timeout_s: float = 60.0, max_retries: int = 5, backoff_s: float = 1.0,
               max_backoff_s: float = 120.0, min_interval_s: float = 1.0,
               sleep: Callable[[float], None] = time.sleep):
    import SPARQLWrapper  # pylint: disable=g-import-not-at-top
    self._sw = SPARQLWrapper
    self.url = url
    self.user_agent = user_agent
    self.timeout_s = timeout_s
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self.max_backoff_s = max_backoff_s
    self.min_interval_s = min_interval_s
    self._sleep = sleep
    self._last = 0.0
    self.num_requests = 0

  def _request(self, query: str) -> dict[str, Any]:
    from SPARQLWrapper import SPARQLExceptions  # pylint: disable=g-import-not-at-top
    delay = self.backoff_s
    for attempt in range(self.max_retries + 1):
      self._last = retry.pace(self._last, self.min_interval_s, self._sleep)
      sw = self._sw.SPARQLWrapper(self.url, agent=self.user_agent)
      sw.setReturnFormat(self._sw.JSON)
      sw.setTimeout(int(max(1, self.timeout_s)))
      sw.setMethod(self._sw.POST)
      sw.setQuery(PREFIXES + query)
      self.num_requests += 1
      retry_after = None
      try:
        return sw.query().convert()
      except urllib.error.HTTPError as e:
        if e.code != 429 and e.code < 500:
          raise EndpointError(f"{self.url}: HTTP {e.code} for query:\n{query}") from e
        retry_after = e.headers.get("Retry-After") if e.headers else None
        err: Exception = e
      except SPARQLExceptions.EndPointInternalError as e:
        err = e
      except SPARQLExceptions.SPARQLWrapperException as e:
        raise EndpointError(f"{self.url}: {e}\nquery:\n{query}") from e
      except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
        err = e
      if attempt == self.max_retries:
        raise EndpointError(f"{self.url}: giving up after {attempt + 1} attempts: {err}") from err
      wait_s = retry.retry_delay(delay, retry_after, self.max_backoff_s)
      _log.warning("%s: %s; retrying in %.1fs", self.url, err, wait_s)
      self._sleep(wait_s)
      delay = min(delay * 2, self.max_backoff_s)
    raise AssertionError("unreachable")

  def select(self, query: str) -> list[dict[str, str]]:
    res = self._request(query)
    rows = []
    for b in res.get("results", {}).get("bindings", []):
      rows.append({k: compact(v["value"]) if v.get("type") == "uri" else v["value"]
                   for k, v in b.items()})
    return rows

  def ask(self, query: str) -> bool:
    res = self._request(query)
    if "boolean" not in res:
      raise EndpointError(f"{self.url}: ASK answer without 'boolean': {str(res)[:200]}")
    return bool(res["boolean"])


class CachedEndpoint(Endpoint):
  """Caches another endpoint's answers on disk (append-only JSONL, flushed per answer).

  Args:
    inner: the endpoint asked on a cache miss.
    path: the cache file; None keeps the cache in memory.

  Attributes:
    hits, misses: counts for the report.
  """

  def __init__(self, inner: Endpoint, path: str | pathlib.Path | None):
    self.inner = inner
    self.cache = JsonlCache(path)
    self.hits = 0
    self.misses = 0

  def _get(self, kind: str, query: str, fn: Callable[[str], Any]) -> Any:
    key = make_key(kind, query)
    if key in self.cache:
      self.hits += 1
      return self.cache[key]
    self.misses += 1
    value = fn(query)
    self.cache.put(key, value, kind=kind, query=query)
    return value

  def predicate_counts(self) -> dict[str, int] | None:
    return self.inner.predicate_counts()

  def select(self, query: str) -> list[dict[str, str]]:
    return self._get("select", query, self.inner.select)

  def ask(self, query: str) -> bool:
    return self._get("ask", query, self.inner.ask)
