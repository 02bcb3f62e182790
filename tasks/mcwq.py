"""SeqIO tasks and mixtures for MCWQ (Cui et al., TACL 2022).

Inputs are the questions (placeholders M0..M9), targets the queries in RIR (`mcwq_t5x.data.rir`),
as in the paper's mT5 experiments (§5). Importing registers, with `vocab.get_vocabulary()` and
nothing with gin (T5X imports it after its flags: `MIXTURE_OR_TASK_MODULE = 'tasks.mcwq'`):
`mcwq_{split}_{lang}` (train, validation = MCWQ's dev, test), `mcwq_gold_{he,kn,zh}`,
`mcwq_{split}_zeroshot_{lang}` (§5.3), `mcwq_{split}_multilingual`, each also `_prefixed` (the
authors' `translate {Language} to Sparql: `), for the published splits and languages and those
`readers.discover` finds. Examples also carry `question`, `sparql`, `rir` and `recursionDepth`
(int32, -1 when unknown).
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import seqio
import tensorflow as tf

from mcwq_t5x.data import readers
from mcwq_t5x.data import vocab as vocab_lib
from mcwq_t5x.evaluation import metrics

SPLITS = readers.SPLITS
LANGUAGES = readers.LANGUAGES
ZEROSHOT_LANGUAGES = ("he", "kn", "zh")
GOLD_LANGUAGES = readers.GOLD_LANGUAGES
# The input prefix of the paper's Hugging Face training code (English); the default is no prefix.
PAPER_INPUT_PREFIX = "translate English to Sparql: "
DEFAULT_INPUT_PREFIX = ""
# Suffix of the tasks in the paper's form (inputs carry `input_prefix(language)`).
PREFIXED_SUFFIX = "_prefixed"
# Language code -> the name in the paper's task prefix (seq2sparql hf/run_mt5.sh).
LANGUAGE_NAMES = {"en": "English", "he": "Hebrew", "kn": "Kannada", "zh": "Chinese"}


def input_prefix(language: str) -> str:
  """The paper's task prefix `translate {Language} to Sparql: ` ("he" -> "translate Hebrew to
  Sparql: ")."""
  # A code missing from LANGUAGE_NAMES (a new release's language) stands for its name.
  return f"translate {LANGUAGE_NAMES.get(language, language)} to Sparql: "


def task_name(split: str, language: str, suffix: str = "") -> str:
  """`mcwq_{split}_{language}{suffix}` (split may be "gold")."""
  return f"mcwq_{split}_{language}{suffix}"


def zeroshot_task_name(split: str, language: str, suffix: str = "") -> str:
  """`mcwq_{split}_zeroshot_{language}{suffix}`."""
  return f"mcwq_{split}_zeroshot_{language}{suffix}"


def multilingual_mixture_name(split: str, suffix: str = "") -> str:
  """`mcwq_{split}_multilingual{suffix}`."""
  return f"mcwq_{split}_multilingual{suffix}"


def examples_to_dataset(examples: Sequence[readers.Example]) -> tf.data.Dataset:
  """A tf.data.Dataset of dicts: `question`, `sparql`, `rir`, `language` (tf.string scalars, "" when
  missing), `recursionDepth` (tf.int32 scalar, -1 when unknown)."""

  def strings(values):
    return tf.constant([v or "" for v in values], dtype=tf.string, shape=[len(values)])

  return tf.data.Dataset.from_tensor_slices({
      "question":
          strings([e.question for e in examples]),
      "sparql":
          strings([e.sparql for e in examples]),
      "rir":
          strings([e.rir for e in examples]),
      "language":
          strings([e.language for e in examples]),
      "recursionDepth":
          tf.constant([-1 if e.recursionDepth is None else e.recursionDepth for e in examples],
                      dtype=tf.int32,
                      shape=[len(examples)]),
  })


def _dataset_fn(split: str,
                shuffle_files: bool,
                seed: Optional[int] = None,
                *,
                mcwq_split: str,
                language: str,
                data_dir: Optional[str]) -> tf.data.Dataset:
  """seqio `dataset_fn`: reads one part through `readers.read_split` (cached per file)."""
  del shuffle_files, seed  # one file per part; seqio shuffles examples when asked.
  if split not in readers.DATASET_SPLIT_TO_PART:
    raise ValueError(
        f"unknown seqio split {split!r}; expected one of {tuple(readers.DATASET_SPLIT_TO_PART)}")
  return examples_to_dataset(
      readers.read_split(mcwq_split, readers.DATASET_SPLIT_TO_PART[split], language, data_dir))


