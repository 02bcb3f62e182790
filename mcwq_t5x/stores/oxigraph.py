"""The embedded SPARQL store: a `pyoxigraph` store in memory (the offline default).

Loaded from N-Triples or from the CoDEx TSV files (`{train,valid,test}.txt`: `Qs<TAB>Pp<TAB>Qo`).
CoDEx's `entity2types.json` (entity -> types, CoDEx takes them from Wikidata's instance-of) is
loaded as `wdt:P31` triples; `types.{lang}.json` / `entities.{lang}.json` labels as `rdfs:label`.
CoDEx has no labels for most entities: `labels` then returns only those it has. With `timeout_s`,
queries run in a forked worker process that is killed when a query runs longer (`QueryTimeout`).

`embedded_store` builds it for the command lines that query a store (`preprocessing.migrate`,
`python -m mcwq_t5x.score --execute`; see `mcwq_t5x.stores.flags`).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import pathlib
import time
from typing import Any, Iterable

from mcwq_t5x.stores.endpoint import (PID_RE, PREFIXES, QID_RE, RDFS_LABEL, WD, WDT, Endpoint,
                                      EndpointError, QueryTimeout, compact)

_log = logging.getLogger(__name__)


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
  """Embedded pyoxigraph store (in memory); `store` default a new empty one.

  With `timeout_s` (seconds, including reading all solutions) each query runs in a worker forked
  from this process; one over time gets its worker killed, is counted in `num_timeouts` and raises
  `QueryTimeout`. None: in this process, unbounded. ValueError: `timeout_s` <= 0, or no `fork`.
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
    # The worker is stopped after loading (`close`), so the next one sees the data.
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
      # why fork: a pyoxigraph query cannot be interrupted; the worker sees the store copy-on-write,
      # and killing it frees CPU and memory.
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


def embedded_store(codex: str | pathlib.Path | None = None,
                   ntriples: Iterable[str | pathlib.Path] = (),
                   timeout_s: float | None = None,
                   allow_empty: bool = False) -> OxigraphEndpoint:
  """The embedded store of a CoDEx folder (`{train,valid,test}.txt`, `entity2types.json`, e.g.
  `../shared/wikidata/codex-m`) and/or Wikidata N-Triples files.

  `allow_empty`: accept neither (`migrate --codex ''`). Raises ValueError (neither, a malformed
  CoDEx line `FILE:LINE`, bad `timeout_s`), FileNotFoundError.
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
