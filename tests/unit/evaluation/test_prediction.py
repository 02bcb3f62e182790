"""Tests of mcwq_t5x.evaluation.prediction with a tiny model and inputs built here: decoding a dataset in
batches (sorted by length, last batch padded, batch sizes rounded to the data-parallel devices)
gives, row for row, what the model decodes for the whole array at once."""
import contextlib
import json
import re

import jax
import numpy as np
import optax
import pytest

from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x.evaluation import prediction
import tiny_engine


@pytest.fixture(scope="module")
def model_and_params():
  partitioner = partitioning.Partitioner(devices=jax.devices()[:4])
  model = tiny_engine.tiny_model(0.0)
  tr = trainer_lib.Trainer(model, partitioner, lambda step: 0.0, optimizer=optax.set_to_zero())
  state = tr.create_state(tiny_engine.SHAPES)
  return model, partitioner, state.params


def test_batch_size_rounded_up_to_the_devices(model_and_params):
  _, partitioner, _ = model_and_params
  assert prediction.decoding_batch_size(6, partitioner) == 8
  assert prediction.decoding_batch_size(8, partitioner) == 8
  with pytest.raises(ValueError, match="positive"):
    prediction.decoding_batch_size(0, partitioner)


def test_infer_fn_matches_one_big_batch_in_row_order(model_and_params):
  model, partitioner, params = model_and_params
  rows = tiny_engine.synthetic_batch(3, batch=11)
  arrays = {k: rows[k] for k in prediction.DECODE_FEATURES}
  # 11 rows in batches of 6 -> 8 (4 devices): two batches, the second padded with 5 empty rows.
  tokens = prediction.get_infer_fn(model, partitioner, 6)(params, arrays)
  assert tokens.shape == (11, arrays["decoder_input_tokens"].shape[1])
  padded = {k: np.concatenate([v, np.zeros((1,) + v.shape[1:], v.dtype)]) for k, v in arrays.items()}
  reference = np.asarray(model.predict_batch(params, padded))[:11]
  np.testing.assert_array_equal(tokens, reference)


def test_infer_fn_empty_input(model_and_params):
  model, partitioner, params = model_and_params
  empty = {
      "encoder_input_tokens": np.zeros((0, 12), np.int32),
      "decoder_input_tokens": np.zeros((0, 10), np.int32)
  }
  assert prediction.get_infer_fn(model, partitioner, 4)(params, empty).shape == (0, 10)


# --- PREDICT_KWARGS, all decodes, output folders ------------------------------------------------
def test_predict_kwargs_checked_before_loading(model_and_params, tmp_path):
  """The documented beam-search form works; a misplaced decoding option is named at once, before
  any checkpoint or task is read."""
  from mcwq_t5x.data import pipeline  # pylint: disable=g-import-not-at-top
  from mcwq_t5x import eval as eval_lib  # pylint: disable=g-import-not-at-top
  model, partitioner, _ = model_and_params
  for ok in ({}, None, {
      "num_decodes": 4,
      "decoder_params": {
          "alpha": 0.6
      }
  }, {
      "method": "temperature_sample",
      "num_decodes": 1,
      "decoder_params": {
          "temperature": 0.7
      }
  }):
    prediction.check_predict_kwargs(model, ok)
  with pytest.raises(
      ValueError,
      match=r"unknown option\(s\) \['alpha'\].*decoder_params, e.g. beam search "
      r"\{'num_decodes': 4, 'decoder_params': \{'alpha': 0.6\}\}"):
    prediction.check_predict_kwargs(model, {"num_decodes": 4, "alpha": 0.6})
  with pytest.raises(ValueError, match=r"decoder_params \['temperature'\] are not taken"):
    prediction.check_predict_kwargs(model, {"num_decodes": 4, "decoder_params": {"temperature": 1}})
  with pytest.raises(ValueError, match="greedy decoding gives one sequence"):
    prediction.check_predict_kwargs(model, {"num_decodes": 2, "method": "greedy"})
  all_decodes = {"num_decodes": 2, "return_all_decodes": True}
  assert prediction.check_predict_kwargs(model, all_decodes, allow_all_decodes=True) == all_decodes
  with pytest.raises(ValueError, match="return_all_decodes=True .* evaluation scores one"):
    prediction.check_predict_kwargs(model, all_decodes)
  with pytest.raises(ValueError, match=r"unknown option\(s\) \['alpha'\]"):
    prediction.get_infer_fn(model, partitioner, 4, {"alpha": 0.6})
  # eval: the error comes first (no checkpoint exists, the task's vocabulary is not read).
  cfg = pipeline.DatasetConfig("mcwq_gold_he", None, "test", 4)
  with pytest.raises(ValueError, match=r"unknown option\(s\) \['alpha'\]"):
    eval_lib.evaluate(
        model=model,
        dataset_cfg=cfg,
        checkpoint_path=str(tmp_path / "missing"),
        predict_kwargs={
            "num_decodes": 4,
            "alpha": 0.6
        })


