"""A fifth language, end to end: a release made by `preprocessing.migrate` (the CFQ
sample, split `cfq_sample`) and `preprocessing.translate` (into French, `fr`, a language MCWQ does
not have) gets its SeqIO tasks with no configuration; `mcwq_t5x.train` / `mcwq_t5x.eval` and the
real T5X train and evaluate on them, and `mcwq_t5x.evaluation.report` lists the new language.

The translation here is a deterministic stand-in (`FR <question>`, placeholders kept) so that the
test is quick; the worked example of docs/dataset_creation.md translates with a (random-weight) Hugging Face model,
trains our engine on English and French, evaluates zero-shot and reports: test_readme.py runs it
and checks the report's rows and each run's metrics against its predictions."""
import json
import shutil

import pytest
import seqio

from mcwq_t5x.data import readers
from mcwq_t5x.data import vocab
from mcwq_t5x.evaluation import metrics
from preprocessing import translate as tr
import mains
import readme_commands as rc

OUR_SIZE = [b.replace(" = ", "=") for b in mains.SMALL_MODEL]
OUR_RUN = [
    "TRAIN_STEPS=4", "BATCH_SIZE=8", "EVAL_PERIOD=0", "LOG_EVERY_STEPS=2", "CHECKPOINT_PERIOD=2",
    "TASK_FEATURE_LENGTHS={'inputs':40,'targets':128}", "INFER_BATCH_SIZE=256",
    "TRAIN_SPLIT='train'", "EVAL_SPLIT='validation'", "FINAL_EVAL_SPLIT='validation'",
    "RUN_NOTE=None"
]


class _French(tr.Backend):
  """A stand-in MT system: `FR ` + the text (the placeholders survive)."""
  name = "fr-stand-in"

  def translate(self, texts, target, source="en"):
    return [f"FR {t}" for t in texts]


@pytest.fixture(scope="module")
def release(migrated_cfq_sample, tmp_path_factory):
  """The migrated CFQ sample translated into `fr` by `translate_release` (official files too)."""
  rel = tmp_path_factory.mktemp("release_fr") / "mcwq_sample"
  shutil.copytree(migrated_cfq_sample, rel)
  result = tr.translate_release(rel, ["fr"], tr.Translator(_French()), progress=False)
  assert result["complete"], result
  assert sorted(
      p.rsplit("/", 1)[-1] for p in result["official_written"]) == ["dev.fr.txt", "train.fr.txt"]
  return rel


@pytest.fixture(scope="module")
def env(release, mcwq_dir):
  """The release as data directory; the small vocabulary of the shared MCWQ copy (the release's
  own text is too small for 2,000 pieces)."""
  del mcwq_dir
  return {"MCWQ_DATA_DIR": str(release), "MCWQ_VOCAB": str(vocab.small_vocab_path())}


def test_discover_release_and_published_layout(release, mcwq_dir):
  contents = readers.discover(release)
  assert contents.splits == readers.SPLITS + ("cfq_sample",)
  assert contents.languages == readers.LANGUAGES + ("fr",)
  assert contents.languages_of("cfq_sample") == ("en", "fr")
  assert contents.languages_of("mcd1") == readers.LANGUAGES  # not in the release: published four
  published = readers.discover(mcwq_dir)
  assert (published.splits, published.languages,
          published.gold_languages) == (readers.SPLITS, readers.LANGUAGES, readers.GOLD_LANGUAGES)
  assert published.ignored == ()
  # Reading: the new split and language through the one entry point, every layout's rules.
  fr = readers.read_split("cfq_sample", "dev", "fr", release)
  en = readers.read_split("cfq_sample", "dev", "en", release)
  assert len(fr) == len(en) == 220
  assert [e.question for e in fr] == ["FR " + e.question for e in en]
  assert [e.rir for e in fr] == [e.rir for e in en] and fr[0].language == "fr"
  with pytest.raises(ValueError, match="unknown language 'fr'"):
    readers.read_split("mcd1", "dev", "fr", mcwq_dir)
  with pytest.raises(ValueError, match="unknown split 'cfq_sample'"):
    readers.read_split("cfq_sample", "dev", "en", mcwq_dir)


