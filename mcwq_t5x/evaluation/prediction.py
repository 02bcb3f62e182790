"""The prediction stage (files -> task -> model -> **predictions** -> metrics), shared by the mains.

Counterpart of T5X's `pipeline.get_infer_fn` and the decoding half of `t5x/train.py` /
`t5x/eval.py`: `get_infer_fn` decodes feature arrays in batches, `evaluate_split` scores one task
split with the values `seqio.Evaluator` gives, `write_predictions` writes the files both mains
write, and `check_writable` / `check_predict_kwargs` fail before anything is loaded. Functions
take the parameters and return the outputs; only the compiled decoding step of each batch shape
is kept. SeqIO/TensorFlow are imported lazily.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import logging
import os
import pathlib
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_loaders
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import writers
from mcwq_t5x.engine import model as model_lib
from mcwq_t5x.engine import partitioning

# Features the decoder reads (the rest of a feature-converted batch is dropped before decoding).
DECODE_FEATURES = ("encoder_input_tokens", "decoder_input_tokens")
InferFn = Callable[..., np.ndarray]


def decoding_batch_size(batch_size: int, partitioner: partitioning.Partitioner) -> int:
  """`batch_size` rounded up to a multiple of the mesh's data-parallel size; ValueError if < 1."""
  if int(batch_size) < 1:
    raise ValueError(f"decoding batch size must be positive, got {batch_size}")
  dp = partitioner.data_parallel_size
  # As T5X pads inference batches: the extra rows are padding.
  rounded = -(-int(batch_size) // dp) * dp
  if rounded != batch_size:
    logging.info(
        "decoding batch size %d rounded up to %d (a multiple of the %d data-parallel "
        "devices; the extra rows are padding)", batch_size, rounded, dp)
  return rounded


class UnwritableOutputError(OSError):
  """An output folder cannot be created or written (checked before any decoding)."""


def check_writable(out_dir: str | pathlib.Path, what: str = "output folder") -> pathlib.Path:
  """`out_dir` as a path, made (with parents) and probed with a file by process 0.

  Raises UnwritableOutputError (an OSError naming the folder `what` and the cause).
  """
  out_dir = pathlib.Path(out_dir)
  # why: an unwritable folder must fail before a split is decoded, not after.
  if jax.process_index() != 0:
    return out_dir
  probe = out_dir / f".write-probe-{os.getpid()}"
  try:
    out_dir.mkdir(parents=True, exist_ok=True)
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as e:
    error = UnwritableOutputError(f"cannot write to the {what} {out_dir} ({type(e).__name__}: "
                                  f"{e}); nothing was decoded: choose a writable folder")
    error.errno = e.errno
    raise error from e
  return out_dir


def check_predict_kwargs(model: Any,
                         predict_kwargs: Optional[Mapping[str, Any]],
                         allow_all_decodes: bool = False) -> dict[str, Any]:
  """PREDICT_KWARGS as a dict, checked against `model.predict_batch_with_aux`'s keyword arguments.

  For `EncoderDecoderModel`: `num_decodes`, `method`, `decoder_params` (e.g. {"alpha": 0.6}),
  `return_all_decodes` (only with `allow_all_decodes`), `prompt_with_targets`,
  `max_decode_length`; values by `model.check_decode_options`. ValueError names the bad option and
  the accepted ones.
  """
  if predict_kwargs is not None and not isinstance(predict_kwargs, Mapping):
    raise ValueError(f"PREDICT_KWARGS must be a dict, got {predict_kwargs!r}")
  kwargs = dict(predict_kwargs or {})
  fn = getattr(model, "predict_batch_with_aux", None) or model.predict_batch
  params = inspect.signature(fn).parameters.values()
  if not any(q.kind == q.VAR_KEYWORD for q in params):
    accepted = [
        q.name
        for q in params
        if q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY) and q.name not in ("self", "params",
                                                                                  "batch", "rng")
    ]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
      hint = ""
      if isinstance(model, model_lib.EncoderDecoderModel):
        taken = sorted({k for ks in model_lib.DECODER_PARAMS.values() for k in ks})
        if set(unknown) & set(taken):
          hint = ("; options of the decoding method go into decoder_params, e.g. beam search "
                  "{'num_decodes': 4, 'decoder_params': {'alpha': 0.6}}")
      raise ValueError(f"PREDICT_KWARGS {predict_kwargs!r}: unknown option(s) {unknown} of "
                       f"{type(model).__name__}.{fn.__name__} (it takes {accepted}){hint}")
  if isinstance(model, model_lib.EncoderDecoderModel):
    try:
      model_lib.check_decode_options(
          kwargs.get("num_decodes", 1), kwargs.get("method"), kwargs.get("decoder_params"))
    except (TypeError, ValueError) as e:
      raise ValueError(f"PREDICT_KWARGS {predict_kwargs!r}: {e}") from e
  if kwargs.get("return_all_decodes") and not allow_all_decodes:
    raise ValueError(
        f"PREDICT_KWARGS {predict_kwargs!r}: return_all_decodes=True gives num_decodes sequences "
        "per example, but evaluation scores one prediction per example: remove it (the best "
        "decode is the prediction; mcwq_t5x.infer prints all decodes)")
  return kwargs


