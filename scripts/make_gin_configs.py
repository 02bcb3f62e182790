#!/usr/bin/env python3
"""Writes the experiment gin files of both engines from one table.

The MCWQ paper (Cui et al., TACL 2022, Sec. 5) fine-tunes mT5-small and mT5-base on each split
(mcd1, mcd2, mcd3, random_split) and language (en, he, kn, zh), and T5-base (`t5-v1_1-base`) on
English, with the recipe of the authors' Hugging Face scripts (coastalcph/seq2sparql hf/run_mt5.sh,
hf/run_t5.sh; `RECIPE` below, the recipe card in docs/recipe.md): AdamW, gradient norm clipped at 1.0,
learning rate 5e-4 decaying linearly to 0 over 50K steps, batch 24 / 12 / 36, inputs
`translate {Language} to Sparql: ` + question (the `_prefixed` tasks), dev loss every 500 steps and
the checkpoint with the lowest one decoded greedily, seed 16 (T5-base: 8, and 16 as a second seed).
The English-trained mT5 models are also evaluated zero-shot on he/kn/zh (Sec. 5.3, with the test
language's prefix), and every mT5 model on the human-translated gold test set (Sec. 4.3).

For each of these the script writes two files, one per engine, from the same row of `MODELS`
and the same settings (`RECIPE`):

* the real T5X (`python -m t5x.train` / `t5x.eval` / `t5x.infer`): `gin/<model>_<split>_<lang>.gin`,
  `gin/test/...`, `gin/zeroshot/...`, `gin/gold/...`, `gin/infer/<model>.gin`; they include T5X's
  own model and run files (`t5x/examples/t5/{mt5,t5_1_1}/<size>.gin`,
  `t5x/configs/runs/{finetune,eval,infer}.gin`);
* our engine (`python -m mcwq_t5x.train` / `.eval` / `.infer`): the same names under
  `gin/mcwq_t5x/`, plus our model files `gin/mcwq_t5x/models/<model>.gin`;
* the T5X-habit alternative (Adafactor, constant rate) for each engine, added after an experiment
  file: `gin/recipes/t5x_adafactor.gin`, `gin/mcwq_t5x/recipes/t5x_adafactor.gin`.

Both sets read the vocabulary with `vocab.mt5_vocabulary()` / `vocab.t5_vocabulary()` (`$MCWQ_VOCAB`,
the variable the SeqIO tasks read too) and the tasks from `MIXTURE_OR_TASK_MODULE = 'tasks.mcwq'`.
T5X counts `TRAIN_STEPS` from 0, so its files train to 1,000,000 (the checkpoint's pre-training
steps) + 50,000.

Usage:
  python scripts/make_gin_configs.py            # (re)write the files under gin/
  python scripts/make_gin_configs.py --check    # exit 1 if a committed file differs
"""
from __future__ import annotations

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

SPLITS = ("mcd1", "mcd2", "mcd3", "random_split")
LANGUAGES = ("en", "he", "kn", "zh")
ZEROSHOT_LANGUAGES = ("he", "kn", "zh")
GOLD_LANGUAGES = ("he", "kn", "zh")
LANGUAGE_NAMES = {"en": "English", "he": "Hebrew", "kn": "Kannada", "zh": "Chinese"}
T5X_CHECKPOINTS = "gs://t5-data/pretrained_models/t5x"
PRETRAINING_STEPS = 1_000_000
PREFIXED = "_prefixed"  # tasks.mcwq.PREFIXED_SUFFIX: inputs `translate {Language} to Sparql: ` + q
# MCWQ dev rows per split (every language: the splits are parallel); T5X's training-eval loss
# reads EVAL_STEPS batches, so its files cover the whole dev set with ceil(rows / BATCH_SIZE).
DEV_ROWS = {"mcd1": 5408, "mcd2": 5929, "mcd3": 6034, "random_split": 6163}

