"""A researcher's first day: help texts, log lines, truncation counts, checkpoint
selection without a held-out dev split, TensorBoard scalars; in this process, on real MCWQ text
where data is needed (the 155 gold questions load in a second)."""
import dataclasses
import json
import logging
import os
import subprocess
import sys

import gin
import pytest

from mcwq_t5x import best_checkpoint as best_checkpoint_cli
from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import vocab
from mcwq_t5x import eval as eval_lib
from mcwq_t5x import gin_utils
from mcwq_t5x import infer as infer_lib
from mcwq_t5x import inspect_task
from mcwq_t5x import score as score_cli
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


def test_best_checkpoint_and_inspect_task_help(capsys):
  with pytest.raises(SystemExit):
    best_checkpoint_cli.main(["--help"])
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m mcwq_t5x.best_checkpoint") and "--metric" in out
  with pytest.raises(SystemExit):
    inspect_task.main(["--help"])
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m mcwq_t5x.inspect_task")
  assert "examples to print" in out


def test_best_checkpoint_prints_the_newest_or_best(tmp_path, capsys):
  assert best_checkpoint_cli.main([str(tmp_path)]) == 1
  assert "no checkpoint" in capsys.readouterr().err


def test_inspect_task_without_train_files_is_one_line(capsys, mcwq_dir):
  del mcwq_dir  # the shared copy: dev and test files only
  assert inspect_task.main(["mcwq_mcd1_en", "--split", "train"]) == 1
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "Traceback" not in err
  assert "download_mcwq.py --out DIR" in err and "MCWQ_DATA_DIR=DIR" in err


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
  gin_utils.setup_logging()
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


def test_truncation_is_counted_and_logged(mcwq_dir, caplog):
  del mcwq_dir
  cfg = pipeline.DatasetConfig(
      "mcwq_gold_he_prefixed", {
          "inputs": 16,
          "targets": 512
      },
      "test",
      8,
      shuffle=False,
      module="tasks.mcwq")
  counts = pipeline.count_truncated(cfg)
  assert counts["inputs"]["examples"] == 155 and counts["inputs"]["truncated"] == 155
  assert counts["targets"]["truncated"] == 0 and counts["inputs"]["longest"] > 16
  # At the boundary: an example exactly as long as the limit fits; counted against the lengths of
  # the task's own examples, read one by one.
  import seqio  # pylint: disable=g-import-not-at-top
  lengths = [
      len(ex["inputs"]) for ex in seqio.get_mixture_or_task("mcwq_gold_he_prefixed").get_dataset(
          None, split="test", shuffle=False).as_numpy_iterator()
  ]
  longest = counts["inputs"]["longest"]
  assert longest == max(lengths) and sum(l == longest for l in lengths) >= 1
  for limit in (longest - 1, longest):
    at = pipeline.count_truncated(
        dataclasses.replace(cfg, task_feature_lengths={
            "inputs": limit,
            "targets": 512
        }))
    assert at["inputs"]["truncated"] == sum(l > limit for l in lengths), limit
  with caplog.at_level(logging.WARNING):
    arrays = pipeline.load_feature_arrays(cfg)
  assert arrays["encoder_input_tokens"].shape == (155, 16)
  (line,) = [r.getMessage() for r in caplog.records if "TRUNCATED" in r.getMessage()]
  assert "155 of 155 inputs" in line and "mcwq_gold_he_prefixed/test" in line
  assert pipeline.count_truncated(
      pipeline.DatasetConfig("mcwq_gold_he", None, "test", 8, module="tasks.mcwq")) == {}


def test_selection_is_never_on_the_reported_split(caplog):
  test = pipeline.DatasetConfig("mcwq_random_split_en", None, "test", 8)
  dev = pipeline.DatasetConfig("mcwq_random_split_en", None, "validation", 8)
  assert train_lib.selection_metric("training_eval/loss", dev, [test]) == "training_eval/loss"
  with caplog.at_level(logging.WARNING):
    assert train_lib.selection_metric("training_eval/loss", test, [test]) is None
  assert "last checkpoint" in caplog.text and "monitoring only" in caplog.text


def test_tiny_job_selects_no_checkpoint():
  """The tiny job has no held-out dev (EVAL_SPLIT is test): it decodes its last checkpoint."""
  fn = mains.configured(train_lib, "train", [TINY], mains.SMALL_MODEL)
  try:
    assert gin.query_parameter("%EVAL_SPLIT") == gin.query_parameter("%FINAL_EVAL_SPLIT") == "test"
    assert gin.query_parameter("%METRIC_NAME_TO_MONITOR") is None
    assert "monitoring only" in gin.query_parameter("%RUN_NOTE")
  finally:
    gin.clear_config()
  del fn


