"""Tests of execution accuracy (`mcwq_t5x.evaluation.execution`, `python -m mcwq_t5x.score --execute`).

The data is real: the shared CFQ sample migrated to Wikidata with entities from the CoDEx-M
subgraph (`preprocessing.migrate`, fixture `migrated_cfq_sample`), executed on the embedded
pyoxigraph store loaded from `../shared/wikidata/codex-m`.
"""
import json
import pathlib
import subprocess
import sys

import pytest

from mcwq_t5x.data import readers
from mcwq_t5x.data import rir
from mcwq_t5x.data import sparql
from mcwq_t5x.evaluation import execution
from mcwq_t5x.evaluation import metrics
from mcwq_t5x import score as score_cli
from mcwq_t5x.stores import cache as cache_lib
from mcwq_t5x.stores import endpoint as ep
from mcwq_t5x.stores import oxigraph
import local_http

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def store(shared_dir):
  return cache_lib.CachedEndpoint(
      oxigraph.embedded_store(shared_dir / "wikidata" / "codex-m"), None)


@pytest.fixture(scope="module")
def train(migrated_cfq_sample):
  """(release queries of cfq_sample/train, dataset.json records, negatives.json records)."""
  queries = execution.load_release_queries(migrated_cfq_sample, "cfq_sample", "train")
  data = json.loads((migrated_cfq_sample / "dataset.json").read_text())
  negatives = json.loads((migrated_cfq_sample / "negatives.json").read_text())
  return queries, data, negatives


def _example(train, pattern):
  queries, data, _ = train
  matches = [q for q in queries if q.pattern == pattern and q.entities is not None]
  assert matches, pattern
  return matches[0], data[matches[0].index]


def _rir(sparql_text):
  return rir.sparql_to_rir(sparql_text)


def test_execution_release_queries_and_gold_answers(train, store):
  """The gold answers on the store are the release's expectedResponse (no labels: Q-ids)."""
  queries, data, _ = train
  assert len(queries) == 1598
  executable = [q for q in queries if q.entities is not None]
  assert len(executable) == 135
  for q in executable:
    answer = execution.execute(sparql.parse_sparql(q.pattern), q.entities, store)
    expected = data[q.index]["expectedResponse"]
    if answer.form == "ask":
      assert answer.value is True and expected == "True"
    else:
      assert sorted(answer.to_json()) == sorted("wd:" + a for a in expected.split("; "))


def test_execution_same_answers_different_string_is_correct(train, store):
  # "Who did M1 star": every cast member of the film is typed human, so the type triple can go.
  example, record = _example(train,
                             "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P31 wd:Q5 . M1 wdt:P161 ?x0 }")
  gold = _rir(example.pattern)
  dropped = _rir("SELECT DISTINCT ?x0 WHERE { M1 wdt:P161 ?x0 }")
  assert metrics.classify_error(gold, dropped) == metrics.MULTIPLE_ERRORS  # P31 and wd:Q5 gone
  answer = execution.execute(metrics.parse_query(dropped), example.entities, store)
  assert sorted(answer.to_json()) == sorted(
      "wd:" + a for a in record["expectedResponse"].split("; "))
  assert len(answer.value) == 8
  # Renamed variables: a different string, not even equivalent, but the same query.
  example2, _ = _example(
      train, "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P31 wd:Q5 . "
      "?x1 wdt:P112 ?x0 . M1 wdt:P108 ?x1 }")
  renamed = _rir(example2.pattern.replace("?x1", "?founded"))
  assert metrics.classify_error(_rir(example2.pattern), renamed) == metrics.WRONG_STRUCTURE
  scores = execution.score_execution([example, example2], [dropped, renamed], store)
  assert scores.outcomes == ["correct", "correct"]
  assert scores.summary()["execution_accuracy"] == 100.0