def get_infer_fn(model: Any,
                 partitioner: partitioning.Partitioner,
                 batch_size: int,
                 predict_kwargs: Optional[Mapping[str, Any]] = None) -> InferFn:
  """`infer_fn(params, arrays, rng=None) -> tokens`, compiled per batch shape.

  `arrays`: int32 features [N, ...] (at least `encoder_input_tokens` [N, input_length] and
  `decoder_input_tokens` [N, max_decode_length]); returns int32 [N, max_decode_length], or
  [N, num_decodes, max_decode_length] with `return_all_decodes` (ascending score, best last), in
  row order on every process. Batches are sharded over the data axis. ValueError: bad
  `predict_kwargs` or batch size.
  """
  kwargs = check_predict_kwargs(model, predict_kwargs, allow_all_decodes=True)
  batch_size = decoding_batch_size(batch_size, partitioner)
  compiled: dict[Any, Callable] = {}

  def compiled_for(params, batch):
    key = tuple(sorted((k, v.shape) for k, v in batch.items()))
    if key not in compiled:
      param_shardings = jax.tree_util.tree_map(lambda x: x.sharding, params)

      def predict(p, b, rng):
        return model.predict_batch(p, b, rng=rng, **kwargs)

      compiled[key] = partitioner.partition(
          predict,
          in_shardings=(param_shardings, partitioner.data_sharding, partitioner.replicated),
          out_shardings=partitioner.replicated)
    return compiled[key]

  def infer_fn(params,
               arrays: Mapping[str, np.ndarray],
               rng: Optional[jax.Array] = None) -> np.ndarray:
    n = len(arrays["encoder_input_tokens"])
    if n == 0:
      decodes = (int(kwargs.get("num_decodes", 1)),) if kwargs.get("return_all_decodes") else ()
      return np.zeros((0,) + decodes + (arrays["decoder_input_tokens"].shape[1],), np.int32)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    # why: longest inputs first, so the loop, which stops when a whole batch has ended, wastes
    # little.
    order = np.argsort(-(arrays["encoder_input_tokens"] > 0).sum(axis=1), kind="stable")
    # Every batch is dispatched before any result is fetched (one host sync at the end, not one
    # per batch): the host pads and transfers the next batch while the device decodes.
    outs = []
    for i, start in enumerate(range(0, n, batch_size)):
      rows = order[start:start + batch_size]
      chunk, real = pipeline.pad_batch({k: arrays[k][rows] for k in DECODE_FEATURES}, batch_size)
      batch = {k: jax.device_put(v, partitioner.data_sharding) for k, v in chunk.items()}
      outs.append((compiled_for(params, batch)(params, batch, jax.random.fold_in(rng, i)), real))
    tokens = np.concatenate([np.asarray(t)[:real] for t, real in jax.device_get(outs)])
    result = np.empty_like(tokens)
    result[order] = tokens
    return result

  return infer_fn


