"""The README's commands (README.md and the docs pages) and the size overrides the tests append.

Every line of every ```bash block of README.md and of the pages of `PAGES` is a command, in the
order of `PAGES`; `with_overrides` appends small
`--gin.NAME=VALUE` overrides (fewer steps, a tiny network, the small offline vocabulary instead of
the mT5 one, no pretrained checkpoint: neither can be downloaded here) and nothing else. Several
overrides are chosen so that the run is also the scenario other tests read (see `README_RUN`):
the T5X run of command `T5X_TRAIN` is `test_t5x_engine`'s T5X checkpoint, our run of
`OUR_PAPER_TRAIN` its checkpoint of ours, the 2-process run `test_multiprocess`'s pair.
"""
import re
import shlex

import local_http
import mains

# README.md, then the docs pages in the order of the README's table: the commands run in this order,
# in one copy of the repository. Each page works on its own in a fresh clone, as a reader who opens
# it alone meets it: an `export` line holds for the commands after it on its page only, and a
# command reads only what commands of its own page wrote (`depends`; test_readme.py checks). A page
# that needs another's output repeats the command that makes it (the main job on the pages that
# read its run); a repeated command, the same text in the same environment, runs once (`same_as`).
# Every page of docs/ is listed (test_readme.py checks).
PAGES = (
    "README.md",
    "docs/main_job.md",
    "docs/t5x.md",
    "docs/recipe.md",
    "docs/benchmarks.md",
    "docs/export_hf.md",
    "docs/data.md",
    "docs/evaluation.md",
    "docs/dataset_creation.md",
    "docs/splits.md",
    "docs/glossary.md",
    "docs/llm.md",
)
TEST_COMMAND = 'pip install -e ".[test]" && bash scripts/install_t5x.sh && python -m pytest -q tests'

# A very small mT5-layout network in T5X's names and ours, over the small vocabulary's 2,048 rows
# (2,000 pieces padded as T5X pads): the same network in both engines, so checkpoints move.
T5X_SIZE = [
    "network.T5Config.vocab_size=2048", "network.T5Config.emb_dim=32",
    "network.T5Config.num_heads=2", "network.T5Config.head_dim=16", "network.T5Config.mlp_dim=64",
    "network.T5Config.num_encoder_layers=1", "network.T5Config.num_decoder_layers=1",
    "network.T5Config.dtype='float32'"
]
OUR_SIZE = [b.replace(" = ", "=") for b in mains.SMALL_MODEL]
OUR_SIZE_2048 = OUR_SIZE + [
    "network.get_config.vocab_size=2048", "network.get_config.dtype='float32'"
]
# The T5X tiny file's runs (the README's and test_new_language's): 4 steps of 8 rows, dev loss and
# decoding of 16 questions in batches of 8 at step 4. Both have T5X_SIZE: the same programs,
# compiled once for the two (JAX's persistent compilation cache, tests/conftest.py).
T5X_TINY = [
    "TRAIN_STEPS=4", "BATCH_SIZE=8", "EVAL_PERIOD=4", "EVAL_STEPS=2", "EVALUATOR_NUM_EXAMPLES=16",
    "INFER_BATCH_SIZE=8"
]
# T5X on the 155 Hebrew gold test questions (real text, quick to load), 20 steps of the paper
# file's recipe: the learning rate decays linearly from the file's 5e-4 to 0 over the 20 steps
# (fine-tuning from step 0: no pretrained checkpoint here); dev loss, decoding of 16 questions and a
# checkpoint every 10 steps, the checkpoint with the lowest dev loss kept (test_recipe reads this
# run) and decoded by the README's `t5x.eval`.
T5X_STEPS, T5X_PERIOD = 20, 10
T5X_DEV_LOSS = "training_eval/mcwq_gold_he/loss"
T5X_TRAIN = [
    f"TRAIN_STEPS={T5X_STEPS}", "PRETRAINING_STEPS=0", f"FINETUNE_STEPS={T5X_STEPS}",
    "BATCH_SIZE=8", "INITIAL_CHECKPOINT_PATH=None",
    "TASK_FEATURE_LENGTHS={'inputs':40,'targets':128}", f"EVAL_PERIOD={T5X_PERIOD}",
    f"utils.SaveCheckpointConfig.period={T5X_PERIOD}", f"METRIC_NAME_TO_MONITOR='{T5X_DEV_LOSS}'",
    "EVAL_STEPS=2", "EVALUATOR_NUM_EXAMPLES=16", "train/utils.DatasetConfig.split='test'",
    "train_eval/utils.DatasetConfig.split='test'", "infer_eval/utils.DatasetConfig.split='test'",
    "MIXTURE_OR_TASK_NAME='mcwq_gold_he'"
]
OUR_STEPS = [
    "TRAIN_STEPS=4", "BATCH_SIZE=8", "EVAL_PERIOD=0", "LOG_EVERY_STEPS=2", "CHECKPOINT_PERIOD=2"
]
# Longer rows for the Hebrew and CFQ-sample questions; the main job keeps its own 32/64.
OUR_TRAIN = OUR_STEPS + ["TASK_FEATURE_LENGTHS={'inputs':40,'targets':128}"]
GOLD_HE = [
    "MIXTURE_OR_TASK_NAME='mcwq_gold_he'", "TRAIN_SPLIT='test'", "EVAL_SPLIT='test'",
    "FINAL_EVAL_SPLIT='test'"
]
# Our paper-recipe file, 40 steps at lr 1e-2 decaying linearly to 0, on the mcd1 Hebrew dev
# questions: trained enough that its greedy decodes differ from question to question (the
# cross-engine comparison of test_t5x_engine reads this run); dev loss and a checkpoint every 10
# steps, the checkpoint with the lowest dev loss kept and decoded on 8 test questions (test_recipe
# reads this run).
OUR_PAPER_STEPS, OUR_PAPER_PERIOD, OUR_PAPER_LR = 40, 10, 1e-2
OUR_PAPER_TASK = "mcwq_mcd1_he_prefixed"  # has a dev split (validation) apart from test
# The 2-process run: 6 steps of 8 packed rows, a checkpoint every 3 (test_multiprocess resumes
# the pair's step-3 checkpoint in one process and compares the losses).
MULTIPROCESS_STEPS, MULTIPROCESS_CHECKPOINT = 6, 3
MULTIPROCESS = OUR_SIZE + [
    "TASK_FEATURE_LENGTHS={'inputs':40,'targets':128}", "BATCH_SIZE=8", "LOG_EVERY_STEPS=1",
    f"CHECKPOINT_PERIOD={MULTIPROCESS_CHECKPOINT}", "EVAL_PERIOD=0", "FINAL_EVAL_NUM_EXAMPLES=8",
    "INFER_BATCH_SIZE=8", "WARMUP_STEPS=2", f"TRAIN_STEPS={MULTIPROCESS_STEPS}"
] + GOLD_HE

