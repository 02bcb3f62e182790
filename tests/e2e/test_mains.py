"""End-to-end tests of our engine's mains (train / infer), each run as users run it, in a fresh
process (`python -m mcwq_t5x.train ...`), on real MCWQ text from ../shared with a very small model.

Configuration errors of the training main, through gin in this process:
tests/unit/entry_points/test_train.py. Kill and resume are checked in
tests/unit/checkpointing/test_checkpoints.py (in this process) and test_multiprocess.py (a 2-process
run resumed by one process); `eval` decoding a checkpoint as the training run's final evaluation
did, by the README's commands (test_readme.py)."""
import json
import os
import re
import shutil

import numpy as np
import pytest

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.data import paths
from mcwq_t5x.data import readers
from mcwq_t5x.engine import flops
from mcwq_t5x.engine import network
from mcwq_t5x.evaluation import metrics
import mains
import scenarios

MODEL = "gin/mcwq_t5x/models/tiny.gin"
STEPS = scenarios.OUR_RUN_STEPS


@pytest.fixture(scope="module")
def trained(our_run):
  """The session's run of our engine (conftest.our_run: OUR_RUN, STEPS steps)."""
  return our_run


# The training loss at steps 50 and 100 of this run (seed 0 of the tiny gin file), recorded on a
# 2-core AMD EPYC machine. XLA sums in another order on another CPU, and 100 AdamW steps amplify
# those last bits a little: 2% is far inside what a changed loss, mask, batch or data order moves.
RECORDED_LOSS = {50: 4.0922, 100: 1.3723}


def test_train_learns_and_writes_its_layout(trained):
  model_dir = trained
  assert checkpoint_paths.finished_steps(model_dir)[-1] == STEPS
  assert list((model_dir / "train").glob("events.out.tfevents.*"))
  assert "mcwq_gold_he" in (model_dir / "config.gin").read_text()
  curve = mains.train_losses(model_dir)
  assert sorted(curve) == list(range(50, STEPS + 1, 50)) and all(np.isfinite(list(curve.values())))
  for step, loss in RECORDED_LOSS.items():
    assert curve[step] == pytest.approx(loss, rel=0.02), (step, curve)
  # The 32 questions decoded at the end were trained on: a model that learns gets many right (the
  # 4-step model of a broken engine gets none).
  preds = (model_dir / "predictions/mcwq_gold_he_test.txt").read_text().splitlines()
  gold = readers.read_split("gold", "test", "he", paths.data_dir())[:32]
  assert len(preds) == 32
  scores = json.loads((model_dir / "metrics/mcwq_gold_he_test.json").read_text())
  assert scores["num_examples"] == 32 and scores["step"] == STEPS
  rescored = metrics.exact_match_metric([e.rir for e in gold], preds)["exact_match"]
  assert scores["exact_match"] == pytest.approx(rescored) and rescored >= 15.0, scores
  assert scores["bleu"] == pytest.approx(metrics.bleu_metric([e.rir for e in gold], preds)["bleu"])
  # T5X's names for the periodic evaluations; with EVAL_STEPS = None the loss covers all 155 rows
  # (batch 8: the last batch of 3 rows is padded, not dropped).
  evals = [json.loads(l) for l in (model_dir / "eval_metrics.jsonl").read_text().splitlines()]
  assert [e["step"] for e in evals] == [150, 300]
  assert {
      "training_eval/loss", "training_eval/accuracy", "inference_eval/exact_match",
      "inference_eval/bleu"
  } <= set(evals[0])
  assert evals[1]["training_eval/loss"] < evals[0]["training_eval/loss"]


def test_train_log_is_short_and_says_what_it_decodes(trained):
  """The log: a config summary (the full config is config.gin), the truncation count, and, with
  no held-out dev (EVAL_SPLIT = FINAL_EVAL_SPLIT = 'test'), the last checkpoint decoded."""
  log = (trained.parent / f"{trained.name}.log").read_text()
  assert "Parameters for" not in log and "gin: files" in log
  assert "Parameters for" in (trained / "config.gin").read_text()
  assert "TRUNCATED" in log or "no example exceeds TASK_FEATURE_LENGTHS" in log
  assert "monitoring on the reported split" in log
  assert f"final evaluation decodes the last checkpoint (checkpoint_{STEPS})" in log
  assert "'logger_cls' is empty" not in log
  # No start-up noise of the native libraries (console.quiet_native_logs): absl's notice and
  # TensorFlow's oneDNN and CUDA lines (each twice), SentencePiece's normalizer note (10 times in
  # a short run), and, without an NVIDIA driver, no error-level CUDA line.
  for noise in ("absl::InitializeLog", "oneDNN custom operations", "cudart_stub.cc",
                "precompiled_charsmap is empty"):
    assert noise not in log, noise
  if not os.path.exists("/proc/driver/nvidia"):
    assert "cuInit" not in log and not re.search(r"^E\d{4} ", log, re.M), log
  metrics_file = json.loads((trained / "metrics/mcwq_gold_he_test.json").read_text())
  assert metrics_file["selected_by"] == "last checkpoint" and metrics_file["step"] == STEPS