class _Vocab:
  """A stand-in vocabulary over tiny_engine's 64 tokens: one token per character."""
  vocab_size = tiny_engine.VOCAB
  eos_id = 1

  def encode(self, text):
    return [2 + ord(c) % (tiny_engine.VOCAB - 2) for c in text]

  def decode(self, ids):
    return " ".join(str(i) for i in ids if i > 1)


def test_infer_prints_all_decodes(model_and_params, tmp_path):
  """infer with return_all_decodes: num_decodes predictions per question (the last the best, the
  one printed without it), printed on the question's line separated by tabs."""
  from mcwq_t5x.checkpointing import checkpoints  # pylint: disable=g-import-not-at-top
  from mcwq_t5x import infer as infer_lib  # pylint: disable=g-import-not-at-top
  model, partitioner, params = model_and_params
  mgr = checkpoints.CheckpointManager(tmp_path, async_save=False)
  mgr.save(1, trainer_lib.TrainState(step=np.int32(1), params=params, opt_state={}), force=True)
  mgr.close()
  questions = ["Did M0 direct M1", "Who", "Was M2 a film"]
  kwargs = dict(
      model=model,
      checkpoint_path=str(tmp_path),
      vocabulary=_Vocab(),
      input_length=12,
      max_decode_length=6,
      batch_size=4,
      partitioner=partitioner)
  beams = infer_lib.infer(
      questions, predict_kwargs={
          "num_decodes": 3,
          "return_all_decodes": True
      }, **kwargs)
  assert [len(b) for b in beams] == [3, 3, 3] and all(isinstance(x, str) for b in beams for x in b)
  best = infer_lib.infer(questions, predict_kwargs={"num_decodes": 3}, **kwargs)
  assert [b[-1] for b in beams] == best
  lines = infer_lib.format_lines(beams).split("\n")
  assert lines[-1] == "" and [l.split("\t") for l in lines[:-1]] == beams
  assert infer_lib.format_lines([["a\tb", "c\nd"], "e"]) == "a b\tc d\ne\n"
  with pytest.raises(ValueError, match=r"unknown option\(s\) \['alpha'\]"):
    infer_lib.infer(questions, predict_kwargs={"alpha": 0.6}, **dict(kwargs, checkpoint_path="x"))


def test_check_writable(tmp_path):
  """An output folder that cannot be created (here under a regular file, which stops root too)
  fails with a clear error; a writable one is created and left empty."""
  out = prediction.check_writable(tmp_path / "a" / "b", "EVAL_OUTPUT_DIR")
  assert out.is_dir() and not list(out.iterdir())
  (tmp_path / "file").write_text("")
  with pytest.raises(
      prediction.UnwritableOutputError,
      match=r"cannot write to the EVAL_OUTPUT_DIR .*file/out \(.*Error: .*\); nothing was decoded"):
    prediction.check_writable(tmp_path / "file" / "out", "EVAL_OUTPUT_DIR")