# The gap runs decode their whole test part (777 questions; the README's report scores them, and
# diagnoses their unseen compounds), up to 8 target tokens.
GAP_DECODE = ["INFER_BATCH_SIZE=256", "INFER_TASK_FEATURE_LENGTHS={'inputs':64,'targets':8}"]

# (command prefix, appended --gin.* overrides, other appended arguments); `{repo}` is the folder
# the commands run in.
OVERRIDES = [
    # The worked example of a new language: 4 steps of the small shape; every dev question is
    # decoded (the report checks predictions against all 220).
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_cfq_sample_",
     OUR_SIZE + OUR_TRAIN + ["INFER_BATCH_SIZE=256"], []),
    ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/models/tiny.gin --gin_file=gin/mcwq_t5x/runs/"
     "eval.gin --gin.MIXTURE_OR_TASK_NAME=\"'mcwq_cfq_sample_zeroshot_fr'\"",
     OUR_SIZE + ["BATCH_SIZE=256"], []),
    # The main job: 4 steps; the final evaluation decodes the whole test set (the README's
    # `mcwq_t5x.score` command scores the file against all 6,282 references), up to 8 target
    # tokens (a 4-step model runs on to the limit; the whole test set at the split's longest
    # target, 66 tokens, would take 8 times as long).
    ("pip install -e . && python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin",
     OUR_SIZE + OUR_STEPS +
     ["INFER_BATCH_SIZE=512", "INFER_TASK_FEATURE_LENGTHS={'inputs':32,'targets':8}"], []),
    ("python -m t5x.train --gin_file=gin/tiny_random_split_en.gin", T5X_SIZE + T5X_TINY, []),
    # The 2-process run on 127.0.0.1 (each process gets the overrides; see `with_overrides`).
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MODEL_DIR=\"'runs/tiny_2proc'\"", MULTIPROCESS, []),
    ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/models/tiny.gin",
     OUR_SIZE + ["NUM_EXAMPLES=16"], []),
    ("echo", OUR_SIZE + ["MAX_DECODE_LENGTH=32"], []),
    ("python -m t5x.train --gin_file=gin/mt5_small_mcd1_en.gin", T5X_SIZE + T5X_TRAIN, []),
    ("python -m t5x.eval", T5X_SIZE + [
        "utils.DatasetConfig.batch_size=16", "seqio.Evaluator.num_examples=16",
        f"METRIC_NAME_TO_MONITOR='{T5X_DEV_LOSS}'"
    ], []),
    # The 20-step run's last checkpoint stands in for the README's checkpoint_1050000.
    ("python -m t5x.infer", T5X_SIZE + [
        "TASK_FEATURE_LENGTHS={'inputs':40,'targets':32}",
        f"CHECKPOINT_PATH='{{repo}}/runs/t5x/mt5_small_mcd1_en/checkpoint_{T5X_STEPS}'"
    ], []),
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_small_mcd1_en.gin", OUR_SIZE_2048 + [
        "INITIAL_CHECKPOINT_PATH=None", f"TRAIN_STEPS={OUR_PAPER_STEPS}", "BATCH_SIZE=8",
        f"LEARNING_RATE={OUR_PAPER_LR}", "TASK_FEATURE_LENGTHS={'inputs':48,'targets':128}",
        "INFER_TASK_FEATURE_LENGTHS={'inputs':48,'targets':128}", f"EVAL_PERIOD={OUR_PAPER_PERIOD}",
        f"CHECKPOINT_PERIOD={OUR_PAPER_PERIOD}", f"LOG_EVERY_STEPS={OUR_PAPER_PERIOD}",
        "EVAL_STEPS=2", "EVAL_BATCH_SIZE=8", "INFER_EVAL_NUM_EXAMPLES=8", "INFER_BATCH_SIZE=8",
        "FINAL_EVAL_NUM_EXAMPLES=8", f"MIXTURE_OR_TASK_NAME='{OUR_PAPER_TASK}'",
        "TRAIN_SPLIT='validation'", "EVAL_SPLIT='validation'", "FINAL_EVAL_SPLIT='test'"
    ], []),
    ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/zeroshot/",
     OUR_SIZE_2048 + ["NUM_EXAMPLES=8"], []),
    # The gap on a generated MCD split and its random twin (README, "Compositional splits").
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_mcd_en'\"", OUR_SIZE + OUR_TRAIN + GAP_DECODE, []),
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_random_en'\"", OUR_SIZE + OUR_TRAIN + GAP_DECODE, []),
    ("python scripts/benchmark.py", [], ["--preset", "tiny"]),
]

