"""Tests for the scoring command line `python -m mcwq_t5x.score` (paper Table 4/5 values)."""
import json
import pathlib
import subprocess
import sys

import pytest

from mcwq_t5x.data import readers
from mcwq_t5x import score as score_cli

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

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


@pytest.mark.parametrize("lang", ["he", "kn", "zh"])
def test_paper_monolingual_exact_match(mcwq_dir, capsys, lang):
  status, out, _ = _run(capsys, _args(mcwq_dir, "monolingual", lang))
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
