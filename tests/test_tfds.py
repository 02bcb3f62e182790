"""Tests of the TFDS builder `mcwq` (mcwq_t5x/tfds_mcwq.py), local data only (no network)."""
import json

import tensorflow_datasets as tfds

from mcwq_t5x import readers
from mcwq_t5x import tfds_mcwq


def test_configs():
  names = [c.name for c in tfds_mcwq.Mcwq.BUILDER_CONFIGS]
  assert len(names) == 19
  assert "mcd1_he" in names and "random_split_zh" in names and "gold_kn" in names
  assert tfds_mcwq.upstream_files("mcd2", "kn")["dev"] == ("official/mcd2/dev.kn.txt",)
  assert tfds_mcwq.upstream_files("gold", "he")["test"][1] == "translations/gold/test.he.sparql"


def test_generate_examples_official(mcwq_dir):
  gen = tfds_mcwq.generate_examples("mcd1", "dev", "en", mcwq_dir)
  key, ex = next(gen)
  assert key == "dev_000000"
  assert ex["question"] == ("Did M3 's cinematographer and star edit , direct , and write M0 , "
                            "M1 , and M2")
  assert ex["rir"].startswith("ASK WHERE lb ( M3 ( wdt:P161 , wdt:P344 ) ( ?x0 ) )")
  assert ex["sparql"].startswith("ASK WHERE { M3 wdt:P161 ?x0 .")
  assert ex["recursionDepth"] == -1
  assert sum(1 for _ in gen) == 5408 - 1


def test_generate_examples_release(tmp_path):
  (tmp_path / "dataset.json").write_text(
      json.dumps([{
          "questionPatternModEntities": "Who directed M0",
          "questionPatternModEntities_kn": "M0 ?",
          "sparqlPatternModEntities": "SELECT DISTINCT ?x0 WHERE {\n?x0 wdt:P57 M0\n}",
          "recursionDepth": 11
      }]))
  (tmp_path / "splits").mkdir()
  (tmp_path / "splits/mcd2.json").write_text('{"trainIdxs": [], "devIdxs": [], "testIdxs": [0]}')
  [(key, ex)] = list(tfds_mcwq.generate_examples("mcd2", "test", "kn", tmp_path))
  assert key == "test_000000"
  assert ex == {
      "question": "M0 ?",
      "sparql": "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P57 M0 }",
      "rir": "SELECT DISTINCT ?x0 WHERE lb ( ?x0 ( wdt:P57 ) ( M0 ) ) rb",
      "recursionDepth": 11
  }


def test_build_gold_he_from_manual_dir(tmp_path, mcwq_dir, monkeypatch):
  monkeypatch.setenv("MCWQ_DATA_DIR", str(tmp_path / "absent"))  # must use the manual dir
  builder = tfds.builder("mcwq/gold_he", data_dir=str(tmp_path / "tfds"))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(mcwq_dir)))
  assert list(builder.info.splits) == ["test"]
  assert builder.info.splits["test"].num_examples == 155
  got = list(tfds.as_numpy(builder.as_dataset(split="test")))
  ref = readers.read_split("gold", "test", "he", mcwq_dir)
  assert sorted((e["question"].decode(), e["rir"].decode(), e["sparql"].decode()) for e in got) == (
      sorted((e.question, e.rir, e.sparql) for e in ref))
  assert {int(e["recursionDepth"]) for e in got} == {-1}
