"""The gin files of both engines: every file parses and binds, the experiment files of both carry
the paper's settings from one table, both engines' files parse one after the other in one process
(nothing is registered with gin at import), typos are clear errors, generated files are current."""
import pathlib
import subprocess
import sys

import gin
import pytest

from mcwq_t5x.data import pipeline
from mcwq_t5x.engine import network
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x import eval as eval_lib
from mcwq_t5x import gin_utils
from mcwq_t5x import infer as infer_lib
from mcwq_t5x import train as train_lib
import mains

REPO = pathlib.Path(__file__).resolve().parents[3]
ALL_GIN = sorted(str(p.relative_to(REPO)) for p in (REPO / "gin").rglob("*.gin"))
OURS = [f for f in ALL_GIN if f.startswith("gin/mcwq_t5x/")]
T5X_FILES = [f for f in ALL_GIN if not f.startswith("gin/mcwq_t5x/")]
OUR_EXPERIMENTS = [f for f in OURS if f.startswith("gin/mcwq_t5x/mt5_")]
T5X_EXPERIMENTS = [f for f in T5X_FILES if f.startswith("gin/mt5_")]
EVAL_FOLDERS = ("zeroshot", "gold", "test")
MODELS = {"mt5_small": (24, 512, 8), "mt5_base": (12, 768, 12)}  # batch, width, layers


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(main_module, files, bindings=()):
  """Parses as `python -m <main_module>` would: T5X's files import `__main__`, ours name the main."""
  if main_module.__name__.startswith("mcwq_t5x."):
    gin_utils.parse_gin(files, bindings, finalize=True, skip_unknown=False)
  else:
    with mains.as_main(main_module):
      gin_utils.parse_gin(files, bindings, finalize=True, skip_unknown=False)


def _network_config():
  with gin.unlock_config():
    return gin.get_configurable(network.get_config)()


def _experiment(path):
  stem = pathlib.Path(path).stem
  model = "mt5_small" if stem.startswith("mt5_small") else "mt5_base"
  split, lang = stem[len(model) + 1:].rsplit("_", 1)
  return model, split, lang


def test_expected_files_exist():
  for f in ("gin/mcwq_t5x/models/tiny.gin", "gin/mcwq_t5x/models/mt5_small.gin",
            "gin/mcwq_t5x/models/mt5_base.gin", "gin/mcwq_t5x/models/mt5_large.gin",
            "gin/mcwq_t5x/models/t5_base.gin", "gin/mcwq_t5x/runs/finetune.gin",
            "gin/mcwq_t5x/runs/eval.gin", "gin/mcwq_t5x/runs/infer.gin",
            "gin/mcwq_t5x/tiny_random_split_en.gin", "gin/tiny_random_split_en.gin",
            "gin/infer/mt5_small.gin", "gin/infer/mt5_base.gin"):
    assert f in ALL_GIN, f
  # {mt5_small, mt5_base} x 4 splits x 4 languages, for each engine.
  assert len(T5X_EXPERIMENTS) == len(OUR_EXPERIMENTS) == 32
  for folder in ("zeroshot", "gold"):  # 2 models x 4 splits x {he, kn, zh}
    assert len([f for f in T5X_FILES if f.startswith(f"gin/{folder}/")]) == 24
    assert len([f for f in OURS if f.startswith(f"gin/mcwq_t5x/{folder}/")]) == 24
  # test-set decoding of the best checkpoint: 32 mT5 + 4 T5-base experiments
  assert len([f for f in T5X_FILES if f.startswith("gin/test/")]) == 36
  assert len([f for f in OURS if f.startswith("gin/mcwq_t5x/test/")]) == 36
  # English T5-base (T5.1.1), seed 8 and the second seed 16, 4 splits
  assert len([f for f in T5X_FILES if f.startswith("gin/t5_base_")]) == 8
  assert len([f for f in OURS if f.startswith("gin/mcwq_t5x/t5_base_")]) == 8


# Our model and run files are partial by design (T5X: %gin.REQUIRED macros): they are checked in
# the combinations users run them in.
REQUIRED = {
    "finetune": [
        "MIXTURE_OR_TASK_NAME = 'mcwq_mcd1_en'", "TRAIN_STEPS = 10",
        "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 64}", "MODEL_DIR = '/tmp/x'"
    ],
    "eval": ["MIXTURE_OR_TASK_NAME = 'mcwq_mcd1_en'", "CHECKPOINT_PATH = '/tmp/x'"],
    "infer": ["CHECKPOINT_PATH = '/tmp/x'"],
}
MAIN_OF_RUN = {"finetune": train_lib, "eval": eval_lib, "infer": infer_lib}