def test_train_logs_model_flops_as_a_share_of_the_matmul_peak(trained):
  """Each step line gives the model FLOPs per second of its steps and their share of the matmul
  peak timed at start-up; the FLOPs per step are those of the run's network on its batch shape
  (packed rows of TASK_FEATURE_LENGTHS: `flops.train_step_flops`)."""
  log = (trained.parent / f"{trained.name}.log").read_text()
  peak = re.search(r"matmul peak: ([\d.]+) GFLOP/s, (numpy|XLA) 2048x2048 float32 matmul \(", log)
  assert peak, log[-3000:]
  steps = re.findall(
      r"step (\d+)/\d+ .* ([\d.]+)s/step .* ([\d.]+) GFLOP/s = ([\d.]+)% of the "
      rf"{peak.group(2)} matmul's {peak.group(1)}\n", log)
  assert [int(s[0]) for s in steps] == list(range(50, STEPS + 1, 50)), log[-3000:]
  top = float(peak.group(1))
  for _, _, gflops, share in steps:  # each figure printed to 0.05
    rounding = 0.05 + 100 * 0.05 / top * (1 + float(gflops) / top)
    assert float(share) == pytest.approx(100 * float(gflops) / top, abs=rounding + 1e-9)
  run = json.loads((trained / "run.json").read_text())
  lengths = run["feature_lengths"]
  per_step = flops.train_step_flops(
      network.T5Config(**run["network"]), run["batch_size"], lengths["inputs"], lengths["targets"])
  for row in map(json.loads, (trained / "train_metrics.jsonl").read_text().splitlines()):
    assert row["model_gflops_per_s"] * 1e9 * row["step_time_s"] == pytest.approx(per_step)
    assert row["matmul_peak_share"] == pytest.approx(
        row["model_gflops_per_s"] / top, abs=0.05 / top)


def test_infer_main_one_line_per_input_line(trained, tmp_path):
  # A form feed and a Unicode line separator inside questions do not split them; CRLF is fine.
  questions = "Did M0 direct M1\r\nWho edited\x0c M0\nWas M2 \u2028 a film\n"
  out = mains.python_m(
      "mcwq_t5x.infer",
      f"--gin_file={MODEL}",
      "--gin_file=gin/mcwq_t5x/runs/infer.gin",
      f"--gin.CHECKPOINT_PATH='{trained}'",
      "--gin.MAX_DECODE_LENGTH=32",
      "--gin.HOST_DEVICE_COUNT=3",
      "--sparql",
      *mains.gin_flags(mains.SMALL_MODEL),
      input=questions)
  assert len(out.stdout.split("\n")) == 4 and out.stdout.endswith("\n")
  for line in out.stdout.split("\n")[:-1]:  # untrained: valid SPARQL or an explicit error
    assert line.startswith(("ASK", "SELECT", "ERROR: ")), line


def test_infer_main_names_the_bad_input_line(trained, tmp_path):
  """Input that is not UTF-8, or a missing --input file: one error line naming the file (and
  line), before any model is built."""
  bad = tmp_path / "questions.txt"
  bad.write_bytes(b"Did M0 direct M1\nWho edited \xff M0\n")
  for path, message in ((bad, f"DataFormatError: {bad}:2: not valid UTF-8"),
                        (tmp_path / "absent.txt",
                         f"FileNotFoundError: {tmp_path / 'absent.txt'}: no such file")):
    out = mains.python_m(
        "mcwq_t5x.infer",
        f"--gin_file={MODEL}",
        "--gin_file=gin/mcwq_t5x/runs/infer.gin",
        f"--gin.CHECKPOINT_PATH='{trained}'",
        f"--input={path}",
        *mains.gin_flags(mains.SMALL_MODEL),
        check=False)
    assert out.returncode == 1 and out.stdout == "", out.stderr[-3000:]
    assert out.stderr.rstrip().splitlines()[-1].startswith(message), out.stderr[-3000:]


def test_infer_main_malformed_weights_are_one_line(tmp_path):
  """A malformed model.safetensors, or an index naming a shard outside the folder: exit 1 and one
  last line naming the file and the problem (no traceback)."""
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text(
      json.dumps({
          "model_type": "mt5",
          "vocab_size": 2000,
          "d_model": 32,
          "num_heads": 2,
          "num_layers": 1,
          "d_kv": 16,
          "d_ff": 64,
          "feed_forward_proj": "gated-gelu"
      }))
  (hf / "model.safetensors").write_bytes(b"not safetensors")
  out = mains.python_m(
      "mcwq_t5x.infer",
      f"--gin_file={MODEL}",
      "--gin_file=gin/mcwq_t5x/runs/infer.gin",
      f"--gin.CHECKPOINT_PATH='{hf}'",
      *mains.gin_flags(mains.SMALL_MODEL),
      input="Did M0 direct M1\n",
      check=False)
  assert out.returncode == 1, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  assert out.stderr.rstrip().splitlines()[-1].startswith(
      f"UnreadableCheckpointFileError: {hf / 'model.safetensors'}: cannot read safetensors file"
  ), out.stderr[-3000:]


