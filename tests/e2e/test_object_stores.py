"""The training main on object-store URLs, as users start it (a fresh process): the paper's run file
names mT5's checkpoint `gs://t5-data/...`; here Google Cloud Storage is a stand-in on 127.0.0.1
(`local_http.GcsFolder`, TensorStore pointed at it by `local_http.gcs_env`), or a closed port on
127.0.0.1 for a store that cannot be reached."""
import hashlib
import json
import re
import shutil

from flax import traverse_util
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_import
from mcwq_t5x.checkpointing import checkpoint_loaders
from mcwq_t5x.checkpointing import t5x_checkpoint_writer
from mcwq_t5x.data import vocab
from mcwq_t5x.engine import network
import local_http
import mains

PAPER = "gin/mcwq_t5x/mt5_small_mcd1_en.gin"
MT5_SMALL = "gs://t5-data/pretrained_models/t5x/mt5_small/checkpoint_1000000"
TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"
# One step at learning rate 0 (the parameters stay those read), a checkpoint, a short final decode;
# the shapes and mesh of test_faults_checkpoints.RUN, whose programs the session's compilation
# cache then holds.
RUN = mains.SMALL_MODEL + [
    "TASK_FEATURE_LENGTHS = {'inputs': 40, 'targets': 128}", "BATCH_SIZE = 8", "TRAIN_STEPS = 1",
    "LEARNING_RATE = 0.0", "WARMUP_STEPS = 0", "LOG_EVERY_STEPS = 1", "CHECKPOINT_PERIOD = 1",
    "EVAL_PERIOD = 0", "FINAL_EVAL_NUM_EXAMPLES = 4", "INFER_BATCH_SIZE = 4",
    "HOST_DEVICE_COUNT = 2", "MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'", "TRAIN_SPLIT = 'test'",
    "EVAL_SPLIT = 'test'", "FINAL_EVAL_SPLIT = 'test'",
    "train_script.train.measure_matmul_peak = False"
]


def test_the_paper_run_on_an_unreachable_bucket_stops_with_one_line_naming_it(tmp_path):
  """`python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_small_mcd1_en.gin` where the object
  store cannot be reached: exit 1, before any data is read, with one line naming the URL whole and
  the store's error. Before, `NotACheckpointError: gs:/t5-data/... no such file or folder` (the
  URL read as a local path)."""
  closed = f"http://127.0.0.1:{local_http.free_port()}"
  out = mains.python_m(
      "mcwq_t5x.train",
      f"--gin_file={PAPER}",
      f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
      env={
          **local_http.gcs_env(closed), vocab.VOCAB_ENV: str(vocab.small_vocab_path())
      },
      check=False)
  assert out.returncode == 1 and out.stdout == "", out.stderr[-3000:]
  assert "Traceback" not in out.stderr and not re.search(r"gs:/[^/]", out.stderr), out.stderr
  last = out.stderr.rstrip().splitlines()[-1]
  assert last.startswith(
      f"ObjectStoreError: {MT5_SMALL}: the object store's listing failed (ABORTED: All 4 "
      "retry attempts failed: CURL error Could not connect to server"), last
  assert last.endswith(f"or copy it to this machine (e.g. `gsutil cp -r {MT5_SMALL} .`) and "
                       "name the copy"), last


def test_a_run_starts_from_a_checkpoint_and_a_vocabulary_in_a_bucket(tmp_path, mcwq_dir):
  """INITIAL_CHECKPOINT_PATH and MCWQ_VOCAB both `gs://` URLs of the stand-in (a T5X-native
  checkpoint, as mT5's; the small SentencePiece model): the run starts from the checkpoint's
  parameters (one step at learning rate 0 keeps them: its checkpoint_1 holds them exactly),
  records the vocabulary by its URL with the file's SHA-256 and copies its bytes, and asks the
  store for nothing else."""
  del mcwq_dir  # the real data must be there
  root = tmp_path / "gcs"
  config = network.get_config(
      "tiny", **{
          line.split(".")[-1].split(" = ")[0]: int(line.split(" = ")[1])
          for line in mains.SMALL_MODEL
      })
  rng = np.random.default_rng(0)
  params = {
      name: rng.standard_normal(shape).astype(np.float32)
      for name, shape in checkpoint_import.expected_param_shapes(config).items()
  }
  t5x_checkpoint_writer.save_t5x_checkpoint(
      traverse_util.unflatten_dict(params, sep="/"),
      root / "pretrained" / "tiny" / "checkpoint_9",
      step=9)
  small = vocab.small_vocab_path()
  (root / "vocabs").mkdir()
  shutil.copy(small, root / "vocabs" / "spm.model")
  model_dir = tmp_path / "run"
  with local_http.serve(local_http.GcsFolder, root=root, seen=[]) as server:
    out = mains.python_m(
        "mcwq_t5x.train",
        f"--gin_file={TINY}",
        *mains.gin_flags(RUN + [
            f"MODEL_DIR = '{model_dir}'",
            "INITIAL_CHECKPOINT_PATH = 'gs://pretrained/tiny/checkpoint_9'"
        ]),
        env={
            **local_http.gcs_env(server.base), vocab.VOCAB_ENV: "gs://vocabs/spm.model"
        })
  assert "initialising the parameters from gs://pretrained/tiny/checkpoint_9" in out.stderr
  loaded = checkpoint_loaders.load_params(model_dir / "checkpoint_1", config).params
  got = traverse_util.flatten_dict(loaded, sep="/")
  assert sorted(got) == sorted(params)
  for name, value in params.items():
    np.testing.assert_array_equal(got[name], value)
  recorded = json.loads((model_dir / "run.json").read_text())["vocabulary"]
  data = small.read_bytes()
  assert (recorded["path"], recorded["sha256"]) == ("gs://vocabs/spm.model",
                                                    hashlib.sha256(data).hexdigest())
  assert (model_dir / recorded["copy"]).read_bytes() == data
  asked = {p.partition("?")[0] for p in server.seen}
  assert "/storage/v1/b/vocabs/o/spm.model" in asked and any(
      p.startswith("/storage/v1/b/pretrained/o/tiny%2Fcheckpoint_9%2Ftarget.") for p in asked)
  assert all(
      p in ("/storage/v1/b/vocabs/o/spm.model", "/storage/v1/b/pretrained/o") or
      p.startswith("/storage/v1/b/pretrained/o/tiny%2Fcheckpoint_9%2F") for p in asked), asked