def _our_files(path):
  """(main module, files, bindings) a user combines `path` with."""
  if path.startswith("gin/mcwq_t5x/models/"):
    return eval_lib, [path, "gin/mcwq_t5x/runs/eval.gin"], REQUIRED["eval"]
  if path.startswith("gin/mcwq_t5x/runs/"):
    run = pathlib.Path(path).stem
    return MAIN_OF_RUN[run], ["gin/mcwq_t5x/models/tiny.gin", path], REQUIRED[run]
  if any(f"/{folder}/" in path for folder in EVAL_FOLDERS):
    return eval_lib, [path], []
  if "/recipes/" in path:  # an alternative added after an experiment file
    return train_lib, ["gin/mcwq_t5x/mt5_small_mcd1_en.gin", path], []
  return train_lib, [path], []


@pytest.mark.parametrize("path", OURS)
def test_every_file_of_ours_parses_and_binds(path):
  main, files, bindings = _our_files(path)
  _parse(main, files, bindings)
  cfg = _network_config()  # the network config (not the parameters: 250k-vocab models are big)
  assert cfg.vocab_size in (2000, 2048, 250112, 32128)
  training = main is train_lib
  assert cfg.dropout_rate == ((0.05 if path == "gin/mcwq_t5x/tiny_random_split_en.gin" else 0.1)
                              if training else 0.0)
  if training:
    with gin.unlock_config():
      with gin.config_scope("train"):
        ds = gin.get_configurable(pipeline.DatasetConfig)()
      lr = gin.get_configurable(trainer_lib.create_learning_rate_schedule)()
      part = gin.get_configurable(partitioning.Partitioner)()
    assert ds.mixture_or_task_name.startswith("mcwq_") and ds.module == "tasks.mcwq"
    assert float(lr(10**6)) >= 0.0 and float(lr(gin.query_parameter("%WARMUP_STEPS"))) > 0
    assert part.mesh.axis_names == ("data", "model")


@pytest.fixture(scope="module")
def t5x_installed():
  pytest.importorskip(
      "t5x.train",
      reason="the real T5X is not installed "
      "(bash scripts/install_t5x.sh; CI installs it)")


# Parsing T5X's files in a fresh process, as `python -m t5x.train` does: T5X's own model files bind
# short selectors without imports (`network.Transformer.config = ...` in t5x/examples/t5/mt5/
# small.gin), which are ambiguous once our `mcwq_t5x.engine.network.Transformer` is registered; so in one
# process T5X's files are parsed first, then ours (test_both_engines_parse_in_one_process).
@pytest.fixture(scope="module")
def t5x_parsed(t5x_installed, tmp_path_factory):
  """{file: values} for every T5X file, then our training files, parsed in one fresh process
  (t5x_gin_values.PARSE_SCRIPT, shared with test_recipe.py)."""
  import t5x_gin_values  # pylint: disable=g-import-not-at-top
  return t5x_gin_values.t5x_values(tmp_path_factory)["parse"]


def test_every_t5x_file_parses(t5x_parsed):
  for path in T5X_FILES:
    assert t5x_parsed[path]["MIXTURE_OR_TASK_MODULE"] == "tasks.mcwq", path
    assert t5x_parsed[path]["MIXTURE_OR_TASK_NAME"].startswith("mcwq_"), path


def test_every_t5x_file_runs_our_engine_unless_asked_for_t5xs_own_model(t5x_parsed):
  """`MODEL` is `mcwq_t5x.t5x_bridge.models.EncoderDecoderModel` over our network of the file's
  `network.T5Config` (T5X's attention logits in the activations' dtype), its `remat_policy` the
  file's `REMAT_POLICY`: "full" where a file trains the paper's models, "none" in the tiny job and
  where nothing is trained; `gin/recipes/t5x_own_model.gin` returns to T5X's own model."""
  for path in T5X_FILES:
    v = t5x_parsed[path]
    own = path == "gin/recipes/t5x_own_model.gin"
    assert v["model"] == ("@models.EncoderDecoderModel()"
                          if own else "@t5x_bridge.EncoderDecoderModel()"), path
    trains_paper_model = path.startswith(("gin/mt5_", "gin/t5_base_", "gin/recipes/"))
    assert v["remat"] == ("full" if trains_paper_model else "none"), path
    assert v["remat_binding"] == "%REMAT_POLICY", path
    tiny = path == "gin/tiny_random_split_en.gin"
    dtype, width, vocab_size, float32_logits, dropout = v["network"]
    assert (dtype, float32_logits) == ("float32" if tiny else "bfloat16", False), path
    if "width" in v:
      assert width == v["width"] and dropout == v["dropout"], path
    assert vocab_size == (2000 if tiny else 32128 if "/t5_base_" in path else 250112), path
  assert t5x_parsed["gin/mt5_base_mcd1_he.gin"]["network"][1:3] == [768, 250112]


