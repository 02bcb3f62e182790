"""DBCA atoms, compounds and divergences (`mcwq_t5x.data.divergence`; Keysers et al., ICLR 2020, §2)."""
import io
import itertools
import random
import subprocess
import sys
from contextlib import redirect_stdout

import numpy as np
import pytest

from mcwq_t5x.data import divergence as dv
from mcwq_t5x.data import paths
from mcwq_t5x.data import readers
from mcwq_t5x import divergence as divergence_cli

# mcd1/dev.en.txt line 3 ("Did M0 's cinematographer , editor , and writer found M1 , M2 , and M3
# and found M4 and M5").
STAR = ("ASK WHERE { M0 wdt:P344 ?x0 . M0 wdt:P1040 ?x0 . M0 wdt:P58 ?x0 . M1 wdt:P112 ?x0 . "
        "M2 wdt:P112 ?x0 . M3 wdt:P112 ?x0 . M4 wdt:P112 ?x0 . M5 wdt:P112 ?x0 }")


def test_identical_distributions_have_no_divergence():
  # Proportional counts are the same distribution.
  p, q = {"a": 2, "b": 1, "c": 1}, {"a": 6, "b": 3, "c": 3}
  for alpha in (dv.ALPHA_ATOMS, dv.ALPHA_COMPOUNDS):
    assert dv.divergence(p, q, alpha) == pytest.approx(0.0, abs=1e-12)
    assert dv.chernoff_coefficient(p, q, alpha) == pytest.approx(1.0)


def test_disjoint_distributions_diverge_fully():
  assert dv.divergence({"a": 1, "b": 5}, {"c": 2}, dv.ALPHA_COMPOUNDS) == 1.0
  assert dv.divergence(np.array([1.0, 0.0]), np.array([0.0, 3.0]), dv.ALPHA_ATOMS) == 1.0


def test_small_case_by_hand():
  # P = (a: 1/2, b: 1/2), Q = (a: 3/4, c: 1/4); only `a` is shared, so
  #   C_0.5(P||Q) = (1/2)^0.5 (3/4)^0.5 = sqrt(0.375) = 0.612372  -> D = 0.387628 (symmetric);
  #   C_0.1(P||Q) = (1/2)^0.1 (3/4)^0.9 = 0.933033 * 0.771891 = 0.720198 -> D = 0.279802;
  #   C_0.1(Q||P) = (3/4)^0.1 (1/2)^0.9 = 0.971642 * 0.535887 = 0.520690 -> D = 0.479310:
  # compound divergence is worse when the test side (Q) has the larger share of unseen mass.
  p, q = {"a": 1, "b": 1}, {"a": 3, "c": 1}
  assert dv.divergence(p, q, 0.5) == pytest.approx(0.387628, abs=1e-6)
  assert dv.divergence(q, p, 0.5) == pytest.approx(0.387628, abs=1e-6)
  assert dv.divergence(p, q, 0.1) == pytest.approx(0.279802, abs=1e-6)
  assert dv.divergence(q, p, 0.1) == pytest.approx(0.479310, abs=1e-6)


@pytest.mark.parametrize("p, q, alpha", [({}, {
    "a": 1
}, 0.5), ({
    "a": 1
}, {
    "a": 1
}, 1.5), ({
    "a": -1,
    "b": 2
}, {
    "a": 1
}, 0.5)])
def test_divergence_rejects_bad_input(p, q, alpha):
  with pytest.raises(ValueError):
    dv.divergence(p, q, alpha)


