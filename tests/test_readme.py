"""Every command the README prints is run, as printed, in a fresh process from the repository root,
in README order (later commands read what earlier ones wrote), with small overrides appended for
size: fewer steps, a tiny network, the small offline vocabulary instead of the mT5 one and no
pretrained checkpoint (neither can be downloaded here). The test command itself is what CI runs
(`.ci/run` runs it verbatim), so it is checked against `.ci/run`, not run again."""
import json
import re
import shlex
import shutil
import socket
import time

import pytest

from mcwq_t5x import vocab
import mains

REPO = mains.REPO
README = (REPO / "README.md").read_text()
TEST_COMMAND = 'pip install -e ".[test]" && bash scripts/install_t5x.sh && python -m pytest -q tests'

T5X_SIZE = [
    "network.T5Config.vocab_size=2048", "network.T5Config.emb_dim=32",
    "network.T5Config.num_heads=2", "network.T5Config.head_dim=16", "network.T5Config.mlp_dim=64",
    "network.T5Config.num_encoder_layers=1", "network.T5Config.num_decoder_layers=1",
    "network.T5Config.dtype='float32'"
]
T5X_TRAIN = [
    "TRAIN_STEPS=20", "BATCH_SIZE=8", "INITIAL_CHECKPOINT_PATH=None",
    "TASK_FEATURE_LENGTHS={'inputs':40,'targets':64}", "EVAL_PERIOD=20", "EVAL_STEPS=1",
    "EVALUATOR_NUM_EXAMPLES=8", "train/utils.DatasetConfig.split='test'",
    "train_eval/utils.DatasetConfig.split='test'", "infer_eval/utils.DatasetConfig.split='test'",
    "MIXTURE_OR_TASK_NAME='mcwq_gold_he'"
]
OUR_SIZE = [b.replace(" = ", "=") for b in mains.SMALL_MODEL]
OUR_STEPS = [
    "TRAIN_STEPS=4", "BATCH_SIZE=8", "EVAL_PERIOD=0", "LOG_EVERY_STEPS=2", "CHECKPOINT_PERIOD=2"
]
# Longer rows for the Hebrew, CFQ-sample and random-weights French questions; the main job keeps
# its own 32/64.
OUR_TRAIN = OUR_STEPS + ["TASK_FEATURE_LENGTHS={'inputs':40,'targets':128}"]
# (command prefix, appended --gin.* overrides, other appended arguments)
OVERRIDES = [
    # The worked example of a new language: 4 steps of the small shape; every dev question is
    # decoded (the report checks predictions against all 220), with a short decode length.
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_cfq_sample_",
     OUR_SIZE + OUR_TRAIN + ["INFER_BATCH_SIZE=256"], []),
    ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/models/tiny.gin --gin_file=gin/mcwq_t5x/runs/"
     "eval.gin --gin.MIXTURE_OR_TASK_NAME=\"'mcwq_cfq_sample_zeroshot_fr'\"",
     OUR_SIZE + ["BATCH_SIZE=256"], []),
    ("pip install -e . && python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin",
     OUR_SIZE + OUR_STEPS + ["INFER_BATCH_SIZE=512"], []),
    ("python -m t5x.train --gin_file=gin/tiny_random_split_en.gin", [
        "network.T5Config.emb_dim=32", "network.T5Config.mlp_dim=64", "TRAIN_STEPS=4",
        "EVAL_PERIOD=4", "EVAL_STEPS=1", "EVALUATOR_NUM_EXAMPLES=8", "BATCH_SIZE=8"
    ], []),
    # The 2-process run on 127.0.0.1 (each process gets the overrides; see `with_overrides`).
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MODEL_DIR=\"'runs/tiny_2proc'\"", OUR_SIZE + OUR_TRAIN + [
         "MIXTURE_OR_TASK_NAME='mcwq_gold_he'", "TRAIN_SPLIT='test'", "EVAL_SPLIT='test'",
         "FINAL_EVAL_SPLIT='test'", "FINAL_EVAL_NUM_EXAMPLES=8"
     ], []),
    ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/models/tiny.gin",
     OUR_SIZE + ["NUM_EXAMPLES=16"], []),
    ("echo", OUR_SIZE + ["MAX_DECODE_LENGTH=32"], []),
    ("python -m t5x.train --gin_file=gin/mt5_small_mcd1_en.gin", T5X_SIZE + T5X_TRAIN, []),
    ("python -m t5x.eval",
     T5X_SIZE + ["utils.DatasetConfig.batch_size=8", "seqio.Evaluator.num_examples=8"], []),
    # The 20-step test run's checkpoint stands in for the README's checkpoint_1050000.
    ("python -m t5x.infer", T5X_SIZE + [
        "TASK_FEATURE_LENGTHS={'inputs':40,'targets':16}",
        f"CHECKPOINT_PATH='{REPO}/runs/t5x/mt5_small_mcd1_en/checkpoint_20'"
    ], []),
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_small_mcd1_en.gin",
     OUR_SIZE + OUR_TRAIN + [
         "network.get_config.vocab_size=2000", "network.get_config.dtype='float32'",
         "INITIAL_CHECKPOINT_PATH=None", "MIXTURE_OR_TASK_NAME='mcwq_gold_he'",
         "TRAIN_SPLIT='test'", "EVAL_SPLIT='test'", "FINAL_EVAL_NUM_EXAMPLES=8"
     ], []),
    ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/zeroshot/", OUR_SIZE +
     ["network.get_config.vocab_size=2000", "network.get_config.dtype='float32'", "NUM_EXAMPLES=8"],
     []),
    # The gap on a generated MCD split and its random twin (README, "Compositional splits").
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_mcd_en'\"",
     OUR_SIZE + OUR_TRAIN + ["INFER_BATCH_SIZE=256", "FINAL_EVAL_NUM_EXAMPLES=8"], []),
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_random_en'\"",
     OUR_SIZE + OUR_TRAIN + ["INFER_BATCH_SIZE=256", "FINAL_EVAL_NUM_EXAMPLES=8"], []),
    ("python scripts/benchmark.py", [], [
        "--model", "tiny", "--dtype", "float32", "--batch_size", "2", "--input_length", "16",
        "--target_length", "16", "--steps", "1", "--beam", "2"
    ]),
]
# Folders the commands write (moved aside first if they exist: the test must not clobber runs).
OUTPUTS = [
    "runs/tiny_random_split_en", "runs/tiny_2proc", "runs/t5x/tiny_random_split_en",
    "runs/t5x/mt5_small_mcd1_en", "runs/mt5_small_mcd1_en", "runs/mcwq_copy", "runs/report",
    "runs/he.json", "runs/mcwq_sample", "runs/complexity.png", "runs/tiny_mt_en_fr",
    "runs/mcwq_spm.model", "runs/mcwq_spm.vocab", "runs/newlang", "runs/mcwq_splits", "runs/gap"
]


