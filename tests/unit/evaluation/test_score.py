"""Tests for the scoring command line `python -m mcwq_t5x.score` (paper Table 4/5 values)."""
import json
import pathlib
import subprocess
import sys

import pytest

from mcwq_t5x.data import readers
from mcwq_t5x.evaluation import prediction_checks
from mcwq_t5x.evaluation import score
from mcwq_t5x import score as score_cli
import mains

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]

# MCWQ paper (Cui et al., TACL 2022), mT5-small+RIR on MCD1: Table 4 (monolingual exact match)
# and the zero-shot table (English-trained model on he/kn/zh).
PAPER_MONOLINGUAL_EM = {"en": 77.6, "he": 57.8, "kn": 55.0, "zh": 52.8}
PAPER_ZEROSHOT_EM = {"he": 0.4, "kn": 0.8, "zh": 0.1}

G1 = "ASK WHERE lb ( M0 ( wdt:P26 ) ( ?x0 ) ) . ( FILTER ( ?x0 != M1 ) ) rb"
G2 = "SELECT DISTINCT ?x0 WHERE lb ( ?x0 ( wdt:P57 ) ( M0 , M1 ) ) rb"


def _run(capsys, argv):
  status = score_cli.main(argv)
  out = capsys.readouterr()
  return status, out.out, out.err


def _args(mcwq_dir, mode, lang):
  return [
      "--predictions",
      str(mcwq_dir / f"results/mt5_small/{mode}/mcd1/generated_predictions_{lang}.txt"),
      "--targets",
      str(mcwq_dir / f"translations/mcd1/test.{lang}.sparql")
  ]


_PUBLISHED = {}  # (mcwq_dir, mode, lang) -> `_run` of the published predictions


def _run_published(capsys, mcwq_dir, mode, lang):
  """`_run` of a published prediction file against its gold queries, scored once per module
  (seconds each; the same read-only files give the same output)."""
  key = (str(mcwq_dir), mode, lang)
  if key not in _PUBLISHED:
    _PUBLISHED[key] = _run(capsys, _args(mcwq_dir, mode, lang))
  return _PUBLISHED[key]


@pytest.mark.parametrize("lang", ["he", "kn", "zh"])
def test_paper_monolingual_exact_match(mcwq_dir, capsys, lang):
  status, out, _ = _run_published(capsys, mcwq_dir, "monolingual", lang)
  assert status == 0
  result = json.loads(out)
  assert result["n"] == 5310
  assert round(result["exact_match"], 1) == PAPER_MONOLINGUAL_EM[lang]
  counts = result["error_categories"]
  assert sum(counts.values()) == 5310
  assert counts["correct"] == round(result["exact_match"] * 53.1)
  assert result["exact_match"] < result["equivalence"] <= 100


@pytest.mark.parametrize("lang", ["he", "kn", "zh"])
def test_paper_zeroshot_exact_match(mcwq_dir, capsys, lang):
  status, out, _ = _run(capsys, _args(mcwq_dir, "zeroshot", lang))
  assert status == 0
  assert round(json.loads(out)["exact_match"], 1) == PAPER_ZEROSHOT_EM[lang]


def test_cli_subprocess_english(mcwq_dir, tmp_path):
  """The real command line, English: exact match 77.6 and BLEU 97.4 (paper Table 4)."""
  out_json = tmp_path / "en.json"
  proc = subprocess.run([
      sys.executable, "-m", "mcwq_t5x.score", *_args(mcwq_dir, "monolingual", "en"), "--json",
      str(out_json)
  ],
                        cwd=REPO_ROOT,
                        capture_output=True,
                        text=True,
                        check=False)
  assert proc.returncode == 0, proc.stderr
  printed = json.loads(proc.stdout)
  written = json.loads(out_json.read_text())
  assert printed == written
  assert round(printed["exact_match"], 1) == PAPER_MONOLINGUAL_EM["en"]
  assert round(printed["bleu"], 1) == 97.4
  assert set(printed) >= {"n", "exact_match", "bleu", "equivalence", "error_categories"}


def test_sparql_targets_give_the_same_scores(mcwq_dir, tmp_path, capsys):
  """official/ SPARQL targets (converted with sparql_to_rir) score like the RIR targets."""
  n = 400
  official = readers.read_lines(mcwq_dir / "official/mcd1/test.kn.txt")[:n]
  rir = readers.read_lines(mcwq_dir / "translations/mcd1/test.kn.sparql")[:n]
  preds = readers.read_lines(mcwq_dir /
                             "results/mt5_small/monolingual/mcd1/generated_predictions_kn.txt")[:n]
  (tmp_path / "official.txt").write_text("\n".join(official))
  (tmp_path / "plain.sparql").write_text("\n".join(l.split("  OUT: ", 1)[1] for l in official) +
                                         "\n")
  (tmp_path / "rir.txt").write_text("\n".join(rir) + "\n")
  (tmp_path / "preds.txt").write_text("\n".join(preds))
  results = []
  for targets, fmt in [("rir.txt", "rir"), ("official.txt", "sparql"), ("plain.sparql", "sparql")]:
    status, out, err = _run(capsys, [
        "--predictions",
        str(tmp_path / "preds.txt"), "--targets",
        str(tmp_path / targets), "--target_format", fmt
    ])
    assert status == 0, err
    result = json.loads(out)
    del result["targets"]
    results.append(result)
  assert results[0] == results[1] == results[2]
  assert results[0]["n"] == n


