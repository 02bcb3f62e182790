"""Tests of the SeqIO tasks (tasks/mcwq.py), the README's example of them, and mcwq_t5x.inspect_task on
the real data."""
import importlib
import io
import json

import pytest
import seqio

from mcwq_t5x.data import readers
from mcwq_t5x.data import vocab
from mcwq_t5x.evaluation import metrics
import mains


@pytest.fixture(scope="module", autouse=True)
def env(tmp_path_factory):
  """Private cache (small vocabulary trained once), default data dir, no MCWQ_VOCAB."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("MCWQ_CACHE_DIR", str(tmp_path_factory.mktemp("mcwq_cache")))
    mp.delenv("MCWQ_VOCAB", raising=False)
    mp.delenv("MCWQ_DATA_DIR", raising=False)
    vocab.clear_vocabulary_cache()  # a vocabulary cached by another module points elsewhere
    yield
  vocab.clear_vocabulary_cache()


@pytest.fixture(scope="module")
def mcwq_tasks(env):
  import tasks.mcwq  # pylint: disable=g-import-not-at-top
  # Another test module may have registered the tasks with its own vocabulary instance:
  # register them again (explicit arguments win over any gin bindings left behind).
  tasks.mcwq.register_mcwq_tasks(
      prefix=tasks.mcwq.DEFAULT_INPUT_PREFIX,
      vocabulary=vocab.get_vocabulary(),
      suffix="",
      data_dir=None)
  return tasks.mcwq


def _first(task_name, split, sequence_length=None):
  task = seqio.get_mixture_or_task(task_name)
  ds = task.get_dataset(sequence_length, split=split, shuffle=False)
  return task, next(ds.as_numpy_iterator())


def test_all_names_registered(mcwq_tasks):
  names = set(seqio.TaskRegistry.names())
  for split in readers.SPLITS:
    for lang in readers.LANGUAGES:
      assert f"mcwq_{split}_{lang}" in names
    for lang in ("he", "kn", "zh"):
      assert f"mcwq_{split}_zeroshot_{lang}" in names
    assert f"mcwq_{split}_multilingual" in seqio.MixtureRegistry.names()
  for lang in ("he", "kn", "zh"):
    assert f"mcwq_gold_{lang}" in names
  # The bare-question tasks and mixtures and the paper's form (`_prefixed`) of each, as
  # registered at import (other modules' tests register variants under their own suffixes).
  # 4 splits x (4 languages + 3 zero-shot) + 3 gold tasks, and one mixture per split.
  bare, prefixed = mcwq_tasks.REGISTERED, mcwq_tasks.REGISTERED_PREFIXED
  assert len([n for n in bare if n in names]) == 31 and len(set(bare)) == len(bare) == 35
  assert [f"{n}_prefixed" for n in bare] == prefixed
  assert set(bare + prefixed) <= names | set(seqio.MixtureRegistry.names())
  assert "mcwq_mcd1_multilingual_prefixed" in seqio.MixtureRegistry.names()
  task = seqio.get_mixture_or_task("mcwq_mcd1_en")
  assert set(task.splits) == {"train", "validation", "test"}
  assert set(seqio.get_mixture_or_task("mcwq_mcd3_zeroshot_kn").splits) == {"validation", "test"}
  assert set(seqio.get_mixture_or_task("mcwq_gold_zh").splits) == {"test"}
  v = task.output_features["targets"].vocabulary
  assert isinstance(v, seqio.SentencePieceVocabulary) and v is vocab.get_vocabulary()
  assert task.output_features["inputs"].vocabulary is v
  assert metrics.exact_match_metric in task.predict_metric_fns
  assert metrics.bleu_metric in task.predict_metric_fns


def test_registration_is_idempotent(mcwq_tasks):
  before = set(seqio.TaskRegistry.names())
  assert mcwq_tasks.register_mcwq_tasks() == mcwq_tasks.REGISTERED
  importlib.reload(mcwq_tasks)
  import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  assert set(seqio.TaskRegistry.names()) == before


def test_mcd1_validation_full_and_round_trip(mcwq_tasks, mcwq_dir):
  task = seqio.get_mixture_or_task("mcwq_mcd1_en")
  ds = task.get_dataset({"inputs": 64, "targets": 256}, split="validation", shuffle=False)
  examples = list(ds.as_numpy_iterator())
  assert len(examples) == 5408
  ex = examples[0]
  ref = readers.read_split("mcd1", "dev", "en", mcwq_dir)[0]
  v = task.output_features["inputs"].vocabulary
  assert ex["inputs_pretokenized"].decode() == ref.question
  assert ex["targets_pretokenized"].decode() == ref.rir
  assert ex["inputs"].tolist() == v.encode(ref.question) + [1]
  assert ex["targets"].tolist() == v.encode(ref.rir) + [1]
  assert v.decode(ex["targets"].tolist()) == ref.rir
  assert ex["sparql"].decode() == ref.sparql and ex["recursionDepth"] == -1
  last = readers.read_split("mcd1", "dev", "en", mcwq_dir)[-1]
  assert examples[-1]["inputs_pretokenized"].decode() == last.question


@pytest.mark.parametrize("name,split,source", [
    ("mcwq_mcd2_he", "test", ("mcd2", "test", "he")),
    ("mcwq_random_split_kn", "validation", ("random_split", "dev", "kn")),
    ("mcwq_mcd3_zeroshot_zh", "test", ("mcd3", "test", "zh")),
    ("mcwq_gold_zh", "test", ("gold", "test", "zh")),
])
def test_first_examples(mcwq_tasks, mcwq_dir, name, split, source):
  task, ex = _first(name, split)
  ref = readers.read_split(*source, mcwq_dir)[0]
  v = task.output_features["targets"].vocabulary
  assert ex["inputs_pretokenized"].decode() == ref.question
  assert v.decode(ex["inputs"].tolist()) == ref.question
  assert v.decode(ex["targets"].tolist()) == ref.rir
  assert ex["targets"][-1] == 1


def test_gold_zh_first_example_text(mcwq_tasks, mcwq_dir):
  _, ex = _first("mcwq_gold_zh", "test")
  assert ex["inputs_pretokenized"].decode() == "M0是编剧吗？"
  assert ex["targets_pretokenized"].decode() == (
      "ASK WHERE lb ( M0 ( wdt:P106 ) ( wd:Q69423232 ) ) rb")


def test_example_counts_per_task(mcwq_tasks, mcwq_dir):
  """Every task reads exactly the published number of examples per split (via readers)."""
  counts = {
      "mcd1": (5408, 5310),
      "mcd2": (5929, 5891),
      "mcd3": (6034, 6151),
      "random_split": (6163, 6282)
  }
  for split, (n_dev, n_test) in counts.items():
    for lang in readers.LANGUAGES:
      assert len(readers.read_split(split, readers.DATASET_SPLIT_TO_PART["validation"],
                                    lang)) == n_dev
      assert len(readers.read_split(split, readers.DATASET_SPLIT_TO_PART["test"], lang)) == n_test
  ds = seqio.get_mixture_or_task("mcwq_gold_he").get_dataset(None, split="test", shuffle=False)
  assert sum(1 for _ in ds.as_numpy_iterator()) == 155


def test_trimming_keeps_eos(mcwq_tasks):
  _, ex = _first("mcwq_mcd1_kn", "test", {"inputs": 8, "targets": 8})
  assert len(ex["inputs"]) == 8 and len(ex["targets"]) == 8
  assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1


def test_missing_train_split_names_fetch_command(mcwq_tasks, mcwq_dir):
  task = seqio.get_mixture_or_task("mcwq_mcd1_en")
  with pytest.raises(Exception) as e:
    next(task.get_dataset(None, split="train", shuffle=False).as_numpy_iterator())
  assert "official/mcd1/train.en.txt" in str(e.value)
  assert "python scripts/download_mcwq.py" in str(e.value)


def test_multilingual_mixture(mcwq_tasks, mcwq_dir):
  mix = seqio.get_mixture_or_task("mcwq_mcd1_multilingual")
  assert sorted(t.name for t in mix.tasks) == [f"mcwq_mcd1_{l}" for l in ("en", "he", "kn", "zh")]
  ds = mix.get_dataset({"inputs": 64, "targets": 256}, split="validation", shuffle=False, seed=0)
  questions = {
      e.question
      for l in readers.LANGUAGES
      for e in readers.read_split("mcd1", "dev", l, mcwq_dir)[:40]
  }
  v = vocab.get_vocabulary()
  # mixtures keep only the output features: decode the token ids
  got = [v.decode(ex["inputs"].tolist()) for ex in ds.take(20).as_numpy_iterator()]
  assert len(got) == 20 and set(got) <= questions


def test_example_location_names_the_file_and_line(mcwq_tasks, mcwq_dir):
  """What `prediction.ExampleTooLongError` names: the file and 1-based line an example of a
  task's split was read from (the real files; the line holds the example's question)."""
  for name, split, index, path, part in [
      ("mcwq_gold_zh", "test", 0, "translations/gold/test.zh.txt", ("gold", "test", "zh")),
      ("mcwq_mcd1_en", "validation", 5407, "official/mcd1/dev.en.txt", ("mcd1", "dev", "en")),
      ("mcwq_mcd2_zeroshot_he", "test", 99, "official/mcd2/test.he.txt", ("mcd2", "test", "he")),
  ]:
    where = seqio.get_mixture_or_task(name).source.example_location(split, index)
    assert where == f"{mcwq_dir / path}:{index + 1}", (name, where)
    line = (mcwq_dir / path).read_text(encoding="utf-8").splitlines()[index]
    assert readers.read_split(*part, mcwq_dir)[index].question in line, (name, line)
  task = seqio.get_mixture_or_task("mcwq_gold_zh")
  assert task.source.example_location("test", 10**6) is None
  assert task.source.example_location("train", 0) is None  # gold has no train split


def test_prefix_postprocess_and_release_layout(mcwq_tasks, tmp_path):
  records = [{
      "questionPatternModEntities": "Did M0 direct M1",
      "questionPatternModEntities_zh": "M0导演了M1吗",
      "sparqlPatternModEntities": "ASK WHERE {\nM0 wdt:P57 M1\n}",
      "recursionDepth": 7,
      "expectedResponse": "Yes"
  }]
  (tmp_path / "dataset.json").write_text(json.dumps(records), encoding="utf-8")
  (tmp_path / "splits").mkdir()
  (tmp_path / "splits/mcd1.json").write_text('{"trainIdxs": [0], "devIdxs": [], "testIdxs": []}')
  names = mcwq_tasks.register_mcwq_tasks(
      prefix=mcwq_tasks.PAPER_INPUT_PREFIX, suffix="_synth", data_dir=str(tmp_path))
  assert "mcwq_mcd1_zh_synth" in names and "mcwq_mcd1_multilingual_synth" in names
  task, ex = _first("mcwq_mcd1_zh_synth", "train")
  assert ex["inputs_pretokenized"].decode() == "translate English to Sparql: M0导演了M1吗"
  assert ex["targets_pretokenized"].decode() == "ASK WHERE lb ( M0 ( wdt:P57 ) ( M1 ) ) rb"
  assert ex["recursionDepth"] == 7
  assert task.postprocess_fn(
      b"ASK  WHERE lb\n rb ", example=ex, is_target=False) == ("ASK WHERE lb rb")
  assert task.source.example_location("train", 0) == f"{tmp_path / 'dataset.json'}, record 1"
  for name in names:
    if name.endswith("_synth"):
      for registry in (seqio.TaskRegistry, seqio.MixtureRegistry):
        if name in registry.names():
          registry.remove(name)


def test_inspect_task(mcwq_tasks, mcwq_dir):
  from mcwq_t5x import inspect_task  # pylint: disable=g-import-not-at-top
  out = io.StringIO()
  stats = inspect_task.inspect("mcwq_gold_he", "test", num_examples=2, out=out)
  v = vocab.get_vocabulary()
  gold = readers.read_split("gold", "test", "he", mcwq_dir)
  target_lengths = sorted(len(v.encode(e.rir)) + 1 for e in gold)
  assert stats["targets"]["count"] == 155 and stats["inputs"]["count"] == 155
  assert stats["targets"]["max"] == target_lengths[-1]
  assert stats["targets"]["p50"] == pytest.approx(target_lengths[77])
  text = out.getvalue()
  assert f"inputs_pretokenized: {gold[0].question}" in text
  assert "--- example 1" in text and "--- example 2" not in text
  assert "p50" in text and "p99" in text and "TASK_FEATURE_LENGTHS" in text
  with pytest.raises(inspect_task.UnknownTaskError, match="did you mean: .*mcwq_mcd1_he"):
    inspect_task.get_task("mcwq_mcd1_hx")


@pytest.mark.parametrize(
    "name,split,prefix",
    [
        ("mcwq_gold_he_prefixed", "test", "translate Hebrew to Sparql: "),
        ("mcwq_mcd1_kn_prefixed", "validation", "translate Kannada to Sparql: "),
        ("mcwq_mcd2_en_prefixed", "test", "translate English to Sparql: "),
        # zero-shot: the English-trained model gets the TEST language's prefix
        ("mcwq_mcd3_zeroshot_zh_prefixed", "test", "translate Chinese to Sparql: "),
    ])
def test_prefixed_tasks_are_the_papers_form(mcwq_tasks, mcwq_dir, name, split, prefix):
  bare_name = name[:-len("_prefixed")]
  _, ex = _first(name, split)
  _, bare = _first(bare_name, split)
  assert ex["inputs_pretokenized"].decode() == prefix + bare["inputs_pretokenized"].decode()
  assert ex["targets_pretokenized"] == bare["targets_pretokenized"]
  assert not bare["inputs_pretokenized"].decode().startswith("translate ")
  v = vocab.get_vocabulary()
  assert v.decode(ex["inputs"].tolist()).startswith(prefix.strip())


def test_input_prefix_per_language(mcwq_tasks):
  assert mcwq_tasks.input_prefix("en") == mcwq_tasks.PAPER_INPUT_PREFIX
  assert mcwq_tasks.input_prefix("he") == "translate Hebrew to Sparql: "
  assert mcwq_tasks.input_prefix("xx") == "translate xx to Sparql: "  # unknown code: the code


def test_inspect_task_shows_the_prefix(mcwq_tasks, mcwq_dir):
  from mcwq_t5x import inspect_task  # pylint: disable=g-import-not-at-top
  out = io.StringIO()
  inspect_task.inspect("mcwq_gold_kn_prefixed", "test", num_examples=1, max_examples=4, out=out)
  text = out.getvalue()
  assert "input prefix: 'translate Kannada to Sparql: '" in text
  assert "inputs_pretokenized: translate Kannada to Sparql: " in text
  out = io.StringIO()
  inspect_task.inspect("mcwq_gold_kn", "test", num_examples=1, max_examples=4, out=out)
  assert "input prefix: none (the bare question)" in out.getvalue()


def test_inspect_task_help(capsys):
  from mcwq_t5x import inspect_task  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit):
    inspect_task.main(["--help"])
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m mcwq_t5x.inspect_task")
  assert "examples to print" in out


def test_inspect_task_without_train_files_is_one_line(capsys, mcwq_dir):
  del mcwq_dir  # the shared copy: dev and test files only
  from mcwq_t5x import inspect_task  # pylint: disable=g-import-not-at-top
  assert inspect_task.main(["mcwq_mcd1_en", "--split", "train"]) == 1
  err = capsys.readouterr().err.strip()
  # The progress lines ("[   0 s] loading ..."), then the error in one line.
  assert all(l.startswith("[") for l in err.splitlines()[:-1]) and "Traceback" not in err
  last = err.splitlines()[-1]
  assert last.startswith("DataNotFoundError: mcwq_mcd1_en split 'train': ")
  assert "download_mcwq.py --out DIR" in last and "MCWQ_DATA_DIR=DIR" in last


def test_readme_seqio_example_runs(mcwq_dir):
  """The README's "Data from Python" block, as printed."""
  del mcwq_dir
  import re  # pylint: disable=g-import-not-at-top
  readme = (mains.REPO / "README.md").read_text()
  section = readme.split("## Data from Python", 1)[1]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  scope = {}
  exec(code, scope)  # pylint: disable=exec-used
  example = next(scope["ds"].as_numpy_iterator())
  assert {"inputs", "targets", "inputs_pretokenized"} <= set(example)


