"""Tests for the reproduction report `python -m mcwq_t5x.report` (paper Tables 4-6, Figures 4-6)."""
import csv
import json
import shutil

import matplotlib.image
import numpy as np
import pytest

from mcwq_t5x.data import rir
from mcwq_t5x.evaluation import report
from mcwq_t5x.evaluation import uncertainty
from mcwq_t5x import report as report_cli
import mains
import readme_commands as rc
import scenarios

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.xdist_group(f"readme-{rc.chain(rc.REPORT)}")  # reads its README run


def _read_csv(path):
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.reader(f))


def _check_png(path):
  data = path.read_bytes()
  assert len(data) > 1000, path
  assert data[:8] == PNG_SIGNATURE, path
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
  assert image.std() > 0.01  # not a blank canvas


@pytest.fixture(scope="module", autouse=True)
def _split_figures_once():
  """The DBCA divergences of a split (`divergence.split_figures`, seconds of CPU each), computed
  once per split and data folder for the reports this module builds in this process: the same
  files give the same figures. The commands the tests start compute their own."""
  from mcwq_t5x.data import divergence  # pylint: disable=g-import-not-at-top
  real, figures = divergence.split_figures, {}

  def once(split, data_dir=None, language=None):
    key = (split, None if data_dir is None else str(data_dir), language)
    if key not in figures:
      figures[key] = real(split, data_dir, language)
    return figures[key]

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(divergence, "split_figures", once)
    yield


@pytest.fixture(scope="module")
def shared_report(readme):
  """The report of the published predictions that the README's command writes (`python -m
  mcwq_t5x.evaluation.report ../shared/mcwq/results --out runs/report/`, run once per session by the `readme`
  fixture); read-only."""
  scenarios.check(readme.result(rc.REPORT))
  return readme.repo / "runs/report"


def test_discover_upstream_layout(mcwq_dir):
  files = report.discover(mcwq_dir / "results")
  assert len(files) == 10
  keys = {(f.model, f.mode, f.split, f.language, f.gold) for f in files}
  assert ("mt5_small", "monolingual", "mcd1", "en", False) in keys
  assert ("mt5_small", "monolingual", "mcd1", "zh", True) in keys
  assert ("mt5_small", "zeroshot", "mcd1", "kn", False) in keys
  assert not any(f.mode == "zeroshot" and f.language == "en" for f in files)


def test_table4_monolingual(shared_report):
  rows = _read_csv(shared_report / "table4_monolingual_exact_match.csv")
  assert rows[0] == ["model", "split", "en", "he", "kn", "zh"] + [
      f"{l} 95% CI {b}" for l in ("en", "he", "kn", "zh") for b in ("low", "high")
  ] + ["training part", "model size"]
  mcd1 = rows[1]
  # The upstream results/ folder: the paper's mT5-small, trained on the train part.
  assert mcd1[:2] + mcd1[-2:] == ["mt5_small", "MCD1", "train", "mT5-small"]
  # Paper Table 4, mT5-small+RIR, MCD1.
  assert [round(float(v), 1) for v in mcd1[2:6]] == [77.6, 57.8, 55.0, 52.8]
  # Each with its 95% bootstrap interval: about ±1.1 points (en) to ±1.35 (zh) at n = 5,310.
  for k, value in enumerate(mcd1[2:6]):
    low, high = float(mcd1[6 + 2 * k]), float(mcd1[7 + 2 * k])
    assert low < float(value) < high and 2.0 < high - low < 2.9
  # One MCD split: no "MCD mean" row (it would repeat MCD1); then the published rows.
  assert [r[:2] for r in rows[2:]
         ] == [["published: mT5-small+RIR (Cui et al., TACL 2022)", "MCD1"],
               ["published: mBART50 (Wang & Hershcovich, ACL 2023)", "MCD mean"]]
  assert rows[2][2:6] == ["77.6000", "57.8000", "55.0000", "52.8000"]
  assert rows[3][2:6] == ["55.2000", "", "", "43.6000"]
  bleu = _read_csv(shared_report / "table4_monolingual_bleu.csv")[1]
  assert round(float(bleu[2]), 1) == 97.4
  equivalence = _read_csv(shared_report / "table4_monolingual_equivalence.csv")[1]
  assert all(float(e) > float(m) for e, m in zip(equivalence[2:6], mcd1[2:6]))


def test_table5_zeroshot(shared_report):
  rows = _read_csv(shared_report / "table5_zeroshot_exact_match.csv")
  row = rows[1]
  assert row[:2] == ["mt5_small", "MCD1"]
  # The en column is the English-trained model's own test result.
  assert [round(float(v), 1) for v in row[2:6]] == [77.6, 0.4, 0.8, 0.1]
  assert [r[0] for r in rows[2:]] == [
      "published: mT5-small+RIR (Cui et al., TACL 2022)",
      "published: mBART50 (Wang & Hershcovich, ACL 2023)"
  ]
  assert rows[2][2:6] == ["", "0.4000", "0.8000", "0.1000"]
  assert rows[3][1:6] == ["MCD mean", "", "", "", "35.0000"]