def test_length_mismatch_names_counts_and_files(tmp_path, capsys):
  (tmp_path / "p.txt").write_text(f"{G1}\n{G1}\n{G1}\n")
  (tmp_path / "t.sparql").write_text(f"{G1}\n{G2}")
  status, out, err = _run(
      capsys, ["--predictions",
               str(tmp_path / "p.txt"), "--targets",
               str(tmp_path / "t.sparql")])
  assert status == 2
  assert out == ""
  assert "3 predictions" in err and "2 targets" in err
  assert str(tmp_path / "p.txt") in err and str(tmp_path / "t.sparql") in err


def test_trailing_newline_and_crlf_do_not_matter(tmp_path, capsys):
  (tmp_path / "t.sparql").write_text(f"{G1}\n{G2}")  # no final newline
  variants = {"a.txt": f"{G1}\n{G2}\n", "b.txt": f"{G1}\n{G2}", "c.txt": f"{G1}\r\n{G2}\r\n"}
  for name, text in variants.items():
    (tmp_path / name).write_bytes(text.encode())
    status, out, err = _run(
        capsys, ["--predictions",
                 str(tmp_path / name), "--targets",
                 str(tmp_path / "t.sparql")])
    assert status == 0, err
    result = json.loads(out)
    assert result["n"] == 2 and result["exact_match"] == 100.0, name
  # An empty last prediction is still a line (and a syntax error).
  (tmp_path / "d.txt").write_text(f"{G1}\n\n")
  status, out, _ = _run(
      capsys, ["--predictions",
               str(tmp_path / "d.txt"), "--targets",
               str(tmp_path / "t.sparql")])
  assert status == 0
  assert json.loads(out)["error_categories"]["syntax_error"] == 1


def test_junk_predictions_are_scored_not_fatal(tmp_path, capsys):
  (tmp_path / "t.sparql").write_text(f"{G1}\n{G2}\n{G1}\n{G2}\n")
  (tmp_path / "p.txt").write_bytes(b"\x00\xff\xfe junk\x1c\xe2\x80\xa8more\n" + G2.encode() +
                                   b"\n" + G1[:30].encode() + b"\n(((( rb\n")
  status, out, err = _run(
      capsys, ["--predictions",
               str(tmp_path / "p.txt"), "--targets",
               str(tmp_path / "t.sparql")])
  assert status == 0, err
  result = json.loads(out)
  assert result["n"] == 4
  assert result["exact_match"] == 25.0
  assert result["error_categories"]["syntax_error"] == 3


def test_malformed_target_names_file_and_line(tmp_path, capsys):
  (tmp_path / "t.sparql").write_text(f"{G1}\nASK WHERE lb ( M0 ( wdt:P26 rb\n")
  (tmp_path / "p.txt").write_text(f"{G1}\n{G1}\n")
  status, _, err = _run(
      capsys, ["--predictions",
               str(tmp_path / "p.txt"), "--targets",
               str(tmp_path / "t.sparql")])
  assert status == 2
  assert f"{tmp_path / 't.sparql'}:2:" in err
  # The same file read as SPARQL: line 1 is not SPARQL.
  status, _, err = _run(capsys, [
      "--predictions",
      str(tmp_path / "p.txt"), "--targets",
      str(tmp_path / "t.sparql"), "--target_format", "sparql"
  ])
  assert status == 2
  assert f"{tmp_path / 't.sparql'}:1: not a well-formed SPARQL query" in err
  # Targets that are not UTF-8: the same exit status, the file and line named.
  (tmp_path / "t.sparql").write_bytes(f"{G1}\n".encode() + b"ASK \xff\n")
  status, _, err = _run(
      capsys, ["--predictions",
               str(tmp_path / "p.txt"), "--targets",
               str(tmp_path / "t.sparql")])
  assert status == 2 and f"{tmp_path / 't.sparql'}:2: not valid UTF-8" in err, err


def test_missing_file(tmp_path, capsys):
  status, _, err = _run(
      capsys,
      ["--predictions",
       str(tmp_path / "nope.txt"), "--targets",
       str(tmp_path / "nope.sparql")])
  assert status == 2
  assert "no such file" in err


