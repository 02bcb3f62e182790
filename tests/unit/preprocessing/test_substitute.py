"""Tests of entity substitution, negative sampling, endpoints and the migrate CLI (MCWQ §3.2)."""

import json

import pytest

from mcwq_t5x.data import readers
from mcwq_t5x.stores import cache as cache_lib
from mcwq_t5x.stores import endpoint as ep
from mcwq_t5x.stores import oxigraph
from mcwq_t5x.stores import remote as remote_lib
from preprocessing import cfq, mapping as mp, migrate, substitute as sb
import local_http


@pytest.fixture(scope="module")
def codex(shared_dir):
  return shared_dir / "wikidata" / "codex-m"


@pytest.fixture(scope="module")
def store(codex):
  ox = oxigraph.OxigraphEndpoint()
  counts = ox.load_codex(codex)
  assert counts["triples"] == 206205  # train + valid + test of CoDEx-M
  return ox


def mq(text):
  q = cfq.parse_query(text)
  return mp.Migrated(q.prefix, q.clauses)


def test_assignment_query_has_variables_and_distinctness():
  q = mq(
      "ASK WHERE { M0 wdt:P26 ?x0 . ?x0 wdt:P27 wd:Q96 . ?x0 wdt:P3373 M1 . FILTER ( ?x0 != M1 ) }")
  text = sb.assignment_query(q, 5)
  assert text == ("SELECT DISTINCT ?m0 ?m1 WHERE { ?m0 wdt:P26 ?x0 . ?x0 wdt:P27 wd:Q96 . "
                  "?x0 wdt:P3373 ?m1 . FILTER ( ?x0 != ?m1 ) . FILTER ( ?m0 != ?m1 ) } LIMIT 5")


def test_injection_is_refused(store):
  q = mq("ASK WHERE { M0 wdt:P26 ?x0 }")
  with pytest.raises(ValueError, match="refusing"):
    sb.ask_query(q, {"M0": "wd:Q1 } . DELETE WHERE { ?s ?p ?o"})
  with pytest.raises(ValueError, match="not a Wikidata item id"):
    store.labels(["Q5\" } ; DROP ALL"])
  with pytest.raises(ValueError, match="language"):
    store.labels(["Q5"], language='en") } #')


def test_substitution_on_codex(store):
  q = mq("SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P31 wd:Q5 . M1 wdt:P161 ?x0 }")  # Who did M1 star
  cands = sb.find_assignments(q, store, limit=20)
  assert len(cands) == 20
  a = sb.choose(cands, seed=3)
  assert a == sb.choose(cands, seed=3)
  answers = store.select(sb.answers_query(q, a))
  assert answers and all(r["x0"].startswith("wd:Q") for r in answers)
  # Every answer is a human cast member of the chosen film in the raw CoDEx triples.
  film = a["M1"][3:]
  assert store.ask(f"ASK WHERE {{ wd:{film} wdt:P161 {answers[0]['x0']} }}")
  mids, brackets = sb.fill_question("Who did M1 star", a, {film: "Some Film"})
  assert mids == f"Who did {film} star" and brackets == "Who did [Some Film] star"
  assert store.labels(["Q5", "Q33999"]) == {"Q5": "human", "Q33999": "actor"}
  # A property CoDEx lacks (P58 screenwriter) gives no assignment and no request.
  n = store.num_queries
  assert sb.find_assignments(mq("ASK WHERE { M0 wdt:P58 M1 }"), store) == []
  assert store.num_queries == n


def test_negative_sampling_is_verified(store):
  q = mq("ASK WHERE { M0 wdt:P26 M1 }")
  cands = sb.find_assignments(q, store, limit=50)
  pool = sb.EntityPool()
  for i, a in enumerate(cands):
    pool.add(i, q, a)
  neg, m = sb.sample_negative(0, q, cands[0], pool, store, seed=1)
  assert neg[m] != cands[0][m] and set(neg) == {"M0", "M1"}
  assert store.ask(sb.ask_query(q, cands[0])) is True
  assert store.ask(sb.ask_query(q, neg)) is False
  # The replacement comes from another query's assignment after the same predicate and side.
  side = "s" if m == "M0" else "o"
  assert neg[m] in {a[m] for a in cands[1:]} and (side, "wdt:P26") in pool.by_key