@pytest.mark.parametrize("num_partitions", [1, 2])
def test_param_shapes_are_the_trainers_without_a_trainer(num_partitions):
  """`param_shapes` (eval_shape of the model's init) gives the shapes, dtypes and shardings of
  `Trainer.state_shapes(...).params`, which builds an optimizer state as well."""
  partitioner = partitioning.Partitioner(num_partitions=num_partitions, devices=jax.devices()[:4])
  model = tiny_engine.tiny_model(0.0)
  tr = trainer_lib.Trainer(model, partitioner, lambda step: 0.0, optimizer=optax.set_to_zero())
  shapes = {
      "encoder_input_tokens": (partitioner.data_parallel_size, 8),
      "decoder_input_tokens": (partitioner.data_parallel_size, 8)
  }
  expected = tr.state_shapes(shapes).params
  got = prediction.param_shapes(model, partitioner)
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
    assert (a.shape, a.dtype, a.sharding) == (b.shape, b.dtype, b.sharding)
  split = [a for a in jax.tree_util.tree_leaves(got) if not a.sharding.is_fully_replicated]
  assert bool(split) == (num_partitions > 1)


# --- metrics of a decoded split -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["mcwq_mcd1_he", "mcwq_mcd1_multilingual"])
def test_evaluate_split_gives_seqios_metrics_and_predictions(name):
  """`evaluate_split` computes the task's exact match and BLEU itself, from one batched read of the
  split: the same values as `seqio.Evaluator`'s own metric computation, the predictions in source
  order as SeqIO decodes and postprocesses them, and `<task>/<metric>` names for a mixture. The
  "model" returns each row's gold target, cut short on every third row, so both metrics are
  strictly between 0 and 100."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tasks.mcwq  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  from mcwq_t5x.data import pipeline  # pylint: disable=g-import-not-at-top

  def infer_fn(params, arrays):
    del params
    targets = np.roll(arrays["decoder_input_tokens"], -1, axis=1)  # gold targets, without EOS
    targets[::3, 4:] = 0
    return targets

  cfg = pipeline.DatasetConfig(name, None, "test", 16, shuffle=False, module="tasks.mcwq")
  split = prediction.make_evaluator(cfg, num_examples=30)
  assert isinstance(split, prediction.EvalSplit)
  metrics, predictions = prediction.evaluate_split(cfg, infer_fn, None, evaluator=split)
  evaluator = seqio.Evaluator(
      mixture_or_task_name=name,
      feature_converter=seqio.EncDecFeatureConverter(pack=False),
      eval_split="test",
      num_examples=30,
      shuffle=False)
  for task in evaluator.eval_tasks:  # the same feature arrays as SeqIO's cached model dataset
    rows = [ex for _, ex in evaluator.cached_model_datasets[task.name].as_numpy_iterator()]
    assert sorted(split.arrays[task.name]) == sorted(rows[0])
    for k, v in split.arrays[task.name].items():
      np.testing.assert_array_equal(v, np.stack([row[k] for row in rows]), err_msg=k)
  seqio_metrics, outputs = evaluator.evaluate(
      compute_metrics=True, predict_fn=prediction.seqio_predict_fn(infer_fn, None))
  expected_metrics, expected_predictions = {}, []
  for task in evaluator.eval_tasks:
    for k, v in seqio_metrics.result()[task.name].items():
      expected_metrics[k if len(evaluator.eval_tasks) == 1 else f"{task.name}/{k}"] = v
    tokens = outputs[task.name][seqio.metrics.ModelOutputType.PREDICTION]
    texts = prediction.decode_predictions(task.output_features["targets"].vocabulary, tokens)
    expected_predictions += [task.postprocess_fn(t, example=None, is_target=False) for t in texts]
  assert metrics == expected_metrics
  assert predictions == expected_predictions
  assert len(predictions) == 30 * len(evaluator.eval_tasks)
  for k, v in metrics.items():
    assert 0 < v < 100, (k, v)
  if name.endswith("multilingual"):
    assert sorted(metrics) == sorted(f"mcwq_mcd1_{lang}/{m}" for lang in ("en", "he", "kn", "zh")
                                     for m in ("bleu", "exact_match"))


@contextlib.contextmanager
def _validation_task(name: str, questions: list[str], tsv_file=None, **metrics):
  """Registers a SeqIO task `name` whose validation split is `questions` with three fixed RIR
  targets, tokenised as the MCWQ tasks are (`metrics`: `metric_fns=` or `metric_objs=`); removes
  it on exit. With `tsv_file`, the split is read from that file (a header line, then a line
  `question<TAB>target` an example) by a `seqio.TextLineDataSource`."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tasks.mcwq  # pylint: disable=g-import-not-at-top
  targets = ["ASK WHERE lb M0 wdt:P57 M1 rb", "SELECT ?x0", "ASK WHERE lb M1 rb"]

  def source(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({"inputs": questions, "targets": targets})

  def parse_tsv(dataset):
    fields = lambda line: tf.strings.split(line, "\t")
    return dataset.map(lambda line: {"inputs": fields(line)[0], "targets": fields(line)[1]})

  if tsv_file is None:
    data_source, parse = seqio.FunctionDataSource(source, splits=["validation"]), []
  else:
    tsv_file.write_text("".join(["question\tquery\n"] +
                                [f"{q}\t{t}\n" for q, t in zip(questions, targets)]))
    data_source = seqio.TextLineDataSource({"validation": str(tsv_file)}, skip_header_lines=1)
    parse = [parse_tsv]
  seqio.TaskRegistry.add(
      name,
      source=data_source,
      preprocessors=parse +
      [seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
      output_features=seqio.get_mixture_or_task("mcwq_gold_he").output_features,
      postprocess_fn=tasks.mcwq.postprocess_query,
      **metrics)
  try:
    yield name
  finally:
    seqio.TaskRegistry.remove(name)


def test_evaluate_split_falls_back_to_seqio_for_other_kinds_of_metric():
  """A task whose metric is a `metric_objs` entry (not a `metric_fns` function) is evaluated by
  `seqio.Evaluator` itself; an otherwise equal task with the function as `metric_fns` takes the
  batched path; both give the same metric and predictions."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tasks.mcwq  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.data import pipeline  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.evaluation import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

  def infer_fn(params, arrays):
    del params
    targets = np.roll(arrays["decoder_input_tokens"], -1, axis=1)
    targets[1, 2:] = 0  # the second prediction is cut short
    return targets

  exact_match = metrics_lib.exact_match_metric
  metric_kwargs = {
      "metric_fns": {
          "metric_fns": [exact_match]
      },
      "metric_objs": {
          "metric_objs": [
              seqio.metrics.LegacyMetric.empty(exact_match, tasks.mcwq.postprocess_query)
          ]
      }
  }
  results = {}
  for kind, kwargs in metric_kwargs.items():
    questions = ["Did M0 direct M1", "Who edited M0", "Was M1 a film"]
    with _validation_task(f"test_prediction_{kind}", questions, **kwargs) as name:
      cfg = pipeline.DatasetConfig(name, None, "validation", 2, shuffle=False)
      evaluator = prediction.make_evaluator(cfg)
      assert isinstance(evaluator, prediction.EvalSplit) == (kind == "metric_fns")
      results[kind] = prediction.evaluate_split(cfg, infer_fn, None, evaluator=evaluator)
  assert results["metric_fns"] == results["metric_objs"]
  assert results["metric_fns"][0] == {"exact_match": pytest.approx(200 / 3)}
  assert results["metric_fns"][1][0] == "ASK WHERE lb M0 wdt:P57 M1 rb"


@pytest.mark.parametrize("source", ["function", "tsv"])
def test_an_over_long_example_is_refused_before_compiling(source, tmp_path):
  """With TASK_FEATURE_LENGTHS None (the eval default: each split's longest example), a question
  of 10,000+ tokens is refused naming the example (its file and line where the task reads a file,
  else its position), its length and the setting (not made the padded length: a 5 MiB question
  would die in XLA with RESOURCE_EXHAUSTED); an explicit inputs length truncates it as
  T5X does. The MCWQ tasks' file and line: tests/unit/tasks/test_tasks.py."""
  from mcwq_t5x.data import pipeline  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.evaluation import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

  questions = ["Did M0 direct M1", "Who edited M0 " * 2500, "Was M1 a film"]
  tsv = tmp_path / "validation.tsv" if source == "tsv" else None
  where = (f"at {tsv}:3" if tsv else "in the split's source order")  # line 1: the header
  with _validation_task(
      f"test_prediction_too_long_{source}",
      questions,
      tsv_file=tsv,
      metric_fns=[metrics_lib.exact_match_metric]) as name:
    cfg = pipeline.DatasetConfig(name, None, "validation", 2, shuffle=False)
    with pytest.raises(prediction.ExampleTooLongError) as e:
      prediction.make_evaluator(cfg)
    assert re.match(
        rf"^{name}/validation: example 2 \({re.escape(where)}; its inputs begin 'Who edited M0 "
        r"Who.*'\) is [\d,]+ tokens long, more than the 4,096 .*Set TASK_FEATURE_LENGTHS = "
        r"\{'inputs': N", str(e.value)), str(e.value)
    cfg = pipeline.DatasetConfig(name, {"inputs": 64}, "validation", 2, shuffle=False)
    split = prediction.make_evaluator(cfg)
    assert split.sequence_length["inputs"] == 64


def test_an_over_long_mcwq_example_is_named_by_its_file(tmp_path):
  """An MCWQ task (tasks/mcwq.py, here of a release layout made here): the over-long example is
  named by its dataset.json record, as `readers` number them."""
  import json as json_lib  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  import tasks.mcwq  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.data import pipeline  # pylint: disable=g-import-not-at-top
  questions = ["Did M0 direct M1", "Was M1 a film", "Who edited M0 " * 2500]
  (tmp_path / "dataset.json").write_text(
      json_lib.dumps([{
          "questionPatternModEntities": q,
          "sparqlPatternModEntities": "ASK WHERE {\nM0 wdt:P57 M1\n}"
      } for q in questions]))
  (tmp_path / "splits").mkdir()
  (tmp_path /
   "splits/mcd1.json").write_text('{"trainIdxs": [], "devIdxs": [0, 2, 1], "testIdxs": []}')
  names = tasks.mcwq.register_mcwq_tasks(suffix="_too_long", data_dir=str(tmp_path))
  try:
    cfg = pipeline.DatasetConfig("mcwq_mcd1_en_too_long", None, "validation", 2, shuffle=False)
    with pytest.raises(
        prediction.ExampleTooLongError,
        match=(r"^mcwq_mcd1_en_too_long/validation: example 2 \(at "
               rf"{re.escape(str(tmp_path / 'dataset.json'))}, record 3; its inputs begin 'Who ")):
      prediction.make_evaluator(cfg)
  finally:
    for name in names:
      for registry in (seqio.TaskRegistry, seqio.MixtureRegistry):
        if name in registry.names():
          registry.remove(name)


def test_a_rewrite_on_a_full_disk_keeps_the_previous_predictions_and_metrics(tmp_path, full_disk):
  """Re-running eval on a full disk keeps the earlier good predictions and metrics, both with their
  previous contents (no partial file beside the old metrics)."""
  import types  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.data import writers  # pylint: disable=g-import-not-at-top
  cfg = types.SimpleNamespace(mixture_or_task_name="mcwq_gold_he", split="test")
  pred_path, met_path = prediction.write_predictions(tmp_path, cfg, ["a", "b"], {"exact_match": 50})
  before = pred_path.read_text(), met_path.read_text()
  assert before[0] == "a\nb\n" and json.loads(before[1])["num_examples"] == 2
  full_disk(3)
  with pytest.raises(writers.ResultWriteError, match=f"cannot write {pred_path}: No space left"):
    prediction.write_predictions(tmp_path, cfg, ["c", "d", "e"], {"exact_match": 0})
  assert (pred_path.read_text(), met_path.read_text()) == before
  assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
      ["predictions", "metrics", pred_path.name, met_path.name])
