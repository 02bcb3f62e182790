"""MCD split generation (`preprocessing.make_splits`; Keysers et al., ICLR 2020, §2.2, App. L)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from mcwq_t5x.data import divergence as dv
from mcwq_t5x.data import paths
from mcwq_t5x.data import readers
from preprocessing import make_splits as ms

POOL = 800  # examples of the shared random_split dev part used by the fast tests
BOUND = 0.02


@pytest.fixture(scope="module")
def pool(mcwq_dir):
  records, languages = ms.load_pool(mcwq_dir, "random_split", ["dev"])
  records = records[:POOL]
  return records, languages, [dv.analyse(r["sparqlPatternModEntities"]) for r in records]


@pytest.fixture(scope="module")
def splits(pool):
  return ms.make_splits(pool[2], seed=1, atom_bound=BOUND, candidates=64)


def test_load_pool_of_the_shared_copy(mcwq_dir):
  records, languages = ms.load_pool(mcwq_dir, "random_split")  # every part it has: dev, test
  assert len(records) == 6163 + 6282 == 12445
  assert languages == ("en", "he", "kn", "zh")
  first = readers.read_official(mcwq_dir / "official" / "random_split" / "dev.zh.txt")[0]
  assert records[0]["source"] == "random_split/dev:1"
  assert records[0]["questionPatternModEntities_zh"] == first.question
  assert records[0]["sparqlPatternModEntities"] == first.sparql
  assert records[6163]["source"] == "random_split/test:1"


def test_load_pool_rejects_languages_that_are_not_parallel(tmp_path, mcwq_dir):
  d = tmp_path / "official" / "s"
  d.mkdir(parents=True)
  lines = readers.read_lines(mcwq_dir / "official" / "mcd1" / "dev.en.txt")[:3]
  (d / "dev.en.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  (d / "dev.fr.txt").write_text("\n".join(lines[:1] + lines[2:0:-1]) + "\n", encoding="utf-8")
  with pytest.raises(readers.DataFormatError, match="differs from the en one"):
    ms.load_pool(tmp_path, "s")
  (d / "dev.fr.txt").write_text("\n".join(lines[:2]) + "\n", encoding="utf-8")
  with pytest.raises(readers.DataFormatError, match="line-parallel"):
    ms.load_pool(tmp_path, "s")


def test_same_seed_same_split(pool, splits):
  again = ms.make_splits(pool[2], seed=1, atom_bound=BOUND, candidates=64)
  assert again == splits
  other = ms.make_splits(pool[2], seed=2, atom_bound=BOUND, candidates=64)
  assert other["mcd"]["trainIdxs"] != splits["mcd"]["trainIdxs"]
  assert other["random"]["trainIdxs"] != splits["random"]["trainIdxs"]


def test_sizes_no_overlap_and_atom_bound(pool, splits):
  assert ms.sizes(POOL, 0.5, 0.0625, 0.0625) == (400, 50, 50)
  queries = [r["sparqlPatternModEntities"] for r in pool[0]]
  for name in ("mcd", "random"):
    parts = [splits[name][f"{p}Idxs"] for p in readers.PARTS]
    assert [len(p) for p in parts] == [400, 50, 50]
    flat = [i for p in parts for i in p]
    assert len(set(flat)) == len(flat) and 0 <= min(flat) and max(flat) < POOL
  mcd = splits["mcd"]
  held_out = mcd["devIdxs"] + mcd["testIdxs"]
  d = dv.compare([queries[i] for i in mcd["trainIdxs"]], [queries[i] for i in held_out])
  assert d.atom <= BOUND + 1e-9  # the greedy bound holds between train and the hold-out


def test_mcd_compound_divergence_far_above_random(pool, splits):
  queries = [r["sparqlPatternModEntities"] for r in pool[0]]
  mcd = ms.split_divergences(queries, splits["mcd"])
  rand = ms.split_divergences(queries, splits["random"])
  assert mcd["train/test"]["compound"] > 0.5
  assert mcd["train/test"]["compound"] > 2 * rand["train/test"]["compound"]
  assert mcd["train/dev"]["compound"] > 2 * rand["train/dev"]["compound"]
  # Atom divergence stays small for both (the halves of the hold-out: near the bound).
  assert mcd["train/test"]["atom"] < 3 * BOUND and rand["train/test"]["atom"] < 3 * BOUND


def test_incremental_divergence_matches_direct(pool):
  """The greedy's running Chernoff sums equal `divergence.compare` on the sets it built."""
  structures = pool[2]
  rng = np.random.default_rng(0)
  train, test = ms.greedy_mcd(structures[:200], 60, 20, rng, candidates=16)
  atom_rows, compound_rows = ms.encode(structures[:200])
  for rows, alpha, attr in ((atom_rows, dv.ALPHA_ATOMS, "atom"), (compound_rows, dv.ALPHA_COMPOUNDS,
                                                                  "compound")):
    pair = ms._Pair(rows, alpha)
    for i in train:
      pair.add(0, int(i))
    for i in test[:-1]:
      pair.add(1, int(i))
    predicted = pair.divergence_if_added(1, test[-1:])[0]
    pair.add(1, int(test[-1]))
    queries = [r["sparqlPatternModEntities"] for r in pool[0][:200]]
    direct = getattr(dv.compare([queries[i] for i in train], [queries[i] for i in test]), attr)
    assert pair.divergence() == pytest.approx(direct, abs=1e-9)
    assert predicted == pytest.approx(direct, abs=1e-9)


