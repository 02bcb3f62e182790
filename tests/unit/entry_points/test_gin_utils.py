"""What every gin main shares (`mcwq_t5x.gin_utils`): its help text lists the gin files, the main
macros and the binding forms; its log gives a one-line config summary, not the gin dump; the
native libraries' start-up noise is kept out of stderr, and nothing else."""
import json
import logging
import os
import subprocess
import sys

import gin
import jax.numpy as jnp
import pytest

from mcwq_t5x import eval as eval_lib
from mcwq_t5x import console
from mcwq_t5x import gin_utils
from mcwq_t5x import infer as infer_lib
from mcwq_t5x import train as train_lib
from mcwq_t5x.engine import network
import mains

TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"


@pytest.mark.parametrize("main, name", [(train_lib.main, "train"), (eval_lib.main, "eval"),
                                        (infer_lib.main, "infer")])
def test_mains_help_lists_gin_files_macros_and_binding_form(main, name, capsys):
  with pytest.raises(SystemExit) as e:
    main(["--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert out.startswith(f"usage: python -m mcwq_t5x.{name}")
  assert "--gin.NAME=VALUE" in out and "--gin_file=FILE" in out and "main macros:" in out
  assert "gin/mcwq_t5x/" in out and "CHECKPOINT_PATH" in out or "MODEL_DIR" in out


def test_log_shows_a_config_summary_not_the_gin_dump(caplog):
  caplog.set_level(logging.DEBUG)
  try:
    gin_utils.parse_flags([f"--gin_file={TINY}", "--gin.TRAIN_STEPS=3"] +
                          mains.gin_flags(mains.SMALL_MODEL))
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any("TRAIN_STEPS=3" in m and "MIXTURE_OR_TASK_NAME='mcwq_random_split_en'" in m
               for m in info), info
    assert not any("Parameters for" in m for m in info)
  finally:
    gin.clear_config()


def test_a_run_trained_in_another_dtype_is_decoded_in_it_unless_the_command_line_says(
    tmp_path, caplog):
  """infer and eval compute in the dtype run.json records (bfloat16 here, over tiny.gin's
  float32) unless the command line binds one; one line on stderr says which and why (before the
  fix: tiny.gin's float32, whatever the run was trained in)."""
  run_json = tmp_path / "run" / "run.json"
  (tmp_path / "run" / "checkpoint_5").mkdir(parents=True)
  run_json.write_text('{"format": 1, "network": {"dtype": "bfloat16"}}')
  (tmp_path / "hf").mkdir()  # no run.json at or above: a Hugging Face download, say
  cases = [
      ("run/checkpoint_5", [], "bfloat16",
       f"the run's (recorded in {run_json}, over the gin config's float32); "
       "--gin.network.get_config.dtype=\"'...'\" chooses another"),
      ("run/checkpoint_5", ["--gin.network.get_config.dtype='float32'"], "float32",
       "as the command line binds it (network.get_config.dtype = 'float32'); the run was trained "
       f"in bfloat16 ({run_json})"),
      ("run/checkpoint_5", ["--gin_bindings=network.get_config.dtype = 'bfloat16'"], "bfloat16",
       "as the command line binds it (network.get_config.dtype = 'bfloat16'); the run was "
       f"trained in bfloat16 ({run_json})"),
      ("hf", [], "float32",
       f"as the gin config binds it (no run.json at or above {tmp_path / 'hf'})"),
  ]
  for folder, flags, used, why in cases:
    caplog.clear()
    try:
      args = gin_utils.parse_flags([
          "--gin_file=gin/mcwq_t5x/models/tiny.gin", "--gin_file=gin/mcwq_t5x/runs/infer.gin",
          f"--gin.CHECKPOINT_PATH='{tmp_path / folder}'", *flags
      ])
      with caplog.at_level(logging.INFO):
        assert gin_utils.adopt_recorded_dtype(
            gin_utils.macro_value("CHECKPOINT_PATH"), args.command_line_bindings) == used
      assert jnp.dtype(gin_utils.call_configured(network.get_config).dtype).name == used
      said = [r for r in caplog.records if r.getMessage().startswith("dtype:")]
      assert [r.getMessage() for r in said] == [f"dtype: computing in {used}, {why}"], flags
      assert said[0].levelno == (
          logging.WARNING if used != "bfloat16" and folder != "hf" else logging.INFO)
    finally:
      gin.clear_config()


def test_infer_main_builds_the_model_in_the_runs_dtype(tmp_path, capsys):
  """The infer main adopts the dtype before it builds the model (here it then stops: the
  checkpoint folder is empty); eval's main makes the same call."""
  (tmp_path / "run.json").write_text('{"format": 1, "network": {"dtype": "bfloat16"}}')
  (tmp_path / "checkpoint_5").mkdir()
  (tmp_path / "questions.txt").write_text("Did M0 direct M1\n")
  try:
    with pytest.raises((ValueError, SystemExit), match="not a checkpoint"):
      infer_lib.main([
          "--gin_file=gin/mcwq_t5x/models/tiny.gin", "--gin_file=gin/mcwq_t5x/runs/infer.gin",
          f"--gin.CHECKPOINT_PATH='{tmp_path / 'checkpoint_5'}'",
          f"--input={tmp_path / 'questions.txt'}"
      ])
    assert jnp.dtype(gin_utils.call_configured(network.get_config).dtype).name == "bfloat16"
  finally:
    gin.clear_config()
  assert f"dtype: computing in bfloat16, the run's (recorded in {tmp_path / 'run.json'}" in (
      capsys.readouterr().err)


def test_seqio_logger_cls_warning_is_silenced():
  console.setup_logging()
  seen = []
  handler = logging.Handler()
  handler.emit = lambda record: seen.append(record.getMessage())
  absl_logger = logging.getLogger("absl")
  absl_logger.addHandler(handler)
  try:
    absl_logger.warning("'logger_cls' is empty so seqio.Evaluator will not log its results.")
    absl_logger.warning("something else")
  finally:
    absl_logger.removeHandler(handler)
  assert seen == ["something else"]


def test_commands_set_tensorflow_log_level_unless_the_user_did(tmp_path):
  """`console.quiet_native_logs` in a fresh process, as a command calls it: without an NVIDIA
  driver TensorFlow's C++ errors are off (its one error there is the failed CUDA probe), a
  user's own TF_CPP_MIN_LOG_LEVEL is kept. (What a command prints: test_readme's inspect_task
  and test_mains' training log.)"""
  probe = ("import os; from mcwq_t5x import console; console.quiet_native_logs(); "
           "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])")
  ours = mains.run([sys.executable, "-c", probe], unset=["TF_CPP_MIN_LOG_LEVEL"], cwd=tmp_path)
  assert ours.stdout.strip() == ("1" if os.path.exists("/proc/driver/nvidia") else "3")
  users = mains.run([sys.executable, "-c", probe], env={"TF_CPP_MIN_LOG_LEVEL": "0"}, cwd=tmp_path)
  assert users.stdout.strip() == "0"


def test_native_noise_filter_keeps_everything_else(tmp_path):
  """The filter process drops exactly the listed lines (as TensorFlow and SentencePiece print
  them, some in pieces) and passes the rest in order, a partial last line and a crash's last
  words included."""
  script = r"""
import os, sys
from mcwq_t5x import console
console.quiet_native_logs()
w = lambda b: os.write(2, b)
w(b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
w(b"I0000 00:00:1796306389.669676   14198 port.cc:153] oneDNN custom operations are on. You may "
  b"see slightly different numerical results. To turn them off, set TF_ENABLE_ONEDNN_OPTS=0`.\n")
w(b"kept 1\n")
for piece in (b"normalizer.cc", b"(51) ", b"LOG(INFO) ", b"precompiled_charsmap is empty. use ",
              b"identity normalization.", b"\n"):
  w(piece)
w(b"I0000 00:00:1796306389.670484   14198 cudart_stub.cc:31] Could not find cuda drivers on your "
  b"machine, GPU will not be used.\n")
print("kept 2: normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty.", file=sys.stderr)
w(b"E0000 00:00:1796306410.230725   14198 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
  b"CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n")
sys.stderr.flush()
w(b"last words without a newline")
os.abort()
"""
  out = mains.run([sys.executable, "-c", script],
                  unset=["TF_CPP_MIN_LOG_LEVEL"],
                  check=False,
                  cwd=tmp_path)
  assert out.returncode != 0  # aborted
  cuda = [] if not os.path.exists("/proc/driver/nvidia") else [
      "E0000 00:00:1796306410.230725   14198 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
      "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"
  ]
  assert out.stderr.split("\n") == [
      "kept 1", "kept 2: normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty.", *cuda,
      "last words without a newline"
  ]


def test_native_noise_filter_outlives_a_signal_to_the_process_group(tmp_path):
  """A scheduler's SIGTERM or Ctrl-C's SIGINT reaches the whole process group; the filter keeps
  running, so what the command prints while it handles the signal still comes out."""
  script = r"""
import os, signal, sys, time
from mcwq_t5x import console
console.quiet_native_logs()
def on_term(signum, frame):
  time.sleep(0.5)  # the filter has had the signal too by now
  print("saving a checkpoint before stopping", file=sys.stderr, flush=True)
  sys.exit(7)
signal.signal(signal.SIGTERM, on_term)
os.killpg(os.getpgrp(), signal.SIGTERM)
time.sleep(10)
"""
  env = dict(os.environ)
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)
  # A process group of its own (and of the filter it starts), as a job under a scheduler.
  out = subprocess.run([sys.executable, "-c", script],
                       cwd=tmp_path,
                       env=env,
                       capture_output=True,
                       text=True,
                       timeout=60,
                       start_new_session=True,
                       check=False)
  assert out.returncode == 7, out.stderr
  assert "saving a checkpoint before stopping" in out.stderr


def _run_json(folder, task, prefixes):
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "run.json").write_text(
      json.dumps({
          "format": 1,
          "task": task,
          "input_prefix": prefixes
      }))
  return folder