def test_table6_gold_test(shared_report):
  rows = _read_csv(shared_report / "table6_gold_test.csv")
  assert rows[0][:6] == ["model", "mode", "trained on", "language", "n gold", "matched in test"]
  by_lang = {r[3]: r for r in rows[1:]}
  assert sorted(by_lang) == ["he", "kn", "zh"]
  gold_em = {l: round(float(r[7]), 1) for l, r in by_lang.items()}
  # 75, 70 and 78 of the 155 gold-test predictions are exact matches.
  assert gold_em == {"he": 48.4, "kn": 45.2, "zh": 50.3}
  for r in by_lang.values():
    assert r[4] == "155" and r[5] == "155"
    assert 40.0 < float(r[6]) < 55.0  # MT counterpart, same examples
    assert r[10] == r[7]  # all 155 matched: the matched and all-n gold columns agree


def test_error_table_and_results_json(shared_report):
  rows = _read_csv(shared_report / "error_categories.csv")
  header = rows[0]
  assert header[5:] == list(report.metrics.ERROR_CATEGORIES)
  for r in rows[1:]:
    assert sum(int(v) for v in r[5:]) == int(r[4])
  en = next(r for r in rows[1:] if r[1] == "monolingual" and r[3] == "en")
  assert int(en[5]) == 4121  # exact matches: 77.6% of 5310
  results = json.loads((shared_report / "results.json").read_text())
  assert len(results["runs"]) == 10
  # Every published file belongs to its gold lines and is UTF-8: no warning.
  assert results["warnings"] == []
  assert all(
      r["alignment"]["checked"] and not r["alignment"]["misaligned"] for r in results["runs"])
  assert any("155 of 155" in m for m in results["messages"])
  md = (shared_report / "report.md").read_text()
  # Each value with its interval, linked to its examples in the error browser.
  table4 = next(line for line in md.splitlines() if line.startswith("| mt5_small | MCD1 | [77.6 ("))
  assert "](html/index.html#language=en&split=mcd1&test=test&model=mt5_small&mode=monolingual)" in (
      table4)
  assert "recursionDepth" in md  # the complexity figure was skipped with a message
  # The shared copy has no training parts: the unseen-compound diagnosis says so in one line.
  assert sum("unseen compounds skipped" in m for m in results["messages"]) == 1


def test_figures_are_valid_pngs(shared_report):
  pngs = sorted(p.name for p in shared_report.glob("*.png"))
  assert pngs == [
      "errors_mt5_small_monolingual_mcd1-gold.png", "errors_mt5_small_monolingual_mcd1.png",
      "errors_mt5_small_zeroshot_mcd1.png"
  ]
  for name in pngs:
    _check_png(shared_report / name)


def _fake_release(tmp_path):
  """A tiny full-release layout (dataset.json + splits/) with recursionDepth, its RIR targets,
  and predictions in our own layout."""
  sparqls = [
      "ASK WHERE { M0 wdt:P57 ?x0 }", "ASK WHERE { M0 wdt:P57 ?x0 . M0 wdt:P58 ?x0 }",
      "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P27 wd:Q30 . ?x0 wdt:P26 M1 . FILTER ( ?x0 != M1 ) }",
      "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P106 wd:Q36834 }"
  ]
  depths = [9, 12, 20, 9]
  records = [{
      "questionPatternModEntities": f"question {i}",
      "questionPatternModEntities_he": f"he question {i}",
      "sparqlPatternModEntities": s,
      "recursionDepth": d
  } for i, (s, d) in enumerate(zip(sparqls, depths))]
  data = tmp_path / "mcwq"
  (data / "splits").mkdir(parents=True)
  (data / "dataset.json").write_text(json.dumps(records))
  (data / "splits" / "mcd1.json").write_text(
      json.dumps({
          "trainIdxs": [],
          "devIdxs": [],
          "testIdxs": [3, 0, 1, 2]
      }))
  targets = [rir.sparql_to_rir(sparqls[i]) for i in (3, 0, 1, 2)]
  (data / "translations" / "mcd1").mkdir(parents=True)
  for lang in ("en", "he"):
    (data / "translations" / "mcd1" / f"test.{lang}.sparql").write_text("\n".join(targets))
  results = tmp_path / "results"
  (results / "tiny" / "zeroshot").mkdir(parents=True)
  # en: all right but the depth-12 one; he: only the first (depth 9) right.
  (results / "tiny" / "predictions_mcd1_en.txt"
  ).write_text("\n".join([targets[0], targets[1], "ASK WHERE lb ( M0 ( wdt:P57", targets[3]]) +
               "\n")
  (results / "tiny" / "predictions_mcd1_he.txt").write_text("\n".join([targets[0], "", "", ""]) +
                                                            "\n")
  (results / "tiny" / "zeroshot" / "predictions_mcd1_he.txt").write_text("\n" * 4)
  return data, results