def test_execution_wrong_entity_is_wrong(train, store):
  queries, data, negatives = train
  # A verified negative of the migration (ASK false): the same query with one entity replaced.
  negative = next(
      n for n in negatives
      if n["sparqlPatternModEntities"] == "ASK WHERE { M0 wdt:P112 ?x0 . ?x0 wdt:P737 M1 }")
  example = next(q for q in queries if q.index == negative["negativeOf"])
  assert example.entities == {"M0": "Q337224", "M1": "Q218960"}
  assert negative["entities"] == {"M0": "Q337224", "M1": "Q202878"}
  wrong = _rir("ASK WHERE { M0 wdt:P112 ?x0 . ?x0 wdt:P737 wd:Q202878 }")
  # SELECT with the same shape and another entity: who influenced [Q882] instead of [Q200228].
  example2, record2 = _example(
      train, "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P106 wd:Q3282637 . M1 wdt:P737 ?x0 }")
  assert example2.entities == {"M1": "Q200228"} and record2["expectedResponse"] == "Q882"
  wrong2 = _rir("SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P106 wd:Q3282637 . wd:Q882 wdt:P737 ?x0 }")
  assert execution.execute(metrics.parse_query(wrong), example.entities, store).value is False
  assert execution.execute(metrics.parse_query(wrong2), example2.entities,
                           store).value == frozenset()
  scores = execution.score_execution([example, example2], [wrong, wrong2], store)
  assert scores.outcomes == ["wrong_answer", "wrong_answer"]
  assert scores.summary()["execution"]["correct"] == 0


class _FailingOn(ep.Endpoint):
  """The real store, except that queries mentioning `marker` fail like a dead endpoint."""

  def __init__(self, inner, marker):
    self.inner, self.marker = inner, marker

  def predicate_counts(self):
    return self.inner.predicate_counts()

  def select(self, query):
    if self.marker in query:
      raise ep.EndpointError("HTTP 500")
    return self.inner.select(query)

  def ask(self, query):
    if self.marker in query:
      raise ep.EndpointError("HTTP 500")
    return self.inner.ask(query)


def test_execution_malformed_and_unsafe_predictions_count_wrong(train, store):
  example, _ = _example(train, "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P31 wd:Q5 . M1 wdt:P161 ?x0 }")
  gold = _rir(example.pattern)
  predictions = {
      "": "syntax_error",
      "\x00\ufffd junk": "syntax_error",
      gold[:40]: "syntax_error",
      gold + " rb": "syntax_error",
      gold.replace("M1", "M7"): "invalid_term",  # no entity for M7 in this example
      gold.replace("wd:Q5", "ns:m.0abc"): "invalid_term",  # not a Wikidata item
      gold.replace("wd:Q5", "<http://example.org/x>"): "invalid_term",
      gold.replace("wdt:P161", "rdfs:label"): "invalid_term",  # not a wdt: property
      gold.replace("wdt:P161", "wdt:P161|ns:x"): "invalid_term",
      gold.replace("wdt:P161", "wdt:P1476"): "endpoint_error",  # the store fails on it
      gold: "correct",
  }
  scores = execution.score_execution([example] * len(predictions), list(predictions),
                                     _FailingOn(store, "wdt:P1476"))
  assert scores.outcomes == list(predictions.values())
  summary = scores.summary()
  assert summary["execution"]["n"] == 11 and summary["execution"]["correct"] == 1
  assert summary["execution_accuracy"] == pytest.approx(100 / 11)
  assert summary["execution"]["endpoint_errors"] == ["example 10: HTTP 500"]
  with pytest.raises(execution.UnsafeQueryError, match="M7"):
    execution.execute(metrics.parse_query(gold.replace("M1", "M7")), example.entities, store)


class _Recording(ep.Endpoint):
  """Records the queries `execute` sends; every ASK holds, every SELECT has no row."""

  def __init__(self, counts):
    self.counts, self.sent = counts, []

  def predicate_counts(self):
    return self.counts

  def select(self, query):
    self.sent.append(query)
    return []

  def ask(self, query):
    self.sent.append(query)
    return True