def test_both_engines_parse_in_one_process(t5x_parsed):
  """Nothing registers gin configurables at import, and ours name their main by module, so T5X's
  files and then ours parse in one process (no "Ambiguous selector 'train'")."""
  assert t5x_parsed["gin/mcwq_t5x/mt5_base_mcd1_he.gin"]["MIXTURE_OR_TASK_MODULE"] == "tasks.mcwq"
  assert t5x_parsed["gin/mcwq_t5x/tiny_random_split_en.gin"]["MIXTURE_OR_TASK_MODULE"] == (
      "tasks.mcwq")


@pytest.mark.parametrize("path", T5X_EXPERIMENTS)
def test_paper_settings_in_both_engines(path, t5x_parsed):
  """The same row of the table gives the same experiment in T5X's file and in ours."""
  model, split, lang = _experiment(path)
  batch, width, layers = MODELS[model]
  t5x = t5x_parsed[path]
  assert t5x["optimizer"] == "@optimizers.chain()" and t5x["width"] == width
  t5x_values = {
      "task": t5x["MIXTURE_OR_TASK_NAME"],
      "steps": t5x["steps"] - 1_000_000,
      "batch": t5x["batch"],
      "lengths": t5x["lengths"],
      "dropout": t5x["dropout"],
      "init": t5x["init"],
      "lr": t5x["lr"],
      "cached": t5x["cached"]
  }
  _parse(train_lib, [f"gin/mcwq_t5x/{pathlib.Path(path).name}"])
  ours = {
      "task": gin.query_parameter("%MIXTURE_OR_TASK_NAME"),
      "steps": gin.query_parameter("%TRAIN_STEPS"),
      "batch": gin.query_parameter("%BATCH_SIZE"),
      "lengths": gin.query_parameter("%TASK_FEATURE_LENGTHS"),
      "dropout": gin.query_parameter("%DROPOUT_RATE"),
      "init": gin.query_parameter("%INITIAL_CHECKPOINT_PATH"),
      "lr": gin.query_parameter("%LEARNING_RATE"),
      "cached": gin.query_parameter("%USE_CACHED_TASKS"),
  }
  # the paper's recipe: tests/unit/entry_points/test_recipe.py
  assert gin.query_parameter("%LR_SCHEDULE") == "linear"
  cfg = _network_config()
  assert (cfg.emb_dim, cfg.num_encoder_layers, cfg.vocab_size) == (width, layers, 250112)
  assert t5x_values == ours == {
      "task": f"mcwq_{split}_{lang}_prefixed",
      "steps": 50_000,
      "batch": batch,
      "dropout": 0.1,
      "lengths": {
          "inputs": 256,
          "targets": 512
      },
      "lr": 5e-4,
      "cached": False,
      "init": f"gs://t5-data/pretrained_models/t5x/{model}/checkpoint_1000000"
  }


def test_zeroshot_and_gold_point_to_the_trained_model():
  _parse(eval_lib, ["gin/mcwq_t5x/zeroshot/mt5_base_mcd2_kn.gin"])
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "mcwq_mcd2_zeroshot_kn_prefixed"
  assert gin.query_parameter("%CHECKPOINT_PATH") == "runs/mt5_base_mcd2_en"
  assert gin.query_parameter("%SPLIT") == "test"
  gin.clear_config()
  _parse(eval_lib, ["gin/mcwq_t5x/gold/mt5_small_mcd1_zh.gin"])
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "mcwq_gold_zh_prefixed"
  assert gin.query_parameter("%CHECKPOINT_PATH") == "runs/mt5_small_mcd1_zh"
  text = (REPO / "gin/zeroshot/mt5_base_mcd2_kn.gin").read_text()
  assert "CHECKPOINT_PATH = 'runs/t5x/mt5_base_mcd2_en'" in text
  assert "MIXTURE_OR_TASK_NAME = 'mcwq_mcd2_zeroshot_kn_prefixed'" in text


def test_tiny_config_and_overrides():
  _, bindings = gin_utils.rewrite_gin_args(
      ["--gin.MODEL_DIR='/tmp/x'", "--gin.TRAIN_STEPS=7", "--other"])
  assert bindings == ["MODEL_DIR = '/tmp/x'", "TRAIN_STEPS = 7"]
  _parse(train_lib, ["gin/mcwq_t5x/tiny_random_split_en.gin"], bindings)
  assert gin.query_parameter("%MODEL_DIR") == "/tmp/x"
  assert gin.query_parameter("%TRAIN_STEPS") == 7
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "mcwq_random_split_en"
  assert gin.query_parameter("%TRAIN_SPLIT") == "validation"
  # One place for the presets: the gin file names a preset of network.CONFIGS.
  assert _network_config() == network.get_config("tiny", dropout_rate=0.05, dtype="float32")
  assert network.CONFIGS["tiny"].vocab_size == 2000