def test_own_layout_and_complexity_figure(tmp_path):
  data, results = _fake_release(tmp_path)
  files = report.discover(results)
  assert [(f.model, f.mode, f.language) for f in files] == [("tiny", "monolingual", "en"),
                                                            ("tiny", "monolingual", "he"),
                                                            ("tiny", "zeroshot", "he")]
  out = tmp_path / "out"
  status = report_cli.main(
      [str(results), "--targets_dir",
       str(data / "translations"), "--out",
       str(out)])
  assert status == 0
  rows = _read_csv(out / "table4_monolingual_exact_match.csv")
  assert rows[1][:6] == ["tiny", "MCD1", "75.0000", "25.0000", "", ""]
  results_json = json.loads((out / "results.json").read_text())
  en = next(r for r in results_json["runs"] if r["language"] == "en")
  assert en["by_complexity"] == {
      "9": {
          "n": 2,
          "correct": 2,
          "exact_match": 100.0
      },
      "12": {
          "n": 1,
          "correct": 0,
          "exact_match": 0.0
      },
      "20": {
          "n": 1,
          "correct": 1,
          "exact_match": 100.0
      }
  }
  _check_png(out / "complexity_tiny_monolingual_mcd1.png")
  _check_png(out / "errors_tiny_monolingual_mcd1.png")
  _check_png(out / "complexity_tiny_zeroshot_mcd1.png")


def test_missing_results_dir(tmp_path, capsys):
  assert report_cli.main([str(tmp_path / "none"), "--targets_dir", str(tmp_path)]) == 2
  assert "no such results directory" in capsys.readouterr().err


def test_length_mismatch_is_reported(mcwq_dir, tmp_path, capsys):
  (tmp_path / "m").mkdir()
  (tmp_path / "m" /
   "predictions_mcd1_en.txt").write_text("ASK WHERE lb ( M0 ( wdt:P57 ) ( ?x0 ) ) rb\n")
  assert report_cli.main([
      str(tmp_path), "--targets_dir",
      str(mcwq_dir / "translations"), "--out",
      str(tmp_path / "out")
  ]) == 2
  err = capsys.readouterr().err
  assert "1 predictions" in err and "5310 targets" in err


def test_markdown_table():
  assert report.to_markdown(
      ["a", "b"],
      [["x", 1.25], ["y", None]]) == ("| a | b |\n| --- | --- |\n| x | 1.2 |\n| y | - |")


def test_discover_train_layout(tmp_path):
  """`mcwq_t5x.train` writes MODEL_DIR/predictions/{task}_{split}.txt."""
  pred_dir = tmp_path / "run_mcd2_en" / "predictions"
  pred_dir.mkdir(parents=True)
  for name in ("mcwq_mcd2_en_test.txt", "mcwq_mcd2_en_validation.txt",
               "mcwq_mcd2_zeroshot_he_test.txt", "mcwq_gold_he_test.txt", "notes.txt"):
    (pred_dir / name).write_text("x\n")
  files = report.discover(tmp_path)
  assert [(f.model, f.mode, f.split, f.language, f.gold) for f in files
         ] == [("run_mcd2_en", "monolingual", "mcd2", "en", False),
               ("run_mcd2_en", "zeroshot", "mcd2", "he", False),
               ("run_mcd2_en", "zeroshot", "mcd2", "he", True)]