def test_depths_questions_and_error_listing(tmp_path, capsys):
  (tmp_path / "t.sparql").write_text(f"{G1}\n{G2}\n{G2}\n")
  (tmp_path / "p.txt").write_text(f"{G1}\n{G2.replace('M0 , M1', 'M0')}\n{G2}\n")
  (tmp_path / "q.txt"
  ).write_text("Did M0 marry someone else than M1\nWho directed M0\nWho directed M0 and M1\n")
  (tmp_path / "d.txt").write_text("10\n12\n12\n")
  errors = tmp_path / "errors.jsonl"
  status, out, err = _run(capsys, [
      "--predictions",
      str(tmp_path / "p.txt"), "--targets",
      str(tmp_path / "t.sparql"), "--questions",
      str(tmp_path / "q.txt"), "--depths",
      str(tmp_path / "d.txt"), "--errors_out",
      str(errors)
  ])
  assert status == 0, err
  result = json.loads(out)
  assert result["by_complexity"] == {
      "10": {
          "n": 1,
          "correct": 1,
          "exact_match": 100.0
      },
      "12": {
          "n": 2,
          "correct": 1,
          "exact_match": 50.0
      }
  }
  records = [json.loads(l) for l in errors.read_text().splitlines()]
  assert [r["category"] for r in records] == ["correct", "missing_entity", "correct"]
  assert records[1]["question"] == "Who directed M0"
  assert records[1]["missing_entities"] == ["M1"]
  (tmp_path / "d.txt").write_text("10\nten\n12\n")
  status, _, err = _run(capsys, [
      "--predictions",
      str(tmp_path / "p.txt"), "--targets",
      str(tmp_path / "t.sparql"), "--depths",
      str(tmp_path / "d.txt")
  ])
  assert status == 2 and f"{tmp_path / 'd.txt'}:2:" in err


PUBLISHED = [("monolingual", lang, "mcd1") for lang in ("en", "he", "kn", "zh")] + [
    ("monolingual", f"{lang}-gold", "gold") for lang in ("he", "kn", "zh")
] + [("zeroshot", lang, "mcd1") for lang in ("he", "kn", "zh")]


def _shuffled(lines, seed=0):
  import random  # pylint: disable=g-import-not-at-top
  out = list(lines)
  random.Random(seed).shuffle(out)
  return out


def test_alignment_check_passes_every_published_file_and_fails_it_shuffled(mcwq_dir):
  """The margin of the misalignment check on the paper's 10 prediction files: each one, against
  its gold queries and questions, agrees far above chance (kappa >= 0.75, the threshold is
  `MIN_KAPPA` 0.2); the same files shuffled agree at chance (kappa < 0.05)."""
  lowest, highest_shuffled = 1.0, -1.0
  for mode, lang, folder in PUBLISHED:
    preds = readers.read_lines(mcwq_dir / f"results/mt5_small/{mode}/mcd1/"
                               f"generated_predictions_{lang}.txt")
    base = mcwq_dir / f"translations/{folder}/test.{lang.split('-')[0]}"
    gold, questions = score.load_targets(f"{base}.sparql"), readers.read_lines(f"{base}.txt")
    aligned = prediction_checks.check_alignment(preds, gold, questions)
    assert aligned["checked"] and not aligned["misaligned"], (mode, lang, aligned)
    shuffled = prediction_checks.check_alignment(_shuffled(preds), gold, questions)
    assert shuffled["checked"] and shuffled["misaligned"], (mode, lang, shuffled)
    for name in ("targets", "questions"):
      lowest = min(lowest, aligned[name]["kappa"])
      highest_shuffled = max(highest_shuffled, shuffled[name]["kappa"])
  assert lowest >= 0.75 and highest_shuffled < 0.05, (lowest, highest_shuffled)
  assert highest_shuffled < prediction_checks.MIN_KAPPA < lowest


def test_shuffled_predictions_are_scored_with_a_warning_naming_both_files(mcwq_dir, tmp_path):
  """The paper's Hebrew predictions with their lines shuffled, scored as a user scores them: still
  exit 0 and a number (exact match 0.04), but a warning on stderr and in the JSON names the
  prediction file and the targets (and questions) and says they do not belong together."""
  preds = tmp_path / "shuffled_he.txt"
  preds.write_text("\n".join(
      _shuffled(
          readers.read_lines(mcwq_dir /
                             "results/mt5_small/monolingual/mcd1/generated_predictions_he.txt"))) +
                   "\n")
  targets = mcwq_dir / "translations/mcd1/test.he.sparql"
  questions = mcwq_dir / "translations/mcd1/test.he.txt"
  for extra in ([], ["--questions", str(questions)]):
    out = mains.python_m("mcwq_t5x.score", "--predictions", str(preds), "--targets", str(targets),
                         *extra)
    result = json.loads(out.stdout)
    assert round(result["exact_match"], 2) == 0.04
    assert result["alignment"]["misaligned"] and result["alignment"]["targets"]["kappa"] < 0.05
    assert ("questions" in result["alignment"]) == bool(extra)
    [warning] = result["warnings"]
    against = str(targets) + (f" and {questions}" if extra else "")
    assert warning.startswith(f"the predictions in {preds} do not seem to belong to the lines of "
                              f"{against}: the placeholders of a prediction and of its gold query "
                              "agree on 7.8% of the lines, 8.1% by chance"), warning
    assert f"warning: {warning}" in out.stderr.splitlines()