def test_eval_decodes_the_runs_task_unless_told_another(tmp_path, caplog):
  """MIXTURE_OR_TASK_NAME unset: the task of the run.json at or above CHECKPOINT_PATH; neither:
  one clear error."""
  caplog.set_level(logging.INFO)
  run = _run_json(tmp_path / "run", "mcwq_gold_he", {"mcwq_gold_he": ""})
  try:
    gin_utils.parse_gin(["gin/mcwq_t5x/models/tiny.gin", "gin/mcwq_t5x/runs/eval.gin"],
                        [f"CHECKPOINT_PATH = '{run}'"])
    assert gin_utils.adopt_recorded_task(str(run / "checkpoint_5"), "tasks.mcwq") == "mcwq_gold_he"
    assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "mcwq_gold_he"
    assert f"task: mcwq_gold_he, the run's (recorded in {run / 'run.json'})" in caplog.text
    gin_utils.parse_gin(["gin/mcwq_t5x/models/tiny.gin", "gin/mcwq_t5x/runs/eval.gin"],
                        [f"CHECKPOINT_PATH = '{tmp_path / 'none'}'"])
    with pytest.raises(
        gin_utils.GinConfigError, match="MIXTURE_OR_TASK_NAME is not set and no run.json"):
      gin_utils.adopt_recorded_task(str(tmp_path / "none"), "tasks.mcwq")
  finally:
    gin.clear_config()