# model -> pretty name, batch size and seed (paper Sec. 5; seq2sparql hf/run_*.sh), T5X model file,
# our preset, dtype, vocabulary function, languages, public T5X checkpoint.
MODELS = {
    "mt5_small": ("mT5-small", 24, 16, "t5x/examples/t5/mt5/small.gin", "mt5_small", "bfloat16",
                  "mt5_vocabulary", LANGUAGES, f"{T5X_CHECKPOINTS}/mt5_small/checkpoint_1000000"),
    "mt5_base": ("mT5-base", 12, 16, "t5x/examples/t5/mt5/base.gin", "mt5_base", "bfloat16",
                 "mt5_vocabulary", LANGUAGES, f"{T5X_CHECKPOINTS}/mt5_base/checkpoint_1000000"),
    "t5_base":
        ("T5-base (T5.1.1, t5-v1_1-base)", 36, 8, "t5x/examples/t5/t5_1_1/base.gin", "t5_1_1_base",
         "bfloat16", "t5_vocabulary", ("en",), f"{T5X_CHECKPOINTS}/t5_1_1_base/checkpoint_1000000"),
}
VOCAB_DESC = {
    "mt5_vocabulary": ("mT5 SentencePiece vocabulary\n# (250,100 pieces incl. 100 sentinels; "
                       "embedding rows 250,112)"),
    "t5_vocabulary": ("T5.1.1 English SentencePiece vocabulary\n# (32,100 pieces incl. 100 "
                      "sentinels; embedding rows 32,128)"),
}
# T5-base's second seed (seq2sparql hf/run_t5.sh trains with --seed 8, predicts with --seed 16).
T5_BASE_SECOND_SEED = 16
# Our model files only (no paper experiment files of their own).
EXTRA_MODELS = {
    "mt5_large": ("mT5-large", "t5x/examples/t5/mt5/large.gin", "mt5_large", "bfloat16"),
}

# The paper's recipe (Sec. 5 + the authors' Hugging Face Seq2SeqTrainer scripts, whose defaults
# fill in what the paper calls "default"), shared by every fine-tuning experiment of both engines.
RECIPE = {
    "train_steps": 50_000,
    "learning_rate": "5e-4",
    "adam_b1": 0.9,
    "adam_b2": 0.999,
    "adam_eps": "1e-8",
    "weight_decay": 0.0,
    "grad_clip_norm": 1.0,
    "warmup_steps": 0,
    "dropout_rate": 0.1,
    "inputs_length": 256,
    "targets_length": 512,
    "eval_period": 500,
    "checkpoint_period": 500,
    "keep_best": 1,
    "num_decodes": 1,
}

HEADER = "# GENERATED by scripts/make_gin_configs.py from one table; edit the script, not this file.\n"

RECIPE_NOTE = """\
# The paper's recipe (docs/recipe.md): AdamW (b1 0.9, b2 0.999, eps 1e-8, weight decay 0),
# gradients clipped at global norm {grad_clip_norm}, learning rate {learning_rate} decaying linearly to 0
# over the {train_steps} fine-tuning steps, no warm-up; dev loss every {eval_period} steps, the checkpoint
# with the lowest dev loss is kept and decoded (greedy). The T5X-habit alternative (Adafactor,
# constant rate): add --gin_file={alt_file}."""