# The README's port for the processes launched together on 127.0.0.1 (a free one is used here).
README_PORT = "127.0.0.1:12345"


def page_commands(text: str) -> list[tuple[str, str]]:
  """(section heading, command) for every line of every ```bash block of one Markdown page."""
  out, heading = [], ""
  for block in re.finditer(r"^(#+ [^\n]*)$|```bash\n(.*?)```", text, re.M | re.S):
    if block.group(1):
      heading = block.group(1).lstrip("# ")
      continue
    lines = block.group(2).replace("\\\n", " ").splitlines()
    out += [(heading, l.strip()) for l in lines if l.strip()]
  return out


def readme_commands() -> list[tuple[str, str]]:
  """(section heading, command) for every command of README.md and the docs pages (`PAGES`)."""
  return [c for page in PAGES for c in page_commands((mains.REPO / page).read_text())]


COMMANDS = readme_commands()
# The page of each command of COMMANDS.
PAGE_OF = [
    page for page in PAGES for _ in page_commands((mains.REPO / page).read_text(encoding="utf-8"))
]


def index_of(prefix: str) -> int:
  """The index of the first README command that starts with `prefix`."""
  for i, (_, command) in enumerate(COMMANDS):
    if command.startswith(prefix):
      return i
  raise KeyError(f"no README command starts with {prefix!r}")


def with_overrides(command: str, repo) -> str:
  """`command` with its overrides appended (each process of `A & B && wait $!` gets them) and the
  README's fixed port replaced by a free one."""
  command = command.replace(README_PORT, f"127.0.0.1:{local_http.free_port()}")
  if " & " in command:
    *first, last = command.split(" & ")
    last, sep, tail = last.partition(" && ")
    return " & ".join(with_overrides(c.strip(), repo) for c in first + [last]) + sep + tail
  for prefix, gin, extra in OVERRIDES:
    if command.startswith(prefix):
      return " ".join([command] +
                      [shlex.quote(f"--gin.{b}".replace("{repo}", str(repo))) for b in gin] +
                      [shlex.quote(a) for a in extra])
  return command