def test_unusable_language_code_is_reported(tmp_path):
  (tmp_path / "official" / "s").mkdir(parents=True)
  (tmp_path / "official" / "s" / "dev.en.txt").write_text("IN: Did M0 die  OUT: ASK WHERE { }\n")
  (tmp_path / "official" / "s" / "dev.zh-CN.txt").write_text("")
  contents = readers.discover(tmp_path)
  assert contents.languages == readers.LANGUAGES and contents.splits[-1] == "s"
  assert [(p.rsplit("/", 1)[-1], "task name" in why) for p, why in contents.ignored
         ] == [("dev.zh-CN.txt", True)]


def test_tasks_of_the_release(release, env):
  import tasks.mcwq  # pylint: disable=g-import-not-at-top
  v = vocab.get_vocabulary(env["MCWQ_VOCAB"])
  names = tasks.mcwq.register_mcwq_tasks(vocabulary=v, suffix="_newlang", data_dir=str(release))
  try:
    for name in ("mcwq_cfq_sample_en_newlang", "mcwq_cfq_sample_fr_newlang",
                 "mcwq_cfq_sample_zeroshot_fr_newlang", "mcwq_mcd1_fr_newlang",
                 "mcwq_mcd1_zeroshot_fr_newlang", "mcwq_cfq_sample_multilingual_newlang",
                 "mcwq_mcd1_he_newlang", "mcwq_gold_he_newlang"):
      assert name in names, name
    assert "mcwq_gold_fr_newlang" not in names  # no gold set in the release
    mix = seqio.get_mixture_or_task("mcwq_cfq_sample_multilingual_newlang")
    assert sorted(
        t.name for t in mix.tasks) == ["mcwq_cfq_sample_en_newlang", "mcwq_cfq_sample_fr_newlang"]
    task = seqio.get_mixture_or_task("mcwq_cfq_sample_zeroshot_fr_newlang")
    assert set(task.splits) == {"validation", "test"}
    assert task.predict_metric_fns == [metrics.exact_match_metric, metrics.bleu_metric]
    ex = next(task.get_dataset(None, split="validation", shuffle=False).as_numpy_iterator())
    first = readers.read_split("cfq_sample", "dev", "fr", release)[0]
    assert ex["inputs_pretokenized"].decode() == first.question
    assert ex["targets_pretokenized"].decode() == first.rir
    assert ex["recursionDepth"] == -1  # read from official/ (recursionDepth is in dataset.json)
    train = seqio.get_mixture_or_task("mcwq_cfq_sample_fr_newlang").get_dataset(
        None, split="train", shuffle=False)
    assert sum(1 for _ in train.as_numpy_iterator()) == 1598
  finally:
    for name in names:
      for registry in (seqio.TaskRegistry, seqio.MixtureRegistry):
        if name in registry.names():
          registry.remove(name)


def test_small_release_vocabulary_error_says_what_to_do(tmp_path):
  with pytest.raises(ValueError, match="MCWQ_VOCAB"):
    vocab.train_sentencepiece(["Did M0 direct M1", "ASK WHERE lb rb"], tmp_path / "v.model")


def test_real_t5x_trains_and_evaluates_on_the_fifth_language(release, env, tmp_path):
  pytest.importorskip(
      "t5x.train", reason="the real T5X is not installed (bash scripts/install_t5x.sh)")
  mains.python_m(
      "t5x.train",
      "--gin_file=gin/tiny_random_split_en.gin",
      f"--gin.MODEL_DIR='{tmp_path}'",
      "--gin.MIXTURE_OR_TASK_NAME='mcwq_cfq_sample_fr'",
      *[
          # the size and steps of the README's T5X tiny run (the same programs: compiled once)
          f"--gin.{b}" for b in rc.T5X_SIZE + rc.T5X_TINY + [
              "train/utils.DatasetConfig.split='train'",
              "train_eval/utils.DatasetConfig.split='validation'",
              "infer_eval/utils.DatasetConfig.split='validation'"
          ]
      ],
      env=env,
      timeout=1200)
  assert (tmp_path / "checkpoint_4").is_dir()
  lines = (tmp_path / "inference_eval" /
           "mcwq_cfq_sample_fr-metrics.jsonl").read_text().splitlines()
  scores = json.loads(lines[-1])
  assert scores["step"] == 4 and {"exact_match", "bleu"} <= set(scores)
  inferences = [
      json.loads(l) for l in (tmp_path / "inference_eval" /
                              "mcwq_cfq_sample_fr-000004.jsonl").read_text().splitlines()
  ]
  assert len(inferences) == 16
  assert inferences[0]["input"]["inputs_pretokenized"].startswith("FR ")