def test_eval_then_report_names_models_after_their_runs(mcwq_dir, tmp_path):
  """The README's chain: `mcwq_t5x.eval` without EVAL_OUTPUT_DIR writes
  MODEL_DIR/eval_<step>/predictions/; `report runs` names each model after its MODEL_DIR, so the
  Hebrew model's test run and the English model's zero-shot runs stay apart."""
  from mcwq_t5x import eval as eval_lib  # pylint: disable=g-import-not-at-top
  runs = tmp_path / "runs"
  he_dir = eval_lib.default_output_dir(runs / "tiny_mcd1_he", 2000)
  en_dir = eval_lib.default_output_dir(runs / "tiny_mcd1_en", 2000)
  assert he_dir == runs / "tiny_mcd1_he" / "eval_2000"
  he_test = (mcwq_dir / "translations/mcd1/test.he.sparql").read_text().splitlines()
  gold_he = (mcwq_dir / "translations/gold/test.he.sparql").read_text().splitlines()
  # Laid out as prediction.write_predictions writes them under EVAL_OUTPUT_DIR.
  for folder, name, lines in ((he_dir, "mcwq_mcd1_he_test.txt", he_test),
                              (en_dir, "mcwq_mcd1_zeroshot_he_test.txt",
                               ["x"] * len(he_test)), (runs / "tiny_mcd1_en" / "gold_he",
                                                       "mcwq_gold_he_prefixed_test.txt", gold_he)):
    (folder / "predictions").mkdir(parents=True)
    (folder / "predictions" / name).write_text("\n".join(lines) + "\n")
  result = report.build(runs, mcwq_dir / "translations", mcwq_dir)
  got = sorted(
      (r["model"], r["mode"], r["language"], r["gold"], r["exact_match"]) for r in result["runs"])
  assert got == [("tiny_mcd1_en", "zeroshot", "he", False, 0.0),
                 ("tiny_mcd1_en", "zeroshot", "he", True, 100.0),
                 ("tiny_mcd1_he", "monolingual", "he", False, 100.0)]
  names = {
      row[0] for name, (header, rows) in report.tables(result, with_published=False).items()
      if name != "split_divergences" for row in rows  # that table's rows are splits, not models
  }
  assert names == {"tiny_mcd1_en", "tiny_mcd1_he"}


def test_table6_compares_like_with_like(mcwq_dir, tmp_path):
  """A random-split model matches only some gold examples (drawn from the MCD tests): the MT and
  gold columns both score those matched examples; `all n` scores every gold example."""
  run = tmp_path / "runs" / "tiny_random_split_he" / "predictions"
  run.mkdir(parents=True)
  test = report.readers.read_split("random_split", "test", "he", mcwq_dir)
  (run / "mcwq_random_split_he_test.txt").write_text("x\n" * len(test))
  gold = (mcwq_dir / "translations/gold/test.he.sparql").read_text().splitlines()
  (run / "mcwq_gold_he_test.txt").write_text("\n".join(gold[:100] + ["x"] * 55) + "\n")
  result = report.build(tmp_path / "runs", mcwq_dir / "translations", mcwq_dir)
  (entry,) = result["intersection"]
  assert 0 < entry["matched"] < entry["n_gold"] == 155
  assert entry["mt"]["exact_match"] == 0.0
  assert round(entry["gold_all"]["exact_match"], 1) == round(100 * 100 / 155, 1)
  header, rows = report.tables(result)["table6_gold_test"]
  assert header[4:8] == ["n gold", "matched in test", "EM MT (matched)", "EM gold (matched)"]
  assert rows[0][5] == entry["matched"] and rows[0][7] == entry["gold"]["exact_match"]


def test_split_divergences(shared_report, mcwq_dir):
  """The report gives the DBCA divergences of every split it reports on (here mcd1: dev/test)."""
  from mcwq_t5x.data import divergence  # pylint: disable=g-import-not-at-top
  rows = _read_csv(shared_report / "split_divergences.csv")
  assert rows[0] == ["split", "parts (P/Q)", "n P", "n Q", "atom divergence", "compound divergence"]
  assert [r[:4] for r in rows[1:]] == [["MCD1", "dev/test", "5408", "5310"]]
  expected = divergence.split_divergences("mcd1", mcwq_dir)[("dev", "test")]
  assert float(rows[1][4]) == pytest.approx(expected.atom, abs=1e-4)
  assert float(rows[1][5]) == pytest.approx(expected.compound, abs=1e-4)
  assert "## Split divergences" in (shared_report / "report.md").read_text(encoding="utf-8")


def test_zeroshot_eval_outside_the_run_is_grouped_with_its_checkpoint(mcwq_dir, tmp_path):
  """`mcwq_t5x.eval` with EVAL_OUTPUT_DIR=runs/zs_he, then `report runs`: the zero-shot results
  belong to the run whose checkpoint the metrics JSON records, in one row of Table 5."""
  runs = tmp_path / "runs"
  model_dir = runs / "tiny_mcd1_en"
  (model_dir / "predictions").mkdir(parents=True)
  (model_dir / "run.json").write_text("{}")
  en = (mcwq_dir / "translations/mcd1/test.en.sparql").read_text().splitlines()
  (model_dir / "predictions" / "mcwq_mcd1_en_test.txt").write_text("\n".join(en) + "\n")
  zs = runs / "zs_he"  # as prediction.write_predictions lays out EVAL_OUTPUT_DIR
  (zs / "predictions").mkdir(parents=True)
  (zs / "metrics").mkdir()
  (zs / "predictions" / "mcwq_mcd1_zeroshot_he_test.txt").write_text("x\n" * len(en))
  (zs / "metrics" / "mcwq_mcd1_zeroshot_he_test.json").write_text(
      json.dumps({
          "checkpoint": "runs/tiny_mcd1_en/checkpoint_400",
          "step": 400
      }))
  result = report.build(runs, mcwq_dir / "translations", mcwq_dir)
  assert sorted(report.run_key(r) for r in result["runs"]) == [
      ("tiny_mcd1_en", "monolingual", "mcd1", "en", False),
      ("tiny_mcd1_en", "zeroshot", "mcd1", "he", False)
  ]
  _, rows = report.tables(result, with_published=False)["table5_zeroshot_exact_match"]
  assert [r[:6] for r in rows] == [["tiny_mcd1_en", "MCD1", 100.0, 0.0, None, None]]


