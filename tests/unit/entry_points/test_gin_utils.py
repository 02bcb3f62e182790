"""What every gin main shares (`mcwq_t5x.gin_utils`): its help text lists the gin files, the main
macros and the binding forms; its log gives a one-line config summary, not the gin dump; the
native libraries' start-up noise is kept out of stderr, and nothing else."""
import logging
import os
import subprocess
import sys

import gin
import pytest

from mcwq_t5x import eval as eval_lib
from mcwq_t5x import console
from mcwq_t5x import gin_utils
from mcwq_t5x import infer as infer_lib
from mcwq_t5x import train as train_lib
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
