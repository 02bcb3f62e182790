"""Every gin file parses and binds; experiment files carry the paper's hyperparameters; typos are
reported clearly; the generated experiment files are up to date."""
import pathlib
import subprocess
import sys

import gin
import pytest

from mcwq_t5x import gin_utils
from mcwq_t5x import partitioning
from mcwq_t5x import trainer as trainer_lib
from mcwq_t5x import utils

REPO = pathlib.Path(__file__).resolve().parents[1]
ALL_GIN = sorted(str(p.relative_to(REPO)) for p in (REPO / "gin").rglob("*.gin"))
EXPERIMENTS = [f for f in ALL_GIN if f.startswith("gin/mt5_")]
ZEROSHOT = [f for f in ALL_GIN if f.startswith("gin/zeroshot/")]


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


def _network_config():
  with gin.unlock_config():
    from mcwq_t5x import network  # pylint: disable=g-import-not-at-top
    return gin.get_configurable(network.T5Config)()


def test_expected_files_exist():
  for f in ("gin/models/tiny.gin", "gin/models/mt5_small.gin", "gin/models/mt5_base.gin",
            "gin/models/mt5_large.gin", "gin/models/t5_base.gin", "gin/runs/finetune.gin",
            "gin/runs/eval.gin", "gin/runs/infer.gin", "gin/tiny_random_split_en.gin"):
    assert f in ALL_GIN, f
  assert len(EXPERIMENTS) == 32  # {mt5_small, mt5_base} x 4 splits x 4 languages
  assert len(ZEROSHOT) == 24     # 2 models x 4 splits x {he, kn, zh}


# Model and run files are partial by design (T5X: %gin.REQUIRED macros): they are checked in the
# combinations users run them in.
REQUIRED = {
    "gin/runs/finetune.gin": ["MIXTURE_OR_TASK_NAME = 'mcwq_mcd1_en'",
                              "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 64}",
                              "TRAIN_STEPS = 10", "MODEL_DIR = '/tmp/unused'"],
    "gin/runs/eval.gin": ["MIXTURE_OR_TASK_NAME = 'mcwq_mcd1_en'", "CHECKPOINT_PATH = '/tmp/x'"],
    "gin/runs/infer.gin": ["CHECKPOINT_PATH = '/tmp/x'"],
}


def _files_and_bindings(path):
  if path.startswith("gin/models/"):
    return [path, "gin/runs/eval.gin"], REQUIRED["gin/runs/eval.gin"]
  if path.startswith("gin/runs/"):
    return ["gin/models/tiny.gin", path], REQUIRED[path]
  return [path], []


@pytest.mark.parametrize("path", ALL_GIN)
def test_every_gin_file_parses_and_binds(path):
  """parse_config_files_and_bindings(finalize, skip_unknown=False), then cheap instantiation."""
  files, bindings = _files_and_bindings(path)
  gin_utils.parse_gin(files, bindings, finalize=True, skip_unknown=False)
  cfg = _network_config()  # the network config (not the parameters: 250k-vocab models are big)
  assert cfg.vocab_size in (2000, 250112, 32128)
  expected_dropout = 0.05 if path == "gin/tiny_random_split_en.gin" else 0.1
  assert cfg.dropout_rate == (0.0 if "eval.gin" in files[-1] or "infer.gin" in files[-1]
                              or "zeroshot" in path else expected_dropout)
  if "finetune" in path or path in EXPERIMENTS or path == "gin/tiny_random_split_en.gin":
    with gin.unlock_config():
      with gin.config_scope("train"):
        ds = gin.get_configurable(utils.DatasetConfig)()
      lr = gin.get_configurable(trainer_lib.create_learning_rate_schedule)()
      part = gin.get_configurable(partitioning.Partitioner)()
    assert ds.mixture_or_task_name.startswith("mcwq_")
    assert float(lr(10**6)) >= 0.0 and float(lr(gin.query_parameter("%WARMUP_STEPS"))) > 0
    assert part.mesh.axis_names == ("data", "model")


