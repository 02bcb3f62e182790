r"""Gold test set sampling and translation quality (MCWQ paper, §4.2–4.3).

* `mcd_test_intersection`: the test examples shared by the three MCD splits (compared by query up
  to clause order, `mcwq_t5x.data.sparql.Query.canonical`; on the published files this gives 1,318
  distinct queries and contains all 155 gold queries).
* `sample_gold`: from that intersection, two yes/no and two wh- questions per complexity level,
  with a seeded generator. The complexity level is `Example.recursionDepth` (CFQ's measure, in
  dataset.json) when known, else the number of clauses of the query (the `official/` files carry
  no recursion depth).
* `bleu`: corpus BLEU (sacrebleu) of machine translations against human ones.

Command line:
  python -m preprocessing.gold sample --data-dir ../shared/mcwq --seed 0 --out gold.en.txt
  python -m preprocessing.gold bleu --hyp mt.he.txt --ref human.he.txt --lang he
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import random
import sys
from typing import Callable, Sequence

import sacrebleu

from mcwq_t5x.data import readers

from mcwq_t5x.data import sparql as sparql_lib

MCD_SPLITS = ("mcd1", "mcd2", "mcd3")


def canonical(query: str) -> tuple:
  """Order-insensitive key of a query (raises sparql_lib.SparqlParseError)."""
  return sparql_lib.parse_sparql(query).canonical()


def mcd_test_intersection(
    split_examples: Sequence[Sequence[readers.Example]]) -> list[readers.Example]:
  """Examples of the first split whose query occurs in every split (first occurrence per query).

  Args:
    split_examples: the test examples of mcd1, mcd2, mcd3 (any language; same order of splits).

  Returns:
    One example per shared query, in the first split's order.
  """
  keys = [{canonical(e.sparql) for e in exs} for exs in split_examples]
  shared = set.intersection(*keys)
  out, seen = [], set()
  for e in split_examples[0]:
    k = canonical(e.sparql)
    if k in shared and k not in seen:
      seen.add(k)
      out.append(e)
  return out


def is_yes_no(example: readers.Example) -> bool:
  """Yes/no question = ASK query."""
  return example.sparql.lstrip().startswith("ASK")


def complexity(example: readers.Example) -> int:
  """recursionDepth when known, else the number of clauses (triples and filters) of the query."""
  if example.recursionDepth is not None:
    return int(example.recursionDepth)
  q = sparql_lib.parse_sparql(example.sparql)
  return len(q.triples) + len(q.filters)


def sample_gold(examples: Sequence[readers.Example],
                seed: int = 0,
                per_kind: int = 2,
                level_fn: Callable[[readers.Example], int] = complexity) -> list[readers.Example]:
  """Samples `per_kind` yes/no and `per_kind` wh- questions per complexity level (§4.2).

  Levels with fewer candidates contribute all they have. Deterministic for a seed.

  Returns:
    The sample ordered by (level, yes/no first, position in `examples`).
  """
  groups: dict[tuple[int, bool], list[int]] = collections.defaultdict(list)
  for i, e in enumerate(examples):
    groups[(level_fn(e), is_yes_no(e))].append(i)
  rng = random.Random(seed)
  chosen = []
  for level, yn in sorted(groups, key=lambda k: (k[0], not k[1])):
    idx = groups[(level, yn)]
    chosen.extend(sorted(rng.sample(idx, min(per_kind, len(idx)))))
  return [examples[i] for i in chosen]


_TOKENIZE = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}


def bleu(hypotheses: Sequence[str], references: Sequence[str], language: str = "en") -> float:
  """Corpus BLEU (sacrebleu, 0–100) of `hypotheses` against one reference each.

  Tokenisation: sacrebleu's `zh` for Chinese, `13a` otherwise (ja/ko would need MeCab).

  Raises:
    ValueError: the two lists differ in length or are empty.
  """
  if len(hypotheses) != len(references) or not hypotheses:
    raise ValueError(f"need equally many hypotheses and references, got {len(hypotheses)} "
                     f"and {len(references)}")
  tok = _TOKENIZE.get(language, "13a")
  if tok.endswith("mecab"):
    tok = "13a"
  return sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tok).score


def main(argv: Sequence[str] | None = None) -> int:
  """Command line `python -m preprocessing.gold {sample,bleu}` (module docstring).

  Raises:
    paths.DataNotFoundError / readers.DataFormatError: missing or malformed input files.
  """
  ap = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  s = sub.add_parser("sample", help="sample the gold set from the MCD test intersection")
  s.add_argument(
      "--data-dir", default=None, help="MCWQ folder (default: mcwq_t5x.data.paths.data_dir())")
  s.add_argument("--language", default="en")
  s.add_argument("--seed", type=int, default=0)
  s.add_argument("--out", required=True, help="output in the official `IN: …  OUT: …` format")
  b = sub.add_parser("bleu", help="BLEU of machine vs human translations (line-parallel files)")
  b.add_argument("--hyp", required=True)
  b.add_argument("--ref", required=True)
  b.add_argument("--lang", default="en")
  args = ap.parse_args(argv)
  if args.cmd == "sample":
    exs = [readers.read_split(s, "test", args.language, data_dir=args.data_dir) for s in MCD_SPLITS]
    inter = mcd_test_intersection(exs)
    gold = sample_gold(inter, args.seed)
    pathlib.Path(args.out).write_text(
        "".join(readers.format_official_line(e.question, e.sparql) + "\n" for e in gold),
        encoding="utf-8")
    print(f"intersection: {len(inter)} queries; sampled {len(gold)} "
          f"({sum(map(is_yes_no, gold))} yes/no) -> {args.out}")
  else:
    # `readers.read_lines` splits at "\n" only: `str.splitlines` would also split at U+2028 and
    # other breaks a translation may contain, breaking line-parallelism.
    hyp = readers.read_lines(args.hyp)
    ref = readers.read_lines(args.ref)
    print(f"BLEU {bleu(hyp, ref, args.lang):.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
