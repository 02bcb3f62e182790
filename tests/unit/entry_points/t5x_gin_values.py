"""T5X's gin files parsed as `python -m t5x.train` (`t5x.eval`, `t5x.infer`) parses them, in one fresh
process a session for test_gin.py and test_recipe.py (`t5x_values`): importing T5X (and TensorFlow)
once instead of once per test file.

Fresh, not this process: T5X's own model files bind short selectors without imports
(`network.Transformer.config = ...` in t5x/examples/t5/mt5/small.gin), which are ambiguous once our
`mcwq_t5x.engine.network.Transformer` is registered; so T5X's files are parsed first, then ours
(test_gin.test_both_engines_parse_in_one_process). Each script below is run as it would run alone
(`python -c SCRIPT ARGS...`, its own globals and `sys.argv`), one after the other, and prints one
`RESULT <json>` line.
"""
import json
import pathlib
import sys

import mains
import scenarios

REPO = pathlib.Path(__file__).resolve().parents[3]

# test_gin.py: every T5X file (the main it belongs to, macros, the network width), then our
# training files in the same process.
PARSE_SCRIPT = r"""
import json, sys
import gin
import t5x.eval, t5x.infer, t5x.train
from mcwq_t5x import gin_utils
from mcwq_t5x import train as train_lib
def maybe(name):
  try:
    return gin.query_parameter(name)
  except ValueError:
    return None
main_of = {"zeroshot": t5x.eval, "gold": t5x.eval, "test": t5x.eval, "infer": t5x.infer}
out = {}
files, ours = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for path in files:
  main = main_of.get(path.split("/")[1], t5x.train)
  extra = []
  if path.startswith("gin/recipes/"):  # an alternative added after an experiment file
    path, extra = "gin/mt5_small_mcd1_en.gin", [path]
  bindings = {t5x.train: ["MODEL_DIR = '/tmp/x'"], t5x.eval: [],
              t5x.infer: ["MIXTURE_OR_TASK_NAME = 'mcwq_mcd1_en'", "CHECKPOINT_PATH = '/tmp/x'",
                          "INFER_OUTPUT_DIR = '/tmp/y'"]}[main]
  sys.modules["__main__"] = main
  gin_utils.parse_gin([path] + extra, bindings)
  values = {m: gin.query_parameter("%" + m) for m in ("MIXTURE_OR_TASK_NAME", "MIXTURE_OR_TASK_MODULE")}
  if main is t5x.train:
    values.update(steps=gin.query_parameter("%TRAIN_STEPS"), batch=gin.query_parameter("%BATCH_SIZE"),
                  lengths=gin.query_parameter("%TASK_FEATURE_LENGTHS"),
                  dropout=gin.query_parameter("%DROPOUT_RATE"),
                  init=gin.query_parameter("%INITIAL_CHECKPOINT_PATH"),
                  cached=gin.query_parameter("%USE_CACHED_TASKS"),
                  lr=maybe("%LEARNING_RATE"),
                  optimizer=repr(maybe("%OPTIMIZER")),
                  width=gin.query_parameter("t5x.examples.t5.network.T5Config.emb_dim"))
  # The model and network T5X builds: ours (mcwq_t5x.t5x_bridge) unless T5X's own is asked for.
  values.update(model=repr(gin.query_parameter("%MODEL")), remat=maybe("%REMAT_POLICY"),
                remat_binding=repr(maybe("t5x_bridge.EncoderDecoderModel.remat_policy")))
  with gin.unlock_config():
    config = gin.get_configurable("t5x_bridge.transformer")().config
  values["network"] = [config.dtype.__name__, config.emb_dim, config.vocab_size,
                       config.float32_attention_logits, config.dropout_rate]
  out[extra[0] if extra else path] = values
  gin.clear_config()
for path in ours:  # then our files, in the same process
  gin_utils.parse_gin([path], ["MODEL_DIR = '/tmp/x'"])
  out[path] = {"MIXTURE_OR_TASK_MODULE": gin.query_parameter("%MIXTURE_OR_TASK_MODULE")}
  gin.clear_config()
print("RESULT " + json.dumps(out))
"""