T5X_FINETUNE = """\
# {pretty} fine-tuned on MCWQ {split}, {language_name} questions -> RIR queries, with the real T5X
# (Cui et al., TACL 2022, Sec. 5: {train_steps} steps from the public checkpoint, batch size
# {batch_size}, seed {seed}, inputs `translate {language_name} to Sparql: ` + question).
{recipe_note}
{header}#
#   export MCWQ_VOCAB={vocab_path}  # or a local copy
#   python -m t5x.train --gin_file=gin/{name}.gin --gin.MODEL_DIR="'$PWD/runs/t5x/{name}'"
# (T5X's Orbax checkpointing needs absolute paths.)
from __gin__ import dynamic_registration

import optax
from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x.data import vocab
from t5x import decoding
from t5x import models
from t5x import optimizers
from t5x import trainer
from t5x import utils

include '{t5x_model}'
include 't5x/configs/runs/finetune.gin'

VOCABULARY = @vocab.{vocab_fn}()
MIXTURE_OR_TASK_NAME = '{task}'
MIXTURE_OR_TASK_MODULE = 'tasks.mcwq'
TASK_FEATURE_LENGTHS = {{'inputs': {inputs_length}, 'targets': {targets_length}}}
PRETRAINING_STEPS = {pretraining_steps}  # the public checkpoint's step
FINETUNE_STEPS = {train_steps}
TRAIN_STEPS = {t5x_train_steps}  # PRETRAINING_STEPS + FINETUNE_STEPS (T5X counts from 0)
BATCH_SIZE = {batch_size}
RANDOM_SEED = {seed}
DROPOUT_RATE = {dropout_rate}
USE_CACHED_TASKS = False
INITIAL_CHECKPOINT_PATH = '{checkpoint}'
train/utils.DatasetConfig.pack = False  # one question per row, as the Hugging Face Trainer
train/utils.DatasetConfig.seed = %RANDOM_SEED

# AdamW with global-norm clipping, as T5X's optax wrapper (t5x.optimizers.chain -> OptaxWrapper).
LEARNING_RATE = {learning_rate}
GRAD_CLIP_NORM = {grad_clip_norm}
WEIGHT_DECAY = {weight_decay}
OPTIMIZER = @optimizers.chain()
optimizers.chain.transformations = [@optax.clip_by_global_norm(), @optax.adamw()]
optax.clip_by_global_norm.max_norm = %GRAD_CLIP_NORM
optax.adamw:
  learning_rate = @optax.linear_schedule()
  b1 = {adam_b1}
  b2 = {adam_b2}
  eps = {adam_eps}
  weight_decay = %WEIGHT_DECAY
# Linear decay to 0 over the fine-tuning steps, no warm-up. The optax count starts at 0 with the
# fresh optimizer state of fine-tuning; T5X's logged rate counts from the checkpoint's step, hence
# its schedule begins at PRETRAINING_STEPS.
optax.linear_schedule:
  init_value = %LEARNING_RATE
  end_value = 0.0
  transition_steps = %FINETUNE_STEPS
trainer.Trainer.learning_rate_fn = @logged_lr/optax.linear_schedule()
logged_lr/optax.linear_schedule.transition_begin = %PRETRAINING_STEPS
# The public checkpoint holds Adafactor statistics: restore its parameters, start AdamW fresh.
utils.CheckpointConfig.restore = @from_pretrained/utils.RestoreCheckpointConfig()
from_pretrained/utils.RestoreCheckpointConfig:
  assignment_map = ((r'state/param_states.*', None),)
  fallback_to_scratch = True

# Dev loss every EVAL_PERIOD steps over the whole dev set; keep the checkpoint with the lowest
# plus the newest: T5X's SaveBestCheckpointer settings, which its Orbax manager reads from a
# functools.partial of the class (mcwq_t5x.checkpointing.best_checkpoint.t5x_save_best_checkpointer).
EVAL_PERIOD = {eval_period}
EVAL_STEPS = {eval_steps}  # ceil({dev_rows} dev rows / BATCH_SIZE)
METRIC_NAME_TO_MONITOR = 'training_eval/{task}/loss'
METRIC_MODE = 'min'
utils.SaveCheckpointConfig:
  period = {checkpoint_period}
  keep = {keep_best}
  checkpointer_cls = @best_checkpoint.t5x_save_best_checkpointer()
best_checkpoint.t5x_save_best_checkpointer:
  metric_name_to_monitor = %METRIC_NAME_TO_MONITOR
  metric_mode = %METRIC_MODE
  keep_checkpoints_without_metrics = True

# Greedy decoding (one beam), up to TASK_FEATURE_LENGTHS['targets'] tokens.
NUM_DECODES = {num_decodes}
models.EncoderDecoderModel.decode_fn = @decoding.beam_search
models.EncoderDecoderModel.default_decoder_params = @models.DecoderParams()
models.DecoderParams.num_decodes = %NUM_DECODES
"""