class CountingEndpoint(ep.Endpoint):
  """Counts requests; raises (like a kill) after `fail_after` of them."""

  def __init__(self, inner, fail_after=None):
    self.inner, self.fail_after, self.asked = inner, fail_after, []

  def predicate_counts(self):
    return self.inner.predicate_counts()

  def _count(self, q):
    if self.fail_after is not None and len(self.asked) >= self.fail_after:
      raise KeyboardInterrupt("killed")
    self.asked.append(q)

  def select(self, q):
    self._count(q)
    return self.inner.select(q)

  def ask(self, q):
    self._count(q)
    return self.inner.ask(q)


def args_for(out, **kw):
  a = migrate.build_parser().parse_args(["--out", str(out), "--quiet", "--max-records", "700"])
  for k, v in kw.items():
    setattr(a, k, v)
  return a


def test_migrate_cli_kill_and_resume(store, tmp_path):
  clean = CountingEndpoint(store)
  report = migrate.run(
      args_for(tmp_path / "clean"), cache_lib.CachedEndpoint(clean, tmp_path / "c.jsonl"))
  assert report["read"] == 700 and report["malformed"] == 0
  assert report["migrated"] == 700 - report["skipped"].get("reverse mark", 0)
  assert report["assigned"] > 0 and report["negatives"] > 0
  assert len(clean.asked) == len(set(clean.asked)) == report["endpoint_requests"]

  # Killed after 40 requests, then resumed on the same cache: nothing repeated, nothing lost.
  cache = tmp_path / "k.jsonl"
  first = CountingEndpoint(store, fail_after=40)
  with pytest.raises(KeyboardInterrupt):
    migrate.run(args_for(tmp_path / "killed"), cache_lib.CachedEndpoint(first, cache))
  second = CountingEndpoint(store)
  report2 = migrate.run(args_for(tmp_path / "killed"), cache_lib.CachedEndpoint(second, cache))
  assert len(first.asked) == 40
  assert not set(first.asked) & set(second.asked)
  assert sorted(first.asked + second.asked) == sorted(clean.asked)
  assert report2["endpoint_cache_hits"] >= 40
  for name in ("dataset.json", "negatives.json", "splits/cfq_sample.json"):
    assert (tmp_path / "killed" / name).read_text() == (tmp_path / "clean" / name).read_text()

  # The data layer reads the output.
  out = tmp_path / "clean"
  dataset = json.loads((out / "dataset.json").read_text())
  split = json.loads((out / "splits" / "cfq_sample.json").read_text())
  train = readers.read_release(out, "cfq_sample", "train", "en")
  assert len(train) == len(split["trainIdxs"]) == len(dataset) == report["written"]
  official = readers.read_official(out / "official" / "cfq_sample" / "train.en.txt")
  assert [e.sparql for e in official] == [e.sparql for e in train]
  with_entities = [r for r in dataset if r["sparql"]]
  assert len(with_entities) == report["assigned"]
  for r in with_entities[:20]:
    if r["sparql"].startswith("ASK"):
      assert store.ask(r["sparql"]) is True
  for r in json.loads((out / "negatives.json").read_text()):
    assert r["expectedResponse"] == "False" and store.ask(r["sparql"]) is False