def env_of(index: int, small_vocab_path: str) -> dict:
  """The variables the `export` lines of command `index`'s page set before it (the small
  vocabulary stands in for mT5's `gs://` one)."""
  env = {}
  for i, (_, earlier) in enumerate(COMMANDS[:index + 1]):
    if earlier.startswith("export ") and PAGE_OF[i] == PAGE_OF[index]:
      for assignment in shlex.split(earlier)[1:]:
        name, value = assignment.split("=", 1)
        if name == "MCWQ_VOCAB" and value.startswith("gs://"):
          value = small_vocab_path
        env[name] = value
  if index == BENCHMARK:  # why: 2 XLA CPU devices, so that the tiny preset runs its sharded step
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
  return env


# What each README command reads of the others' outputs: (its prefix, prefixes of the commands it
# needs). Every command the tests run must match exactly one entry (test_readme.py checks), so a
# new README command is placed deliberately: in a chain, or on its own.
MAIN_JOB_PREFIX = "pip install -e . && python -m mcwq_t5x.train"
T5X_TRAIN_PREFIX = "python -m t5x.train --gin_file=gin/mt5_small_mcd1_en.gin"
OUR_PAPER_PREFIX = "python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_small_mcd1_en.gin"
MIGRATE = "python -m preprocessing.migrate"
TINY_MT = "python scripts/make_tiny_translation_model.py"
TRANSLATE = "python -m preprocessing.translate"
VOCAB = "python scripts/train_vocab.py"
MAKE_SPLITS = "python -m preprocessing.make_splits"
NEWLANG_EN = ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
              "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_cfq_sample_en'\"")
NEWLANG_ZEROSHOT = ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/models/tiny.gin "
                    "--gin_file=gin/mcwq_t5x/runs/eval.gin "
                    "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_cfq_sample_zeroshot_fr'\"")
NEWLANG_FR = ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
              "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_cfq_sample_fr'\"")
GAP_MCD = ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
           "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_mcd_en'\"")
GAP_RANDOM = ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
              "--gin.MIXTURE_OR_TASK_NAME=\"'mcwq_random_en'\"")
DEPENDS = [
    (MAIN_JOB_PREFIX, []),
    ("python -m mcwq_t5x.score --predictions runs/tiny_random_split_en", [MAIN_JOB_PREFIX]),
    ("python -m t5x.train --gin_file=gin/tiny_random_split_en.gin", []),
    ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/models/tiny.gin --gin_file=gin/mcwq_t5x/runs/"
     "eval.gin --gin.MIXTURE_OR_TASK_NAME=\"'mcwq_random", [MAIN_JOB_PREFIX]),
    ("echo \"Did M0 direct M1\" | python -m mcwq_t5x.infer", [MAIN_JOB_PREFIX]),
    (T5X_TRAIN_PREFIX, []),
    ("python -m t5x.eval --gin_file=gin/zeroshot/", [T5X_TRAIN_PREFIX]),
    ("python -m t5x.infer", [T5X_TRAIN_PREFIX]),
    (OUR_PAPER_PREFIX, []),
    ("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/zeroshot/", [OUR_PAPER_PREFIX]),
    ("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/tiny_random_split_en.gin "
     "--gin.MODEL_DIR=\"'runs/tiny_2proc'\"", []),
    ("python scripts/benchmark.py", []),
    ("python -m mcwq_t5x.export_hf --checkpoint runs/tiny_random_split_en", [MAIN_JOB_PREFIX]),
    ("python scripts/download_mcwq.py", []),
    ("python -m mcwq_t5x.inspect_task mcwq_mcd1_he", []),
    ("python -m mcwq_t5x.score --predictions ../shared", []),
    ("python -m mcwq_t5x.report ../shared", []),
    ("python -m mcwq_t5x.report --compare ../shared", []),
    ("python -m preprocessing.derive_mapping", []),
    (MIGRATE, []),
    ("python -m preprocessing.stats --dataset runs/mcwq_sample", [MIGRATE]),
    (TINY_MT, []),
    (TRANSLATE, [MIGRATE, TINY_MT]),
    (VOCAB, []),
    ("python -m mcwq_t5x.inspect_task mcwq_cfq_sample", [TRANSLATE, VOCAB]),
    (NEWLANG_EN, [TRANSLATE, VOCAB]),
    (NEWLANG_ZEROSHOT, [NEWLANG_EN]),
    (NEWLANG_FR, [TRANSLATE, VOCAB]),
    ("python -m mcwq_t5x.report runs/newlang", [NEWLANG_EN, NEWLANG_ZEROSHOT, NEWLANG_FR]),
    ("python -m mcwq_t5x.divergence", []),
    (MAKE_SPLITS, []),
    (GAP_MCD, [MAKE_SPLITS, VOCAB]),
    (GAP_RANDOM, [MAKE_SPLITS, VOCAB]),
    ("python -m mcwq_t5x.report runs/gap", [GAP_MCD, GAP_RANDOM]),
]
# Commands whose outputs several chains read, quick to run: they do not join those chains into one
# xdist group (whichever worker asks first runs them; the other waits for its lock).
SHARED = [VOCAB]