# test_recipe.py: the recipe's values (optimizer updates, schedules, checkpointing, datasets) of
# every experiment file, every evaluation file and the T5X-habit alternative.
RECIPE_SCRIPT = r"""
import json, sys
import gin
import jax.numpy as jnp
import numpy as np
import optax
import t5x.eval, t5x.train
from t5x import models, optimizers, utils
from mcwq_t5x import gin_utils
from mcwq_t5x.checkpointing import t5x_checkpoint_writer
import pathlib

def reference_updates(tx, n=3):
  params = {"w": jnp.ones((4, 3)), "b": jnp.zeros((3,))}
  state = tx.init(params)
  out = []
  for i in range(n):
    grads = {"w": jnp.full((4, 3), 3.0 * (i + 1)), "b": jnp.full((3,), -2.0)}
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return [float(x) for x in np.concatenate([np.ravel(params["w"]), np.ravel(params["b"])])]

def train_values(path, extra, initial=None):
  sys.modules["__main__"] = t5x.train
  initial = initial or PRETRAINED  # why: the files' gs:// checkpoint is checked when restore is built
  gin_utils.parse_gin([path, *extra], ["MODEL_DIR = '/tmp/x'", f"INITIAL_CHECKPOINT_PATH = {initial!r}"])
  q = gin.query_parameter
  v = {m: q("%" + m) for m in ("MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "TRAIN_STEPS",
                                "BATCH_SIZE", "RANDOM_SEED", "EVAL_PERIOD", "EVAL_STEPS",
                                "LEARNING_RATE", "DROPOUT_RATE")}
  v["optimizer"] = repr(q("%OPTIMIZER"))
  v["lr_fn"] = repr(q("trainer.Trainer.learning_rate_fn"))
  with gin.unlock_config():
    opt = gin.get_configurable(optimizers.chain)() if "chain" in v["optimizer"] else None
    if opt is not None:
      v["updates"] = reference_updates(opt.optax_optimizer)
      sched = gin.get_configurable(optax.linear_schedule)()
      with gin.config_scope("logged_lr"):
        logged = gin.get_configurable(optax.linear_schedule)()
      v["optax_lr"] = [float(sched(s)) for s in (0, 25_000, 50_000, 60_000)]
      v["logged_lr"] = [float(logged(s)) for s in (1_000_000, 1_025_000, 1_050_000)]
      with gin.config_scope("from_pretrained"):
        restore = gin.get_configurable(utils.RestoreCheckpointConfig)()
      v["restore"] = [restore.path, restore.mode, [list(m) for m in restore.assignment_map],
                      restore.fallback_to_scratch]
    else:
      lr = gin.get_configurable(utils.create_learning_rate_scheduler)()
      v["t5x_lr"] = [float(lr(s)) for s in (0, 1_025_000, 1_050_000)]
    save = gin.get_configurable(utils.SaveCheckpointConfig)()
    cls = save.checkpointer_cls
    v["save"] = [save.period, save.keep, getattr(getattr(cls, "func", cls), "__name__", ""),
                 dict(getattr(cls, "keywords", {}))]
    v["num_decodes"] = gin.get_configurable(models.DecoderParams)().num_decodes
    v["decode_fn"] = repr(q("models.EncoderDecoderModel.decode_fn"))
    v["bridge_decoding"] = [repr(q("t5x_bridge.EncoderDecoderModel.decode_fn")),
                            repr(q("t5x_bridge.EncoderDecoderModel.default_decoder_params"))]
    for scope in ("train", "train_eval"):
      with gin.config_scope(scope):
        ds = gin.get_configurable(utils.DatasetConfig)()
      v[scope] = [ds.mixture_or_task_name, ds.split, ds.pack, ds.seed, ds.batch_size]
  gin.clear_config()
  return v

def eval_values(path):
  sys.modules["__main__"] = t5x.eval
  gin_utils.parse_gin([path], [])
  q = gin.query_parameter
  v = {m: q("%" + m) for m in ("MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "CHECKPOINT_PATH",
                                "METRIC_NAME_TO_MONITOR", "METRIC_MODE")}
  v["restore_path"] = repr(q("utils.RestoreCheckpointConfig.path"))
  v["restore_mode"] = q("utils.RestoreCheckpointConfig.mode")
  v["best_path"] = repr(q("best_checkpoint.checkpoint_path.path"))
  with gin.unlock_config():
    v["num_decodes"] = gin.get_configurable(models.DecoderParams)().num_decodes
    v["bridge_decoding"] = [repr(q("t5x_bridge.EncoderDecoderModel.decode_fn")),
                            repr(q("t5x_bridge.EncoderDecoderModel.default_decoder_params"))]
    ds = gin.get_configurable(utils.DatasetConfig)()
  v["dataset"] = [ds.mixture_or_task_name, ds.split, ds.task_feature_lengths]
  gin.clear_config()
  return v

# The path of `path`'s T5X restore config with INITIAL_CHECKPOINT_PATH = `initial`, or the error
# building it raises: [type, message].
def restore_of(path, initial):
  sys.modules["__main__"] = t5x.train
  gin_utils.parse_gin([path], ["MODEL_DIR = '/tmp/x'", f"INITIAL_CHECKPOINT_PATH = {initial!r}"])
  try:
    with gin.unlock_config():
      return gin.get_configurable(utils.CheckpointConfig)().restore.path
  except Exception as e:  # pylint: disable=broad-except
    return [type(e).__name__, str(e)]
  finally:
    gin.clear_config()

# A tiny T5X-native checkpoint (msgpack + zarr, as mT5's public one) at its step's folder name.
PRETRAINED = str(pathlib.Path(sys.argv[4]) / "t5x" / "checkpoint_1000000")
t5x_checkpoint_writer.save_t5x_checkpoint({"token_embedder": {"embedding": np.ones((2, 2))}},
                                          PRETRAINED, step=1_000_000)
MISSING = str(pathlib.Path(PRETRAINED).parent / "missing" / "checkpoint_1000000")
train_files, eval_files, alt = (json.loads(a) for a in sys.argv[1:4])
out = {"pretrained": PRETRAINED, "missing": MISSING,
       "restore_of": {k: restore_of("gin/mt5_base_mcd1_he.gin", v)
                      for k, v in (("pretrained", PRETRAINED), ("missing", MISSING),
                                   ("none", None))}}
for path in train_files:
  out[path] = train_values(path, [])
for path in eval_files:
  out[path] = eval_values(path)
for path in alt:
  out["alt:" + path] = train_values(path, ["gin/recipes/t5x_adafactor.gin"])
print("RESULT " + json.dumps(out))
"""