def test_atoms_and_compounds_of_a_real_query_by_hand(mcwq_dir):
  line = readers.read_official(mcwq_dir / "official" / "mcd1" / "dev.en.txt")[2]
  assert line.sparql == STAR
  assert dv.atoms(STAR) == {
      "form:ASK": 1,
      "property:wdt:P344": 1,
      "property:wdt:P1040": 1,
      "property:wdt:P58": 1,
      "property:wdt:P112": 5,
      "term:M": 6,
      "term:?v": 1
  }
  # Eight triples around ?x0: A = M0 P344, B = M0 P1040, C = M0 P58 (one placeholder) and five
  # D = Mk P112 (five placeholders). Anonymised, the connected sub-graphs are
  #   1 edge:  A, B, C, D                                                   -> 4
  #   2 edges: AB, AC, BC (same M), AD, BD, CD, DD (two Ms)                 -> 7
  #   3 edges: ABC, ABD, ACD, BCD, ADD, BDD, CDD, DDD                       -> 8
  compounds = dv.compounds(STAR)
  assert len(compounds) == 19
  assert "M1 wdt:P112 ?v1 . M2 wdt:P112 ?v1 . M3 wdt:P112 ?v1" in compounds  # DDD
  assert "M1 wdt:P1040 ?v1 . M1 wdt:P344 ?v1 . M1 wdt:P58 ?v1" in compounds  # ABC
  assert "M1 wdt:P1040 ?v1 . M2 wdt:P112 ?v1" in compounds  # BD
  assert len(dv.compounds(STAR, max_size=1)) == 4
  assert len(dv.compounds(STAR, max_size=2)) == 11


def test_roles_constants_and_filters():
  q = ("SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P106 wd:Q2526255 . ?x1 wdt:P57 ?x0 . "
       "?x1 wdt:P31 wd:Q5 . M0 wdt:P31 wd:Q5 . FILTER ( ?x0 != M0 ) }")
  assert dv.atoms(q) == {
      "form:SELECT": 1,
      "property:wdt:P106": 1,
      "property:wdt:P57": 1,
      "property:wdt:P31": 2,
      "entity:wd:Q2526255": 1,
      "entity:wd:Q5": 2,
      "filter:?ans!=M": 1,
      "term:?ans": 1,
      "term:?v": 1,
      "term:M": 1
  }
  c = dv.compounds(q)
  assert "?v1 wdt:P31 wd:Q5 . ?v1 wdt:P57 ?ans" in c
  # The filter joins M0 to ?x0; the shared constant wd:Q5 joins nothing.
  assert "?ans != M1 . M1 wdt:P31 wd:Q5" in c
  assert not any("?v1 wdt:P31 wd:Q5" in x and "M1 wdt:P31 wd:Q5" in x for x in c)


def test_compounds_ignore_names_and_clause_order():
  q = "ASK WHERE { M0 wdt:P57 ?x0 . ?x0 wdt:P27 wd:Q30 . M1 wdt:P58 ?x1 . FILTER ( ?x0 != M1 ) }"
  renamed = ("ASK WHERE { FILTER ( M3 != ?x7 ) . ?x7 wdt:P27 wd:Q30 . M3 wdt:P58 ?x2 . "
             "M5 wdt:P57 ?x7 }")
  assert dv.analyse(q) == dv.analyse(renamed)
  # ...but not the roles: the same triples in a SELECT query have an answer variable.
  assert dv.compounds(q.replace("ASK WHERE", "SELECT DISTINCT ?x0 WHERE")) != dv.compounds(q)


def _brute_force_subsets(edges, max_size):
  anonymous = lambda i: {t for t in (edges[i][0], edges[i][2]) if t[0] in "?M"}
  shares = lambda i, j: bool(anonymous(i) & anonymous(j))
  out = []
  for k in range(1, max_size + 1):
    for subset in itertools.combinations(range(len(edges)), k):
      reached, todo = {subset[0]}, [subset[0]]
      while todo:
        i = todo.pop()
        for j in subset:
          if j not in reached and shares(i, j):
            reached.add(j)
            todo.append(j)
      if len(reached) == k:
        out.append(subset)
  return out


def test_connected_subsets_match_brute_force(mcwq_dir):
  examples = readers.read_official(mcwq_dir / "official" / "mcd2" / "test.en.txt")
  for ex in random.Random(0).sample(examples, 150):
    edges = dv._edges(dv.sparql_lib.parse_sparql(ex.sparql))
    masks = dv._connected_masks(dv._neighbour_masks(edges), 3)  # what `analyse` enumerates
    subsets = sorted((tuple(i for i in range(len(edges)) if m >> i & 1) for m in masks),
                     key=lambda t: (len(t), t))
    assert subsets == _brute_force_subsets(edges, 3), ex.sparql