def runnable(index: int) -> bool:
  """Whether the tests run command `index` (not an `export` line, not the test command itself)."""
  command = COMMANDS[index][1]
  return command != TEST_COMMAND and not command.startswith("export ")


def depends_entries(index: int) -> list[tuple[str, list[str]]]:
  """The `DEPENDS` entries whose prefix command `index` starts with."""
  return [e for e in DEPENDS if COMMANDS[index][1].startswith(e[0])]


def depends(index: int) -> list[int]:
  """The indices of the earlier commands whose outputs command `index` reads: for each prefix of
  its `DEPENDS` entry, the last command before it on its page that starts with the prefix, else
  the first one anywhere (a page that does not work on its own: test_readme.py fails)."""
  entries = depends_entries(index)
  if len(entries) != 1:
    raise KeyError(
        f"README command {index} matches {len(entries)} entries of DEPENDS (expected 1): "
        f"{COMMANDS[index][1]}")
  out = []
  for prefix in entries[0][1]:
    on_page = [
        i for i in range(index)
        if PAGE_OF[i] == PAGE_OF[index] and COMMANDS[i][1].startswith(prefix)
    ]
    out.append(on_page[-1] if on_page else index_of(prefix))
  return out


def same_as(index: int) -> int:
  """The first command with the same text and the same variables (`env_of`) as command `index`
  (`index` itself if none): a command repeated on another page runs once."""
  for i in range(index):
    if COMMANDS[i][1] == COMMANDS[index][1] and env_of(i, "") == env_of(index, ""):
      return i
  return index


def chain(index: int) -> int:
  """The first command of the group of commands linked to `index` by `depends` (in either
  direction): the tests of one chain run on one xdist worker (`xdist_group`)."""
  parent = {i: i for i in range(len(COMMANDS)) if runnable(i)}

  def root(i):
    while parent[i] != i:
      i = parent[i]
    return i

  shared = {i for i in parent if same_as(i) in {index_of(prefix) for prefix in SHARED}}
  for i in parent:
    for d in depends(i) + [same_as(i)]:
      if d not in shared:
        parent[max(root(i), root(d))] = min(root(i), root(d))
  return root(index)


# Indices of the commands other tests read.
MAIN_JOB = index_of("pip install -e . && python -m mcwq_t5x.train")
OUR_EVAL = index_of(
    "python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/models/tiny.gin "
    "--gin_file=gin/mcwq_t5x/runs/eval.gin --gin.MIXTURE_OR_TASK_NAME=\"'mcwq_random")
T5X_TRAIN = index_of("python -m t5x.train --gin_file=gin/mt5_small_mcd1_en.gin")
T5X_EVAL = index_of("python -m t5x.eval")
T5X_INFER = index_of("python -m t5x.infer")
OUR_PAPER_TRAIN = index_of("python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_small_mcd1_en.gin")
MULTIPROCESS_RUN = [i for i, (_, c) in enumerate(COMMANDS) if "--process_index=1" in c][0]
NEWLANG_REPORT = index_of("python -m mcwq_t5x.report runs/newlang")
REPORT = index_of("python -m mcwq_t5x.report ../shared")
DOWNLOAD = index_of("python scripts/download_mcwq.py")
BENCHMARK = index_of("python scripts/benchmark.py")
BENCHMARK_T5X = index_of("python scripts/benchmark.py --mode t5x")