def test_infer_prefix_of_a_multilingual_run_is_the_users_choice(tmp_path, caplog):
  """A run of several prefixes (the multilingual mixture) gives infer none: the gin files' stays,
  with a WARNING naming the run's; a command-line prefix of the run's is taken quietly."""
  prefixes = {
      f"mcwq_mcd1_{l}_prefixed": f"translate {n} to Sparql: "
      for l, n in (("en", "English"), ("he", "Hebrew"))
  }
  run = _run_json(tmp_path / "run", "mcwq_mcd1_multilingual_prefixed", prefixes)
  files = ["gin/mcwq_t5x/models/tiny.gin", "gin/mcwq_t5x/runs/infer.gin"]
  try:
    gin_utils.parse_gin(files, [f"CHECKPOINT_PATH = '{run}'"])
    assert gin_utils.adopt_recorded_input_prefix(str(run), []) == ""
    assert ("WARNING" in caplog.text and "mcwq_mcd1_he_prefixed: inputs begin 'translate Hebrew "
            "to Sparql: '" in caplog.text and
            "the prefix of the questions' language" in caplog.text)
    caplog.clear()
    told = ["INPUT_PREFIX = 'translate Hebrew to Sparql: '"]
    gin_utils.parse_gin(files, [f"CHECKPOINT_PATH = '{run}'", *told])
    assert gin_utils.adopt_recorded_input_prefix(str(run), told) == "translate Hebrew to Sparql: "
    assert "WARNING" not in caplog.text and "as the command line binds it" in caplog.text
  finally:
    gin.clear_config()