def test_invalid_utf8_prediction_lines_are_named(mcwq_dir, tmp_path, capsys):
  """Prediction lines that are not UTF-8 are scored (their bytes read as U+FFFD) with a warning
  naming the file and the lines; a file that is all UTF-8 gets none."""
  lines = (
      mcwq_dir /
      "results/mt5_small/monolingual/mcd1/generated_predictions_he.txt").read_bytes().split(b"\n")
  for number in (17, 4000):
    lines[number - 1] = lines[number - 1][:10] + b"\xff\xfe" + lines[number - 1][10:]
  preds = tmp_path / "he.txt"
  preds.write_bytes(b"\n".join(lines))
  targets = str(mcwq_dir / "translations/mcd1/test.he.sparql")
  status, out, err = _run(capsys, ["--predictions", str(preds), "--targets", targets])
  assert status == 0
  warning = (f"{preds}: 2 line(s) are not valid UTF-8 (line 17, 4000); their undecodable bytes "
             "are read as U+FFFD and scored as such")
  assert json.loads(out)["warnings"] == [warning]
  assert err.splitlines() == [f"warning: {warning}"]
  assert not json.loads(out)["alignment"]["misaligned"]
  status, out, err = _run_published(capsys, mcwq_dir, "monolingual", "he")
  assert status == 0 and json.loads(out)["warnings"] == [] and err == ""


def test_a_runaway_prediction_line_is_named_with_a_warning(mcwq_dir, tmp_path, capsys):
  """One prediction line of 560,000 characters (a model that never stops) takes corpus BLEU down
  for the whole file: a warning names it (stderr and the JSON); the scores are still computed."""
  lines = (mcwq_dir / "results/mt5_small/monolingual/mcd1/generated_predictions_en.txt").read_text(
      encoding="utf-8").split("\n")
  lines[99] = "( M0 ( wdt:P57 ) ( M1 ) ) . " * 20_000
  preds = tmp_path / "en.txt"
  preds.write_text("\n".join(lines), encoding="utf-8")
  targets = str(mcwq_dir / "translations/mcd1/test.en.sparql")
  status, out, err = _run(capsys, ["--predictions", str(preds), "--targets", targets])
  assert status == 0
  result = json.loads(out)
  warning = (f"{preds}: 1 prediction line(s) are more than 10 times as long as the longest gold "
             f"line of {targets} (341 characters): line 100 (the longest 560000 characters); they "
             "are scored, but they dominate corpus BLEU")
  assert result["warnings"] == [warning]
  assert err.splitlines() == [f"warning: {warning}"]
  status, out, _ = _run(capsys, _args(mcwq_dir, "monolingual", "en"))
  assert json.loads(out)["warnings"] == []
  assert result["bleu"] < 0.6 * json.loads(out)["bleu"]  # 54.4 vs 97.4: why the warning matters


def test_a_full_disk_keeps_the_previous_results_and_ends_in_one_line(tmp_path, capsys, full_disk):
  """`--json` and `--errors_out` on a full disk: one line naming the file, exit status 1, the
  previous file whole (a new one: no file at all, not a 0-byte one)."""
  (tmp_path / "t.sparql").write_text(f"{G1}\n{G2}\n")
  (tmp_path / "p.txt").write_text(f"{G1}\n{G1}\n")
  args = ["--predictions", str(tmp_path / "p.txt"), "--targets", str(tmp_path / "t.sparql")]
  old = tmp_path / "old.json"
  old.write_text("previous result\n")
  full_disk(0)
  for out_flag, path in (("--json", old), ("--json", tmp_path / "new.json"), ("--errors_out", old),
                         ("--errors_out", tmp_path / "new.jsonl")):
    status, _, err = _run(capsys, args + [out_flag, str(path)])
    assert status == 1
    assert err.splitlines() == [
        f"ResultWriteError: cannot write {path}: No space left on device (ENOSPC); nothing was written (the "
        f"previous {path.name}, if any, is unchanged)"
    ]
  assert old.read_text() == "previous result\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json", "p.txt", "t.sparql"]
