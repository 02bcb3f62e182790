"""Compound coverage of each demonstration-selection method (issue 54, item 4), no model needed.

For each test query: the share of its compounds (`mcwq_t5x.data.divergence.compounds`) that occur
in the queries of its `--shots` demonstrations, averaged over the first `--n` test examples, per
split, language and method. Demonstrations come from the train part, else dev (the shared copy).

  python scripts/compound_coverage.py --splits mcd1 random_split --n 300 --shots 8 \
      --out docs/figures/compound_coverage.png --json docs/figures/compound_coverage.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from mcwq_t5x.data import readers  # noqa: E402
from mcwq_t5x.prompting import selection as selection_lib  # noqa: E402


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--splits", nargs="+", default=["mcd1", "random_split"])
  p.add_argument("--languages", nargs="+", default=["en", "he", "kn", "zh"])
  p.add_argument("--n", type=int, default=300)
  p.add_argument("--shots", type=int, default=8)
  p.add_argument("--out", required=True)
  p.add_argument("--json", required=True)
  args = p.parse_args()
  table = {}
  for split in args.splits:
    pool_part = "train" if "train" in readers.available_parts(split, "en") else "dev"
    for language in args.languages:
      pool = readers.read_split(split, pool_part, language)
      test = readers.read_split(split, "test", language)[:args.n]
      sel = selection_lib.Selector([e.question for e in pool], [e.sparql for e in pool], language)
      for method in selection_lib.METHODS:
        if method in ("random", "oracle_compounds") and language != args.languages[0]:
          table[f"{split}/{language}/{method}"] = table[f"{split}/{args.languages[0]}/{method}"]
          continue  # why: these two ignore the question's language (parallel files, same seed)
        cov = [
            selection_lib.compound_coverage(
                e.sparql,
                [pool[j].sparql
                 for j in sel.select(method, e.question, args.shots, i, e.sparql)])
            for i, e in enumerate(test)
        ]
        table[f"{split}/{language}/{method}"] = 100.0 * sum(cov) / len(cov)
        print(
            f"{split} {language} {method} (pool {pool_part}): {table[f'{split}/{language}/{method}']:.1f}",
            flush=True)
  pathlib.Path(args.json).write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, len(args.splits), figsize=(5 * len(args.splits), 3.5), sharey=True)
  for ax, split in zip(list(axes) if len(args.splits) > 1 else [axes], args.splits):
    width = 0.8 / len(selection_lib.METHODS)
    for k, method in enumerate(selection_lib.METHODS):
      xs = [i + k * width for i in range(len(args.languages))]
      label = "ORACLE compounds" if method == "oracle_compounds" else method
      ax.bar(xs, [table[f"{split}/{l}/{method}"] for l in args.languages], width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(args.languages))], args.languages)
    ax.set_title(f"{split}: {args.shots} demonstrations")
    ax.set_ylabel("test compounds covered (%)")
  axes_list = list(axes) if len(args.splits) > 1 else [axes]
  axes_list[-1].legend(fontsize=8, loc="lower right")
  fig.tight_layout()
  fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
  main()