def test_tensorboard_metrics_are_plain_scalars(tmp_path):
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  writer = train_lib.create_metric_writer(str(tmp_path / "train"))
  writer.write_scalars(1, {"loss": 2.5, "accuracy": 0.25})
  writer.write_scalars(2, {"loss": 1.5, "accuracy": 0.5})
  writer.close()
  acc = event_accumulator.EventAccumulator(str(tmp_path / "train"))
  acc.Reload()
  assert sorted(acc.Tags()["scalars"]) == ["accuracy", "loss"]
  assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (2, 1.5)]
  # best_checkpoint reads them too (T5X's {run}/{tag} form).
  assert best_checkpoint.read_metric(tmp_path, "train/loss") == {1: 2.5, 2: 1.5}


def test_commands_set_tensorflow_log_level_unless_the_user_did(tmp_path):
  """`gin_utils.quiet_native_logs` in a fresh process, as a command calls it: without an NVIDIA
  driver TensorFlow's C++ errors are off (its one error there is the failed CUDA probe), a
  user's own TF_CPP_MIN_LOG_LEVEL is kept. (What a command prints: test_readme's inspect_task
  and test_mains' training log.)"""
  probe = ("import os; from mcwq_t5x import gin_utils; gin_utils.quiet_native_logs(); "
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
from mcwq_t5x import gin_utils
gin_utils.quiet_native_logs()
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


def test_missing_vocabulary_file_is_one_line(tmp_path):
  """MCWQ_VOCAB naming a file that is not there (docs/splits.md followed without its vocabulary
  command): the commands stop at once with one line naming the variable and the path."""
  message = ("MCWQ_VOCAB=runs/mcwq_spm.model: this SentencePiece model does not exist; create it "
             "(`python scripts/train_vocab.py --output runs/mcwq_spm.model` trains the small "
             "offline vocabulary there) or unset MCWQ_VOCAB (the small offline vocabulary)")
  env = {"MCWQ_VOCAB": "runs/mcwq_spm.model"}
  train = mains.python_m("mcwq_t5x.train", f"--gin_file={TINY}", env=env, check=False, cwd=tmp_path)
  assert train.returncode == 1 and "Traceback" not in train.stderr
  assert train.stderr.splitlines()[-1] == f"VocabularyNotFoundError: {message}"
  inspect = mains.python_m(
      "mcwq_t5x.inspect_task", "mcwq_mcd1_en", env=env, check=False, cwd=tmp_path)
  assert inspect.returncode == 1 and inspect.stderr.strip() == f"error: {message}"


def test_unreadable_remote_vocabulary_is_one_line(monkeypatch):
  """A `gs://` vocabulary that cannot be read (offline, no credentials, no such object): one line
  naming MCWQ_VOCAB and what to do, not TensorFlow's transport error."""
  path = "gs://mcwq-t5x-no-such-bucket/sentencepiece.model"
  monkeypatch.setenv("MCWQ_VOCAB", path)
  with pytest.raises(vocab.VocabularyNotFoundError) as e:
    vocab.get_vocabulary().encode("ASK")
  message = str(e.value)
  assert message.startswith(f"MCWQ_VOCAB={path}: this SentencePiece model cannot be read (")
  assert "\n" not in message and message.endswith(
      f"copy it to this machine (e.g. `gsutil cp {path} runs/`) and point MCWQ_VOCAB at the copy")


# --- execution accuracy: what it is, where it runs, how it is reported -------------------------
_WD = "http://www.wikidata.org/entity/"
_WDT = "http://www.wikidata.org/prop/direct/"


def _tiny_store(tmp_path):
  """N-Triples: Q42 and Q5 are citizens of Q29 (Spain); Q7 of Q142 (France)."""
  lines = [
      f"<{_WD}{s}> <{_WDT}P27> <{_WD}{o}> ." for s, o in (("Q42", "Q29"), ("Q5", "Q29"), ("Q7",
                                                                                          "Q142"))
  ]
  path = tmp_path / "tiny.nt"
  path.write_text("\n".join(lines) + "\n")
  return path


def test_execution_on_targets_without_a_release(tmp_path, capsys):
  """MCWQ's own files carry no entities: queries with placeholders are not executable, those
  without run; reported as "x of n executable (n of N)", answers per line with --answers."""
  targets = [
      "ASK WHERE { M0 wdt:P27 wd:Q29 }",  # placeholder: nothing binds it
      "SELECT DISTINCT ?x0 WHERE { ?x0 wdt:P27 wd:Q29 }",
      "ASK WHERE { wd:Q7 wdt:P27 wd:Q29 }",
  ]
  (tmp_path / "targets.txt").write_text("\n".join(targets) + "\n")
  from mcwq_t5x.data import rir  # pylint: disable=g-import-not-at-top
  preds = [
      rir.sparql_to_rir(q)
      for q in (targets[0], targets[1].replace("Q29", "Q142"), targets[2].replace("Q29", "Q142"))
  ]
  (tmp_path / "pred.txt").write_text("\n".join(preds) + "\n")
  assert score_cli.main([
      "--predictions",
      str(tmp_path / "pred.txt"), "--targets",
      str(tmp_path / "targets.txt"), "--target_format", "sparql", "--execute", "--codex", "",
      "--ntriples",
      str(_tiny_store(tmp_path)), "--answers",
      str(tmp_path / "answers.jsonl")
  ]) == 0
  captured = capsys.readouterr()
  result = json.loads(captured.out)
  assert result["execution"]["executable_of"] == ("execution accuracy 0.0%: 0 of 2 executable "
                                                  "(2 of 3)")
  assert "0 of 2 executable (2 of 3)" in captured.err
  assert result["execution"]["outcomes"]["not_executable"] == 1
  answers = [json.loads(l) for l in (tmp_path / "answers.jsonl").read_text().splitlines()]
  assert [a["outcome"] for a in answers] == ["not_executable", "wrong_answer", "wrong_answer"]
  assert answers[1]["gold"] == ["wd:Q42", "wd:Q5"] and answers[1]["predicted"] == ["wd:Q7"]
  assert answers[2]["gold"] is False and answers[2]["predicted"] is True


def test_execution_help_says_what_it_is(capsys):
  with pytest.raises(SystemExit):
    score_cli.main(["--help"])
  out = " ".join(capsys.readouterr().out.split())
  assert "not a metric of the MCWQ paper" in out and "x of n executable (n of N)" in out
  assert "--answers" in out


def test_release_without_entities_binds_placeholders_from_its_sparql(tmp_path):
  """The published MCWQ dataset.json has no `entities`: its `sparql` field binds them."""
  from mcwq_t5x.evaluation import execution  # pylint: disable=g-import-not-at-top
  assert execution.entities_from_sparql(
      "ASK WHERE { M0 wdt:P27 M1 . M0 wdt:P1 wd:Q3 }",
      "ASK WHERE { wd:Q42 wdt:P27 wd:Q29 . wd:Q42 wdt:P1 wd:Q3 }") == {
          "M0": "Q42",
          "M1": "Q29"
      }
  assert execution.entities_from_sparql("ASK WHERE { M0 wdt:P27 M0 }",
                                        "ASK WHERE { wd:Q1 wdt:P27 wd:Q2 }") is None
  assert execution.entities_from_sparql("ASK WHERE { M0 wdt:P27 wd:Q1 }",
                                        "ASK WHERE { wd:Q1 wdt:P31 wd:Q1 }") is None
  (tmp_path / "splits").mkdir()
  (tmp_path / "splits" / "s.json").write_text('{"testIdxs": [0]}')
  (tmp_path / "dataset.json").write_text(
      json.dumps([{
          "sparqlPatternModEntities": "ASK WHERE { M0 wdt:P27 wd:Q29 }",
          "sparql": "ASK WHERE { wd:Q42 wdt:P27 wd:Q29 }"
      }]))
  (query,) = execution.load_release_queries(tmp_path, "s", "test")
  assert query.entities == {"M0": "Q42"}


def test_readme_seqio_example_runs(mcwq_dir):
  """The README's "Data from Python" block, as printed."""
  del mcwq_dir
  import re  # pylint: disable=g-import-not-at-top
  readme = (mains.REPO / "README.md").read_text()
  section = readme.split("## Data from Python", 1)[1]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  scope = {}
  exec(code, scope)  # pylint: disable=exec-used
  example = next(scope["ds"].as_numpy_iterator())
  assert {"inputs", "targets", "inputs_pretokenized"} <= set(example)


def test_native_noise_filter_outlives_a_signal_to_the_process_group(tmp_path):
  """A scheduler's SIGTERM or Ctrl-C's SIGINT reaches the whole process group; the filter keeps
  running, so what the command prints while it handles the signal still comes out."""
  script = r"""
import os, signal, sys, time
from mcwq_t5x import gin_utils
gin_utils.quiet_native_logs()
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