def test_train_main_unknown_task_is_one_line_and_leaves_no_model_dir(tmp_path):
  """A misspelt task: exit status 1, one last line `UnknownTaskError: ...` naming the closest
  tasks (no traceback), and the MODEL_DIR the failed start made (its train.lock) is gone."""
  model_dir = tmp_path / "new" / "run"
  out = mains.python_m(
      "mcwq_t5x.train",
      "--gin_file=gin/mcwq_t5x/tiny_random_split_en.gin",
      f"--gin.MODEL_DIR='{model_dir}'",
      "--gin.MIXTURE_OR_TASK_NAME='mcwq_mcd1_hee'",
      check=False)
  assert out.returncode == 1, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("UnknownTaskError: unknown task or mixture 'mcwq_mcd1_hee' "
                         "(MIXTURE_OR_TASK_NAME; task module tasks.mcwq)"), out.stderr[-3000:]
  assert "closest: mcwq_mcd1_he" in last and "Traceback" not in out.stderr
  assert not model_dir.exists() and (tmp_path / "new").is_dir()


HE_PREFIX = "translate Hebrew to Sparql: "


def test_run_json_records_the_input_prefix(trained):
  run = json.loads((trained / "run.json").read_text())
  assert run["task"] == "mcwq_gold_he" and run["input_prefix"] == {"mcwq_gold_he": ""}


def test_infer_takes_the_runs_input_prefix_and_warns_when_told_another(trained, tmp_path):
  """`infer` puts the run's prefix before each question: a run.json of the paper's form
  (`mcwq_gold_he_prefixed`, written before runs recorded their prefix) decodes as the same
  checkpoint told that prefix; telling another than the run's warns, naming both."""
  questions = "".join(e.question + "\n"
                      for e in readers.read_split("gold", "test", "he", str(paths.data_dir()))[:8])
  prefixed = tmp_path / "prefixed_run"
  shutil.copytree(trained, prefixed, ignore=shutil.ignore_patterns("predictions", "eval_*"))
  run = json.loads((prefixed / "run.json").read_text())
  run["task"] = "mcwq_gold_he_prefixed"
  del run["input_prefix"]
  (prefixed / "run.json").write_text(json.dumps(run))

  def infer(checkpoint, *flags):
    return mains.python_m(
        "mcwq_t5x.infer",
        f"--gin_file={MODEL}",
        "--gin_file=gin/mcwq_t5x/runs/infer.gin",
        f"--gin.CHECKPOINT_PATH='{checkpoint}'",
        "--gin.MAX_DECODE_LENGTH=64",
        *flags,
        *mains.gin_flags(mains.SMALL_MODEL),
        input=questions)

  told = infer(trained, f"--gin.INPUT_PREFIX='{HE_PREFIX}'")
  assert (f"WARNING input prefix: '{HE_PREFIX}', as the command line binds it "
          f"(INPUT_PREFIX = '{HE_PREFIX}'); the run was trained on mcwq_gold_he (the bare "
          f"questions), recorded in {trained / 'run.json'}") in told.stderr
  adopted = infer(prefixed)
  assert (f"INFO input prefix: '{HE_PREFIX}', the run's (the run was trained on "
          f"mcwq_gold_he_prefixed (inputs begin '{HE_PREFIX}')") in adopted.stderr
  assert adopted.stdout == told.stdout
  # The prefix changes what the model decodes: the run's own decoding of the bare questions.
  bare = (trained / "predictions" / "mcwq_gold_he_test.txt").read_text().splitlines()[:8]
  assert told.stdout.splitlines() != bare


def test_eval_warns_when_the_task_has_another_input_form_than_the_run(trained, tmp_path):
  """`eval` of the run's checkpoint on the prefixed form of its task: a WARNING names both tasks
  and their input forms."""
  out = mains.python_m("mcwq_t5x.eval", f"--gin_file={MODEL}",
                       "--gin_file=gin/mcwq_t5x/runs/eval.gin",
                       f"--gin.CHECKPOINT_PATH='{trained}'",
                       "--gin.MIXTURE_OR_TASK_NAME='mcwq_gold_he_prefixed'", "--gin.NUM_EXAMPLES=4",
                       f"--gin.EVAL_OUTPUT_DIR='{tmp_path / 'out'}'",
                       *mains.gin_flags(mains.SMALL_MODEL))
  assert (f"WARNING task mcwq_gold_he_prefixed (inputs begin '{HE_PREFIX}'): the run was trained "
          f"on mcwq_gold_he (the bare questions) (recorded in {trained / 'run.json'})"
         ) in out.stderr, out.stderr[-3000:]
  assert (tmp_path / "out" / "predictions" / "mcwq_gold_he_prefixed_test.txt").is_file()