def to_inputs_and_targets(dataset: tf.data.Dataset, prefix: str = "") -> tf.data.Dataset:
  """Adds `inputs` = prefix + question and `targets` = RIR query (other features kept)."""

  def fn(ex: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    out = dict(ex)
    out["inputs"] = tf.strings.join([prefix, ex["question"]]) if prefix else ex["question"]
    out["targets"] = ex["rir"]
    return out

  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


def postprocess_query(output: Any,
                      example: Optional[Mapping[str, Any]] = None,
                      is_target: bool = False) -> str:
  """`output` (str or UTF-8 bytes; target or prediction alike) stripped, whitespace runs -> one
  space."""
  del example, is_target
  if isinstance(output, bytes):
    output = output.decode("utf-8", errors="replace")
  return " ".join(str(output).split())


def _remove(registry, name: str) -> None:
  if name in registry.names():
    registry.remove(name)


class McwqDataSource(seqio.FunctionDataSource):
  """The source of one MCWQ split and language (`_dataset_fn`), which also names the file and
  line each example comes from (`example_location`)."""

  def __init__(self, mcwq_split: str, language: str, data_dir: Optional[str],
               splits: Sequence[str]):
    self._read = dict(mcwq_split=mcwq_split, language=language, data_dir=data_dir)
    super().__init__(dataset_fn=functools.partial(_dataset_fn, **self._read), splits=tuple(splits))

  def example_location(self, split: str, index: int) -> Optional[str]:
    """"FILE:LINE" (1-based; dataset.json: "FILE, record N") of example `index` (0-based, in the
    dataset's order) of the seqio `split`, or None when there is none."""
    if split not in readers.DATASET_SPLIT_TO_PART:
      return None
    args = (self._read["mcwq_split"], readers.DATASET_SPLIT_TO_PART[split], self._read["language"],
            self._read["data_dir"])
    try:
      examples = readers.read_split(*args)  # why: cached, the examples the dataset was made of
      layout = readers.split_files(*args)[0]
    except (OSError, ValueError):  # why: an error message's detail never raises in its place
      return None
    if not 0 <= index < len(examples) or not examples[index].source:
      return None
    e = examples[index]
    if layout == "release":  # dataset.json: `line` is the record number
      return f"{e.source}, record {e.line}"
    return f"{e.source}:{e.line}"


def _add_task(name: str, mcwq_split: str, language: str, splits: Sequence[str],
              output_features: Mapping[str, seqio.Feature],
              prefix: Union[str, Callable[[str], str]], data_dir: Optional[str]) -> seqio.Task:
  _remove(seqio.TaskRegistry, name)
  prefix = prefix(language) if callable(prefix) else prefix
  source = McwqDataSource(mcwq_split, language, data_dir, splits)
  return seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=[
          functools.partial(to_inputs_and_targets, prefix=prefix),
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=output_features,
      postprocess_fn=postprocess_query,
      metric_fns=[metrics.exact_match_metric, metrics.bleu_metric])


def register_mcwq_tasks(prefix: Union[str, Callable[[str], str]] = DEFAULT_INPUT_PREFIX,
                        vocabulary: Optional[seqio.Vocabulary] = None,
                        suffix: str = "",
                        data_dir: Optional[str] = None) -> list[str]:
  """The names of all MCWQ tasks and mixtures, registered (replacing earlier ones of those names).

  `prefix`: text before every input, or a function language -> text (`input_prefix`); default
  none. `vocabulary` default `vocab.get_vocabulary()` ($MCWQ_VOCAB, else the offline SentencePiece
  model). `suffix` names variants side by side. `data_dir` (default `paths.data_dir()`, resolved
  when read) adds the splits and languages it holds, listed now.
  """
  vocabulary = vocabulary if vocabulary is not None else vocab_lib.get_vocabulary()
  output_features = {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
  }
  data_dir = None if data_dir is None else str(data_dir)
  contents = readers.discover(data_dir)
  for path, reason in contents.ignored:
    logging.warning("tasks.mcwq: no tasks for %s: %s", path, reason)
  names = []
  all_splits = ("train", "validation", "test")
  for split in contents.splits:
    for language in contents.languages:
      name = task_name(split, language, suffix)
      _add_task(name, split, language, all_splits, output_features, prefix, data_dir)
      names.append(name)
    for language in zeroshot_languages(contents.languages):
      name = zeroshot_task_name(split, language, suffix)
      _add_task(name, split, language, ("validation", "test"), output_features, prefix, data_dir)
      names.append(name)
  for language in contents.gold_languages:
    name = task_name(readers.GOLD_SPLIT, language, suffix)
    _add_task(name, readers.GOLD_SPLIT, language, ("test",), output_features, prefix, data_dir)
    names.append(name)
  for split in contents.splits:
    name = multilingual_mixture_name(split, suffix)
    _remove(seqio.MixtureRegistry, name)
    seqio.MixtureRegistry.add(
        name, [task_name(split, l, suffix) for l in contents.languages_of(split)], default_rate=1.0)
    names.append(name)
  return names


def zeroshot_languages(languages: Sequence[str]) -> tuple[str, ...]:
  """The languages that get zero-shot tasks: every one but English (the training language)."""
  return tuple(l for l in languages if l != "en")


REGISTERED = register_mcwq_tasks()
# The paper's form: `translate {Language} to Sparql: ` + question.
REGISTERED_PREFIXED = register_mcwq_tasks(prefix=input_prefix, suffix=PREFIXED_SUFFIX)