def _synthetic(runs):
  """A report of runs given as (model, mode, split, language, outcomes)."""
  report_runs, data = [], []
  for model, mode, split, lang, outcomes in runs:
    correct = np.array(outcomes, dtype=bool)
    report_runs.append(
        dict(
            model=model,
            mode=mode,
            split=split,
            language=lang,
            gold=False,
            n=len(outcomes),
            exact_match=100 * correct.mean(),
            bleu=0.0,
            equivalence=0.0,
            exact_match_ci=list(uncertainty.exact_match_interval([correct])),
            error_categories={c: 0 for c in report.metrics.ERROR_CATEGORIES}))
    data.append(dict(correct=correct))
  return {"runs": report_runs, "intersection": [], "messages": [], "_examples": {"runs": data}}


def test_mcd_mean_needs_two_splits():
  """The MCD mean row (mean of the splits, its interval from resampling each) only when two or
  more MCD splits are present."""
  one = _synthetic([("m", "monolingual", "mcd1", "en", [1] * 60 + [0] * 40)])
  _, rows = report.tables(one, with_published=False)["table4_monolingual_exact_match"]
  assert [r[1] for r in rows] == ["MCD1"]
  two = _synthetic([("m", "monolingual", "mcd1", "en", [1] * 60 + [0] * 40),
                    ("m", "monolingual", "mcd2", "en", [1] * 40 + [0] * 60)])
  _, rows = report.tables(two, with_published=False)["table4_monolingual_exact_match"]
  assert [r[1] for r in rows] == ["MCD1", "MCD2", "MCD mean"]
  mean = rows[2]
  assert mean[2] == pytest.approx(50.0)
  low, high = mean[6], mean[7]  # en's interval
  assert low < 50.0 < high
  assert high - low < rows[0][7] - rows[0][6]  # two test sets: narrower than one's


def test_seed_groups():
  """Runs `<configuration>_seed<k>`: mean ± 95% Student-t half width over the runs."""
  result = _synthetic([("tiny_seed0", "monolingual", "mcd1", "en", [1] * 90 + [0] * 10),
                       ("tiny_seed1", "monolingual", "mcd1", "en", [1] * 80 + [0] * 20),
                       ("other", "monolingual", "mcd1", "en", [1] * 50 + [0] * 50)])
  header, rows = report.tables(result)["seeds_exact_match"]
  assert header[:9] == [
      "model", "mode", "test set", "language", "runs", "mean exact match", "± (95%, Student t)",
      "min", "max"
  ]
  (row,) = rows
  assert row[:5] == ["tiny", "monolingual", "MCD1", "en", 2]
  assert row[5] == pytest.approx(85.0)
  # t(0.975, 1) = 12.7062; s = 7.0711 for 90 and 80.
  assert row[6] == pytest.approx(12.7062 * 7.0711 / 2**0.5, rel=1e-4)
  assert row[7:] == [80.0, 90.0, "tiny_seed0, tiny_seed1"]


def test_compare_command(mcwq_dir, tmp_path):
  """`report --compare A B` in a fresh process: the paired test of the published Hebrew
  predictions, monolingual (3,071 exact matches) against zero-shot (19); files of different test
  sets are an error."""
  results = mcwq_dir / "results/mt5_small"
  mono, zero = (
      results / f"{m}/mcd1/generated_predictions_he.txt" for m in ("monolingual", "zeroshot"))
  proc = mains.python_m(
      "mcwq_t5x.report",
      "--compare",
      str(mono),
      str(zero),
      "--targets_dir",
      str(mcwq_dir / "translations"),
      cwd=tmp_path)
  c = json.loads(proc.stdout)
  assert c["n"] == 5310 and c["only_a"] + c["both"] == 3071 and c["only_b"] + c["both"] == 19
  assert c["interval"][0] < c["difference"] < c["interval"][1] and c["p_value"] < 1e-100
  assert "paired permutation test (exact, two-sided) p < 1e-300." in proc.stderr, proc.stderr
  english = results / "monolingual/mcd1/generated_predictions_en.txt"
  proc = mains.python_m(
      "mcwq_t5x.report",
      "--compare",
      str(mono),
      str(english),
      "--targets_dir",
      str(mcwq_dir / "translations"),
      cwd=tmp_path,
      check=False)
  assert proc.returncode == 2
  assert "a paired comparison needs the same examples" in proc.stderr