OURS_FINETUNE = """\
# {pretty} fine-tuned on MCWQ {split}, {language_name} questions -> RIR queries, with mcwq_t5x
# (Cui et al., TACL 2022, Sec. 5: {train_steps} steps from the public checkpoint, batch size
# {batch_size}, seed {seed}, inputs `translate {language_name} to Sparql: ` + question).
{recipe_note}
{header}#
#   export MCWQ_VOCAB={vocab_path}  # or a local copy
#   python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/{name}.gin --gin.MODEL_DIR="'runs/{name}'"
include 'gin/mcwq_t5x/models/{model_file}.gin'
include 'gin/mcwq_t5x/runs/finetune.gin'

MIXTURE_OR_TASK_NAME = '{task}'
TASK_FEATURE_LENGTHS = {{'inputs': {inputs_length}, 'targets': {targets_length}}}
TRAIN_STEPS = {train_steps}
BATCH_SIZE = {batch_size}
RANDOM_SEED = {seed}
PACK = False
DROPOUT_RATE = {dropout_rate}
INITIAL_CHECKPOINT_PATH = '{checkpoint}'
MODEL_DIR = 'runs/{name}'

# AdamW with global-norm clipping; linear decay to 0 over TRAIN_STEPS, no warm-up.
OPTIMIZER = 'adamw'
ADAM_B1 = {adam_b1}
ADAM_B2 = {adam_b2}
ADAM_EPS = {adam_eps}
WEIGHT_DECAY = {weight_decay}
GRAD_CLIP_NORM = {grad_clip_norm}
LEARNING_RATE = {learning_rate}
LR_SCHEDULE = 'linear'
WARMUP_STEPS = {warmup_steps}

# Dev loss every EVAL_PERIOD steps over the whole dev set; keep the checkpoint with the lowest
# (plus the newest) and decode it on the test set at the end.
EVAL_PERIOD = {eval_period}
EVAL_STEPS = None
CHECKPOINT_PERIOD = {checkpoint_period}
KEEP_CHECKPOINTS = {keep_best}
METRIC_NAME_TO_MONITOR = 'training_eval/loss'
METRIC_MODE = 'min'
INFER_EVAL_NUM_EXAMPLES = 1000
LOG_EVERY_STEPS = 100

# Greedy decoding (one beam), up to {targets_length} target tokens.
NUM_DECODES = {num_decodes}
INFER_TASK_FEATURE_LENGTHS = {{'inputs': {inputs_length}, 'targets': {targets_length}}}
"""

T5X_EVAL = """\
# {title}, with the real T5X: the {pretty} model fine-tuned on MCWQ {split} {train_language_name}
# (gin/{train_name}.gin) decodes {what}, with the checkpoint of the lowest dev loss in its MODEL_DIR
# (mcwq_t5x.checkpointing.best_checkpoint reads T5X's training-eval summaries) and greedy decoding.
{header}#
#   python -m t5x.eval --gin_file=gin/{path} \\
#     --gin.CHECKPOINT_PATH="'$PWD/runs/t5x/{train_name}'" \\
#     --gin.EVAL_OUTPUT_DIR="'$PWD/runs/t5x/{train_name}/{out}'"
# (T5X's Orbax checkpointing needs absolute paths; the defaults below are relative. A
# checkpoint_<step> folder as CHECKPOINT_PATH is decoded as it is.)
from __gin__ import dynamic_registration

from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x.data import vocab
from t5x import decoding
from t5x import models
from t5x import utils

include '{t5x_model}'
include 't5x/configs/runs/eval.gin'

VOCABULARY = @vocab.{vocab_fn}()
DROPOUT_RATE = 0.0
MIXTURE_OR_TASK_NAME = '{task}'
MIXTURE_OR_TASK_MODULE = 'tasks.mcwq'
TASK_FEATURE_LENGTHS = {{'inputs': {inputs_length}, 'targets': {targets_length}}}
utils.DatasetConfig.task_feature_lengths = %TASK_FEATURE_LENGTHS
CHECKPOINT_PATH = 'runs/t5x/{train_name}'  # the training MODEL_DIR
EVAL_OUTPUT_DIR = 'runs/t5x/{train_name}/{out}'
METRIC_NAME_TO_MONITOR = 'training_eval/{train_task}/loss'
METRIC_MODE = 'min'
utils.RestoreCheckpointConfig:
  path = @best_checkpoint.checkpoint_path()
  mode = 'specific'
best_checkpoint.checkpoint_path:
  path = %CHECKPOINT_PATH
  metric_name_to_monitor = %METRIC_NAME_TO_MONITOR
  metric_mode = %METRIC_MODE
utils.DatasetConfig.split = 'test'
NUM_DECODES = {num_decodes}
models.EncoderDecoderModel.decode_fn = @decoding.beam_search
models.EncoderDecoderModel.default_decoder_params = @models.DecoderParams()
models.DecoderParams.num_decodes = %NUM_DECODES
"""