def seqio_predict_fn(infer_fn: InferFn, params: Any) -> Callable[..., list]:
  """A `seqio.Evaluator` predict_fn: unbatched (index, features) dataset -> [(index, tokens)]."""

  def predict_fn(dataset: Any, model_feature_shapes: Any = None) -> list[tuple[int, list[int]]]:
    del model_feature_shapes
    indices, features = [], []
    for index, example in dataset.batch(1024).as_numpy_iterator():
      indices.append(np.asarray(index))
      features.append(example)
    arrays = pipeline.dataset_to_arrays(features)
    if not arrays:
      return []
    tokens = infer_fn(params, arrays)
    # One `tolist` per array (not a Python int per token): the same lists, much faster.
    return list(zip(np.concatenate(indices).tolist(), np.asarray(tokens).tolist()))

  return predict_fn


def decode_predictions(vocabulary: Any, tokens: Any) -> list[str]:
  """Token rows (int [N, L], or N lists) -> N strings, `vocabulary.decode(row)` (to the first
  EOS)."""
  # One `tolist()` for the array: no Python conversion per token.
  rows = tokens.tolist() if isinstance(tokens, np.ndarray) else tokens
  return [vocabulary.decode(row) for row in rows]


@dataclasses.dataclass
class EvalSplit:
  """A split read once and decoded and scored repeatedly (`seqio.Evaluator`'s cache, as NumPy).

  `tasks`: the evaluated subtasks (`seqio.evaluation.get_valid_eval_tasks`), mixture order;
  `examples` and `arrays` (int32 [N, ...], `EncDecFeatureConverter(pack=False)`) per task, source
  order; `sequence_length`: the config's, else each feature's longest example over all tasks.
  """
  tasks: list[Any]
  examples: dict[str, list[dict[str, Any]]]
  arrays: dict[str, dict[str, np.ndarray]]
  sequence_length: dict[str, int]

  @property
  def eval_tasks(self) -> list[Any]:
    """`tasks`, under `seqio.Evaluator`'s name."""
    return self.tasks


# The longest feature (tokens, EOS included) that a decoding evaluation pads to when
# TASK_FEATURE_LENGTHS leaves its length to the data: the encoder's attention logits of one batch
# take batch x heads x length^2 x 4 bytes (32 x 6 x 4,096^2 x 4 = 12.9 GB for mT5-small); MCWQ's
# questions and RIR queries are far shorter. A longer example is refused, never padded to.
MAX_INFERRED_LENGTH = 4096


class ExampleTooLongError(ValueError):
  """An example is longer than `MAX_INFERRED_LENGTH` tokens and no TASK_FEATURE_LENGTHS bounds it
  (the message names the example's file and line, else its position, its length and the
  setting)."""


