"""Prompt sizes of `mcwq_t5x.prompt` (issue 54): one real prompt, and the estimated prompt tokens
of a whole test part, from the first `--n` test examples' prompts (tokenizer-free estimate:
characters / 4, the usual rule for English BPE vocabularies; Hebrew, Kannada and Chinese take
more tokens per character, so read their figures as lower bounds).

  python scripts/prompt_sizes.py --split mcd1 --shots 8 --selection cover --n 100
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from mcwq_t5x.data import readers  # noqa: E402
from mcwq_t5x.prompting import prompt_format  # noqa: E402
from mcwq_t5x.prompting import selection as selection_lib  # noqa: E402


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--split", default="mcd1")
  p.add_argument("--shots", type=int, default=8)
  p.add_argument("--selection", default="cover")
  p.add_argument("--n", type=int, default=100)
  p.add_argument("--example_language", default="he")
  args = p.parse_args()
  for language in ("en", "he", "kn", "zh"):
    pool = readers.read_split(args.split, "dev", language)
    test = readers.read_split(args.split, "test", language)
    sel = selection_lib.Selector([e.question for e in pool], [e.sparql for e in pool], language)
    chars = []
    for i, e in enumerate(test[:args.n]):
      d = sel.select(args.selection, e.question, args.shots, i, e.sparql)
      text = prompt_format.render([(pool[j].question, pool[j].sparql) for j in d], e.question)
      chars.append(len(text))
      if i == 0 and language == args.example_language:
        print(f"--- prompt of {args.split} test line 1 ({language}) ---\n{text}\n--- gold: "
              f"{e.sparql}\n")
    mean = sum(chars) / len(chars)
    print(f"{args.split} {language}: {mean:.0f} characters per prompt, ~{mean / 4:.0f} tokens; "
          f"whole test part ({len(test)} examples): ~{mean / 4 * len(test) / 1e6:.2f} M prompt "
          "tokens")


if __name__ == "__main__":
  main()