def test_distributions_count_atoms_per_occurrence_and_compounds_per_query():
  d = dv.distributions([STAR, STAR, "ASK WHERE { M0 wdt:P112 ?x0 }"])
  assert d.n == 3
  assert d.atoms["property:wdt:P112"] == 11 and d.atoms["form:ASK"] == 3
  assert d.compounds["M1 wdt:P112 ?v1"] == 3
  assert d.compounds["M1 wdt:P112 ?v1 . M2 wdt:P112 ?v1"] == 2
  same = dv.compare([STAR], [STAR, STAR])
  assert same.atom == pytest.approx(
      0.0, abs=1e-12) and same.compound == pytest.approx(
          0.0, abs=1e-12)


def test_published_splits_figures(mcwq_dir):
  """`--split mcd1 --split random_split` prints dev-vs-test figures equal to `split_divergences`:
  dev and test of an MCD split are two random halves of one hold-out (Keysers et al. §4), so both
  divergences are low; the atoms are shared almost exactly."""
  out = io.StringIO()
  with redirect_stdout(out):
    assert divergence_cli.main(
        ["--split", "mcd1", "--split", "random_split", "--data_dir",
         str(mcwq_dir)]) == 0
  rows = [
      l.split("|")
      for l in out.getvalue().splitlines()
      if l.startswith("| mcd1") or l.startswith("| random_split")
  ]
  assert [r[1].strip() for r in rows] == ["mcd1", "random_split"]
  assert rows[0][2].strip() == "dev (5,408)" and rows[0][3].strip() == "test (5,310)"
  for row, split in zip(rows, ("mcd1", "random_split")):
    expected = dv.split_divergences(split, mcwq_dir)[("dev", "test")]
    assert float(row[4]) == pytest.approx(expected.atom, abs=1e-4)
    assert float(row[5]) == pytest.approx(expected.compound, abs=1e-4)
    assert expected.atom < 0.005 and 0.01 < expected.compound < 0.3


def test_files_command_fresh_process(tmp_path, mcwq_dir):
  """`--files A B` reads official lines, plain SPARQL and RIR (`translations/`)."""
  dev = readers.read_lines(mcwq_dir / "official" / "mcd1" / "dev.en.txt")[:40]
  rir = readers.read_lines(mcwq_dir / "translations" / "mcd1" / "dev.en.sparql")[:40]
  a, b = tmp_path / "a.txt", tmp_path / "b.sparql"
  a.write_text("\n".join(dev) + "\n", encoding="utf-8")
  b.write_text("\n".join(rir), encoding="utf-8")
  from_official, from_rir = dv.read_query_file(a), dv.read_query_file(b)
  assert from_official[0].startswith("ASK WHERE { M3 wdt:P161 ?x0 . M3 wdt:P344 ?x0 . M0 wdt:P57")
  # RIR orders the clauses its own way: the same queries up to clause order.
  assert [dv.analyse(q) for q in from_official] == [dv.analyse(q) for q in from_rir]
  proc = subprocess.run(
      [sys.executable, "-m", "mcwq_t5x.divergence", "--files",
       str(a), str(b)],
      capture_output=True,
      text=True,
      check=True,
      cwd=paths.REPO_ROOT)
  row = [l for l in proc.stdout.splitlines() if l.startswith("| files")][0].split("|")
  assert row[2].strip() == f"{a} (40)" and row[3].strip() == f"{b} (40)"
  assert float(row[4]) == 0.0 and float(row[5]) == 0.0


def test_analyse_many_in_worker_processes_equals_analyse(mcwq_dir):
  queries = [e.sparql for e in readers.read_official(mcwq_dir / "official" / "mcd3" / "dev.en.txt")]
  queries = queries[:60] + queries[:10]  # repeats are analysed once
  parallel = dv.analyse_many(queries, processes=2)
  assert list(parallel) == list(dict.fromkeys(queries))
  assert all(parallel[q] == dv.analyse(q) for q in queries)