# why: runs each (name, script, argv) in turn in this one process, as `python -c script argv...`
_DRIVER = r"""
import contextlib, io, json, sys
out = {}
for name, script, argv in json.loads(sys.stdin.read()):
  sys.argv = ["-c", *argv]
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(compile(script, f"<{name}>", "exec"), {"__name__": "__main__"})
  line = [l for l in printed.getvalue().splitlines() if l.startswith("RESULT ")][-1]
  out[name] = json.loads(line[len("RESULT "):])
print("RESULT " + json.dumps(out))
"""


def jobs(folder):
  """[(name, script, argv)] in the order they run: "recipe" (test_recipe.py's experiment,
  evaluation and alternative files, all T5X's), then "parse" (every T5X file as test_gin.py lists
  them, then our mcd1 experiment files and the tiny one: ours last, see above). `folder` holds
  the recipe's tiny T5X checkpoint."""
  all_gin = sorted(str(p.relative_to(REPO)) for p in (REPO / "gin").rglob("*.gin"))
  t5x_files = [f for f in all_gin if not f.startswith("gin/mcwq_t5x/")]
  ours = [f for f in all_gin if f.startswith("gin/mcwq_t5x/mt5_") and "mcd1" in f]
  ours.append("gin/mcwq_t5x/tiny_random_split_en.gin")
  experiments = [f for f in t5x_files if f.startswith(("gin/mt5_", "gin/t5_base_"))]
  evals = [f for f in t5x_files if f.split("/")[1] in ("test", "zeroshot", "gold")]
  alt = ["gin/mt5_small_mcd1_en.gin", "gin/t5_base_mcd2_en.gin"]
  return [("recipe", RECIPE_SCRIPT,
           [json.dumps(experiments),
            json.dumps(evals),
            json.dumps(alt),
            str(folder)]), ("parse", PARSE_SCRIPT, [json.dumps(t5x_files),
                                                    json.dumps(ours)])]


def t5x_values(tmp_path_factory) -> dict:
  """{"parse": {file: values}, "recipe": {file: values}}, computed once per session
  (`scenarios.once`: the first test file to ask runs the process, the other reads its result)."""

  def build(folder):
    out = mains.run([sys.executable, "-c", _DRIVER], input=json.dumps(jobs(folder)))
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])

  return scenarios.once(tmp_path_factory, "t5x_gin_values", build)[1]