def test_misaligned_prediction_file_is_named_on_stderr_and_in_the_report(mcwq_dir, tmp_path):
  """A published prediction file with its lines shuffled, reported as a user reports it: the
  report is written, with a warning on stderr, in report.md and in results.json naming the
  prediction file and its gold files; the file kept in order gets none."""
  import random  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "results/mt5_small/monolingual/mcd1"
  folder.mkdir(parents=True)
  published = mcwq_dir / "results/mt5_small/monolingual/mcd1"
  lines = (published / "generated_predictions_he.txt").read_text(encoding="utf-8").splitlines()
  random.Random(0).shuffle(lines)
  (folder / "generated_predictions_he.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  shutil.copy(published / "generated_predictions_en.txt", folder)
  out = mains.python_m("mcwq_t5x.report", str(tmp_path / "results"), "--targets_dir",
                       str(mcwq_dir / "translations"), "--out", str(tmp_path / "out"))
  gold = mcwq_dir / "translations/mcd1/test.he"
  head = (f"the predictions in {folder / 'generated_predictions_he.txt'} do not seem to belong to "
          f"the lines of {gold}.sparql and {gold}.txt: ")
  [warning] = [l for l in out.stderr.splitlines() if l.startswith("warning: ")]
  assert warning.startswith(f"warning: {head}"), out.stderr[-3000:]
  assert f"5 CSV tables and 1 figure to {tmp_path / 'out'}" in out.stdout  # one model, no depths
  results = json.loads((tmp_path / "out/results.json").read_text())
  assert [w[:len(head)] for w in results["warnings"]] == [head]
  runs = {r["language"]: r["alignment"] for r in results["runs"]}
  assert runs["he"]["misaligned"] and not runs["en"]["misaligned"]
  assert f"- {head}" in (tmp_path / "out/report.md").read_text()


def test_p_value_that_underflows_is_not_printed_as_zero():
  assert report.format_p_value(20 / 512) == "p = 0.0391"
  assert report.format_p_value(0.0) == "p < 1e-300"


def test_browser_data_escapes_markup():
  """The data embedded in the error browser holds no `<`, `>` or `&` (so no `<!--`, `<script>` or
  `</script>` of a prediction can end or hide the page's code) and decodes back to itself."""
  from mcwq_t5x.evaluation import browser  # pylint: disable=g-import-not-at-top
  value = {"prediction": ["<!--<script>", "</script>", "a & b -->", "\u05d0 </SCRIPT >"]}
  text = browser.script_json(value)
  assert not set("<>&") & set(text)
  assert json.loads(text) == value


def test_report_replaces_only_the_files_it_wrote(tmp_path, capsys):
  """A report into a folder with a user's report.md is refused, naming it, and writes nothing; a
  report replaces the files of an earlier report (its manifest lists them)."""
  data, results = _fake_release(tmp_path)
  args = [str(results), "--targets_dir", str(data / "translations"), "--out"]
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "report.md").write_text("my notes\n")
  assert report_cli.main(args + [str(mine)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == (f"ForeignFileError: {mine} holds report.md, which no report wrote "
                     f"({report.MANIFEST} does not list them): move them away or give another "
                     "--out/--html; nothing was written")
  assert sorted(p.name for p in mine.iterdir()) == ["report.md"]
  assert (mine / "report.md").read_text() == "my notes\n"
  out = tmp_path / "out"
  assert report_cli.main(args + [str(out)]) == 0
  first = (out / "report.md").read_text()
  assert "report.md" in json.loads((out / report.MANIFEST).read_text())
  assert report_cli.main(args + [str(out)]) == 0  # its own files: replaced
  assert (out / "report.md").read_text() == first


def test_report_on_a_full_disk_keeps_the_previous_report(tmp_path, capsys, full_disk):
  data, results = _fake_release(tmp_path)
  args = [str(results), "--targets_dir", str(data / "translations"), "--out", str(tmp_path / "out")]
  assert report_cli.main(args) == 0
  before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
  capsys.readouterr()
  full_disk(0)
  assert report_cli.main(args) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith(
      f"ResultWriteError: cannot write {tmp_path}/out/") and "(ENOSPC)" in err[-1]
  assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


def test_a_full_disk_while_writing_a_figure_keeps_the_previous_png(tmp_path, capsys, full_disk):
  """The figures are the report's first files: a full disk there ends in one line naming the PNG
  and leaves every previous file as it was (a PNG is written whole or not at all, never by
  matplotlib straight over the previous one)."""
  data, results = _fake_release(tmp_path)
  out = tmp_path / "out"
  args = [str(results), "--targets_dir", str(data / "translations"), "--out", str(out)]
  assert report_cli.main(args) == 0
  for png in out.glob("*.png"):
    png.write_bytes(b"previous " + png.name.encode())  # differs from what the report draws
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  capsys.readouterr()
  full_disk(0)
  assert report_cli.main(args) == 1
  first = out / "errors_tiny_monolingual_mcd1.png"
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      f"ResultWriteError: cannot write {first}: No space left on device (ENOSPC); nothing was written (the "
      f"previous {first.name}, if any, is unchanged)")
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary file either


def _run_json(folder, task, split, preset):
  """A run.json as `mcwq_t5x.train` writes it (`run_info.write`): the task, the seqio split
  trained on and the network config of `preset`."""
  from mcwq_t5x.checkpointing import run_info  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.engine import network  # pylint: disable=g-import-not-at-top
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "run.json").write_text(
      json.dumps({
          "format": run_info.FORMAT_VERSION,
          "task": task,
          "split": split,
          "network": run_info.network_fields(network.CONFIGS[preset])
      }))