OURS_EVAL = """\
# {title}, with mcwq_t5x: the {pretty} model fine-tuned on MCWQ {split} {train_language_name}
# (gin/mcwq_t5x/{train_name}.gin) decodes {what}, with the checkpoint of the lowest dev loss in its
# MODEL_DIR (mcwq_t5x.checkpointing.best_checkpoint) and greedy decoding.
{header}#
#   python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/{path}
from __gin__ import dynamic_registration

from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x import eval as eval_script

include 'gin/mcwq_t5x/models/{model_file}.gin'
include 'gin/mcwq_t5x/runs/eval.gin'

MIXTURE_OR_TASK_NAME = '{task}'
SPLIT = 'test'
TASK_FEATURE_LENGTHS = {{'inputs': {inputs_length}, 'targets': {targets_length}}}
CHECKPOINT_PATH = 'runs/{train_name}'  # the training MODEL_DIR
EVAL_OUTPUT_DIR = 'runs/{train_name}/{out}'
BATCH_SIZE = 64
METRIC_NAME_TO_MONITOR = 'training_eval/loss'
METRIC_MODE = 'min'
eval_script.evaluate.checkpoint_path = @best_checkpoint.checkpoint_path()
best_checkpoint.checkpoint_path:
  path = %CHECKPOINT_PATH
  metric_name_to_monitor = %METRIC_NAME_TO_MONITOR
  metric_mode = %METRIC_MODE
PREDICT_KWARGS = {{'num_decodes': {num_decodes}}}
"""

T5X_ADAFACTOR = """\
# The T5X-habit alternative to the paper's recipe for the real T5X's experiment files: Adafactor
# (the model file's, decay rate 0.8) at a constant learning rate LEARNING_RATE, restoring the public
# checkpoint with its Adafactor statistics. Add it AFTER an experiment file:
{header}#
#   python -m t5x.train --gin_file=gin/mt5_small_mcd1_en.gin --gin_file=gin/recipes/t5x_adafactor.gin \\
#     --gin.MODEL_DIR="'$PWD/runs/t5x/mt5_small_mcd1_en_adafactor'"
from __gin__ import dynamic_registration

from t5x import adafactor
from t5x import trainer
from t5x import utils

OPTIMIZER = @adafactor.Adafactor()
trainer.Trainer.learning_rate_fn = @utils.create_learning_rate_scheduler()
utils.create_learning_rate_scheduler:
  factors = 'constant'
  base_learning_rate = %LEARNING_RATE
utils.CheckpointConfig.restore = @utils.RestoreCheckpointConfig()
"""

