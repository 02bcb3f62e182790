r"""Maximum-compound-divergence (MCD) splits of any MCWQ release, and random splits of equal sizes.

  python -m preprocessing.make_splits --out DIR [--data_dir SRC] [--source_split random_split]
      [--source_parts dev test] [--seed 0] [--train_fraction 0.5] [--dev_fraction 0.0625]
      [--test_fraction 0.0625] [--atom_bound 0.02] [--candidates 256]

DBCA split generation (Keysers et al., ICLR 2020, §2.2 and App. L): train and the hold-out grow
together greedily, each step taking the candidate with the highest compound divergence
D_0.1(train‖test) that keeps the atom divergence D_0.5 at most `--atom_bound`; the hold-out is
split at random into dev and test (as CFQ's, Keysers et al. §4). The pool is a release's
`dataset.json`, else `--source_split`'s parts with every language. The output is a release
(`dataset.json`, `splits/{name}.json`, `official/{name}/{part}.{lang}.txt`, `make_splits.json`:
sizes, `unused`, divergences, options, time) that `readers.discover` finds; the default fractions
give CFQ's 80/10/10 proportions with train half the pool. Reproducible from `--seed` (PCG64).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np

from mcwq_t5x.data import divergence as dv
from mcwq_t5x.data import paths
from mcwq_t5x.data import readers

DEFAULT_MCD_NAME = "mcd"
DEFAULT_RANDOM_NAME = "random"

# ------------------------------------------------------------------------------------------
# The pool.


def _question_field(language: str) -> str:
  return "questionPatternModEntities" + ("" if language == "en" else f"_{language}")


def _language_of_field(field: str) -> Optional[str]:
  if field == "questionPatternModEntities":
    return "en"
  prefix = "questionPatternModEntities_"
  if field.startswith(prefix) and readers.LANGUAGE_CODE_RE.match(field[len(prefix):]):
    return field[len(prefix):]
  return None


def load_pool(data_dir: Optional[readers.PathLike] = None,
              source_split: Optional[str] = None,
              source_parts: Optional[Sequence[str]] = None) -> tuple[list[dict], tuple[str, ...]]:
  """The examples to split, as CFQ-style records, and their languages.

  Args:
    data_dir: an MCWQ folder (default `paths.data_dir()`).
    source_split: pool this split's parts (official/translations layouts, or a release's
      `splits/{name}.json`); default: all of `dataset.json` if the folder has one, else
      "random_split".
    source_parts: the parts of `source_split` to pool (default: every part it has).

  Returns:
    (records, languages): each record has `sparqlPatternModEntities` and one question field per
    language (`questionPatternModEntities` for English).

  Raises:
    DataNotFoundError: nothing to read. DataFormatError: language files of a part that are not
    line-parallel (different lengths or queries).
  """
  root = pathlib.Path(paths.data_dir(data_dir))
  dataset = root / "dataset.json"
  if source_split is None and dataset.is_file():
    records = json.loads(dataset.read_text(encoding="utf-8"))
    languages = sorted({l for r in records for f in r if (l := _language_of_field(f)) is not None},
                       key=lambda l: (l not in readers.LANGUAGES, l))
    return records, tuple(languages)
  split = source_split or "random_split"
  contents = readers.discover(root)
  languages = contents.languages_of(split)
  records: list[dict] = []
  for part in source_parts or readers.PARTS:
    per_language = {}
    for language in languages:
      try:
        layout, files = readers.split_files(split, part, language, root)
      except paths.DataNotFoundError:
        if source_parts:
          raise
        continue
      if layout == "official":
        per_language[language] = readers.read_official(files[0], language, with_rir=False)
      else:
        per_language[language] = readers.read_split(split, part, language, root)
    if not per_language:
      continue
    first_language, first = next(iter(per_language.items()))
    for language, examples in per_language.items():
      if len(examples) != len(first):
        raise readers.DataFormatError(
            examples[0].source if examples else "",
            len(examples) + 1, f"{split}/{part}: {len(examples)} {language} examples, {len(first)} "
            f"{first_language} ones (the language files must be line-parallel)")
    for i, ex in enumerate(first):
      record = {"sparqlPatternModEntities": ex.sparql, "source": f"{split}/{part}:{ex.line}"}
      for language, examples in per_language.items():
        if examples[i].sparql != ex.sparql:
          raise readers.DataFormatError(
              examples[i].source, examples[i].line,
              f"the {language} query differs from the {first_language} one of the same line")
        record[_question_field(language)] = examples[i].question
      records.append(record)
  if not records:
    raise paths.not_found(root / "official" / split, f"MCWQ split {split}")
  return records, tuple(per_language)


# ------------------------------------------------------------------------------------------
# Encoding and the greedy procedure.


@dataclasses.dataclass(frozen=True)
class Sparse:
  """Rows of counts in compressed sparse row form: row i's entries are
  `indices[indptr[i]:indptr[i+1]]` with values `data[...]`; `width` columns; `sums[i]` its total."""
  indptr: np.ndarray  # [n + 1] int64
  indices: np.ndarray  # [nnz] int64
  data: np.ndarray  # [nnz] float64
  width: int
  sums: np.ndarray  # [n] float64

  def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segment [m], column [m], value [m]) of the entries of `rows`, segment = position in rows."""
    starts, lens = self.indptr[rows], self.indptr[rows + 1] - self.indptr[rows]
    seg = np.repeat(np.arange(len(rows)), lens)
    offsets = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    pos = np.repeat(starts, lens) + offsets
    return seg, self.indices[pos], self.data[pos]