def _predictions(out_dir, task, lines, step, checkpoint):
  """`out_dir/predictions/<task>_test.txt` and its metrics JSON, as `prediction.write_predictions`
  lays them out."""
  (out_dir / "predictions").mkdir(parents=True)
  (out_dir / "metrics").mkdir()
  (out_dir / "predictions" / f"{task}_test.txt").write_text("\n".join(lines) + "\n")
  (out_dir / "metrics" / f"{task}_test.json").write_text(
      json.dumps({
          "task": task,
          "split": "test",
          "step": step,
          "checkpoint": str(checkpoint)
      }))


def test_two_results_of_one_run_are_both_shown_by_their_step(mcwq_dir, tmp_path, capsys):
  """`report runs` on a run folder holding its final evaluation (step 1000,
  MODEL_DIR/predictions/: the paper's Hebrew predictions, 57.8) and an eval of checkpoint_400
  (eval_400/: the zero-shot ones, 0.4): both are rows of Table 4, the final one under the run's
  name, the other as `<run> step 400`, with a warning on stderr naming both files. Every row says
  its training part and model size (run.json: dev, tiny; the published rows: train, mT5-small),
  and the unseen compounds compare with the dev part that run.json records."""
  published = mcwq_dir / "results/mt5_small"
  run = tmp_path / "runs/tiny_mcd1_he"
  task = "mcwq_mcd1_he_prefixed"
  _run_json(run, task, "validation", "tiny")
  for out_dir, mode, step in ((run, "monolingual", 1000), (run / "eval_400", "zeroshot", 400)):
    lines = (published / mode / "mcd1/generated_predictions_he.txt").read_text().splitlines()
    _predictions(out_dir, task, lines, step, run / f"checkpoint_{step}")
  assert report_cli.main([
      str(tmp_path / "runs"), "--targets_dir",
      str(mcwq_dir / "translations"), "--out",
      str(tmp_path / "out")
  ]) == 0
  rows = _read_csv(tmp_path / "out/table4_monolingual_exact_match.csv")
  assert rows[0][:6] == ["model", "split", "en", "he", "kn", "zh"]
  assert rows[0][-2:] == ["training part", "model size"]
  assert [[r[0], r[1], r[3][:5], r[-2], r[-1]] for r in rows[1:]] == [
      ["tiny_mcd1_he", "MCD1", "57.83", "dev", "tiny"],
      ["tiny_mcd1_he step 400", "MCD1", "0.357", "dev", "tiny"],
      ["published: mT5-small+RIR (Cui et al., TACL 2022)", "MCD1", "57.80", "train", "mT5-small"],
      [
          "published: mBART50 (Wang & Hershcovich, ACL 2023)", "MCD mean", "", "train",
          "mBART-large-50"
      ],
  ]
  [warning] = [l for l in capsys.readouterr().err.splitlines() if l.startswith("warning: ")]
  assert warning.startswith("warning: 2 results of tiny_mcd1_he (monolingual) on the mcd1 he test "
                            "set, all shown: ")
  assert (f"{run}/predictions/{task}_test.txt (checkpoint 1000, final evaluation) as "
          "`tiny_mcd1_he`" in warning)
  assert f"{run}/eval_400/predictions/{task}_test.txt (checkpoint 400) as `tiny_mcd1_he step 400`" in (
      warning)
  md = (tmp_path / "out/report.md").read_text()
  assert "the row named after the run alone is its final evaluation" in md
  # Unseen compounds against the dev part (5,408 queries) the run trained on, said in the table.
  unseen = _read_csv(tmp_path / "out/unseen_compounds_exact_match.csv")
  assert unseen[0][-1] == "training part compared"
  final = [r for r in unseen[1:] if r[0] == "tiny_mcd1_he"]
  assert {r[-1] for r in unseen[1:]} == {"dev (run.json)"}
  assert sum(int(r[5]) for r in final) == 5310 and final[0][4:6] == ["0", "3566"]
  assert "unseen compounds of mcd1: compared with its dev part" in md