OURS_ADAFACTOR = """\
# The T5X-habit alternative to the paper's recipe for mcwq_t5x's experiment files: Adafactor (decay
# rate 0.8, update clipping 1.0) at a constant learning rate LEARNING_RATE, no gradient clipping.
# Add it AFTER an experiment file:
{header}#
#   python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_small_mcd1_en.gin \\
#     --gin_file=gin/mcwq_t5x/recipes/t5x_adafactor.gin --gin.MODEL_DIR="'runs/adafactor'"
OPTIMIZER = 'adafactor'
LR_SCHEDULE = 'constant'
GRAD_CLIP_NORM = None
"""
T5X_INFER = """\
# Inference with the real T5X and a fine-tuned {pretty} model: writes the predictions of a task
# split as JSON lines (T5X's infer.py). Set the task, one checkpoint_<step> folder (t5x.infer takes
# no MODEL_DIR) and the output folder:
{header}#
#   python -m t5x.infer --gin_file=gin/infer/{model}.gin --gin.MIXTURE_OR_TASK_NAME="'mcwq_mcd1_he_prefixed'" \\
#     --gin.CHECKPOINT_PATH="'$PWD/runs/t5x/{model}_mcd1_he/checkpoint_{t5x_train_steps}'" \\
#     --gin.INFER_OUTPUT_DIR="'$PWD/runs/t5x/{model}_mcd1_he/infer'"
# (T5X's Orbax checkpointing needs absolute paths.)
from __gin__ import dynamic_registration

from mcwq_t5x.data import vocab
from t5x import utils

include '{t5x_model}'
include 't5x/configs/runs/infer.gin'

VOCABULARY = @vocab.{vocab_fn}()
DROPOUT_RATE = 0.0
MIXTURE_OR_TASK_MODULE = 'tasks.mcwq'
TASK_FEATURE_LENGTHS = {{'inputs': {inputs_length}, 'targets': {targets_length}}}
"""

OURS_MODEL = """\
# {pretty} for mcwq_t5x: preset '{preset}' of `mcwq_t5x.engine.network.CONFIGS` (the
# hyperparameters of T5X's `{t5x_model}`), with the {vocab_desc} from $MCWQ_VOCAB.
{header}from __gin__ import dynamic_registration

from mcwq_t5x.data import vocab
from mcwq_t5x.engine import model
from mcwq_t5x.engine import network

VOCABULARY = @vocab.{vocab}()
Z_LOSS = 1e-4
LABEL_SMOOTHING = 0.0
LOSS_NORMALIZING_FACTOR = None
DROPOUT_RATE = %gin.REQUIRED  # set by the run file (gin/mcwq_t5x/runs/*.gin), as in T5X

MODEL = @model.EncoderDecoderModel()
model.EncoderDecoderModel:
  module = @network.Transformer()
  input_vocabulary = %VOCABULARY
  output_vocabulary = %VOCABULARY
  z_loss = %Z_LOSS
  label_smoothing = %LABEL_SMOOTHING
  loss_normalizing_factor = %LOSS_NORMALIZING_FACTOR

network.Transformer.config = @network.get_config()
network.get_config:
  name = '{preset}'
  dtype = '{dtype}'
  dropout_rate = %DROPOUT_RATE
"""