def encode(structures: Sequence[dv.QueryStructure]) -> tuple[Sparse, Sparse]:
  """The atom counts and compound indicators of examples as `Sparse` rows (columns: the atoms and
  compounds in order of first occurrence)."""
  out = []
  for get in (lambda s: s.atoms.items(), lambda s: ((c, 1) for c in sorted(s.compounds))):
    vocab: dict[str, int] = {}
    indptr, indices, data = [0], [], []
    for s in structures:
      for key, value in get(s):
        indices.append(vocab.setdefault(key, len(vocab)))
        data.append(float(value))
      indptr.append(len(indices))
    indptr = np.asarray(indptr, dtype=np.int64)
    data = np.asarray(data, dtype=np.float64)
    sums = np.add.reduceat(data, indptr[:-1]) if len(data) else np.zeros(len(structures))
    sums[indptr[:-1] == indptr[1:]] = 0.0
    out.append(Sparse(indptr, np.asarray(indices, dtype=np.int64), data, len(vocab), sums))
  return out[0], out[1]


class _Pair:
  """Unnormalised frequencies of train (P) and test (Q) over one vocabulary, with the Chernoff sum
  T = Σ_k P_k^α Q_k^(1−α) kept up to date, so that D_α = 1 − T / (ΣP^α ΣQ^(1−α))."""

  def __init__(self, rows: Sparse, alpha: float):
    self.rows, self.alpha = rows, alpha
    self.counts = [np.zeros(rows.width), np.zeros(rows.width)]  # train, test
    self.totals = [0.0, 0.0]
    self.chernoff = 0.0

  def _powers(self, side: int, values: np.ndarray) -> np.ndarray:
    return np.power(values, self.alpha if side == 0 else 1.0 - self.alpha)

  def divergence(self) -> float:
    if min(self.totals) <= 0:
      return 1.0
    norm = self.totals[0]**self.alpha * self.totals[1]**(1.0 - self.alpha)
    return 1.0 - self.chernoff / norm

  def divergence_if_added(self, side: int, rows: np.ndarray) -> np.ndarray:
    """D_α after adding each one of `rows` (alone) to `side` (0 train, 1 test): [len(rows)]."""
    seg, col, val = self.rows.gather(rows)
    own, other = self.counts[side][col], self.counts[1 - side][col]
    delta = (self._powers(side, own + val) - self._powers(side, own)) * self._powers(
        1 - side, other)
    chernoff = self.chernoff + np.bincount(seg, weights=delta, minlength=len(rows))
    totals = [np.full(len(rows), self.totals[0]), np.full(len(rows), self.totals[1])]
    totals[side] = totals[side] + self.rows.sums[rows]
    norm = np.power(totals[0], self.alpha) * np.power(totals[1], 1.0 - self.alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
      return np.where(norm > 0, 1.0 - chernoff / norm, 1.0)

  def add(self, side: int, row: int) -> None:
    _, col, val = self.rows.gather(np.array([row]))
    own, other = self.counts[side][col], self.counts[1 - side][col]
    self.chernoff += float(
        np.sum((self._powers(side, own + val) - self._powers(side, own)) *
               self._powers(1 - side, other)))
    self.counts[side][col] += val
    self.totals[side] += float(self.rows.sums[row])


def greedy_mcd(structures: Sequence[dv.QueryStructure],
               n_train: int,
               n_test: int,
               rng: np.random.Generator,
               atom_bound: float = 0.02,
               candidates: int = 256) -> tuple[np.ndarray, np.ndarray]:
  """(train indices [n_train], test indices [n_test]), int64 in the order added: Keysers et al.'s
  greedy MCD construction over the pool's `divergence.analyse` structures.

  `atom_bound`: the largest D_0.5 a step may leave once reached; `candidates` are drawn without
  replacement from the unused pool each step. ValueError: impossible sizes.
  """
  n = len(structures)
  if n_train < 1 or n_test < 1 or n_train + n_test > n:
    raise ValueError(f"sizes {n_train} + {n_test} do not fit a pool of {n}")
  atom_rows, compound_rows = encode(structures)
  atoms = _Pair(atom_rows, dv.ALPHA_ATOMS)
  comps = _Pair(compound_rows, dv.ALPHA_COMPOUNDS)
  unused = rng.permutation(n)  # unused[:m] are the unused examples
  m = n
  chosen: list[list[int]] = [[], []]

  def take(side: int, position: int) -> None:
    nonlocal m
    row = int(unused[position])
    unused[position], unused[m - 1] = unused[m - 1], unused[position]
    m -= 1
    atoms.add(side, row)
    comps.add(side, row)
    chosen[side].append(row)

  # Each set starts from one random example.
  take(0, 0)
  take(1, 0)
  targets = (n_train, n_test)
  while len(chosen[0]) < n_train or len(chosen[1]) < n_test:
    fill = [len(chosen[s]) / targets[s] for s in (0, 1)]
    # The set further from its target size grows, so both grow in proportion.
    side = 0 if (fill[0] <= fill[1] and fill[0] < 1) or fill[1] >= 1 else 1
    k = min(candidates, m)
    # A random sample of candidates per step, as Keysers et al. score.
    positions = rng.choice(m, size=k, replace=False) if k < m else np.arange(m)
    rows = unused[positions]
    atom_div = atoms.divergence_if_added(side, rows)
    # While the sets are too small for the bound, at most the current atom divergence.
    feasible = atom_div <= max(atom_bound, atoms.divergence())
    if feasible.any():
      comp_div = comps.divergence_if_added(side, rows)
      best = int(np.argmax(np.where(feasible, comp_div, -np.inf)))
    else:
      # No candidate keeps the bound: the one with the lowest atom divergence.
      best = int(np.argmin(atom_div))
    take(side, int(positions[best]))
  return np.asarray(chosen[0], dtype=np.int64), np.asarray(chosen[1], dtype=np.int64)


def sizes(n: int, train_fraction: float, dev_fraction: float,
          test_fraction: float) -> tuple[int, int, int]:
  """(train, dev, test) sizes: each fraction of `n` rounded down; at least one each.

  Raises:
    ValueError: fractions outside (0, 1] or summing to more than 1, or a pool too small.
  """
  fractions = (train_fraction, dev_fraction, test_fraction)
  if any(not 0 < f <= 1 for f in fractions) or sum(fractions) > 1 + 1e-9:
    raise ValueError(f"fractions {fractions} must lie in (0, 1] and sum to at most 1")
  out = tuple(max(1, int(n * f)) for f in fractions)
  if sum(out) > n:
    raise ValueError(f"a pool of {n} examples is too small for {out}")
  return out  # type: ignore[return-value]


def make_splits(structures: Sequence[dv.QueryStructure],
                seed: int = 0,
                train_fraction: float = 0.5,
                dev_fraction: float = 0.0625,
                test_fraction: float = 0.0625,
                atom_bound: float = 0.02,
                candidates: int = 256) -> dict[str, dict[str, list[int]]]:
  """{"mcd": {"trainIdxs", "devIdxs", "testIdxs"}, "random": {...}} (sorted pool indices): an MCD
  split and a random split of the same sizes, all randomness from `seed`."""
  n_train, n_dev, n_test = sizes(len(structures), train_fraction, dev_fraction, test_fraction)
  rng = np.random.default_rng(seed)
  train, holdout = greedy_mcd(structures, n_train, n_dev + n_test, rng, atom_bound, candidates)
  # The atom bound holds between train and the whole hold-out; dev and test alone, smaller samples,
  # come out a little higher.
  holdout = rng.permutation(holdout)
  perm = rng.permutation(len(structures))
  as_list = lambda a: sorted(int(i) for i in a)
  return {
      "mcd": {
          "trainIdxs": as_list(train),
          "devIdxs": as_list(holdout[:n_dev]),
          "testIdxs": as_list(holdout[n_dev:])
      },
      "random": {
          "trainIdxs": as_list(perm[:n_train]),
          "devIdxs": as_list(perm[n_train:n_train + n_dev]),
          "testIdxs": as_list(perm[n_train + n_dev:n_train + n_dev + n_test])
      },
  }


def split_divergences(queries: Sequence[str], split: dict[str, list[int]]) -> dict[str, Any]:
  """{"train/dev+test": {"atom": .., "compound": ..}, "train/dev": .., "train/test": ..,
  "dev/test": ..} of a split (D_0.5 of atoms, D_0.1 of compounds, rounded to 6 places);
  "train/dev+test" is the pair the atom bound of `greedy_mcd` holds."""
  dists = {
      p: dv.distributions([queries[i] for i in split[f"{p}Idxs"]])
      for p in readers.PARTS
      if split.get(f"{p}Idxs")
  }
  if split.get("devIdxs") and split.get("testIdxs"):
    dists["dev+test"] = dv.distributions([queries[i] for i in split["devIdxs"] + split["testIdxs"]])
  out = {}
  for a, b in (("train", "dev+test"), ("train", "dev"), ("train", "test"), ("dev", "test")):
    if a in dists and b in dists:
      d = dv.compare(dists[a], dists[b])
      out[f"{a}/{b}"] = {"atom": round(d.atom, 6), "compound": round(d.compound, 6)}
  return out


# ------------------------------------------------------------------------------------------
# Writing.


def _write_text(path: pathlib.Path, text: str) -> None:
  """Writes atomically (temporary file + rename)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(text, encoding="utf-8")
  os.replace(tmp, path)


def write_release(out: readers.PathLike, records: Sequence[dict], languages: Sequence[str],
                  splits: dict[str, dict[str, list[int]]]) -> list[str]:
  """The paths written: `dataset.json` (CFQ-style records; a pool from official files adds `source`:
  `split/part:line`), `splits/{name}.json` and `official/{name}/{part}.{lang}.txt`."""
  out = pathlib.Path(out)
  written = [out / "dataset.json"]
  _write_text(written[0], json.dumps(list(records), indent=1, ensure_ascii=False))
  for name, split in splits.items():
    path = out / "splits" / f"{name}.json"
    _write_text(path, json.dumps(split, indent=1))
    written.append(path)
    for part in readers.PARTS:
      idxs = split.get(f"{part}Idxs") or []
      if not idxs:
        continue
      for language in languages:
        field = _question_field(language)
        lines = [
            readers.format_official_line(records[i][field], records[i]["sparqlPatternModEntities"])
            for i in idxs
            if isinstance(records[i].get(field), str)
        ]
        if len(lines) != len(idxs):
          continue  # a language not every record has: not written for this part
        path = out / "official" / name / f"{part}.{language}.txt"
        _write_text(path, "".join(l + "\n" for l in lines))
        written.append(path)
  return [str(p) for p in written]


def build_parser() -> argparse.ArgumentParser:
  """The command line (module docstring)."""
  ap = argparse.ArgumentParser(
      prog="python -m preprocessing.make_splits",
      description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True, help="output release folder")
  ap.add_argument(
      "--data_dir", default=None, help="source MCWQ folder (default $MCWQ_DATA_DIR / ../shared)")
  ap.add_argument("--source_split", default=None, help="pool this split (default: see docstring)")
  ap.add_argument("--source_parts", nargs="*", default=None, help="its parts (default: all)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--train_fraction", type=float, default=0.5)
  ap.add_argument("--dev_fraction", type=float, default=0.0625)
  ap.add_argument("--test_fraction", type=float, default=0.0625)
  ap.add_argument("--atom_bound", type=float, default=0.02, help="largest atom divergence")
  ap.add_argument("--candidates", type=int, default=256, help="examples scored per greedy step")
  ap.add_argument("--mcd_name", default=DEFAULT_MCD_NAME)
  ap.add_argument("--random_name", default=DEFAULT_RANDOM_NAME)
  return ap


def run(args: argparse.Namespace) -> dict[str, Any]:
  """Makes and writes the splits; returns the report written to `make_splits.json`."""
  for name in (args.mcd_name, args.random_name):
    if not readers.SPLIT_NAME_RE.match(name):
      raise ValueError(f"bad split name {name!r}: letters, digits and underscores")
  start = time.perf_counter()
  records, languages = load_pool(args.data_dir, args.source_split, args.source_parts)
  queries = [" ".join(r["sparqlPatternModEntities"].split()) for r in records]
  structures = [dv.analyse(q) for q in queries]
  analysed = time.perf_counter()
  made = make_splits(structures, args.seed, args.train_fraction, args.dev_fraction,
                     args.test_fraction, args.atom_bound, args.candidates)
  split_time = time.perf_counter()
  splits = {args.mcd_name: made["mcd"], args.random_name: made["random"]}
  written = write_release(args.out, records, languages, splits)
  report = {
      "pool": len(records),
      "languages": list(languages),
      "seed": args.seed,
      "options": {
          k: getattr(args, k) for k in ("data_dir", "source_split", "source_parts", "train_fraction",
                                       "dev_fraction", "test_fraction", "atom_bound", "candidates")
      },
      "splits": {
          name: {
              "sizes": {
                  p: len(split[f"{p}Idxs"]) for p in readers.PARTS
              },
              "unused": len(records) - sum(len(split[f"{p}Idxs"]) for p in readers.PARTS),
              "divergences": split_divergences(queries, split)
          } for name, split in splits.items()
      },
      "seconds": {
          "read_and_analyse": round(analysed - start, 1),
          "greedy": round(split_time - analysed, 1),
          "total": round(time.perf_counter() - start, 1)
      },
      "written": len(written),
  }
  _write_text(pathlib.Path(args.out) / "make_splits.json", json.dumps(report, indent=1))
  return report


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point; prints the report."""
  report = run(build_parser().parse_args(argv))
  print(json.dumps(report, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