def test_execution_queries_are_built_from_validated_terms(store):
  query = sparql.parse_sparql("SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P31 wd:Q5 . M1 wdt:P161 ?x0 . "
                              "?x2 wdt:P737 M0 . FILTER ( ?x0 != M1 ) }")
  entities = {"M0": "Q882", "M1": "Q30937"}
  counts = store.predicate_counts()
  assert counts["wdt:P161"] < counts["wdt:P31"]
  # The unconnected ?x2 pattern is asked on its own; P161 (rarer) is joined before P31.
  recording = _Recording(counts)
  execution.execute(query, entities, recording, max_answers=99)
  assert recording.sent == [
      "ASK WHERE { ?x2 wdt:P737 wd:Q882 }",
      "SELECT DISTINCT ?x0 WHERE { wd:Q30937 wdt:P161 ?x0 . ?x0 wdt:P31 wd:Q5 . "
      "FILTER ( ?x0 != wd:Q30937 ) } LIMIT 100"
  ]
  # A filter on a variable that no triple binds has no solution (nothing is sent).
  unbound = sparql.parse_sparql("ASK WHERE { M0 wdt:P737 ?x0 . FILTER ( ?x9 != M0 ) }")
  recording.sent.clear()
  assert execution.execute(unbound, entities, recording).value is False
  assert recording.sent == []
  assert execution.execute(unbound, entities, store).value is False
  with pytest.raises(ValueError, match="not a Wikidata item id"):
    execution.check_entities({"M0": "Q1 } . ?s ?p ?o"})
  with pytest.raises(ValueError, match="not a Wikidata item id"):
    execution.check_entities({"M0": "Q1\n"})
  with pytest.raises(ValueError, match="not a placeholder"):
    execution.check_entities({"?x0": "Q1"})


def test_execution_release_errors_name_file_and_line(tmp_path):
  (tmp_path / "splits").mkdir()
  (tmp_path / "splits" / "s.json").write_text('{"trainIdxs": [0, 1]}')
  records = [{
      "sparqlPatternModEntities": "ASK WHERE { M0 wdt:P27 wd:Q29 }",
      "entities": {
          "M0": "Q42"
      }
  }, {
      "sparqlPatternModEntities": "ASK WHERE { M0 wdt:P27 wd:Q29 }",
      "entities": {
          "M0": "Q42 } ; DROP ALL"
      }
  }]
  (tmp_path / "dataset.json").write_text(json.dumps(records, indent=1))
  with pytest.raises(readers.DataFormatError) as e:
    execution.load_release_queries(tmp_path, "s", "train")
  assert str(e.value).startswith(f"{tmp_path / 'dataset.json'}:8: record 1: not a Wikidata item")
  (tmp_path / "splits" / "s.json").write_text('{"trainIdxs": [0,\n 7]}')
  with pytest.raises(readers.DataFormatError, match=r"s\.json:2: trainIdxs\[1\] = 7"):
    execution.load_release_queries(tmp_path, "s", "train")