def test_impossible_sizes():
  with pytest.raises(ValueError, match="sum to at most 1"):
    ms.sizes(100, 0.9, 0.1, 0.1)
  with pytest.raises(ValueError, match="do not fit"):
    ms.greedy_mcd([dv.analyse("ASK WHERE { M0 wdt:P57 M1 }")] * 3, 2, 2, np.random.default_rng(0))


def test_release_is_read_like_any_split(tmp_path, pool, splits):
  records, languages, _ = pool
  ms.write_release(tmp_path, records, languages, {"mcd": splits["mcd"], "rnd": splits["random"]})
  contents = readers.discover(tmp_path)
  assert contents.splits == readers.SPLITS + ("mcd", "rnd")
  assert contents.languages_of("mcd") == ("en", "he", "kn", "zh")
  zh = readers.read_split("mcd", "test", "zh", tmp_path)
  expected = [records[i] for i in splits["mcd"]["testIdxs"]]
  assert [e.question for e in zh] == [r["questionPatternModEntities_zh"] for r in expected]
  assert [e.sparql for e in zh] == [r["sparqlPatternModEntities"] for r in expected]
  # The dataset.json + splits/ layout holds the same examples as the official/ files.
  release = readers.read_release(tmp_path, "mcd", "train", "he", with_rir=False)
  official = readers.read_official(tmp_path / "official" / "mcd" / "train.he.txt")
  assert [e.question for e in release] == [e.question for e in official]
  # ... and a written release is itself a pool (its dataset.json).
  assert ms.load_pool(tmp_path) == (records, languages)
  figures = dv.split_divergences("mcd", tmp_path)
  queries = [r["sparqlPatternModEntities"] for r in records]
  assert figures[("train", "test")].compound == pytest.approx(
      ms.split_divergences(queries, splits["mcd"])["train/test"]["compound"], abs=1e-6)


def test_command_fresh_process(tmp_path, mcwq_dir):
  src = tmp_path / "src"
  for lang in ("en", "he"):
    lines = readers.read_lines(mcwq_dir / "official" / "random_split" / f"test.{lang}.txt")[:240]
    (src / "official" / "random_split").mkdir(parents=True, exist_ok=True)
    (src / "official" / "random_split" / f"test.{lang}.txt").write_text(
        "\n".join(lines) + "\n", encoding="utf-8")
  out = tmp_path / "out"
  subprocess.run([
      sys.executable, "-m", "preprocessing.make_splits", "--data_dir",
      str(src), "--out",
      str(out), "--seed", "3", "--candidates", "32", "--mcd_name", "mcd_s3"
  ],
                 check=True,
                 capture_output=True,
                 cwd=paths.REPO_ROOT)
  report = json.loads((out / "make_splits.json").read_text())
  assert report["pool"] == 240 and report["languages"] == ["en", "he"]
  assert report["splits"]["mcd_s3"]["sizes"] == {"train": 120, "dev": 15, "test": 15}
  assert report["splits"]["mcd_s3"]["unused"] == report["splits"]["random"]["unused"] == 90
  assert sorted(p.name for p in (out / "official" / "random").iterdir()) == [
      f"{p}.{l}.txt" for p in ("dev", "test", "train") for l in ("en", "he")
  ]
  mcd, rand = report["splits"]["mcd_s3"]["divergences"], report["splits"]["random"]["divergences"]
  assert mcd["train/test"]["compound"] > rand["train/test"]["compound"]
  # The atom bound is held between train and the whole hold-out, the pair the report names.
  assert mcd["train/dev+test"]["atom"] <= BOUND
  split = json.loads((out / "splits" / "mcd_s3.json").read_text())
  queries = [e.sparql for e in readers.read_official(src / "official/random_split/test.en.txt")]
  held_out = [queries[i] for i in split["devIdxs"] + split["testIdxs"]]
  assert mcd["train/dev+test"]["atom"] == pytest.approx(
      dv.compare([queries[i] for i in split["trainIdxs"]], held_out).atom, abs=1e-6)