def readme_commands() -> list[tuple[str, str]]:
  """(section heading, command) for every line of every ```bash block of the README."""
  out, heading = [], ""
  for block in re.finditer(r"^(#+ [^\n]*)$|```bash\n(.*?)```", README, re.M | re.S):
    if block.group(1):
      heading = block.group(1).lstrip("# ")
      continue
    text = block.group(2).replace("\\\n", " ")
    out += [(heading, l.strip()) for l in text.splitlines() if l.strip()]
  return out


COMMANDS = readme_commands()

# The README's port for the processes launched together on 127.0.0.1 (a free one is used here).
README_PORT = "127.0.0.1:12345"


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def with_overrides(command: str) -> str:
  if " & " in command:  # processes launched together: `A & B && wait $!`, each gets overrides
    *first, last = command.split(" & ")
    last, sep, tail = last.partition(" && ")
    return " & ".join(with_overrides(c.strip()) for c in first + [last]) + sep + tail
  for prefix, gin, extra in OVERRIDES:
    if command.startswith(prefix):
      return " ".join([command] + [shlex.quote(f"--gin.{b}") for b in gin] +
                      [shlex.quote(a) for a in extra])
  return command


def test_readme_commands_are_covered():
  assert ("Set-up and the two commands", TEST_COMMAND) in COMMANDS
  assert TEST_COMMAND in (REPO / ".ci/run").read_text()  # CI runs the README's test command
  assert len(COMMANDS) >= 15
  for _, command in COMMANDS:
    assert command.startswith(("pip ", "python ", "echo ", "export ")), command