@pytest.mark.parametrize("path", EXPERIMENTS)
def test_experiment_hyperparameters(path):
  gin_utils.parse_gin([path])
  model, split, lang = pathlib.Path(path).stem.rsplit("_", 2) if "random_split" not in path else (
      pathlib.Path(path).stem.split("_random_split_")[0], "random_split",
      pathlib.Path(path).stem.rsplit("_", 1)[1])
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == f"mcwq_{split}_{lang}"
  assert gin.query_parameter("%TRAIN_STEPS") == 50000
  assert gin.query_parameter("%LEARNING_RATE") == 5e-4
  assert gin.query_parameter("%BATCH_SIZE") == {"mt5_small": 24, "mt5_base": 12}[model]
  assert gin.query_parameter("%INITIAL_CHECKPOINT_PATH") == (
      f"gs://t5-data/pretrained_models/t5x/{model}/checkpoint_1000000")
  cfg = _network_config()
  assert cfg.vocab_size == 250112
  assert cfg.emb_dim == {"mt5_small": 512, "mt5_base": 768}[model]
  assert cfg.num_encoder_layers == {"mt5_small": 8, "mt5_base": 12}[model]


def test_zeroshot_configs_point_to_english_model():
  gin_utils.parse_gin(["gin/zeroshot/mt5_base_mcd2_kn.gin"])
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "mcwq_mcd2_zeroshot_kn"
  assert gin.query_parameter("%CHECKPOINT_PATH") == "runs/mt5_base_mcd2_en"
  assert gin.query_parameter("%SPLIT") == "test"


def test_tiny_config_and_overrides():
  _, bindings = gin_utils.rewrite_gin_args(["--gin.MODEL_DIR='/tmp/x'", "--gin.TRAIN_STEPS=7",
                                            "--other"])
  assert bindings == ["MODEL_DIR = '/tmp/x'", "TRAIN_STEPS = 7"]
  gin_utils.parse_gin(["gin/tiny_random_split_en.gin"], bindings)
  assert gin.query_parameter("%MODEL_DIR") == "/tmp/x"
  assert gin.query_parameter("train.total_steps") == 7 or gin.query_parameter(
      "%TRAIN_STEPS") == 7
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "mcwq_random_split_en"
  assert gin.query_parameter("%TRAIN_SPLIT") == "validation"
  assert _network_config().vocab_size == 2000


def test_generated_files_are_up_to_date():
  out = subprocess.run([sys.executable, str(REPO / "scripts/make_gin_configs.py"), "--check"],
                       capture_output=True, text=True)
  assert out.returncode == 0, out.stdout + out.stderr


def test_generator_round_trip(tmp_path):
  subprocess.run([sys.executable, str(REPO / "scripts/make_gin_configs.py"), "--root",
                  str(tmp_path)], check=True, capture_output=True)
  for f in EXPERIMENTS + ZEROSHOT:
    assert (tmp_path / f).read_text() == (REPO / f).read_text(), f


def test_gin_typos_are_clear_errors(tmp_path):
  # Unknown parameter of a configurable, in a file: names the file and line.
  bad = tmp_path / "bad.gin"
  bad.write_text("include 'gin/tiny_random_split_en.gin'\n\ntrain.totl_steps = 5\n")
  with pytest.raises(gin_utils.GinConfigError, match=r"(?s)totl_steps.*bad.gin.*line 3"):
    gin_utils.parse_gin([str(bad)])
  # A misspelt macro on the command line.
  with pytest.raises(gin_utils.GinConfigError, match="macro TRAIN_STEPPS is not used"):
    gin_utils.parse_gin(["gin/tiny_random_split_en.gin"], ["TRAIN_STEPPS = 5"])
  # A missing file.
  with pytest.raises(gin_utils.GinConfigError, match="gin file 'gin/nope.gin' not found"):
    gin_utils.parse_gin(["gin/nope.gin"])
  # --gin.NAME without a value.
  with pytest.raises(gin_utils.GinConfigError, match="expected --gin.NAME=VALUE"):
    gin_utils.rewrite_gin_args(["--gin.TRAIN_STEPS"])