def test_multilingual_run(mcwq_dir, tmp_path, capsys):
  """A mixture's prediction file (`mcwq_mcd1_multilingual_prefixed_test.txt`: its four tasks'
  test sets one after another, in task-name order) is cut into its languages: here the paper's
  four monolingual prediction files, so Table 4 gives the paper's numbers, in one row of a model
  trained on all languages. A file one line short is refused, naming the counts."""
  published = mcwq_dir / "results/mt5_small/monolingual/mcd1"
  run = tmp_path / "runs/mt5_mcd1_multilingual"
  task = "mcwq_mcd1_multilingual_prefixed"
  _run_json(run, task, "train", "mt5_small")
  lines = [
      l for lang in ("en", "he", "kn", "zh")
      for l in (published / f"generated_predictions_{lang}.txt").read_text().splitlines()
  ]
  (run / "predictions").mkdir()
  (run / "predictions" / f"{task}_test.txt").write_text("\n".join(lines) + "\n")
  args = [
      str(tmp_path / "runs"), "--targets_dir",
      str(mcwq_dir / "translations"), "--out",
      str(tmp_path / "out"), "--no_published"
  ]
  assert report_cli.main(args) == 0
  rows = _read_csv(tmp_path / "out/table4_monolingual_exact_match.csv")
  assert [(r[0], r[1], r[-2], r[-1]) for r in rows[1:]] == [("mt5_mcd1_multilingual", "MCD1",
                                                             "train (multilingual)", "mT5-small")]
  assert [round(float(v), 1) for v in rows[1][2:6]] == [77.6, 57.8, 55.0, 52.8]
  assert f"- `{run}/predictions/{task}_test.txt` lines 5311-10620: mt5_mcd1_multilingual " in ((
      tmp_path / "out/report.md").read_text())
  (run / "predictions" / f"{task}_test.txt").write_text("\n".join(lines[1:]) + "\n")
  capsys.readouterr()
  assert report_cli.main(args) == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      f"InputError: {run}/predictions/{task}_test.txt: 21239 predictions, but the mixture's test "
      "sets hold 21240 examples (en 5310, he 5310, kn 5310, zh 5310, in that order): a mixture's "
      "file must hold every example of each of its tasks")


def test_linked_and_several_results_folders(mcwq_dir, tmp_path, capsys):
  """`report A B`: two results folders read as one, A holding its predictions through a symbolic
  link to a folder (`A/paper -> store`); a file reached twice (B/../A/paper again) is read once,
  with a warning."""
  store = tmp_path / "store/mcd1"
  store.mkdir(parents=True)
  shutil.copy(mcwq_dir / "results/mt5_small/monolingual/mcd1/generated_predictions_en.txt", store)
  a, b = tmp_path / "a", tmp_path / "b"
  a.mkdir()
  (a / "paper").symlink_to(tmp_path / "store", target_is_directory=True)
  he = (mcwq_dir / "translations/mcd1/test.he.sparql").read_text().splitlines()
  (b / "tiny").mkdir(parents=True)
  (b / "tiny" / "predictions_mcd1_he.txt").write_text("\n".join(he) + "\n")
  assert report_cli.main([
      str(a),
      str(b),
      str(a / "paper"), "--targets_dir",
      str(mcwq_dir / "translations"), "--out",
      str(tmp_path / "out"), "--no_published"
  ]) == 0
  rows = _read_csv(tmp_path / "out/table4_monolingual_exact_match.csv")
  assert [(r[0], r[1], r[2][:5], r[3], r[-2], r[-1]) for r in rows[1:]] == [
      ("paper", "MCD1", "77.60", "", "train", ""),
      ("tiny", "MCD1", "", "100.0000", "", ""),
  ]
  err = capsys.readouterr().err
  assert (f"warning: {a}/paper/mcd1/generated_predictions_en.txt is found twice (through a link "
          "or two RESULTS_DIRs): read once") in err


def test_nothing_to_report(tmp_path, capsys):
  """An empty results folder: one error line, and no progress line about divergences."""
  assert report_cli.main([str(tmp_path), "--targets_dir", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert err.strip().splitlines(
  )[-1] == f"FileNotFoundError: no prediction files found under {tmp_path}"
  assert "divergences" not in err