def _lines(paths):
  return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)


def test_inspect_task_reads_a_mixture_to_its_end(mcwq_tasks, mcwq_dir, capsys):
  """The command the TRUNCATED warning recommends, on the multilingual mixture: every example of
  the four dev files once, then the statistics (it read examples for ever)."""
  from mcwq_t5x import inspect_task  # pylint: disable=g-import-not-at-top
  dev = sorted((mcwq_dir / "official" / "mcd1").glob("dev.*.txt"))
  assert [p.name for p in dev] == ["dev.en.txt", "dev.he.txt", "dev.kn.txt", "dev.zh.txt"]
  assert inspect_task.main(["mcwq_mcd1_multilingual_prefixed", "--split", "validation", "-n",
                            "0"]) == 0
  out, err = capsys.readouterr()
  assert f"{_lines(dev):,} examples read" in err  # 21,632
  inputs = next(l for l in out.splitlines() if l.split()[:1] == ["inputs"])
  assert inputs.split()[1] == str(_lines(dev)) and inputs.split()[-1] == "70"  # Kannada's longest


def test_one_epoch_of_a_mixture_holds_every_example(mcwq_tasks, mcwq_dir):
  """A mixture of the three gold tasks (155 questions each) read once: SeqIO samples its tasks and
  stops at the first that runs out; the pipeline's rows and truncation counts hold all 465, each
  task's in source order."""
  from mcwq_t5x.data import pipeline  # pylint: disable=g-import-not-at-top
  gold = sorted((mcwq_dir / "translations" / "gold").glob("test.*.txt"))
  assert len(gold) == 3
  names = [f"mcwq_gold_{lang}" for lang in ("he", "kn", "zh")]
  seqio.MixtureRegistry.add("test_gold_mixture", names, default_rate=1.0)
  try:
    seqio_rows = sum(1 for _ in seqio.get_mixture_or_task("test_gold_mixture").get_dataset(
        None, split="test", shuffle=False, num_epochs=1).as_numpy_iterator())
    assert seqio_rows < _lines(gold)  # the loss this test is about
    lengths = {"inputs": 48, "targets": 128}
    cfg = pipeline.DatasetConfig("test_gold_mixture", lengths, "test", 8, shuffle=False)
    arrays = pipeline.load_feature_arrays(cfg)
    assert len(arrays["encoder_input_tokens"]) == _lines(gold) == 465
    counts = pipeline.count_truncated(cfg)
    assert counts["inputs"]["examples"] == counts["targets"]["examples"] == 465
    # Each task's rows, in order: the he task's first, the zh task's last question.
    v = vocab.get_vocabulary()
    for row, (name, index) in ((0, (names[0], 0)), (464, (names[2], 154))):
      first = readers.read_split("gold", "test", name[-2:])[index]
      assert v.decode(arrays["encoder_input_tokens"][row].tolist()) == first.question
  finally:
    seqio.MixtureRegistry.remove("test_gold_mixture")