@pytest.fixture(scope="module")
def workspace(mcwq_dir):
  del mcwq_dir
  stamp = time.strftime("%Y%m%d-%H%M%S")
  for rel in OUTPUTS:
    if (REPO / rel).exists():
      (REPO / rel).rename(REPO / f"{rel}.before-readme-test-{stamp}")
  yield {"MCWQ_VOCAB": str(vocab.small_vocab_path())}
  for rel in OUTPUTS:
    path = REPO / rel
    if path.is_dir():
      shutil.rmtree(path)
    elif path.exists():
      path.unlink()


@pytest.mark.parametrize(
    "index", range(len(COMMANDS)), ids=[f"{i}:{c[:60]}" for i, (_, c) in enumerate(COMMANDS)])
def test_readme_command(index, workspace):
  heading, command = COMMANDS[index]
  if command == TEST_COMMAND:
    pytest.skip("the README's test command is what CI runs (see test_readme_commands_are_covered)")
  env = {}
  for _, earlier in COMMANDS[:index + 1]:  # `export` lines of the README apply to what follows
    if earlier.startswith("export "):
      for assignment in shlex.split(earlier)[1:]:
        name, value = assignment.split("=", 1)
        if name == "MCWQ_VOCAB" and value.startswith("gs://"):
          value = workspace["MCWQ_VOCAB"]  # the small vocabulary stands in for mT5's
        env[name] = value
  if command.startswith("export "):
    return
  out = mains.run(
      ["bash", "-c",
       with_overrides(command.replace(README_PORT, f"127.0.0.1:{free_port()}"))],
      env=env,
      timeout=1500)
  if "mcwq_t5x.evaluate" in command and "--json" not in command:
    assert "exact_match" in out.stdout or "exact match" in out.stdout.lower()
  if "generated_predictions_he" in command:
    assert "57.8" in out.stdout  # the paper's Table 4, Hebrew
  if command.startswith("pip install -e . && python -m mcwq_t5x.train"):
    assert (REPO / "runs/tiny_random_split_en/predictions/mcwq_random_split_en_test.txt").is_file()
  if "--process_index=1" in command:  # the 2-process run: one checkpoint written by both
    state = REPO / "runs/tiny_2proc/checkpoint_4/state"
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= {p.name for p in state.iterdir()}
    assert (REPO / "runs/tiny_2proc/predictions/mcwq_gold_he_test.txt").is_file()
  if "mcwq_t5x.divergence" in command:
    assert "| mcd1 | dev (5,408) | test (5,310) | 0.0003 | 0.0578 |" in out.stdout
  if "preprocessing.make_splits" in command:
    report = json.loads((REPO / "runs/mcwq_splits/make_splits.json").read_text())
    assert report["splits"]["mcd"]["sizes"] == {"train": 6222, "dev": 777, "test": 777}
  if "'mcwq_mcd_en'" in command:
    assert (REPO / "runs/gap/mcd_en/predictions/mcwq_mcd_en_test.txt").is_file()
  if command.startswith("echo"):
    assert len(out.stdout.splitlines()) == 1
  if "preprocessing.translate" in command:
    assert json.loads(out.stdout)["complete"] is True
  if "mcwq_t5x.report runs/newlang" in command:
    assert "| model | split | en | he | kn | zh | fr |" in out.stdout
    assert "| tiny_fr | cfq_sample |" in out.stdout and "| tiny_en | cfq_sample |" in out.stdout
  del heading
