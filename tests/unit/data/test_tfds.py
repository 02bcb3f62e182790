"""Tests of the TFDS builder `mcwq` (mcwq_t5x/data/tfds_mcwq.py), local data only (no network)."""
import json

import tensorflow_datasets as tfds

from mcwq_t5x.data import readers
from mcwq_t5x.data import tfds_mcwq


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


def _questions(builder, split):
  return [e["question"].decode() for e in tfds.as_numpy(builder.as_dataset(split=split))]


def test_changed_source_files_rebuild(tmp_path, mcwq_dir, monkeypatch):
  # A small copy of one split (50 + 20 lines), a fresh TFDS data dir.
  data = tmp_path / "mcwq"
  (data / "official/random_split").mkdir(parents=True)
  for part, n in (("dev", 50), ("test", 20)):
    lines = (mcwq_dir / f"official/random_split/{part}.en.txt").read_text().splitlines()[:n]
    (data / f"official/random_split/{part}.en.txt").write_text("\n".join(lines) + "\n")
  monkeypatch.setenv("MCWQ_DATA_DIR", str(data))
  tfds_dir = str(tmp_path / "tfds")
  builder = tfds.builder("mcwq/random_split_en", data_dir=tfds_dir)
  builder.download_and_prepare()
  assert builder.info.splits["validation"].num_examples == 50
  source = builder.info.metadata["source"]
  assert source["source_dir"] == str(data)
  assert source["files"] == [
      "official/random_split/dev.en.txt", "official/random_split/test.en.txt"
  ]
  # Unchanged files: reused as they are.
  assert tfds_mcwq.Mcwq(config="random_split_en", data_dir=tfds_dir)._stale_source(None) is None
  # The dev file changes (a question edited, 10 lines dropped): a new builder rebuilds.
  dev = data / "official/random_split/dev.en.txt"
  lines = dev.read_text().splitlines()[:40]
  lines[0] = lines[0].replace("IN: ", "IN: Changed ", 1)
  dev.write_text("\n".join(lines) + "\n")
  builder = tfds.builder("mcwq/random_split_en", data_dir=tfds_dir)
  builder.download_and_prepare()
  assert builder.info.splits["validation"].num_examples == 40
  assert "Changed " in "".join(_questions(builder, "validation"))
  # as_dataset without download_and_prepare (the test file changes) rebuilds too.
  test = data / "official/random_split/test.en.txt"
  test.write_text("\n".join(test.read_text().splitlines()[:5]) + "\n")
  builder = tfds.builder("mcwq/random_split_en", data_dir=tfds_dir)
  assert len(_questions(builder, "test")) == 5
  assert builder.info.metadata["source"]["sha256"] == tfds_mcwq.source_fingerprint(
      "random_split", "en", data)["sha256"]


def test_data_page_says_where_tfds_writes_and_what_minus_one_means(mcwq_dir, monkeypatch):
  """docs/data.md states TFDS's default folder and the builder's version as the code has them, and
  what `recursionDepth` -1 means: every example of the official files has it."""
  import pathlib  # pylint: disable=g-import-not-at-top
  page = (pathlib.Path(__file__).resolve().parents[3] / "docs/data.md").read_text(encoding="utf-8")
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)  # TFDS's default folder, not a user's
  default = pathlib.Path(tfds.core.constants.get_default_data_dir()).relative_to(
      pathlib.Path.home())
  assert f"`~/{default}/mcwq/<config>/{tfds_mcwq.Mcwq.VERSION}/`" in page
  assert "`TFDS_DATA_DIR`" in page
  assert "**−1 where it does not**" in page and "`official/` files" in page
  depths = {
      ex["recursionDepth"] for _, ex in tfds_mcwq.generate_examples("mcd1", "test", "he", mcwq_dir)
  }
  assert depths == {-1}