def test_the_prefixed_lengths_of_the_docs_hold_every_shared_example(mcwq_tasks, mcwq_dir):
  """The TASK_FEATURE_LENGTHS docs/main_job.md and the tiny gin file give the `_prefixed` tasks
  hold every question (after its language's prefix) and query of every language in the shared dev
  and test files, with the tasks' vocabulary and EOS, and are the smallest multiple of 8 that
  does."""
  import re  # pylint: disable=g-import-not-at-top
  page = (mains.REPO / "docs" / "main_job.md").read_text()
  gin_text = (mains.REPO / "gin" / "mcwq_t5x" / "tiny_random_split_en.gin").read_text()
  pattern = r"_prefixed` tasks[^`]*?need\s*(?:#\s*)?`?--gin\.TASK_FEATURE_LENGTHS=\"(\{[^}]*\})\""
  import ast  # pylint: disable=g-import-not-at-top
  docs = [ast.literal_eval(m) for m in re.findall(pattern, page + gin_text.replace("# ", ""))]
  assert len(docs) == 2 and docs[0] == docs[1], docs
  sp = vocab.get_vocabulary().tokenizer
  longest = {"inputs": 0, "targets": 0}
  for split in readers.SPLITS:
    for part in ("dev", "test"):
      for lang in readers.LANGUAGES:
        path = mcwq_dir / "official" / split / f"{part}.{lang}.txt"
        questions = [readers.split_official_line(l)[0] for l in readers.read_lines(path)]
        ids = sp.encode(
            [mcwq_tasks.input_prefix(lang) + readers.normalize_question(q) for q in questions])
        longest["inputs"] = max(longest["inputs"], max(map(len, ids)) + 1)  # + EOS
      # The queries are the same in every language.
      rirs = [e.rir for e in readers.read_split(split, part, "en")]
      longest["targets"] = max(longest["targets"], max(map(len, sp.encode(rirs))) + 1)
  assert longest == {"inputs": 70, "targets": 71}
  assert docs[0] == {k: -(-n // 8) * 8 for k, n in longest.items()}