def example_location(task: Any, split: str, index: int) -> Optional[str]:
  """"FILE:LINE" (1-based) of example `index` (0-based, source order, unshuffled) of a SeqIO
  task's `split`, where its source knows it, else None.

  Known for a source with `example_location(split, index)` (tasks/mcwq.py's) and for a
  `seqio.TextLineDataSource` of one local file (its preprocessors taken to keep every line, as
  SeqIO's own do; the line must exist); another `seqio.FileDataSource` of one file gives "FILE"
  alone.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  source = getattr(task, "source", None)
  if callable(getattr(source, "example_location", None)):
    return source.example_location(split, index)
  if not isinstance(source, seqio.FileDataSource):
    return None
  try:
    files = source.list_shards(split)
  except KeyError:
    return None
  if len(files) != 1:
    return None  # why: several files are interleaved, the position says nothing of the line
  if not isinstance(source, seqio.TextLineDataSource):
    return files[0]
  line = index + 1 + source._skip_header_lines  # pylint: disable=protected-access
  try:
    with open(files[0], "rb") as f:
      if sum(1 for _ in itertools.islice(f, line)) < line:
        return files[0]  # why: fewer lines than examples: a preprocessor made them
  except OSError:  # not a local file (gs://...)
    return files[0]
  return f"{files[0]}:{line}"


def check_inferred_lengths(cfg: pipeline.DatasetConfig,
                           examples: Mapping[str, Sequence[Mapping]],
                           lengths: Optional[Mapping[str, int]],
                           tasks: Optional[Mapping[str, Any]] = None) -> None:
  """Raises ExampleTooLongError for the longest example of a feature whose length comes from the
  data (`lengths` lacks it) when it exceeds `MAX_INFERRED_LENGTH` tokens; `tasks` (name -> SeqIO
  task) let the message name the example's file and line (`example_location`)."""
  for k in ("inputs", "targets"):
    if (lengths or {}).get(k):
      continue  # why: an explicit length truncates, with pipeline.warn_truncated's warning
    for task, exs in examples.items():
      sizes = [len(ex[k]) for ex in exs]
      if not sizes or max(sizes) <= MAX_INFERRED_LENGTH:
        continue
      i = int(np.argmax(sizes))
      text = exs[i].get(f"{k}_pretokenized", b"")
      text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
      where = example_location((tasks or {}).get(task), cfg.split, i)
      where = f"at {where}" if where else "in the split's source order"
      raise ExampleTooLongError(
          f"{task}/{cfg.split}: example {i + 1} ({where}; its {k} begin "
          f"{text[:60]!r}) is {sizes[i]:,} tokens long, more than the {MAX_INFERRED_LENGTH:,} "
          f"a decoding evaluation pads to when TASK_FEATURE_LENGTHS leaves the {k} length to the "
          f"data. Set TASK_FEATURE_LENGTHS = {{'inputs': N, 'targets': M}} (gin, or "
          f"--gin.TASK_FEATURE_LENGTHS=\"{{'{k}': N, ...}}\") to truncate it, or remove the "
          "example")


@pipeline.without_autograph
def make_evaluator(cfg: pipeline.DatasetConfig, num_examples: Optional[int] = None) -> Any:
  """`cfg`'s split tokenised once: an `EvalSplit` when every metric is `prediction_metric_fns`
  (MCWQ's tasks), else a `seqio.Evaluator`.

  None lengths in `cfg` mean the split's maximum. Raises ValueError (unknown task),
  ExampleTooLongError (an unbounded feature over `MAX_INFERRED_LENGTH` tokens).
  """
  import seqio  # pylint: disable=g-import-not-at-top
  task_or_mixture = pipeline.get_mixture_or_task(cfg.mixture_or_task_name, cfg.module)
  pipeline.warn_truncated(cfg, pipeline.count_truncated(cfg, num_examples=num_examples))
  lengths = dict(cfg.task_feature_lengths) if cfg.task_feature_lengths else None
  tasks = list(
      seqio.evaluation.get_valid_eval_tasks(seqio.get_subtasks(task_or_mixture), cfg.split))
  converter = seqio.EncDecFeatureConverter(pack=False)
  if not tasks or not all(prediction_metric_fns(task) is not None for task in tasks):
    return seqio.Evaluator(
        mixture_or_task_name=cfg.mixture_or_task_name,
        feature_converter=converter,
        eval_split=cfg.split,
        use_cached=cfg.use_cached,
        seed=cfg.seed,
        sequence_length=lengths,
        num_examples=num_examples,
        shuffle=False,
        async_compute_metrics=False)
  datasets, examples = {}, {}
  longest = {k: 0 for k in converter.TASK_FEATURES}  # inputs, targets
  for task in tasks:
    ds = task.get_dataset(
        sequence_length=lengths,
        split=cfg.split,
        shuffle=False,
        num_epochs=1,
        seed=cfg.seed,
        use_cached=cfg.use_cached)
    if num_examples:
      ds = ds.take(num_examples)
    datasets[task.name] = ds.cache()
    examples[task.name] = task_examples(datasets[task.name])
    for k in longest:
      longest[k] = max([longest[k]] + [len(ex[k]) for ex in examples[task.name]])
  sequence_length = {k: (lengths or {}).get(k) or longest[k] for k in longest}
  check_inferred_lengths(cfg, examples, lengths,
                         {t.name: t for t in tasks})  # why: before anything is padded or compiled
  arrays = {
      name:
          pipeline.dataset_to_arrays(
              converter(ds, sequence_length).batch(1024).as_numpy_iterator())
      for name, ds in datasets.items()
  }
  return EvalSplit(tasks, examples, arrays, sequence_length)