def render() -> dict[str, str]:
  """Relative path -> file text for every generated gin file."""
  files = {
      "gin/recipes/t5x_adafactor.gin": T5X_ADAFACTOR.format(header=HEADER),
      "gin/mcwq_t5x/recipes/t5x_adafactor.gin": OURS_ADAFACTOR.format(header=HEADER),
  }
  for model, (pretty, batch_size, seed, t5x_model, preset, dtype, vocab_fn, languages,
              checkpoint) in MODELS.items():
    model_file = preset if model == "t5_base" else model
    vocab_path = ("gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"
                  if vocab_fn == "t5_vocabulary" else
                  "gs://t5-data/vocabs/mc4.250000.100extra/sentencepiece.model")
    common = dict(
        RECIPE,
        pretty=pretty,
        model=model,
        model_file=model_file,
        batch_size=batch_size,
        seed=seed,
        t5x_model=t5x_model,
        vocab_fn=vocab_fn,
        vocab_path=vocab_path,
        header=HEADER,
        pretraining_steps=PRETRAINING_STEPS,
        t5x_train_steps=PRETRAINING_STEPS + RECIPE["train_steps"],
        checkpoint=checkpoint)
    common["recipe_note"] = RECIPE_NOTE.format(
        **RECIPE,
        alt_file="gin/recipes/t5x_adafactor.gin").replace("--gin_file=gin/recipes/",
                                                          "--gin_file=gin/{engine}recipes/")
    files[f"gin/mcwq_t5x/models/{model_file}.gin"] = OURS_MODEL.format(
        **common, preset=preset, dtype=dtype, vocab=vocab_fn, vocab_desc=VOCAB_DESC[vocab_fn])
    if model != "t5_base":
      files[f"gin/infer/{model}.gin"] = T5X_INFER.format(**common)
    seeds = [seed] + ([T5_BASE_SECOND_SEED] if model == "t5_base" else [])
    for split in SPLITS:
      for lang in languages:
        for run_seed in seeds:
          name = f"{model}_{split}_{lang}" + ("" if run_seed == seed else f"_seed{run_seed}")
          kw = dict(
              common,
              seed=run_seed,
              split=split,
              lang=lang,
              language_name=LANGUAGE_NAMES[lang],
              name=name,
              task=f"mcwq_{split}_{lang}{PREFIXED}",
              eval_steps=-(-DEV_ROWS[split] // batch_size),
              dev_rows=DEV_ROWS[split])
          files[f"gin/{name}.gin"] = T5X_FINETUNE.format(
              **dict(kw, recipe_note=kw["recipe_note"].replace("{engine}", "")))
          files[f"gin/mcwq_t5x/{name}.gin"] = OURS_FINETUNE.format(
              **dict(kw, recipe_note=kw["recipe_note"].replace("{engine}", "mcwq_t5x/")))
      evals = [
          ("test", lang, lang, f"mcwq_{split}_{lang}{PREFIXED}", f"test_{lang}",
           "Test-set evaluation (Sec. 5)", f"the {LANGUAGE_NAMES[lang]} {split} test questions")
          for lang in languages
      ]
      if model != "t5_base":
        evals += [("zeroshot", lang, "en", f"mcwq_{split}_zeroshot_{lang}{PREFIXED}",
                   f"zeroshot_{lang}", "Zero-shot cross-lingual evaluation (Sec. 5.3)",
                   f"the {LANGUAGE_NAMES[lang]} {split} test questions, with the "
                   f"{LANGUAGE_NAMES[lang]} prefix") for lang in ZEROSHOT_LANGUAGES]
        evals += [("gold", lang, lang, f"mcwq_gold_{lang}{PREFIXED}", f"gold_{lang}",
                   "Evaluation on the human-translated gold test set (Sec. 4.3)",
                   f"the 155 {LANGUAGE_NAMES[lang]} gold test questions")
                  for lang in GOLD_LANGUAGES]
      for folder, lang, train_lang, task, out, title, what in evals:
        path = f"{folder}/{model}_{split}_{lang}.gin"
        kw = dict(
            common,
            split=split,
            train_lang=train_lang,
            train_language_name=LANGUAGE_NAMES[train_lang],
            train_name=f"{model}_{split}_{train_lang}",
            train_task=f"mcwq_{split}_{train_lang}{PREFIXED}",
            task=task,
            out=out,
            title=title,
            what=what,
            path=path)
        files[f"gin/{path}"] = T5X_EVAL.format(**kw)
        files[f"gin/mcwq_t5x/{path}"] = OURS_EVAL.format(**kw)
  for model, (pretty, t5x_model, preset, dtype) in EXTRA_MODELS.items():
    files[f"gin/mcwq_t5x/models/{model}.gin"] = OURS_MODEL.format(
        pretty=pretty,
        t5x_model=t5x_model,
        preset=preset,
        dtype=dtype,
        header=HEADER,
        vocab="mt5_vocabulary",
        vocab_desc=VOCAB_DESC["mt5_vocabulary"])
  return files


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
      "--check", action="store_true", help="compare with the files on disk instead of writing them")
  parser.add_argument("--root", default=str(REPO), help="repository root")
  args = parser.parse_args(argv)
  root = pathlib.Path(args.root)
  files = render()
  stale = []
  for rel, text in sorted(files.items()):
    path = root / rel
    if args.check:
      if not path.is_file() or path.read_text() != text:
        stale.append(rel)
    else:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(text)
  if args.check and stale:
    print("out of date (run scripts/make_gin_configs.py):\n  " + "\n  ".join(stale))
    return 1
  if not args.check:
    print(f"wrote {len(files)} gin files under {root / 'gin'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