def test_malformed_records_are_reported_and_skipped(store, tmp_path, shared_dir):
  recs = json.loads((shared_dir / "cfq" / "cfq_sample_dev.json").read_text())[:30]
  del recs[3]["sparql"]
  recs[5]["sparql"] = "SELECT count(*) WHERE { broken"
  path = tmp_path / "bad_dev.json"
  path.write_text(json.dumps(recs))
  cfq_split = tmp_path / "mcd_x.json"  # CFQ-style split over the input records
  cfq_split.write_text(
      json.dumps({
          "trainIdxs": list(range(10)),
          "devIdxs": [],
          "testIdxs": list(range(10, 30))
      }))
  report = migrate.run(
      args_for(tmp_path / "o", cfq=[str(path)], no_negatives=True, cfq_split=[str(cfq_split)]),
      cache_lib.CachedEndpoint(store, None))
  induced = json.loads((tmp_path / "o" / "splits" / "mcd_x.json").read_text())
  assert len(induced["trainIdxs"]) == 10 - 2 - sum("^" in r.get("sparql", "") for r in recs[:10])
  assert len(induced["trainIdxs"]) + len(induced["testIdxs"]) == report["written"]
  assert sorted(induced["trainIdxs"] + induced["testIdxs"]) == list(range(report["written"]))
  assert report["read"] == 30 and report["malformed"] == 2
  assert f"questionIdx={recs[3]['questionIdx']}: missing key 'sparql'" in report[
      "malformed_records"][0]
  assert f"questionIdx={recs[5]['questionIdx']}" in report["malformed_records"][1]
  assert report["splits"]["cfq_sample"]["devIdxs"] == report["written"]


class TimingOutAnswers(CountingEndpoint):
  """Raises QueryTimeout for every answers query (`SELECT DISTINCT ?x0 …`), listed in `refused`."""

  def __init__(self, inner):
    super().__init__(inner)
    self.refused = []

  def select(self, q):
    if q.startswith("SELECT DISTINCT ?x0 "):
      self.refused.append(q)
      raise ep.QueryTimeout(f"timed out:\n{q}", 1.0)
    return super().select(q)


def test_migrate_reports_answer_query_timeouts_instead_of_failing(store, tmp_path, caplog):
  inner = TimingOutAnswers(store)
  cached = cache_lib.CachedEndpoint(inner, None)
  report = migrate.run(args_for(tmp_path, max_records=400, no_negatives=True), cached)
  refused = len(inner.refused)
  assert sum("timed out:" in r.getMessage() for r in caplog.records) == refused
  assert refused > 0 and report["endpoint errors"] == report["endpoint_timeouts"] == refused
  dataset = json.loads((tmp_path / "dataset.json").read_text())
  with_sparql = [r for r in dataset if r["sparql"]]
  # The wh- records whose answers timed out are written without an assignment, not unanswered.
  assert with_sparql and all(r["sparql"].startswith("ASK") for r in with_sparql)
  assert report["assigned"] == len(with_sparql)


def test_cache_survives_torn_line(tmp_path):
  from mcwq_t5x.stores.jsonl_cache import JsonlCache
  path = tmp_path / "c.jsonl"
  c = JsonlCache(path)
  c.put("a", [1, 2])
  with open(path, "a") as f:
    f.write('{"key": "b", "val')  # killed while writing
  c2 = JsonlCache(path)
  assert c2.get("a") == [1, 2] and "b" not in c2 and c2.torn_lines == 1
  c2.put("b", True)
  assert JsonlCache(path).get("b") is True


# ---- Remote endpoint (SPARQL 1.1 over HTTP) against a real local SPARQL server and a flaky one ----


@pytest.fixture(scope="module")
def oxigraph_server(codex, tmp_path_factory):
  """(the query URL of a local SPARQL server, an embedded store) with the same CoDEx-M triples:
  those of train.txt with P26, P161 or P57."""
  d = tmp_path_factory.mktemp("oxserver")
  nt = d / "data.nt"
  with open(nt, "w") as f:
    for line in open(codex / "train.txt"):
      s, p, o = line.split()
      if p in ("P26", "P161", "P57"):
        f.write(f"<{ep.WD}{s}> <{ep.WDT}{p}> <{ep.WD}{o}> .\n")
  with local_http.sparql_server(nt, d, load_timeout_s=60) as url:
    local = oxigraph.OxigraphEndpoint()
    local.load_ntriples(nt)
    yield url, local