def prediction_metric_fns(task: Any) -> Optional[list[Callable[..., Mapping[str, Any]]]]:
  """The task's metrics when all are SeqIO `metric_fns` of (targets, predictions), else None."""
  fns = list(task.metric_fns)
  if fns and len(task.metric_objs) == len(fns) and len(task.predict_metric_fns) == len(fns):
    return fns
  return None


def task_examples(dataset: Any, batch_size: int = 1024) -> list[dict[str, Any]]:
  """The examples of a finite, unbatched task dataset as `tfds.as_numpy` gives them, in order."""
  examples: list[dict[str, Any]] = []
  # In batches: much faster than one example at a time.
  for batch in dataset.ragged_batch(batch_size):
    columns = {k: list(v.numpy()) for k, v in batch.items()}
    n = len(next(iter(columns.values()))) if columns else 0
    examples.extend({k: column[i] for k, column in columns.items()} for i in range(n))
  return examples


def metrics_of_predictions(task: Any, examples: Sequence[Mapping[str, Any]],
                           tokens: Any) -> tuple[dict[str, Any], list[str]]:
  """({metric: value}, postprocessed predictions) of decoded `tokens`, as `seqio.Evaluator`
  computes.

  As `seqio.metrics.LegacyMetric`: targets are `targets_pretokenized` (else decoded `targets`),
  both sides go through the task's `postprocess_fn`, each `metric_fn` sees the whole split.
  ValueError: not one row per example, or two metric functions giving the same name.
  """
  vocabulary = task.output_features["targets"].vocabulary
  if len(tokens) != len(examples):
    raise ValueError(f"task {task.name}: {len(tokens)} predictions for {len(examples)} examples")

  def postprocess(text, example, is_target):
    if isinstance(text, bytes):
      text = text.decode("utf-8")
    if task.postprocess_fn is None:
      return text
    return task.postprocess_fn(text, example=example, is_target=is_target)

  targets = [
      postprocess(
          ex["targets_pretokenized"] if "targets_pretokenized" in ex else vocabulary.decode(
              list(ex["targets"])), ex, True) for ex in examples
  ]
  predictions = [
      postprocess(text, ex, False)
      for ex, text in zip(examples, decode_predictions(vocabulary, tokens))
  ]
  metrics: dict[str, Any] = {}
  for metric_fn in prediction_metric_fns(task) or ():
    for name, value in metric_fn(targets=targets, predictions=predictions).items():
      if name in metrics:
        raise ValueError(f"Duplicate metric key '{name}' in Task '{task.name}'.")
      metrics[name] = value
  return metrics, predictions