def test_execution_cli_on_migrated_cfq_sample(train, migrated_cfq_sample, tmp_path):
  """`python -m mcwq_t5x.score --execute` on cfq_sample/train, with perturbed gold queries
  whose execution outcome is known by construction."""
  queries, data, negatives = train
  negative_of = {n["negativeOf"]: n for n in negatives}
  predictions, expected = [], {}
  executable = 0
  for line, q in enumerate(queries, start=1):
    prediction = _rir(q.pattern)
    if q.entities is None:
      if line % 7 == 0:
        prediction = prediction[:25]  # never executed: changes exact match only
      predictions.append(prediction)
      continue
    executable += 1
    kind = executable % 5
    if kind == 0:
      prediction, outcome = prediction[:-3], "syntax_error"
    elif kind == 1 and q.index in negative_of:
      neg = negative_of[q.index]
      (m, qid), = [(m, v) for m, v in neg["entities"].items() if q.entities[m] != v]
      prediction = _rir(" ".join(f"wd:{qid}" if t == m else t for t in q.pattern.split()))
      outcome = "wrong_answer"  # the migration verified that ASK is false with this entity
    elif kind == 2 and "?x1" in q.pattern:
      prediction, outcome = _rir(q.pattern.replace("?x1", "?renamed")), "correct"
    elif kind == 3 and q.entities:
      prediction, outcome = prediction.replace(next(iter(q.entities)), "M9"), "invalid_term"
    else:
      outcome = "correct"
    predictions.append(prediction)
    expected[line] = outcome
  (tmp_path / "pred.txt").write_text("\n".join(predictions) + "\n")
  counts = {o: list(expected.values()).count(o) for o in execution.OUTCOMES}
  assert executable == 135 and min(
      counts[o] for o in ("correct", "syntax_error", "wrong_answer", "invalid_term")) >= 10
  proc = subprocess.run([
      sys.executable, "-m", "mcwq_t5x.score", "--predictions",
      str(tmp_path / "pred.txt"), "--targets",
      str(migrated_cfq_sample / "official" / "cfq_sample" / "train.en.txt"), "--target_format",
      "sparql", "--release",
      str(migrated_cfq_sample), "--split", "cfq_sample", "--part", "train", "--execute",
      "--errors_out",
      str(tmp_path / "errors.jsonl")
  ],
                        cwd=REPO_ROOT,
                        capture_output=True,
                        text=True,
                        check=False,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(proc.stdout)
  assert result["n"] == 1598
  assert result["execution"]["n"] == 135
  assert result["execution"]["outcomes"] == {**counts, "not_executable": 1598 - 135}
  assert result["execution_accuracy"] == pytest.approx(100.0 * counts["correct"] / 135)
  assert result["exact_match"] < 100.0 and result["bleu"] < 100.0
  errors = [json.loads(l) for l in (tmp_path / "errors.jsonl").read_text().splitlines()]
  assert {e["line"]: e["execution"] for e in errors if e["line"] in expected} == expected
  renamed = [e for e in errors if "?renamed" in e["prediction"]]
  assert renamed and all(
      e["execution"] == "correct" and e["category"] != "correct" for e in renamed)


def test_execution_cli_input_errors(tmp_path, capsys):
  (tmp_path / "splits").mkdir()
  (tmp_path / "splits" / "s.json").write_text('{"devIdxs": [1, 0]}')
  records = [{
      "sparqlPatternModEntities": "ASK WHERE { M0 wdt:P27 wd:Q29 }",
      "entities": None
  }, {
      "sparqlPatternModEntities": "ASK WHERE { M0 wdt:P21 wd:Q6581072 }",
      "entities": {
          "M0": "Q42"
      }
  }]
  (tmp_path / "dataset.json").write_text(json.dumps(records, indent=1))
  gold = [_rir(r["sparqlPatternModEntities"]) for r in records[::-1]]
  (tmp_path / "p.txt").write_text("\n".join(gold) + "\n")
  (tmp_path / "t.txt").write_text("\n".join(gold[::-1]) + "\n")  # the wrong order
  with pytest.raises(SystemExit) as e:
    score_cli.main([
        "--predictions",
        str(tmp_path / "p.txt"), "--targets",
        str(tmp_path / "t.txt"), "--answers",
        str(tmp_path / "a.jsonl")
    ])
  assert e.value.code == 2
  assert "--answers needs --execute" in capsys.readouterr().err
  base = ["--predictions", str(tmp_path / "p.txt"), "--release", str(tmp_path), "--split", "s"]
  assert score_cli.main(base + ["--part", "test", "--execute"]) == 2
  assert f"{tmp_path / 'splits' / 's.json'}:1: expected an object with an index list 'testIdxs'" \
      in capsys.readouterr().err
  assert score_cli.main(base + ["--part", "dev", "--targets", str(tmp_path / "t.txt")]) == 2
  assert f"{tmp_path / 't.txt'}:1: target is not the query of {tmp_path / 'dataset.json'} " \
         "record 1" in capsys.readouterr().err
  assert score_cli.main(base + ["--part", "dev", "--execute", "--codex",
                                str(tmp_path / "nope")]) == 2
  assert f"{tmp_path / 'nope' / 'train.txt'}: no such file" in capsys.readouterr().err
  # Without --targets the release's queries are the targets (no store needed without --execute).
  assert score_cli.main(base + ["--part", "dev"]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["n"] == 2 and result["exact_match"] == 100.0 and "execution" not in result
  assert not hasattr(metrics, "evaluate")  # scoring lives in the score command line


class _ErrorAnswers(local_http.Handler):
  """A SPARQL endpoint that answers every query with status 200 and a JSON error object."""

  def do_POST(self):  # noqa: N802
    self.read_body()
    self.answer(200, b'{"error": "Query is malformed: the store is read-only and broken"}',
                "application/json")


def test_execution_cli_when_every_gold_query_fails_is_an_error_not_zero(
    tmp_path, capsys, local_server):
  """An endpoint answering errors (status 200, `{"error": ...}`) makes every gold query fail:
  execution accuracy is undefined (null, exit 3), not 0.0 with exit 0, and nothing is cached."""
  (tmp_path / "splits").mkdir()
  (tmp_path / "splits" / "s.json").write_text('{"devIdxs": [0, 1, 2]}')
  records = [{
      "sparqlPatternModEntities": "ASK WHERE { M0 wdt:P21 wd:Q6581072 }",
      "entities": {
          "M0": "Q42"
      }
  }, {
      "sparqlPatternModEntities": "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P161 M0 }",
      "entities": {
          "M0": "Q30937"
      }
  }, {
      "sparqlPatternModEntities": "ASK WHERE { M0 wdt:P27 wd:Q29 }",
      "entities": None
  }]
  (tmp_path / "dataset.json").write_text(json.dumps(records))
  (tmp_path / "p.txt").write_text("\n".join(_rir(r["sparqlPatternModEntities"]) for r in records))
  srv = local_server(_ErrorAnswers, "/sparql")
  url = srv.url
  argv = [
      "--predictions",
      str(tmp_path / "p.txt"), "--release",
      str(tmp_path), "--split", "s", "--part", "dev", "--execute", "--endpoint", "remote", "--url",
      url, "--rate", "0", "--cache",
      str(tmp_path / "answers.jsonl"), "--json",
      str(tmp_path / "result.json")
  ]
  assert score_cli.main(argv) == 3  # score.EXIT_UNDEFINED
  captured = capsys.readouterr()
  result = json.loads(captured.out)
  assert result["execution_accuracy"] is None and result["execution"]["n"] == 0
  assert result["execution"]["outcomes"]["gold_error"] == 2
  assert "RuntimeError: execution accuracy is undefined: the gold query of every executable example " \
      "failed on the store (2 examples" in captured.err
  assert url in captured.err and "an error object" in captured.err
  assert json.loads((tmp_path / "result.json").read_text())["execution_accuracy"] is None
  assert srv.requests == 2  # one per gold query: an error answer is not retried...
  assert score_cli.main(argv) == 3  # score.EXIT_UNDEFINED
  assert srv.requests == 4  # ...nor cached
  assert json.loads(capsys.readouterr().out)["execution"]["store_requests"] == 2
  # No line with entities: nothing can be scored either.
  (tmp_path / "splits" / "s.json").write_text('{"devIdxs": [2]}')
  (tmp_path / "p.txt").write_text(_rir(records[2]["sparqlPatternModEntities"]))
  assert score_cli.main(argv[:-2]) == 3
  assert "undefined: no example has an entity assignment" in capsys.readouterr().err
  scores = execution.ExecutionScores([execution.GOLD_ERROR], [(1, "gold: HTTP 500")])
  assert scores.summary()["execution_accuracy"] is None
  assert "every executable example failed" in scores.undefined_reason()


@pytest.fixture(scope="module")
def sparql_server(shared_dir, tmp_path_factory):
  """A local SPARQL 1.1 server (`oxigraph serve-read-only`) with the CoDEx-M triples and types."""
  codex = shared_dir / "wikidata" / "codex-m"
  d = tmp_path_factory.mktemp("sparql_server")
  with open(d / "data.nt", "w") as f:
    for part in ("train", "valid", "test"):
      for line in open(codex / f"{part}.txt"):
        s, p, o = line.split()
        f.write(f"<{ep.WD}{s}> <{ep.WDT}{p}> <{ep.WD}{o}> .\n")
    for e, types in json.loads((codex / "entity2types.json").read_text()).items():
      for t in types:
        f.write(f"<{ep.WD}{e}> <{ep.WDT}P31> <{ep.WD}{t}> .\n")
  with local_http.sparql_server(d / "data.nt", d) as url:
    yield url


def test_execution_cli_remote_endpoint_and_cache(migrated_cfq_sample, sparql_server, tmp_path):
  """`--endpoint remote` (`requests` with urllib3's Retry, rate limit) gives the embedded store's outcomes;
  with `--cache` a rerun sends no request."""
  queries = execution.load_release_queries(migrated_cfq_sample, "cfq_sample", "dev")
  predictions = [_rir(q.pattern) for q in queries]
  executable = [i for i, q in enumerate(queries) if q.entities is not None]
  assert len(executable) == 16
  negative_of = {
      n["negativeOf"]: n for n in json.loads((migrated_cfq_sample / "negatives.json").read_text())
  }
  for i in executable[::2]:
    q = queries[i]
    if q.index in negative_of:  # a verified negative's entity: a wrong answer
      (m, qid), = [(m, v) for m, v in negative_of[q.index]["entities"].items() if q.entities[m] != v
                  ]
      predictions[i] = _rir(" ".join(f"wd:{qid}" if t == m else t for t in q.pattern.split()))
    else:  # drop the first triple: right or wrong depending on the data
      parsed = sparql.parse_sparql(q.pattern)
      predictions[i] = _rir(
          sparql.Query(parsed.prefix, parsed.triples[1:], parsed.filters).to_sparql()) if len(
              parsed.triples) > 1 else predictions[i][:-3]
  (tmp_path / "pred.txt").write_text("\n".join(predictions) + "\n")
  base = [
      sys.executable, "-m", "mcwq_t5x.score", "--predictions",
      str(tmp_path / "pred.txt"), "--release",
      str(migrated_cfq_sample), "--split", "cfq_sample", "--part", "dev", "--execute"
  ]
  runs = {}
  for name, extra in [("embedded", []),
                      ("remote", [
                          "--endpoint", "remote", "--url", sparql_server, "--rate", "0", "--cache",
                          str(tmp_path / "answers.jsonl")
                      ]),
                      ("cached", [
                          "--endpoint", "remote", "--url", sparql_server, "--rate", "0", "--cache",
                          str(tmp_path / "answers.jsonl")
                      ])]:
    proc = subprocess.run(
        base + extra, cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr
    runs[name] = json.loads(proc.stdout)
  outcomes = runs["embedded"]["execution"]["outcomes"]
  assert outcomes["correct"] + outcomes["wrong_answer"] + outcomes["syntax_error"] == 16
  assert 0 < outcomes["wrong_answer"] and outcomes["correct"] < 16
  for name in ("remote", "cached"):
    assert runs[name]["execution"]["outcomes"] == outcomes
    assert runs[name]["execution_accuracy"] == runs["embedded"]["execution_accuracy"]
  assert runs["remote"]["execution"]["store_requests"] > 16
  assert runs["cached"]["execution"]["store_requests"] == 0


# --- execution accuracy on MCWQ's own files (no release), what --help says ------------------------
_WD = "http://www.wikidata.org/entity/"
_WDT = "http://www.wikidata.org/prop/direct/"


def _tiny_store(tmp_path):
  """N-Triples: Q42 and Q5 are citizens of Q29 (Spain); Q7 of Q142 (France)."""
  lines = [
      f"<{_WD}{s}> <{_WDT}P27> <{_WD}{o}> ." for s, o in (("Q42", "Q29"), ("Q5", "Q29"), ("Q7",
                                                                                          "Q142"))
  ]
  path = tmp_path / "tiny.nt"
  path.write_text("\n".join(lines) + "\n")
  return path


def test_execution_on_targets_without_a_release(tmp_path, capsys):
  """MCWQ's own files carry no entities: queries with placeholders are not executable, those
  without run; reported as "x of n executable (n of N)", answers per line with --answers."""
  targets = [
      "ASK WHERE { M0 wdt:P27 wd:Q29 }",  # placeholder: nothing binds it
      "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P27 wd:Q29 }",
      "ASK WHERE { wd:Q7 wdt:P27 wd:Q29 }",
  ]
  (tmp_path / "targets.txt").write_text("\n".join(targets) + "\n")
  from mcwq_t5x.data import rir  # pylint: disable=g-import-not-at-top
  preds = [
      rir.sparql_to_rir(q)
      for q in (targets[0], targets[1].replace("Q29", "Q142"), targets[2].replace("Q29", "Q142"))
  ]
  (tmp_path / "pred.txt").write_text("\n".join(preds) + "\n")
  assert score_cli.main([
      "--predictions",
      str(tmp_path / "pred.txt"), "--targets",
      str(tmp_path / "targets.txt"), "--target_format", "sparql", "--execute", "--codex", "",
      "--ntriples",
      str(_tiny_store(tmp_path)), "--answers",
      str(tmp_path / "answers.jsonl")
  ]) == 0
  captured = capsys.readouterr()
  result = json.loads(captured.out)
  assert result["execution"]["executable_of"] == ("execution accuracy 0.0%: 0 of 2 executable "
                                                  "(2 of 3)")
  assert "0 of 2 executable (2 of 3)" in captured.err
  assert result["execution"]["outcomes"]["not_executable"] == 1
  answers = [json.loads(l) for l in (tmp_path / "answers.jsonl").read_text().splitlines()]
  assert [a["outcome"] for a in answers] == ["not_executable", "wrong_answer", "wrong_answer"]
  assert answers[1]["gold"] == ["wd:Q42", "wd:Q5"] and answers[1]["predicted"] == ["wd:Q7"]
  assert answers[2]["gold"] is False and answers[2]["predicted"] is True


def test_execution_help_says_what_it_is(capsys):
  with pytest.raises(SystemExit):
    score_cli.main(["--help"])
  out = " ".join(capsys.readouterr().out.split())
  assert "not a metric of the MCWQ paper" in out and "x of n executable (n of N)" in out
  assert "--answers" in out


def test_release_without_entities_binds_placeholders_from_its_sparql(tmp_path):
  """The published MCWQ dataset.json has no `entities`: its `sparql` field binds them."""
  from mcwq_t5x.evaluation import execution  # pylint: disable=g-import-not-at-top
  assert execution.entities_from_sparql(
      "ASK WHERE { M0 wdt:P27 M1 . M0 wdt:P1 wd:Q3 }",
      "ASK WHERE { wd:Q42 wdt:P27 wd:Q29 . wd:Q42 wdt:P1 wd:Q3 }") == {
          "M0": "Q42",
          "M1": "Q29"
      }
  assert execution.entities_from_sparql("ASK WHERE { M0 wdt:P27 M0 }",
                                        "ASK WHERE { wd:Q1 wdt:P27 wd:Q2 }") is None
  assert execution.entities_from_sparql("ASK WHERE { M0 wdt:P27 wd:Q1 }",
                                        "ASK WHERE { wd:Q1 wdt:P31 wd:Q1 }") is None
  (tmp_path / "splits").mkdir()
  (tmp_path / "splits" / "s.json").write_text('{"testIdxs": [0]}')
  (tmp_path / "dataset.json").write_text(
      json.dumps([{
          "sparqlPatternModEntities": "ASK WHERE { M0 wdt:P27 wd:Q29 }",
          "sparql": "ASK WHERE { wd:Q42 wdt:P27 wd:Q29 }"
      }]))
  (query,) = execution.load_release_queries(tmp_path, "s", "test")
  assert query.entities == {"M0": "Q42"}
