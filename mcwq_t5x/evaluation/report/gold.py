"""Gold queries of the report's test sets (`GoldSet`, cached by `GoldLoader`) and the
test-intersection index of Table 6 (`metrics.match_test_intersection`).

Gold RIR is `{targets_dir}/{split}/test.{lang}.sparql` (and `gold/`), else
`readers.read_split`. recursionDepth (Figure 4) comes from a full release in --data_dir, used
only if its test queries equal the gold file's line by line. Table 6's MT and gold columns score
both prediction sets on the matched examples only (like with like), `(all n)` every gold example.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional

from mcwq_t5x.data import readers
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation import score as score_lib
from mcwq_t5x.evaluation.report.common import GOLD
from mcwq_t5x.evaluation.report.common import GOLD_LANGUAGES


@dataclasses.dataclass
class GoldSet:
  """Gold queries of one test set: RIR targets, questions and depths (None when unknown), the
  file of the targets and that of the questions (None: the targets' file, or no questions)."""
  targets: list[str]
  questions: Optional[list[str]]
  depths: Optional[list[Optional[int]]]
  source: str
  questions_source: Optional[str] = None


class GoldLoader:
  """Loads and caches gold sets; records why depths are unavailable."""

  def __init__(self, targets_dir: pathlib.Path, data_dir: pathlib.Path, part: str = "test"):
    self.targets_dir = targets_dir
    self.data_dir = data_dir
    self.part = part  # of every split but the gold set (test only)
    self._cache: dict[tuple[str, str], Optional[GoldSet]] = {}
    self.messages: list[str] = []

  def get(self, split: str, language: str) -> Optional[GoldSet]:
    key = (split, language)
    if key not in self._cache:
      self._cache[key] = self._load(split, language)
    return self._cache[key]

  def languages(self, split: str) -> tuple[str, ...]:
    """The languages `split`'s tasks have in `data_dir` (`readers.discover`, as `tasks.mcwq`
    registers them: the languages of a multilingual mixture)."""
    return tuple(readers.discover(self.data_dir).languages_of(split))

  def _load(self, split: str, language: str) -> Optional[GoldSet]:
    part = "test" if split == GOLD else self.part
    rir_file = self.targets_dir / split / f"{part}.{language}.sparql"
    question_file = rir_file.with_suffix(".txt")
    if rir_file.is_file():
      targets = score_lib.load_targets(rir_file)
      questions = (readers.read_lines(question_file) if question_file.is_file() else None)
      if questions is not None and len(questions) != len(targets):
        questions = None
      source = str(rir_file)
      questions_source = None if questions is None else str(question_file)
    elif split == GOLD:
      self.messages.append(f"no gold targets {rir_file}")
      return None
    else:
      try:
        examples = readers.read_split(split, part, language, self.data_dir)
      except (FileNotFoundError, ValueError) as e:
        self.messages.append(f"no targets for {split}/{part}/{language}: {e}")
        return None
      targets = [e.rir for e in examples]
      questions = [e.question for e in examples]
      source = examples[0].source if examples else str(self.data_dir)
      questions_source = None
    return GoldSet(targets, questions, self._depths(split, language, targets), source,
                   questions_source)

  def _depths(self, split: str, language: str, targets: list[str]) -> Optional[list]:
    if split == GOLD:
      return None
    dataset = self.data_dir / "dataset.json"
    if not (dataset.is_file() and (self.data_dir / "splits" / f"{split}.json").is_file()):
      self.messages.append(
          f"accuracy by complexity skipped for {split}/{language}: no recursionDepth "
          f"(needs the full release's {dataset} and splits/{split}.json)")
      return None
    try:
      examples = readers.read_release(self.data_dir, split, self.part, language)
    except (FileNotFoundError, ValueError) as e:
      self.messages.append(f"accuracy by complexity skipped for {split}/{language}: {e}")
      return None
    if [(e.rir or "").strip() for e in examples] != [t.strip() for t in targets]:
      self.messages.append(
          f"accuracy by complexity skipped for {split}/{language}: the {self.part} queries of "
          f"{dataset} are not line-parallel with the gold file")
      return None
    return [e.recursionDepth for e in examples]


def intersection_index(loader: GoldLoader, split: str, gold_set: GoldSet, mcd_set: GoldSet,
                       cache: dict[str, list[Optional[int]]]) -> list[Optional[int]]:
  """Gold-set line -> line of `split`'s test set (`metrics.match_test_intersection`), using the
  questions of every gold language that both sides have (one mapping for all languages, since
  the gold files of all languages are line-parallel)."""
  if split in cache and len(cache[split]) == len(gold_set.targets):
    return cache[split]
  gold_questions, mcd_questions = {}, {}
  for lang in GOLD_LANGUAGES:
    g, m = loader.get(GOLD, lang), loader.get(split, lang)
    if (g is not None and m is not None and g.questions is not None and m.questions is not None and
        g.targets == gold_set.targets and m.targets == mcd_set.targets):
      gold_questions[lang], mcd_questions[lang] = g.questions, m.questions
  index = metrics.match_test_intersection(gold_set.targets, mcd_set.targets, gold_questions or None,
                                          mcd_questions or None)
  found = sum(j is not None for j in index)
  loader.messages.append(
      f"test-intersection: {found} of {len(index)} gold examples found in the {split} test set "
      f"(matched on the target query and the {'/'.join(gold_questions) or 'no'} questions)")
  cache[split] = index
  return index