def test_remote_endpoint_matches_embedded_store(oxigraph_server):
  url, local = oxigraph_server
  remote = remote_lib.RemoteEndpoint(url, min_interval_s=0.0, timeout_s=10)
  q = mq("ASK WHERE { M0 wdt:P57 ?x0 . ?x0 wdt:P26 M1 }")
  text = sb.assignment_query(q, 100000)
  rows = remote.select(text)
  key = lambda r: (r["m0"], r["m1"])  # noqa: E731
  assert sorted(rows, key=key) == sorted(local.select(text), key=key) and len(rows) > 10
  a = {"M0": rows[0]["m0"], "M1": rows[0]["m1"]}
  assert remote.ask(sb.ask_query(q, a)) is True
  assert remote.ask(sb.ask_query(q, {
      "M0": a["M1"],
      "M1": a["M0"]
  })) == local.ask(sb.ask_query(q, {
      "M0": a["M1"],
      "M1": a["M0"]
  }))
  assert remote.num_requests == 3


class _Flaky(local_http.Handler):
  """Answers 429 (Retry-After: 2), then 503, then a SPARQL JSON result; records each request's
  User-Agent in `server.agents`."""

  def do_POST(self):  # noqa: N802
    self.server.agents.append(self.headers.get("User-Agent"))
    self.read_body()
    if self.server.requests == 1:
      self.answer(429, headers={"Retry-After": "2"})
    elif self.server.requests == 2:
      self.answer(503)
    else:
      self.answer(200, json.dumps({"head": {}, "boolean": True}).encode())


def test_remote_endpoint_retries_with_backoff_and_retry_after(local_server):
  srv = local_server(_Flaky, "/sparql", agents=[])
  waits = []
  remote = remote_lib.RemoteEndpoint(
      srv.url, user_agent="ua-test/1", backoff_s=0.5, min_interval_s=0.0, sleep=waits.append)
  assert remote.ask("ASK WHERE { ?s ?p ?o }") is True
  assert waits == [2.0, 0.5 * 2]  # Retry-After honoured, then exponential backoff
  assert srv.agents == ["ua-test/1"] * 3
  with pytest.raises(ValueError):
    remote.labels(["not-a-qid"])
  # Rate limit: a second request within min_interval_s waits for the rest of the interval.
  paced = []
  slow = remote_lib.RemoteEndpoint(remote.url, min_interval_s=30.0, sleep=paced.append)
  assert slow.ask("ASK WHERE { ?s ?p ?o }") and slow.ask("ASK WHERE { ?s ?p ?o }")
  assert len(paced) == 1 and 25.0 < paced[0] <= 30.0


def test_migrate_through_remote_endpoint_matches_embedded(oxigraph_server, tmp_path):
  """The pipeline gives the same records an assignment whichever endpoint kind answers."""
  url, local = oxigraph_server
  remote = remote_lib.RemoteEndpoint(url, min_interval_s=0.0, timeout_s=10)
  a = args_for(tmp_path / "remote", max_records=250, no_negatives=True)
  r1 = migrate.run(a, cache_lib.CachedEndpoint(remote, tmp_path / "r.jsonl"))
  r2 = migrate.run(
      args_for(tmp_path / "local", max_records=250, no_negatives=True),
      cache_lib.CachedEndpoint(local, None))
  assert r1["assigned"] == r2["assigned"] > 0
  d1 = json.loads((tmp_path / "remote" / "dataset.json").read_text())
  d2 = json.loads((tmp_path / "local" / "dataset.json").read_text())
  assert [r["sparql"] is None for r in d1] == [r["sparql"] is None for r in d2]
  assert remote.num_requests == r1["endpoint_requests"] > 0