def test_generated_files_are_up_to_date():
  out = subprocess.run(
      [sys.executable, str(REPO / "scripts/make_gin_configs.py"), "--check"],
      capture_output=True,
      text=True)
  assert out.returncode == 0, out.stdout + out.stderr


def test_generator_round_trip(tmp_path):
  subprocess.run(
      [sys.executable,
       str(REPO / "scripts/make_gin_configs.py"), "--root",
       str(tmp_path)],
      check=True,
      capture_output=True)
  generated = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.gin"))
  assert len(generated) == 257
  for f in generated:
    assert (tmp_path / f).read_text() == (REPO / f).read_text(), f


def test_gin_typos_are_clear_errors(tmp_path):
  # Unknown parameter of a configurable, in a file: names the file and line.
  bad = tmp_path / "bad.gin"
  bad.write_text(
      "include 'gin/mcwq_t5x/tiny_random_split_en.gin'\n\ntrain_script.train.totl_steps = 5\n")
  with pytest.raises(gin_utils.GinConfigError, match=r"(?s)totl_steps.*bad.gin.*line 3"):
    _parse(train_lib, [str(bad)])
  # A misspelt macro on the command line.
  with pytest.raises(gin_utils.GinConfigError, match="macro TRAIN_STEPPS is not used"):
    _parse(train_lib, ["gin/mcwq_t5x/tiny_random_split_en.gin"], ["TRAIN_STEPPS = 5"])
  # A macro name that is a prefix of a used one (the files reference %TRAIN_STEPS, %EVAL_STEPS,
  # %BATCH_SIZE, %KEEP_CHECKPOINTS, %LEARNING_RATE): matched by whole name, not as a substring.
  for name in ("TRAIN_STEP", "EVAL_STEP", "BATCH", "KEEP_CHECKPOINT", "LEARNING_RAT"):
    with pytest.raises(gin_utils.GinConfigError, match=f"macro {name} is not used"):
      gin_utils.parse_gin(["gin/mcwq_t5x/tiny_random_split_en.gin"], [f"{name} = 5"])
  # The whole names still bind.
  _parse(train_lib, ["gin/mcwq_t5x/tiny_random_split_en.gin"], ["TRAIN_STEPS = 5"])
  # A missing file.
  with pytest.raises(gin_utils.GinConfigError, match="gin file 'gin/nope.gin' not found"):
    gin_utils.parse_gin(["gin/nope.gin"])
  # --gin.NAME without a value.
  with pytest.raises(gin_utils.GinConfigError, match="expected --gin.NAME=VALUE"):
    gin_utils.rewrite_gin_args(["--gin.TRAIN_STEPS"])


def test_gin_include_cycles_and_missing_includes_name_their_files(tmp_path):
  """An include cycle names each file of the cycle and the line that includes the next (gin
  itself recurses until RecursionError); a pure two-file cycle is reported as a cycle, not as an
  unused macro; a missing include names the file and line that include it."""
  c, d, e, f, m = (tmp_path / f"{n}.gin" for n in "cdefm")
  c.write_text(f"include 'gin/mcwq_t5x/tiny_random_split_en.gin'\ninclude '{d}'\n")
  d.write_text(f"# d\ninclude '{c}'\n")
  e.write_text(f"include '{f}'\n")
  f.write_text(f"include '{e}'\n")
  m.write_text("include 'gin/mcwq_t5x/tiny_random_split_en.gin'\ninclude 'gin/nowhere.gin'\n")
  with pytest.raises(
      gin_utils.GinConfigError,
      match=(f"^gin include cycle: {e}, line 1, includes {f}; {f}, line 1, includes {e}$")):
    gin_utils.parse_gin([str(e)], ["MODEL_DIR = 'x'"])
  with pytest.raises(
      gin_utils.GinConfigError,
      match=f"^{m}, line 2: included gin file 'gin/nowhere.gin' not found \\(searched: "):
    gin_utils.parse_gin([str(m)])
  # A file included twice, not in a cycle, is no cycle.
  twice = tmp_path / "twice.gin"
  twice.write_text("include 'gin/mcwq_t5x/models/tiny.gin'\n"
                   "include 'gin/mcwq_t5x/tiny_random_split_en.gin'\n")
  _parse(train_lib, [str(twice)], ["TRAIN_STEPS = 5"])
  # As a user meets it: the command's last line names the cycle.
  out = mains.python_m(
      "mcwq_t5x.train", f"--gin_file={c}", "--gin.MODEL_DIR='runs/x'", cwd=tmp_path, check=False)
  assert out.returncode == 1
  assert out.stderr.strip().splitlines()[-1] == (
      f"mcwq_t5x.gin_utils.GinConfigError: gin include cycle: {c}, line 2, includes {d}; "
      f"{d}, line 2, includes {c}"), out.stderr[-2000:]
  assert "RecursionError" not in out.stderr