def evaluate_split(cfg: pipeline.DatasetConfig,
                   infer_fn: InferFn,
                   params: Any,
                   num_examples: Optional[int] = None,
                   *,
                   evaluator: Any = None,
                   return_predictions: bool = True) -> tuple[dict[str, float], list[str]]:
  """(metrics, predictions) of one task split: the values of `seqio.Evaluator`, predictions
  postprocessed as T5X writes them, source order ([] without `return_predictions`).

  Metrics are `{name: float}` (prefixed `<task>/` for a mixture). `evaluator`: from
  `make_evaluator`, for repeated evaluation of one split. ValueError: unknown task.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  if evaluator is None:
    evaluator = make_evaluator(cfg, num_examples)
  metrics_by_task: dict[str, Mapping[str, Any]] = {}
  predictions: list[str] = []
  if isinstance(evaluator, EvalSplit):
    for task in evaluator.tasks:
      arrays = evaluator.arrays[task.name]
      tokens = infer_fn(params, {k: arrays[k] for k in DECODE_FEATURES}) if arrays else []
      examples = evaluator.examples[task.name]
      metrics_by_task[task.name], texts = metrics_of_predictions(task, examples, tokens)
      predictions.extend(texts if return_predictions else ())
  else:
    all_metrics, all_outputs = evaluator.evaluate(
        compute_metrics=True, predict_fn=seqio_predict_fn(infer_fn, params))
    metrics_by_task = all_metrics.result()
    for task in evaluator.eval_tasks if return_predictions else ():
      tokens = all_outputs[task.name][seqio.metrics.ModelOutputType.PREDICTION]
      post = task.postprocess_fn or (lambda text, **_: text)
      for text in decode_predictions(task.output_features["targets"].vocabulary, tokens):
        predictions.append(post(text, example=None, is_target=False))
  metrics: dict[str, float] = {}
  for task_name, task_metrics in metrics_by_task.items():
    for k, v in task_metrics.items():
      key = k if len(metrics_by_task) == 1 else f"{task_name}/{k}"
      metrics[key] = float(np.asarray(getattr(v, "value", v)))
  return metrics, predictions


def write_predictions(
    out_dir: str | pathlib.Path,
    cfg: pipeline.DatasetConfig,
    predictions: Sequence[str],
    metrics: Mapping[str, Any],
    extra: Optional[Mapping[str, Any]] = None) -> tuple[pathlib.Path, pathlib.Path]:
  """(predictions path, metrics path): `predictions/<task>_<split>.txt`,
  `metrics/<task>_<split>.json`.

  One line per prediction, source order; the JSON holds task, split, num_examples, the metrics and
  `extra`. Process 0 writes, each file whole or not at all, metrics last. Raises
  writers.ResultWriteError (that file and the later ones keep their contents).
  """
  out_dir = pathlib.Path(out_dir)
  pred_path = run_folder.predictions_file(out_dir, cfg.mixture_or_task_name, cfg.split)
  met_path = run_folder.metrics_file(out_dir, cfg.mixture_or_task_name, cfg.split)
  if jax.process_index() == 0:
    # Exactly one line per prediction: inner line breaks become spaces.
    writers.write_atomic(pred_path, (" ".join(p.splitlines()) + "\n" for p in predictions))
    record = {
        "task": cfg.mixture_or_task_name,
        "split": cfg.split,
        "num_examples": len(predictions),
        **dict(metrics),
        **dict(extra or {})
    }
    # Metrics last: metrics never describe predictions that are not on disk.
    writers.write_atomic(met_path,
                         json.dumps(pipeline.to_jsonable(record), indent=2, sort_keys=True) + "\n")
  return pred_path, met_path


def param_shapes(model: Any, partitioner: partitioning.Partitioner) -> Any:
  """The model's parameters as `jax.ShapeDtypeStruct`s with `NamedSharding`s (T5X names).

  The same as `Trainer.state_shapes(...).params`; nothing is allocated, no optimizer built.
  """
  shapes = {
      "encoder_input_tokens": (partitioner.data_parallel_size, 8),
      "decoder_input_tokens": (partitioner.data_parallel_size, 8)
  }
  return partitioner.abstract_params(lambda rng: model.get_initial_variables(rng, shapes)["params"])


# Bad input the mains print as one line (`console.one_line_exit`): each message names the file
# or example and the problem.
INPUT_ERRORS = (ExampleTooLongError, *checkpoint_paths.INPUT_ERRORS,
                checkpoints.NoUsableCheckpointError)  # why: also UnreadableCheckpointError


def load_params(model: Any,
                partitioner: partitioning.Partitioner,
                checkpoint_path: str,
                abstract_params: Any = None) -> tuple[Any, Optional[int], pathlib.Path]:
  """(params, step or None, MODEL_DIR-like folder) from any checkpoint `checkpoint_loaders` reads,
  sharded over the mesh with the model's dtypes.

  Raises FileNotFoundError / ValueError (nothing, or no checkpoint, at the path),
  CheckpointMismatchError, UnreadableCheckpointError, NoUsableCheckpointError.
  """
  if abstract_params is None:
    abstract_params = param_shapes(model, partitioner)
  loaded = checkpoint_loaders.load_params(checkpoint_path, model.module.config, abstract_params)
  return loaded.params, loaded.step, loaded.directory
