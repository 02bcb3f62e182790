"""The real T5X runs our experiment files, as users type them (`python -m t5x.train
--gin_file=gin/mt5_small_mcd1_en.gin`), each in a fresh process, with only command-line overrides
for model size, vocabulary, steps, batch, split and INITIAL_CHECKPOINT_PATH (no pretrained mT5
here): T5X trains on real MCWQ text, writes an inference evaluation with exact match and BLEU, and
`t5x.eval` (zero-shot file) and `t5x.infer` run on its checkpoint.

CI installs T5X (scripts/install_t5x.sh, from ../shared/wheels); elsewhere these tests are skipped
with that message."""
import json

import pytest

from mcwq_t5x import vocab
import mains

pytest.importorskip("t5x.train", reason="the real T5X is not installed (bash scripts/install_t5x.sh)")

# Model size: a very small mT5-layout network; vocabulary: the small offline SentencePiece model
# (MCWQ_VOCAB, read by both the tasks and the experiment files), 2,000 pieces -> 2,048 rows.
SIZE = ["network.T5Config.vocab_size = 2048", "network.T5Config.emb_dim = 32",
        "network.T5Config.num_heads = 2", "network.T5Config.head_dim = 16",
        "network.T5Config.mlp_dim = 64", "network.T5Config.num_encoder_layers = 1",
        "network.T5Config.num_decoder_layers = 1", "network.T5Config.dtype = 'float32'"]
# Steps, batch, split (the 155 gold questions of a language: real text, quick to load), no
# pretrained checkpoint.
RUN = ["TRAIN_STEPS = 20", "BATCH_SIZE = 8", "INITIAL_CHECKPOINT_PATH = None",
       "TASK_FEATURE_LENGTHS = {'inputs': 40, 'targets': 128}", "EVAL_PERIOD = 20",
       "EVAL_STEPS = 2", "EVALUATOR_NUM_EXAMPLES = 16", "train/utils.DatasetConfig.split = 'test'",
       "train_eval/utils.DatasetConfig.split = 'test'",
       "infer_eval/utils.DatasetConfig.split = 'test'"]


@pytest.fixture(scope="module")
def small_vocab_env(mcwq_dir):
  del mcwq_dir
  return {"MCWQ_VOCAB": str(vocab.small_vocab_path())}


def t5x_train(model_dir, gin_file, task, env):
  return mains.python_m("t5x.train", f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'",
                        *[f"--gin.{b.replace(' = ', '=')}" for b in SIZE + RUN],
                        f"--gin.MIXTURE_OR_TASK_NAME='{task}'", env=env)


@pytest.fixture(scope="module")
def trained_en(tmp_path_factory, small_vocab_env):
  model_dir = tmp_path_factory.mktemp("t5x_en")
  t5x_train(model_dir, "gin/mt5_small_mcd1_en.gin", "mcwq_gold_he", small_vocab_env)
  return model_dir


def _inference_metrics(model_dir, task):
  lines = (model_dir / "inference_eval" / f"{task}-metrics.jsonl").read_text().splitlines()
  return json.loads(lines[-1])


def test_t5x_train_writes_inference_eval_with_exact_match_and_bleu(trained_en):
  assert (trained_en / "checkpoint_20").is_dir()
  metrics = _inference_metrics(trained_en, "mcwq_gold_he")
  assert metrics["step"] == 20
  assert 0.0 <= metrics["exact_match"] <= 100.0 and 0.0 <= metrics["bleu"] <= 100.0
  # The inferences are RIR strings decoded with our vocabulary (same file as the task's).
  inferences = [json.loads(l) for l in
                (trained_en / "inference_eval/mcwq_gold_he-000020.jsonl").read_text().splitlines()]
  assert len(inferences) == 16
  assert inferences[0]["target"].startswith(("ASK", "SELECT"))
  config = (trained_en / "config.gin").read_text()
  assert "tasks.mcwq" in config and "mcwq_gold_he" in config


def test_t5x_train_hebrew_experiment_file(tmp_path, small_vocab_env):
  t5x_train(tmp_path, "gin/mt5_base_mcd1_he.gin", "mcwq_gold_zh", small_vocab_env)
  assert (tmp_path / "checkpoint_20").is_dir()
  assert set(_inference_metrics(tmp_path, "mcwq_gold_zh")) >= {"exact_match", "bleu", "step"}


def test_t5x_eval_zero_shot_file_on_the_checkpoint(trained_en, tmp_path, small_vocab_env):
  mains.python_m("t5x.eval", "--gin_file=gin/zeroshot/mt5_small_mcd1_he.gin",
                 *[f"--gin.{b.replace(' = ', '=')}" for b in SIZE],
                 f"--gin.CHECKPOINT_PATH='{trained_en}'", f"--gin.EVAL_OUTPUT_DIR='{tmp_path}'",
                 "--gin.utils.DatasetConfig.batch_size=16", "--gin.seqio.Evaluator.num_examples=16",
                 env=small_vocab_env)
  metrics = _inference_metrics(tmp_path, "mcwq_mcd1_zeroshot_he")
  assert metrics["step"] == 20 and {"exact_match", "bleu"} <= set(metrics)


def test_t5x_infer_on_the_checkpoint(trained_en, tmp_path, small_vocab_env):
  mains.python_m("t5x.infer", "--gin_file=gin/infer/mt5_small.gin",
                 *[f"--gin.{b.replace(' = ', '=')}" for b in SIZE],
                 "--gin.MIXTURE_OR_TASK_NAME='mcwq_gold_kn'",
                 f"--gin.CHECKPOINT_PATH='{trained_en / 'checkpoint_20'}'",
                 f"--gin.INFER_OUTPUT_DIR='{tmp_path}'",
                 "--gin.TASK_FEATURE_LENGTHS={'inputs': 40, 'targets': 32}", env=small_vocab_env)
  out = tmp_path / "mcwq_gold_kn-predict.jsonl-00000-of-00001"
  rows = [json.loads(l) for l in out.read_text().splitlines()]
  assert len(rows) == 155  # every gold question, one prediction each
  assert all("prediction" in r and "inputs" in r for r in rows)


def test_paper_files_ask_for_the_mt5_vocabulary(tmp_path):
  """Without MCWQ_VOCAB the tasks would use the small vocabulary: the paper files say so early."""
  env = {"MCWQ_VOCAB": ""}
  out = mains.python_m("t5x.train", "--gin_file=gin/mt5_small_mcd1_en.gin",
                       f"--gin.MODEL_DIR='{tmp_path}'", env=env, check=False)
  assert out.returncode != 0
  assert "MCWQ_VOCAB" in out.stderr and "mc4.250000.100extra" in out.stderr
