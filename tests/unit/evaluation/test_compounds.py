"""Tests for mcwq_t5x.evaluation.compounds (unseen compounds) and its place in the report: a
hand-made release whose compounds are known, the shared copy (no training part)."""
import csv
import json

import pytest

from mcwq_t5x.data import rir
from mcwq_t5x.evaluation import compounds
from mcwq_t5x.evaluation import report
import mains

TRAIN = ["SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M0 }", "ASK WHERE { M0 wdt:P58 M1 }"]
Q_SEEN = TRAIN[0]
Q_BOTH = "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M0 . ?x0 wdt:P58 M1 }"
Q_P58 = "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P58 M0 }"
TEST = [Q_SEEN, Q_BOTH, Q_P58, Q_BOTH]
# Compounds (mcwq_t5x.data.divergence): Q_BOTH has `?ans wdt:P57 M1` (seen in training),
# `?ans wdt:P58 M1` and the pair; the training query `M0 wdt:P58 M1` is another compound (no
# answer variable).
PAIR = "?ans wdt:P57 M1 . ?ans wdt:P58 M2"
P58 = "?ans wdt:P58 M1"
UNSEEN = [(), (PAIR, P58), (P58,), (PAIR, P58)]
CORRECT = [True, False, True, False]


def _release(tmp_path):
  """A release (dataset.json + splits/mcd1.json) with TRAIN as train and TEST twice as test part,
  and predictions of model `tiny` (right as CORRECT says)."""
  records = [{
      "questionPatternModEntities": f"question {i}",
      "sparqlPatternModEntities": q,
      "recursionDepth": 10 + i
  } for i, q in enumerate(TRAIN + TEST * 2)]
  data = tmp_path / "release"
  (data / "splits").mkdir(parents=True)
  (data / "dataset.json").write_text(json.dumps(records))
  (data / "splits" / "mcd1.json").write_text(
      json.dumps({
          "trainIdxs": [0, 1],
          "devIdxs": [],
          "testIdxs": [2, 3, 4, 5, 6, 7, 8, 9]
      }))
  results = tmp_path / "results" / "tiny"
  results.mkdir(parents=True)
  preds = [
      rir.sparql_to_rir(q) if ok else "ASK WHERE lb rb" for q, ok in zip(TEST * 2, CORRECT * 2)
  ]
  (results / "predictions_mcd1_en.txt").write_text("\n".join(preds) + "\n")
  return data, results.parent


def test_bucket_names():
  names = [compounds.bucket_name(k) for k in (0, 1, 2, 3, 4, 5, 9, 10, 19, 20, 39, 40, 122)]
  assert names == [
      "0", "1", "2", "3-4", "3-4", "5-9", "5-9", "10-19", "10-19", "20-39", "20-39", "40+", "40+"
  ]
  assert compounds.BUCKETS == ("0", "1", "2", "3-4", "5-9", "10-19", "20-39", "40+")
  with pytest.raises(ValueError):
    compounds.bucket_name(-1)


def test_unseen_compounds_of_a_release(tmp_path):
  data, _ = _release(tmp_path)
  train = compounds.training_compounds("mcd1", data)
  assert train == {"?ans wdt:P57 M1", "M1 wdt:P58 M2"}
  targets = [rir.sparql_to_rir(q) for q in TEST]
  assert compounds.unseen_compounds(targets, train) == UNSEEN


def test_exact_match_by_unseen_and_costliest():
  assert compounds.by_unseen(CORRECT, UNSEEN) == {
      "0": {
          "n": 1,
          "correct": 1,
          "exact_match": 100.0
      },
      "1": {
          "n": 1,
          "correct": 1,
          "exact_match": 100.0
      },
      "2": {
          "n": 2,
          "correct": 0,
          "exact_match": 0.0
      }
  }
  ranked = compounds.costliest(CORRECT, UNSEEN, min_examples=1)
  # P58: 3 examples, 1 right (33.3%) against 1 of 1 without it: 66.7 points, 2 matches lost. The
  # pair: 2 examples, none right, against 2 of 2: 100 points, also 2 lost; more examples first.
  assert [(r["compound"], r["n_with"], r["correct_with"]) for r in ranked] == [(P58, 3, 1),
                                                                               (PAIR, 2, 0)]
  assert ranked[0]["cost"] == pytest.approx(200 / 3)
  assert ranked[0]["lost"] == pytest.approx(2.0)
  assert ranked[1]["cost"] == pytest.approx(100.0)
  assert ranked[1]["lost"] == pytest.approx(2.0)
  assert compounds.costliest(CORRECT, UNSEEN, min_examples=3) == ranked[:1]
  with pytest.raises(ValueError, match="4 outcomes but 3"):
    compounds.by_unseen(CORRECT, UNSEEN[:3])


def test_malformed_gold_query_names_its_line():
  with pytest.raises(ValueError, match=r"test.sparql:2: cannot read the compounds"):
    compounds.unseen_compounds([rir.sparql_to_rir(Q_SEEN), "SELECT lb ( ("], frozenset(),
                               "test.sparql")


def test_report_diagnoses_a_release(tmp_path):
  """The command line in a fresh process on the release: the unseen-compound tables and figure,
  progress lines on stderr."""
  data, results = _release(tmp_path)
  out = tmp_path / "out"
  proc = mains.python_m("mcwq_t5x.report", str(results), "--data_dir", str(data), "--targets_dir",
                        str(data / "translations"), "--out", str(out))
  assert "report [" in proc.stderr and "scoring 1/1" in proc.stderr
  assert "unseen compounds: reading the training part of mcd1" in proc.stderr
  with open(out / "unseen_compounds_exact_match.csv", newline="", encoding="utf-8") as f:
    rows = list(csv.reader(f))
  assert rows[0][:8] == [
      "model", "mode", "split", "language", "unseen compounds", "n", "exact matches", "exact match"
  ]
  assert [r[4:8] for r in rows[1:]] == [["0", "2", "2", "100.0000"], ["1", "2", "2", "100.0000"],
                                        ["2", "4", "0", "0.0000"]]
  with open(out / "unseen_compounds_costliest.csv", newline="", encoding="utf-8") as f:
    ranked = list(csv.reader(f))
  # Only P58 is in MIN_EXAMPLES (5) test examples: 2 of its 6 right, both others right.
  assert ranked[1:] == [[
      "tiny", "monolingual", "MCD1", "en", "1", P58, "6", "33.3333", "100.0000", "66.6667", "4.0000"
  ]]
  assert (out / "unseen_monolingual_mcd1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "## Exact match by number of unseen compounds" in (out / "report.md").read_text()


def test_shared_copy_has_no_training_part(mcwq_dir):
  assert compounds.training_compounds("mcd1", mcwq_dir) is None
  messages = []
  runs = [
      dict(model="m", mode="monolingual", split=s, language="en", gold=False)
      for s in ("mcd1", "mcd2")
  ]
  report.unseen_compounds(runs, {"sets": {}, "runs": [{}, {}]}, mcwq_dir, messages, print)
  assert len(messages) == 1  # one line for all splits
  assert messages[0].startswith("unseen compounds skipped for mcd1, mcd2:")
