#!/usr/bin/env python3
r"""Training speed of our engine against Hugging Face transformers (PyTorch) on the same work.

  python scripts/benchmark_vs_hf.py [--repeats 2] [--host_devices 2] [--max_examples 256]
  python scripts/benchmark_vs_hf.py --modes decode --checkpoint runs/tiny_random_split_en
  # mT5-small at the paper's lengths: a step, greedy and beam-4 from one export of initial weights
  python scripts/benchmark_vs_hf.py --shape mt5_small --modes fixed,decode --batch_size 2 \
    --decode_model bench --decode_train_steps 0 --max_examples 32 --decode_batch_size 16
  python scripts/benchmark_vs_hf.py --modes eval --checkpoint runs/tiny_random_split_en \
    --split test --repeats 2

Both train the same mT5-layout network with Adafactor on the same batches of one SeqIO split,
each in a fresh process, interleaved `--repeats` times. `--modes`: `epoch` (packed rows vs
length-grouped dynamic padding), `fixed`, `decode` (greedy and beam, a checkpoint and its
`export_hf` export), `eval`. Prints throughput, wall time, peak RSS, FLOP/s against the matmul
peak and the ratios ours/hf (docs/benchmarks.md). Needs PyTorch and transformers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _peak_rss_gib() -> float:
  """Peak resident set size of this process in GiB (Linux `ru_maxrss` is in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _network_config(args: argparse.Namespace):
  """The benchmark network as `mcwq_t5x.engine.network.T5Config`: `_flop_config`'s fields, float32, an
  untied output layer."""
  from mcwq_t5x.engine import network
  return network.T5Config(
      **vars(_flop_config(args)),
      dropout_rate=args.dropout_rate,
      remat_policy=args.remat_policy,
      logits_via_embedding=False,
      dtype="float32")


def _dataset_config(args: argparse.Namespace, pack: bool):
  from mcwq_t5x.data import pipeline
  return pipeline.DatasetConfig(
      mixture_or_task_name=args.task,
      task_feature_lengths={
          "inputs": args.pack_input_length,
          "targets": args.pack_target_length
      },
      split=args.split,
      batch_size=args.batch_size,
      shuffle=True,
      seed=0,
      pack=pack,
      module="tasks.mcwq")


EXAMPLES_FILE = "examples.json"
TEXTS_FILE = "texts.json"  # the same examples' (input, target) strings


def _examples(args: argparse.Namespace) -> list[tuple[list[int], list[int]]]:
  """The split's (input ids, target ids) with EOS, truncated to the lengths, source order.

  The first worker of a run tokenises the split with SeqIO and writes the pairs to
  `--work_dir`/examples.json; the later workers read them there, so that the HF processes never
  import TensorFlow (as a transformers user's would not).
  """
  path = os.path.join(args.work_dir, EXAMPLES_FILE) if args.work_dir else ""
  if path and os.path.exists(path):
    with open(path) as f:
      return [(list(i), list(t)) for i, t in json.load(f)]
  from mcwq_t5x.data import pipeline
  task = pipeline.get_mixture_or_task(args.task, "tasks.mcwq")
  ds = task.get_dataset(
      sequence_length={
          "inputs": args.input_length,
          "targets": args.target_length
      },
      split=args.split,
      shuffle=False)
  out, texts = [], []
  for ex in ds.as_numpy_iterator():
    out.append(
        (ex["inputs"][:args.input_length].tolist(), ex["targets"][:args.target_length].tolist()))
    texts.append((ex["inputs_pretokenized"].decode(), ex["targets_pretokenized"].decode()))
    if args.max_examples and len(out) >= args.max_examples:
      break
  if path:
    with open(path, "w") as f:
      json.dump(out, f)
    with open(os.path.join(args.work_dir, TEXTS_FILE), "w") as f:
      json.dump(texts, f)
  return out


# --- ours -------------------------------------------------------------------------------------
def _our_model(args: argparse.Namespace):
  from mcwq_t5x.engine import model as model_lib
  from mcwq_t5x.engine import network
  return model_lib.EncoderDecoderModel(network.Transformer(_network_config(args)), z_loss=0.0)


def _our_trainer_cls(args: argparse.Namespace):
  import functools

  from mcwq_t5x.engine import trainer as trainer_lib
  lr = trainer_lib.create_learning_rate_schedule(args.learning_rate, "constant")
  tx = trainer_lib.make_optimizer(lr, "adafactor", adafactor_multiply_by_parameter_scale=False)
  return functools.partial(
      trainer_lib.Trainer,
      learning_rate_fn=lr,
      optimizer=tx,
      use_hardware_rng=args.use_hardware_rng)


def ours_epoch(args: argparse.Namespace) -> dict[str, Any]:
  """One epoch through `mcwq_t5x.train.train` (packed rows); see the module docstring."""
  import numpy as np

  from mcwq_t5x.data import pipeline
  from mcwq_t5x.engine import flops
  from mcwq_t5x.engine import partitioning
  from mcwq_t5x import train as train_lib
  _examples(args)  # written for the HF worker that runs next (not timed)
  cfg = _dataset_config(args, pack=True)
  rows = pipeline.load_feature_arrays(cfg, 0, 1)
  per_row = rows["decoder_segment_ids"].max(axis=1)  # examples packed into each row
  num_rows = len(per_row)
  if args.max_examples:  # as many rows as hold the first max_examples examples
    num_rows = max(1, int(np.searchsorted(np.cumsum(per_row), args.max_examples)) + 1)
  steps = math.ceil(num_rows / args.batch_size)
  with tempfile.TemporaryDirectory() as model_dir:
    result = train_lib.train(
        model=_our_model(args),
        train_dataset_cfg=cfg,
        model_dir=model_dir,
        total_steps=steps,
        partitioner=partitioning.Partitioner(),
        trainer_cls=_our_trainer_cls(args),
        eval_period=0,
        log_every_steps=max(steps, 1),
        checkpoint_period=10**9,
        keep_checkpoints=1)
  seconds = result["train_time_s"]
  split_tokens = int(rows["decoder_loss_weights"].sum())
  # Examples and target tokens seen: steps x batch rows at the split's mean per row.
  seen_rows = steps * args.batch_size
  n = seen_rows * float(per_row.mean())
  tokens = seen_rows * float(rows["decoder_loss_weights"].sum(axis=1).mean())
  step_flops = flops.train_step_flops(
      _flop_config(args), args.batch_size, args.pack_input_length, args.pack_target_length)
  return {
      "system": "ours",
      "mode": "epoch",
      "steps": steps,
      "rows": num_rows,
      "examples": n,
      "seconds": seconds,
      "examples_per_s": n / seconds,
      "target_tokens_per_s": tokens / seconds,
      "peak_rss_gib": _peak_rss_gib(),
      "devices": _device_count(),
      "split_target_tokens": split_tokens if not args.max_examples else None,
      "flops": steps * step_flops,
      "peak": _peak_dict(result["matmul_peak"])
  }


def _peak_dict(peak: Any) -> dict[str, Any]:
  """A `flops.MatmulPeak` as JSON: {"gflops", "kernel", "measured"}."""
  return {"gflops": peak.gflops, "kernel": peak.kernel, "measured": dict(peak.measured)}


def _torch_matmul(x, y) -> Any:
  """`torch.matmul` of two NumPy arrays (zero-copy views), the HF workers' extra peak kernel."""
  import torch
  return torch.matmul(torch.from_numpy(x), torch.from_numpy(y))


def _hf_peak() -> dict[str, Any]:
  """The matmul peak in an HF worker: NumPy's and PyTorch's float32 products (no JAX)."""
  from mcwq_t5x.engine import flops
  return _peak_dict(flops.matmul_peak(kernels=("numpy",), extra={"torch": _torch_matmul}))


def _device_count() -> int:
  import jax
  return jax.device_count()


def _flop_config(args: argparse.Namespace) -> Any:
  """The fields of the benchmark network that `flops.train_step_flops` reads, without importing
  JAX (the HF worker counts its FLOPs with the same formula)."""
  import types
  return types.SimpleNamespace(
      emb_dim=args.emb_dim,
      num_heads=args.num_heads,
      head_dim=args.head_dim,
      mlp_dim=args.mlp_dim,
      mlp_activations=("gelu", "linear"),
      num_encoder_layers=args.num_layers,
      num_decoder_layers=args.num_layers,
      vocab_size=args.vocab_size)


def _fixed_batch(args: argparse.Namespace, examples) -> dict[str, Any]:
  """`batch_size` examples padded to exactly input_length/target_length (no packing)."""
  import numpy as np
  b, li, lt = args.batch_size, args.input_length, args.target_length
  batch = {
      "encoder_input_tokens": np.zeros((b, li), np.int32),
      "decoder_target_tokens": np.zeros((b, lt), np.int32),
      "decoder_input_tokens": np.zeros((b, lt), np.int32),
      "decoder_loss_weights": np.zeros((b, lt), np.int32),
  }
  for i in range(b):
    inp, tgt = examples[i % len(examples)]
    batch["encoder_input_tokens"][i, :len(inp)] = inp
    batch["decoder_target_tokens"][i, :len(tgt)] = tgt
    batch["decoder_input_tokens"][i, 1:len(tgt)] = tgt[:-1]
    batch["decoder_loss_weights"][i, :len(tgt)] = 1
  return batch


def _step_memory(trainer: Any, state: Any, batch: dict[str, Any]) -> dict[str, float]:
  """XLA's memory analysis of the compiled train step in GiB: `temp` (the step's own buffers),
  `arguments`, `outputs`, `alias` (donated state) and `total` (arguments + outputs + temp - alias).
  `state` may be `Trainer.state_shapes`; compiles the step, runs nothing."""
  import jax
  shardings = jax.tree_util.tree_map(lambda x: x.sharding, state)
  compiled = trainer.compile_train_step(shardings, batch).lower(state, batch, trainer.dropout_rng,
                                                                trainer.initial_guard()).compile()
  m = compiled.memory_analysis()
  figures = {
      "temp": m.temp_size_in_bytes,
      "arguments": m.argument_size_in_bytes,
      "outputs": m.output_size_in_bytes,
      "alias": m.alias_size_in_bytes
  }
  figures["total"] = figures["arguments"] + figures["outputs"] + figures["temp"] - figures["alias"]
  return {k: v / 2**30 for k, v in figures.items()}


def ours_memory(args: argparse.Namespace) -> dict[str, Any]:
  """XLA's memory analysis of our train step at each of `--memory_batch_sizes` (compiled, never
  run: no batch of that size needs to fit), 1 device."""
  import jax
  import jax.numpy as jnp

  from mcwq_t5x.engine import partitioning
  partitioner = partitioning.Partitioner(devices=jax.devices()[:1])
  trainer = _our_trainer_cls(args)(model=_our_model(args), partitioner=partitioner, seed=0)
  out = {}
  for rows in [int(b) for b in args.memory_batch_sizes.split(",")]:
    shapes = {
        "encoder_input_tokens": (rows, args.input_length),
        **{
            k: (rows, args.target_length)
            for k in ("decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights")
        }
    }
    batch = {
        k: jax.ShapeDtypeStruct(v, jnp.int32, sharding=partitioner.data_sharding)
        for k, v in shapes.items()
    }
    trainer._state_shardings = None  # pylint: disable=protected-access
    state = trainer.state_shapes(shapes, {k: jnp.int32 for k in shapes})
    out[str(rows)] = _step_memory(trainer, state, batch)
  return {"system": "ours", "mode": "memory", "memory": out, "peak_rss_gib": _peak_rss_gib()}


def ours_fixed(args: argparse.Namespace) -> dict[str, Any]:
  """`Trainer.train_step` on fixed-shape batches, 1 device; see the module docstring."""
  import jax
  import jax.numpy as jnp

  from mcwq_t5x.engine import flops
  from mcwq_t5x.engine import partitioning
  examples = _examples(args)
  batch = _fixed_batch(args, examples)
  partitioner = partitioning.Partitioner(devices=jax.devices()[:1])
  trainer = _our_trainer_cls(args)(model=_our_model(args), partitioner=partitioner, seed=0)
  state = trainer.create_state({
      k: v.shape for k, v in batch.items()
  }, {k: jnp.int32 for k in batch})
  global_batch = partitioner.make_global_batch(batch)
  peak = _peak_dict(flops.matmul_peak())
  times = []
  for i in range(args.fixed_steps + args.fixed_warmup_steps):
    t = time.time()
    state, metrics = trainer.train_step(state, global_batch)
    jax.block_until_ready(metrics)
    if i >= args.fixed_warmup_steps:
      times.append(time.time() - t)
  result = _fixed_result("ours", args, batch["decoder_loss_weights"].sum(), times, peak)
  result["xla_memory_gib"] = _step_memory(trainer, state, dict(global_batch))
  return result


def _fixed_result(system: str, args: argparse.Namespace, target_tokens, times,
                  peak: dict[str, Any]) -> dict[str, Any]:
  from mcwq_t5x.engine import flops
  seconds = sum(times) / len(times)
  step_flops = flops.train_step_flops(
      _flop_config(args), args.batch_size, args.input_length, args.target_length)
  return {
      "system": system,
      "mode": "fixed",
      "steps": len(times),
      "s_per_step": seconds,
      "seconds": sum(times),
      "examples_per_s": args.batch_size / seconds,
      "target_tokens_per_s": float(target_tokens) / seconds,
      "peak_rss_gib": _peak_rss_gib(),
      "flops": len(times) * step_flops,
      "peak": peak
  }


# --- Hugging Face ------------------------------------------------------------------------------
def _hf_model(args: argparse.Namespace):
  import torch
  import transformers
  torch.manual_seed(0)
  config = transformers.MT5Config(
      vocab_size=args.vocab_size,
      d_model=args.emb_dim,
      d_kv=args.head_dim,
      d_ff=args.mlp_dim,
      num_layers=args.num_layers,
      num_decoder_layers=args.num_layers,
      num_heads=args.num_heads,
      dropout_rate=args.dropout_rate,
      feed_forward_proj="gated-gelu",
      tie_word_embeddings=False,
      decoder_start_token_id=0,
      pad_token_id=0,
      eos_token_id=1)
  model = transformers.MT5ForConditionalGeneration(config)
  model.train()
  optimizer = transformers.optimization.Adafactor(
      model.parameters(),
      lr=args.learning_rate,
      scale_parameter=False,
      relative_step=False,
      warmup_init=False)
  return model, optimizer


def _hf_batch(pairs, pad_to=None):
  """Dynamic padding (to the longest in the batch, or to `pad_to`), labels padded with -100."""
  import torch
  li = pad_to[0] if pad_to else max(len(i) for i, _ in pairs)
  lt = pad_to[1] if pad_to else max(len(t) for _, t in pairs)
  ids = torch.zeros((len(pairs), li), dtype=torch.long)
  mask = torch.zeros((len(pairs), li), dtype=torch.long)
  labels = torch.full((len(pairs), lt), -100, dtype=torch.long)
  for r, (inp, tgt) in enumerate(pairs):
    ids[r, :len(inp)] = torch.tensor(inp)
    mask[r, :len(inp)] = 1
    labels[r, :len(tgt)] = torch.tensor(tgt)
  return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _hf_step(model, optimizer, batch) -> float:
  loss = model(**batch).loss
  loss.backward()
  optimizer.step()
  optimizer.zero_grad(set_to_none=True)
  return float(loss.detach())


def hf_epoch(args: argparse.Namespace) -> dict[str, Any]:
  """One epoch of the HF model, length-grouped batches; see the module docstring."""
  from mcwq_t5x.engine import flops
  import torch
  from transformers.trainer_pt_utils import LengthGroupedSampler
  examples = _examples(args)
  model, optimizer = _hf_model(args)
  sampler = LengthGroupedSampler(
      args.batch_size,
      lengths=[len(i) + len(t) for i, t in examples],
      generator=torch.Generator().manual_seed(0))
  order = list(sampler)
  batches = [
      _hf_batch([examples[j]
                 for j in order[k:k + args.batch_size]])
      for k in range(0, len(order), args.batch_size)
  ]
  peak = _hf_peak()
  t = time.time()
  for batch in batches:
    _hf_step(model, optimizer, batch)
  seconds = time.time() - t
  tokens = sum(len(t) for _, t in examples)
  epoch_flops = sum(
      flops.train_step_flops(_flop_config(args), *b["input_ids"].shape, b["labels"].shape[1])
      for b in batches)
  return {
      "system": "hf",
      "mode": "epoch",
      "steps": len(batches),
      "examples": len(examples),
      "seconds": seconds,
      "examples_per_s": len(examples) / seconds,
      "target_tokens_per_s": tokens / seconds,
      "peak_rss_gib": _peak_rss_gib(),
      "threads": torch.get_num_threads(),
      "flops": epoch_flops,
      "peak": peak,
      "split_target_tokens": tokens if not args.max_examples else None
  }


def hf_fixed(args: argparse.Namespace) -> dict[str, Any]:
  """The HF step on batches padded to exactly input_length/target_length."""
  examples = _examples(args)
  model, optimizer = _hf_model(args)
  pairs = [examples[i % len(examples)] for i in range(args.batch_size)]
  batch = _hf_batch(pairs, pad_to=(args.input_length, args.target_length))
  peak = _hf_peak()
  times = []
  for i in range(args.fixed_steps + args.fixed_warmup_steps):
    t = time.time()
    _hf_step(model, optimizer, batch)
    if i >= args.fixed_warmup_steps:
      times.append(time.time() - t)
  return _fixed_result("hf", args, (batch["labels"] != -100).sum(), times, peak)


# --- decode -----------------------------------------------------------------------------------
# `--decode_model` for the benchmark network itself (the `--vocab_size` ... flags, float32).
BENCH_NETWORK = "bench"

DECODE_METHODS = {
    "greedy": {
        "num_decodes": 1
    },
    "beam4": {
        "num_decodes": 4,
        "decoder_params": {
            "alpha": 0.6
        }
    },
}


def _decode_config(args: argparse.Namespace):
  """The decoded network: the one recorded in `--checkpoint`'s run.json (any run of our engine),
  else the `--decode_model` preset; dropout off.

  Raises:
    ValueError: a run.json that cannot be read or does not describe a `T5Config`.
  """
  import dataclasses

  from mcwq_t5x.checkpointing import run_info
  from mcwq_t5x.engine import network
  run_path = run_info.find(args.checkpoint) if args.checkpoint else None
  if run_path is None and args.decode_model == BENCH_NETWORK:
    return dataclasses.replace(_network_config(args), dropout_rate=0.0)
  if run_path is None:
    return network.get_config(args.decode_model, dropout_rate=0.0)
  config = run_info.network_config(run_info.read(run_path), run_path)
  return dataclasses.replace(config, dropout_rate=0.0)


def _decode_questions(args: argparse.Namespace) -> tuple[list[list[int]], int]:
  """The split's input ids (with EOS, source order) and the decode length."""
  examples = _examples(args)
  length = args.decode_length or max(len(t) for _, t in examples)
  return [i for i, _ in examples], length


def prep_decode(args: argparse.Namespace) -> dict[str, Any]:
  """Without `--checkpoint`: trains the `--decode_model` preset and exports it for HF (with one,
  the first `ours_decode` worker exports it)."""
  from mcwq_t5x.data import pipeline
  from mcwq_t5x.engine import model as model_lib
  from mcwq_t5x.engine import network
  from mcwq_t5x.engine import partitioning
  from mcwq_t5x.evaluation import prediction
  from mcwq_t5x import train as train_lib
  config = _decode_config(args)
  model = model_lib.EncoderDecoderModel(network.Transformer(config))
  checkpoint = args.checkpoint
  if not checkpoint and args.decode_train_steps == 0:
    return _export_initialised(args, model, config)
  if not checkpoint:
    checkpoint = os.path.join(args.work_dir, "model")
    cfg = pipeline.DatasetConfig(
        mixture_or_task_name=args.task,
        task_feature_lengths={
            "inputs": args.input_length,
            "targets": args.target_length
        },
        split=args.split,
        batch_size=args.batch_size,
        shuffle=True,
        seed=0,
        module="tasks.mcwq")
    steps = args.decode_train_steps
    train_config = (
        _network_config(args)
        if args.decode_model == BENCH_NETWORK else network.get_config(args.decode_model))
    train_lib.train(
        model=model_lib.EncoderDecoderModel(network.Transformer(train_config)),
        train_dataset_cfg=cfg,
        model_dir=checkpoint,
        total_steps=steps,
        partitioner=partitioning.Partitioner(),
        trainer_cls=_our_trainer_cls(args),
        eval_period=0,
        log_every_steps=steps,
        checkpoint_period=10**9,
        keep_checkpoints=1)
  params = prediction.load_params(model, partitioning.Partitioner(), checkpoint)[0]
  vocab = _checked_vocabulary(args, checkpoint)
  _export(params, config, _hf_dir(args), vocab, args.target_length)
  _examples(args)  # the token ids and texts, for the HF workers
  return {"checkpoint": checkpoint}


def _export_initialised(args: argparse.Namespace, model, config) -> dict[str, Any]:
  """`--decode_train_steps 0`: the network's initial weights (seed 0), exported for HF; both
  systems then load that export (ours through `checkpoint_loaders`' Hugging Face reader)."""
  import jax
  import numpy as np

  from mcwq_t5x.data import pipeline
  from mcwq_t5x.engine import model as model_lib
  _, length = _decode_questions(args)
  shapes = {"encoder_input_tokens": (1, 8), "decoder_input_tokens": (1, 8)}
  params = model_lib.unbox(model.get_initial_variables(jax.random.PRNGKey(0), shapes))["params"]
  vocab = pipeline.output_vocabulary(args.task, "tasks.mcwq")
  _export(jax.tree_util.tree_map(np.asarray, params), config, _hf_dir(args), vocab, length)
  return {"checkpoint": _hf_dir(args)}


def _hf_dir(args: argparse.Namespace) -> str:
  return os.path.join(args.work_dir, "hf")


def _checked_vocabulary(args: argparse.Namespace, checkpoint: str):
  """The task's vocabulary, checked against the one the run recorded (`run_info`)."""
  from mcwq_t5x.checkpointing import run_info
  from mcwq_t5x.data import pipeline
  vocab = pipeline.output_vocabulary(args.task, "tasks.mcwq")
  run_info.check_vocabulary(vocab, checkpoint, f"task {args.task}")
  return vocab


def _infer_vocabulary(checkpoint: str):
  """The vocabulary as the infer main reads it (gin/mcwq_t5x/runs/infer.gin): the run's recorded
  one unless $MCWQ_VOCAB names another, with SentencePiece alone (no TensorFlow or SeqIO, as
  transformers' worker reads its tokenizer), checked against the run."""
  from mcwq_t5x.checkpointing import run_info
  from mcwq_t5x.data import vocab
  run_info.adopt_recorded_vocabulary(checkpoint)
  vocabulary = vocab.get_vocabulary(sentencepiece_only=True)
  run_info.check_vocabulary(vocabulary, checkpoint, "decode")
  return vocabulary


def _export(params, config, hf_dir: str, vocab, target_length: int) -> None:
  """`mcwq_t5x.checkpointing.export_hf` of `params` to `hf_dir`, unless a worker of this run already did."""
  from mcwq_t5x.checkpointing import export_hf
  if os.path.exists(os.path.join(hf_dir, "config.json")):
    return
  export_hf.export_params(
      jax_to_numpy(params),
      config,
      hf_dir,
      vocab.sentencepiece_model_file,
      vocab.extra_ids,
      max_new_tokens=target_length,
      overwrite=True)


def jax_to_numpy(tree):
  import jax
  return jax.tree_util.tree_map(lambda x: __import__("numpy").asarray(x), jax.device_get(tree))


def until_eos(row: Any) -> list[int]:
  """A decoded row's token ids up to its first EOS (id 1, included), without padding (id 0)."""
  ids = [int(i) for i in row]
  if 1 in ids:
    ids = ids[:ids.index(1) + 1]
  while ids and ids[-1] == 0:
    ids.pop()
  return ids


def _decode_result(system: str, method: str, args: argparse.Namespace, tokens: Any,
                   texts: list[str], seconds: float, peak: dict[str, Any]) -> dict[str, Any]:
  """Writes the predictions' token ids (`until_eos`) to `--work_dir`/{system}_{method}.json (the
  driver compares the systems' token ids) and returns the figures, with the model FLOPs
  (`flops.decode_flops` of the questions' lengths and of the system's own predictions' lengths)."""
  from mcwq_t5x.engine import flops
  predictions = [until_eos(row) for row in tokens]
  with open(os.path.join(args.work_dir, f"{system}_{method}.json"), "w") as f:
    json.dump(predictions, f)
  questions, _ = _decode_questions(args)
  work = flops.decode_flops(
      _decode_config(args), [len(q) for q in questions], [len(p) for p in predictions],
      DECODE_METHODS[method]["num_decodes"])
  return {
      "flops": work,
      "peak": peak,
      "system": system,
      "mode": "decode",
      "method": method,
      "questions": len(texts),
      "seconds": seconds,
      "questions_per_s": len(texts) / seconds,
      "peak_rss_gib": _peak_rss_gib()
  }


def ours_decode(args: argparse.Namespace, method: str) -> dict[str, Any]:
  """`mcwq_t5x.evaluation.prediction` on the questions (the mains' decoding) with the infer main's
  vocabulary (`_infer_vocabulary`); see the module docstring."""
  import numpy as np

  from mcwq_t5x.engine import flops
  from mcwq_t5x.engine import model as model_lib
  from mcwq_t5x.engine import network
  from mcwq_t5x.engine import partitioning
  from mcwq_t5x.evaluation import prediction
  cached = _use_compilation_cache(args, method)  # why first: JAX reads the setting once
  questions, length = _decode_questions(args)
  arrays = {
      "encoder_input_tokens": np.zeros((len(questions), max(map(len, questions))), np.int32),
      "decoder_input_tokens": np.zeros((len(questions), length), np.int32)
  }
  for r, q in enumerate(questions):
    arrays["encoder_input_tokens"][r, :len(q)] = q
  config = _decode_config(args)
  model = model_lib.EncoderDecoderModel(network.Transformer(config))
  partitioner = partitioning.Partitioner()
  params = prediction.load_params(model, partitioner, args.checkpoint)[0]
  vocab = _infer_vocabulary(args.checkpoint)
  peak = _peak_dict(flops.matmul_peak())  # XLA's defaults, as the decoding itself
  t = time.time()
  infer_fn = prediction.get_infer_fn(model, partitioner, args.decode_batch_size,
                                     DECODE_METHODS[method])
  tokens = np.asarray(infer_fn(params, arrays))
  texts = prediction.decode_predictions(vocab, tokens)
  result = _decode_result("ours", method, args, tokens, texts, time.time() - t, peak)
  result["compilation"] = "cache" if cached else "compiled"
  _export(params, config, _hf_dir(args), vocab, args.target_length)  # after the peak RSS is read
  return result


def _use_compilation_cache(args: argparse.Namespace, method: str) -> bool:
  """The eval main's persistent compilation cache (`engine.compilation_cache`), in a folder of
  this run and method: the first worker compiles and writes it, later ones load it. True when it
  already held programs (JAX writes those that took over 1 s to compile)."""
  import jax

  from mcwq_t5x.engine import compilation_cache
  if compilation_cache.turned_off():
    return False  # why: the user turned the mains' cache off, so the eval main would compile
  folder = os.path.join(args.work_dir, "jax_cache", method)
  jax.config.update("jax_compilation_cache_dir", folder)  # why: not the user's, maybe warm, cache
  cached = _holds_programs(folder)
  return compilation_cache.use_persistent_cache() is not None and cached


def _holds_programs(folder: str) -> bool:
  """Whether a compilation cache folder holds programs (JAX writes those that took over 1 s to
  compile; its `.lockfile` is not one)."""
  return os.path.isdir(folder) and any(not n.startswith(".") for n in os.listdir(folder))


def hf_decode(args: argparse.Namespace, method: str) -> dict[str, Any]:
  """transformers' `generate` on the export, length-sorted batches; see the module docstring."""
  import torch
  import transformers

  questions, length = _decode_questions(args)
  model = transformers.MT5ForConditionalGeneration.from_pretrained(_hf_dir(args))
  model.eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(_hf_dir(args))
  beams = DECODE_METHODS[method]["num_decodes"]
  order = sorted(range(len(questions)), key=lambda i: -len(questions[i]))
  texts: list[str] = [""] * len(questions)
  tokens: list[Any] = [None] * len(questions)
  peak = _hf_peak()
  t = time.time()
  with torch.inference_mode():
    for k in range(0, len(order), args.decode_batch_size):
      rows = order[k:k + args.decode_batch_size]
      li = max(len(questions[i]) for i in rows)
      ids = torch.zeros((len(rows), li), dtype=torch.long)
      mask = torch.zeros((len(rows), li), dtype=torch.long)
      for r, i in enumerate(rows):
        ids[r, :len(questions[i])] = torch.tensor(questions[i])
        mask[r, :len(questions[i])] = 1
      out = model.generate(
          input_ids=ids,
          attention_mask=mask,
          max_new_tokens=length,
          do_sample=False,
          num_beams=beams,
          length_penalty=DECODE_METHODS[method].get("decoder_params", {}).get("alpha", 1.0),
          decoder_start_token_id=0,
          eos_token_id=1,
          pad_token_id=0)
      batch_tokens = out[:, 1:].tolist()  # without the decoder start token
      batch_texts = tokenizer.batch_decode(batch_tokens, skip_special_tokens=True)
      for r, i in enumerate(rows):
        tokens[i], texts[i] = batch_tokens[r], batch_texts[r]
  return _decode_result("hf", method, args, tokens, texts, time.time() - t, peak)


def hf_eval(args: argparse.Namespace) -> dict[str, Any]:
  """What a transformers user's evaluation script does, as one process (timed by the driver).

  Loads the export, tokenises the questions with its tokenizer, `generate`s greedily in
  length-sorted batches of `--decode_batch_size` (`torch.inference_mode()`), decodes the texts,
  scores exact match against the targets (whitespace runs as one space, as the task's
  postprocessing) and writes one prediction per line. Its input is the split's (question, target)
  strings that our first worker wrote, so it pays no data reading or RIR conversion of its own.
  """
  import torch
  import transformers
  with open(os.path.join(args.work_dir, TEXTS_FILE)) as f:
    texts = json.load(f)
  _, length = _decode_questions(args)
  tokenizer = transformers.AutoTokenizer.from_pretrained(_hf_dir(args))
  model = transformers.MT5ForConditionalGeneration.from_pretrained(_hf_dir(args)).eval()
  ids = tokenizer([q for q, _ in texts]).input_ids
  order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
  predictions = [""] * len(ids)
  with torch.inference_mode():
    for k in range(0, len(order), args.decode_batch_size):
      rows = order[k:k + args.decode_batch_size]
      batch = tokenizer.pad({"input_ids": [ids[i] for i in rows]}, return_tensors="pt")
      out = model.generate(
          **batch,
          max_new_tokens=length,
          do_sample=False,
          num_beams=1,
          decoder_start_token_id=0,
          eos_token_id=1,
          pad_token_id=0)
      for i, text in zip(rows, tokenizer.batch_decode(out, skip_special_tokens=True)):
        predictions[i] = " ".join(text.split())
  exact = sum(p == " ".join(t.split()) for p, (_, t) in zip(predictions, texts))
  with open(os.path.join(args.work_dir, "hf_eval.txt"), "w", encoding="utf-8") as f:
    f.write("".join(p + "\n" for p in predictions))
  return {"exact_match": 100.0 * exact / max(len(texts), 1), "questions": len(texts)}


def _our_eval_command(args: argparse.Namespace, checkpoint: str, out_dir: str) -> list[str]:
  """The README's eval command (`python -m mcwq_t5x.eval`, greedy, TASK_FEATURE_LENGTHS None) on
  `checkpoint`, with the `--decode_model` preset's gin file and the fields where the decoded
  network differs from that preset as `network.get_config` bindings."""
  import dataclasses

  from mcwq_t5x.engine import network
  preset = network.CONFIGS[args.decode_model]
  config = _decode_config(args)
  differ = [
      f.name
      for f in dataclasses.fields(config)
      if getattr(config, f.name) != getattr(preset, f.name) and f.name != "dropout_rate"
  ]
  overrides = [f"--gin.network.get_config.{k}={getattr(config, k)!r}" for k in differ]
  return [
      sys.executable, "-m", "mcwq_t5x.eval",
      f"--gin_file=gin/mcwq_t5x/models/{args.decode_model}.gin",
      "--gin_file=gin/mcwq_t5x/runs/eval.gin", f"--gin.MIXTURE_OR_TASK_NAME={args.task!r}",
      f"--gin.SPLIT={args.split!r}", f"--gin.CHECKPOINT_PATH={checkpoint!r}",
      f"--gin.EVAL_OUTPUT_DIR={out_dir!r}", f"--gin.BATCH_SIZE={args.decode_batch_size}",
      *([f"--gin.NUM_EXAMPLES={args.max_examples}"] if args.max_examples else []), *overrides
  ]


WORKERS = {
    ("ours", "epoch"): ours_epoch,
    ("ours", "fixed"): ours_fixed,
    ("ours", "memory"): ours_memory,
    ("hf", "epoch"): hf_epoch,
    ("hf", "fixed"): hf_fixed,
    ("prep", "decode"): prep_decode,
    ("hf", "eval"): hf_eval,
    **{
        ("ours", f"decode-{m}"): (lambda a, m=m: ours_decode(a, m)) for m in DECODE_METHODS
    },
    **{
        ("hf", f"decode-{m}"): (lambda a, m=m: hf_decode(a, m)) for m in DECODE_METHODS
    },
}


# --- driver ------------------------------------------------------------------------------------
def _run_worker(system: str, mode: str, argv: list[str], host_devices: int) -> dict[str, Any]:
  """Runs one measurement in a fresh process and returns its JSON result.

  Raises:
    RuntimeError: the worker failed (its stderr's end is in the message).
  """
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  if system == "ours" and mode == "epoch" and host_devices > 1:
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={host_devices}"
  env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  proc = subprocess.run(
      [sys.executable,
       os.path.abspath(__file__), "--worker", f"{system}:{mode}", *argv],
      env=env,
      capture_output=True,
      text=True,
      check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"{system} {mode} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def matmul_peak_of_run(results: dict[tuple[str, str], list[dict[str, Any]]]) -> dict[str, Any]:
  """The run's matmul peak: the fastest float32 product any worker timed in its own process
  (`flops.matmul_peak` before its training: ours NumPy's and XLA's, HF NumPy's and PyTorch's).

  Returns:
    {"gflops", "kernel", "line"}: the line names the kernel and each kernel's best of the run,
    e.g. "matmul peak: 135.0 GFLOP/s (XLA; best per kernel: numpy 130.2, XLA 135.0, torch
    133.1; 2048x2048 float32, timed in each worker)".
  """
  best: dict[str, float] = {}
  for runs in results.values():
    for r in runs:
      for kernel, gflops in r["peak"]["measured"].items():
        best[kernel] = max(best.get(kernel, 0.0), gflops)
  kernel = max(best, key=best.get)
  each = ", ".join(f"{k} {v:.1f}" for k, v in best.items())
  return {
      "gflops": best[kernel],
      "kernel": kernel,
      "line": f"matmul peak: {best[kernel]:.1f} GFLOP/s ({kernel}; best per kernel: {each}; "
              "2048x2048 float32, timed in each worker)"
  }


def _rate(x: float) -> str:
  """A rate or a time with one decimal, three below 10 (mT5-small's step on a CPU: 0.041 ex/s; a
  16-question decode: 0.046 s)."""
  return f"{x:8.1f}" if x >= 10 else f"{x:8.3f}"


def _line(r: dict[str, Any]) -> str:
  return (f"{r['system']:>4} {r['mode']:<5} {_rate(r['examples_per_s'])} ex/s "
          f"{r['target_tokens_per_s']:9.0f} tgt tok/s {_rate(r['seconds'])} s "
          f"{r['peak_rss_gib']:5.2f} GiB peak RSS  ({r['steps']} steps)" +
          ("  XLA step memory: temp {temp:.2f} GiB, total {total:.2f} GiB".format(
              **r["xla_memory_gib"]) if "xla_memory_gib" in r else ""))


def _decode_line(r: dict[str, Any]) -> str:
  compilation = {"compiled": "  (compiles)", "cache": "  (compilation cache)"}
  return (f"{r['system']:>4} decode {r['method']:<6} {_rate(r['questions_per_s'])} questions/s "
          f"{_rate(r['seconds'])} s {r['peak_rss_gib']:5.2f} GiB peak RSS  "
          f"{r['identical']}/{r['questions']} identical{compilation.get(r.get('compilation'), '')}")


def _decode_driver(args: argparse.Namespace, argv: list[str],
                   work_dir: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
  """`--modes decode`: prepare the checkpoint and its export, then ours/hf per method.

  Returns:
    (system, "decode-" + method) -> that pair's runs (the figures of `_decode_result`).
  """
  print(
      f"decode: {'checkpoint ' + args.checkpoint if args.checkpoint else 'training the '}"
      f"{'' if args.checkpoint else args.decode_model + ' preset for '}"
      f"{'' if args.checkpoint else str(args.decode_train_steps) + ' steps'}; exporting it",
      flush=True)
  if not args.checkpoint:
    prep = _run_worker("prep", "decode", argv, 1)
    argv = argv + ["--checkpoint", prep["checkpoint"]]
  methods = _decode_methods(args)
  runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for _ in range(args.repeats):
    for method in methods:
      pair = {}
      for system in ("ours", "hf"):
        pair[system] = _run_worker(system, f"decode-{method}", argv, 1)
        with open(os.path.join(work_dir, f"{system}_{method}.json")) as f:
          pair[system]["tokens"] = json.load(f)
      same = sum(a == b for a, b in zip(pair["ours"]["tokens"], pair["hf"]["tokens"]))
      for system in ("ours", "hf"):
        r = pair[system]
        r["identical"] = same
        del r["tokens"]
        runs.setdefault((system, method), []).append(r)
        print(_decode_line(r), flush=True)
  # Ours: the runs that compiled (the first) and those that loaded the compilation cache, apart.
  means, cached = {}, {}
  for method in methods:
    for system in ("ours", "hf"):
      rs = runs[(system, method)]
      first = [r for r in rs if r.get("compilation") != "cache"]
      means[(system, method)] = sum(r["questions_per_s"] for r in first) / len(first)
      print(f"mean {system} decode {method}: {_rate(means[(system, method)]).strip()} "
            f"questions/s over {len(first)} run(s){' that compiled' if system == 'ours' else ''}")
      warm = [r["questions_per_s"] for r in rs if r.get("compilation") == "cache"]
      if warm:
        cached[method] = sum(warm) / len(warm)
        print(f"mean ours decode {method} with the compilation cache: "
              f"{_rate(cached[method]).strip()} questions/s over {len(warm)} run(s)")
  for method in methods:
    if method in cached:
      print(f"decode {method} ratio ours/hf with the compilation cache: "
            f"{cached[method] / means[('hf', method)]:.2f}")
  for method in methods:
    if method != "greedy":
      print(f"decode {method} ratio ours/hf: "
            f"{means[('ours', method)] / means[('hf', method)]:.2f}")
  if "greedy" in methods:
    print(
        f"decode ratio ours/hf: {means[('ours', 'greedy')] / means[('hf', 'greedy')]:.2f}",
        flush=True)
  return {(system, f"decode-{method}"): rs for (system, method), rs in runs.items()}


def _timed_process(command: list[str], compilation_cache: str = "") -> tuple[float, float, str]:
  """Runs `command` (cwd: the repository, without XLA_FLAGS; with `compilation_cache`, the mains'
  persistent compilation cache in that folder instead of the user's) and returns (wall seconds from
  start to exit, its peak RSS in GiB, its stdout).

  Raises:
    RuntimeError: it failed (the end of its stderr is in the message).
  """
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  if compilation_cache:
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # why: it would win over ours
    env["MCWQ_T5X_COMPILATION_CACHE"] = compilation_cache
  env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  t = time.time()
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.time() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    if proc.returncode != 0:
      raise RuntimeError(f"{' '.join(command[:4])} ... failed (exit {proc.returncode}):\n"
                         f"{err.read()[-4000:]}")
    return seconds, usage.ru_maxrss / 2**20, out.read()


def _eval_driver(args: argparse.Namespace, argv: list[str], work_dir: str) -> None:
  """`--modes eval`: the README's eval command against a transformers user's script, each as a
  whole process (imports, loading, data, decoding, scoring, writing), on the same checkpoint."""
  checkpoint = args.checkpoint
  if not os.path.exists(os.path.join(_hf_dir(args), "config.json")) or not os.path.exists(
      os.path.join(work_dir, TEXTS_FILE)):
    checkpoint = _run_worker("prep", "decode", argv, 1)["checkpoint"]
  checkpoint = checkpoint or os.path.join(work_dir, "model")
  from mcwq_t5x.engine import compilation_cache
  name = f"{args.task}_{args.split}"
  seconds: dict[str, list[float]] = {"ours": [], "hf": []}
  for r in range(args.repeats):
    out_dir = os.path.join(work_dir, f"ours_eval_{r}")
    # why a cache of the run: the first process compiles, the later ones load its programs (a
    # user's own cache could make even the first one warm).
    # A user's opt-out (MCWQ_T5X_COMPILATION_CACHE=off) stays: then every process compiles.
    cache = "" if compilation_cache.turned_off() else os.path.join(work_dir, "jax_cache", "eval")
    warm = bool(cache) and _holds_programs(cache)
    ours_s, ours_rss, _ = _timed_process(_our_eval_command(args, checkpoint, out_dir), cache)
    hf_s, hf_rss, hf_out = _timed_process(
        [sys.executable, os.path.abspath(__file__), "--worker", "hf:eval", *argv])
    with open(os.path.join(out_dir, "metrics", f"{name}.json")) as f:
      ours_em = json.load(f)["exact_match"]
    with open(os.path.join(out_dir, "predictions", f"{name}.txt"), encoding="utf-8") as f:
      ours_p = f.read().splitlines()
    with open(os.path.join(work_dir, "hf_eval.txt"), encoding="utf-8") as f:
      hf_p = f.read().splitlines()
    hf = json.loads(hf_out.strip().splitlines()[-1])
    same = sum(a == b for a, b in zip(ours_p, hf_p))
    rows = {"ours": (ours_s, ours_rss, ours_em), "hf": (hf_s, hf_rss, hf["exact_match"])}
    for system, (s, rss, em) in rows.items():
      seconds[system].append(s)
      compiled = {"ours": "  (compilation cache)" if warm else "  (compiles)", "hf": ""}
      print(
          f"{system:>4} eval process {s:8.1f} s {rss:5.2f} GiB peak RSS  exact match "
          f"{em:.2f}  {same}/{hf['questions']} identical{compiled[system]}",
          flush=True)
  means = {k: sum(v) / len(v) for k, v in seconds.items()}
  print(f"eval process time ours/hf: {means['ours'] / means['hf']:.2f}", flush=True)


def _decode_methods(args: argparse.Namespace) -> list[str]:
  """The `--decode_methods` names, in order, without repeats.

  Raises:
    SystemExit: (argparse's error) an unknown name, or none.
  """
  methods = list(dict.fromkeys(m.strip() for m in args.decode_methods.split(",") if m.strip()))
  unknown = [m for m in methods if m not in DECODE_METHODS]
  if unknown or not methods:
    raise SystemExit(f"--decode_methods {args.decode_methods!r}: unknown {unknown}; choose from "
                     f"{sorted(DECODE_METHODS)}")
  return methods


def add_network_flags(parser: argparse.ArgumentParser) -> None:
  """The benchmark network's and optimizer's flags (`--vocab_size` ... `--use_hardware_rng`), also
  those of `scripts/profile_train_step.py`, which trains the same network."""
  parser.add_argument("--vocab_size", type=int, default=2048)
  parser.add_argument("--emb_dim", type=int, default=256)
  parser.add_argument("--num_heads", type=int, default=4)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--mlp_dim", type=int, default=1024)
  parser.add_argument("--num_layers", type=int, default=4, help="encoder and decoder layers each")
  parser.add_argument("--dropout_rate", type=float, default=0.1)
  parser.add_argument(
      "--remat_policy",
      default="none",
      choices=("none", "minimal", "full"),
      help="our network's T5Config.remat_policy (memory mode: compare the policies)")
  parser.add_argument("--learning_rate", type=float, default=1e-3)
  parser.add_argument(
      "--use_hardware_rng",
      action=argparse.BooleanOptionalAction,
      default=True,
      help="our dropout masks from the unsafe_rbg PRNG (USE_HARDWARE_RNG, as the main job)")


# `--shape`: a published network's sizes and the paper's lengths, as defaults of the flags.
SHAPES = {
    # mT5-small (T5X `t5x/examples/t5/mt5/small.gin`; gin/mcwq_t5x/models/mt5_small.gin) at the
    # paper's TASK_FEATURE_LENGTHS (docs/recipe.md: inputs 256, targets 512).
    "mt5_small": {
        "vocab_size": 250112,
        "emb_dim": 512,
        "num_heads": 6,
        "head_dim": 64,
        "mlp_dim": 1024,
        "num_layers": 8,
        "input_length": 256,
        "target_length": 512,
    },
}


def parse_args(argv=None) -> argparse.Namespace:
  """The command line; `--shape` supplies the defaults of the flags it names (given flags win)."""
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--task", default="mcwq_random_split_en")
  parser.add_argument("--split", default="validation")
  parser.add_argument("--max_examples", type=int, default=0, help="0 = the whole split")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--input_length", type=int, default=64)
  parser.add_argument("--target_length", type=int, default=128)
  parser.add_argument(
      "--pack_input_length",
      type=int,
      default=40,
      help="tokens per packed encoder row, our epoch (fixed-shape: --input_length)")
  parser.add_argument(
      "--pack_target_length",
      type=int,
      default=72,
      help="tokens per packed decoder row, our epoch (fixed-shape: --target_length)")
  add_network_flags(parser)
  parser.add_argument("--fixed_steps", type=int, default=5)
  parser.add_argument(
      "--memory_limit_gib",
      type=float,
      default=20.0,
      help="memory mode: XLA buffers a step may hold (24 GiB machine: 20, leaving the runtime's)")
  parser.add_argument(
      "--memory_batch_sizes",
      default="2,8",
      help="memory mode: batch sizes whose train step XLA compiles for its memory analysis")
  parser.add_argument(
      "--fixed_warmup_steps", type=int, default=2, help="untimed steps before --fixed_steps")
  parser.add_argument(
      "--shape",
      choices=sorted(SHAPES),
      default=None,
      help="a published network's sizes and the paper's lengths as the defaults of --vocab_size "
      "... --num_layers, --input_length, --target_length (flags given still win)")
  parser.add_argument(
      "--host_devices", type=int, default=1, help="XLA CPU devices, our epoch (fixed: 1)")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument(
      "--modes", default="epoch,fixed", help="any of epoch,fixed,decode,eval,memory")
  parser.add_argument(
      "--checkpoint",
      default="",
      help="decode: a MODEL_DIR or checkpoint of our engine (its run.json gives the network; "
      "without one, the --decode_model preset); default: train the preset")
  parser.add_argument(
      "--decode_model",
      default="tiny",
      help=f"decode: a network.CONFIGS preset, or {BENCH_NETWORK!r}: the network of the flags "
      "(--vocab_size ...)")
  parser.add_argument(
      "--decode_train_steps",
      type=int,
      default=300,
      help="decode: steps to train --decode_model when no --checkpoint is given (0: its "
      "initial weights, seed 0)")
  parser.add_argument(
      "--decode_length", type=int, default=0, help="decode: 0 = the split's longest target")
  parser.add_argument("--decode_batch_size", type=int, default=64)
  parser.add_argument(
      "--decode_methods",
      default="greedy,beam4",
      help=f"decode: comma-separated methods of {sorted(DECODE_METHODS)}")
  parser.add_argument("--work_dir", default="", help=argparse.SUPPRESS)
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.shape:
    parser.set_defaults(**SHAPES[args.shape])
    args = parser.parse_args(argv)
  return args


def main(argv=None) -> None:
  args = parse_args(argv)

  if args.worker:
    import logging
    logging.basicConfig(level=logging.WARNING)
    system, mode = args.worker.split(":")
    # Flags before JAX starts its backend, as the training main sets them; decoding runs with
    # XLA's defaults, as the eval and infer mains do.
    if system in ("ours", "prep") and not mode.startswith("decode-"):
      from mcwq_t5x.engine import cpu_settings
      cpu_settings.set_xla_cpu_flags()
      cpu_settings.set_host_malloc_options()
    print(json.dumps(WORKERS[(system, mode)](args)))
    return

  modes = [m for m in args.modes.split(",") if m]
  if "decode" in modes:
    _decode_methods(args)  # checked before anything runs
  # One work folder for the run's workers: the tokenised examples (`_examples`), the checkpoint
  # and export of the decode mode, the predictions.
  with tempfile.TemporaryDirectory() as work_dir:
    argv = [a for a in (argv if argv is not None else sys.argv[1:])] + ["--work_dir", work_dir]
    args.work_dir = work_dir
    _drive(args, argv, modes, work_dir)


def _memory_driver(args: argparse.Namespace, argv: list[str]) -> None:
  """`--modes memory`: XLA's memory of our step at each batch size, and the largest batch whose
  step fits `--memory_limit_gib`, by the line through the two largest sizes measured."""
  figures = {int(b): m for b, m in _run_worker("ours", "memory", argv, 1)["memory"].items()}
  for rows, m in sorted(figures.items()):
    print(f"ours memory batch {rows}: temp {m['temp']:.2f} GiB, arguments {m['arguments']:.2f}, "
          f"outputs {m['outputs']:.2f}, aliased {m['alias']:.2f}, total {m['total']:.2f} GiB")
  if len(figures) >= 2:
    (b1, m1), (b2, m2) = sorted(figures.items())[-2:]
    per_row = (m2["total"] - m1["total"]) / (b2 - b1)
    rows = b2 + int((args.memory_limit_gib - m2["total"]) // per_row)
    print(f"ours memory: {per_row:.3f} GiB a row; the largest batch within "
          f"{args.memory_limit_gib:g} GiB of XLA buffers: {rows} (extrapolated)")


def _drive(args: argparse.Namespace, argv: list[str], modes: list[str], work_dir: str) -> None:
  """Runs the workers of `modes` (see `main`) and prints their lines and the ratios."""
  results: dict[tuple[str, str], list[dict[str, Any]]] = {}
  decoded: dict[tuple[str, str], list[dict[str, Any]]] = {}
  if "decode" in modes:
    modes.remove("decode")
    decoded = _decode_driver(args, argv, work_dir)
  if "eval" in modes:
    modes.remove("eval")
    _eval_driver(args, argv, work_dir)
  if "memory" in modes:
    modes.remove("memory")
    _memory_driver(args, argv)
  if not modes and not decoded:
    return
  for _ in range(args.repeats):
    for mode in modes:
      for system in ("ours", "hf"):
        r = _run_worker(system, mode, argv, args.host_devices)
        results.setdefault((system, mode), []).append(r)
        print(_line(r), flush=True)
  if "epoch" in modes:
    seen = {results[(system, "epoch")][0]["split_target_tokens"] for system in ("ours", "hf")}
    if len(seen) > 1:
      print(f"WARNING: the systems' epochs hold different target tokens {sorted(seen)}: "
            "the packed rows truncate examples; raise --pack_input_length/--pack_target_length")
  ratios, memory = {}, {}
  for mode in modes:
    means = {}
    for system in ("ours", "hf"):
      runs = results[(system, mode)]
      means[system] = sum(r["examples_per_s"] for r in runs) / len(runs)
      print(f"mean {system} {mode}: {_rate(means[system]).strip()} ex/s over {len(runs)} run(s)")
    ratios[mode] = means["ours"] / means["hf"]
  peak = matmul_peak_of_run({**results, **decoded})
  print(peak["line"])
  for (system, mode), runs in [*results.items(), *decoded.items()]:
    achieved = sum(r["flops"] / r["seconds"] for r in runs) / len(runs) / 1e9
    name = f"{mode[len('decode-'):]} decode" if mode.startswith("decode-") else mode
    print(f"{system} {name}: {achieved:.1f} GFLOP/s of {peak['gflops']:.1f} GFLOP/s matmul peak "
          f"({100 * achieved / peak['gflops']:.1f}%)")
    memory.setdefault(name, {})[system] = max(r["peak_rss_gib"] for r in runs)
  for name, rss in memory.items():
    print(f"{name} peak RSS ours/hf: {rss['ours'] / rss['hf']:.2f} "
          f"({rss['ours']:.2f} / {rss['hf']:.2f} GiB, each its own process)")
  if "epoch" in ratios:
    print(f"epoch ratio ours/hf: {ratios['epoch']:.2f}")
  if "fixed" in ratios:
    print(f"fixed-shape ratio ours/hf: {ratios['fixed']:.2f}")


if __name__ == "__main__":
  main()
