"""Every command the README and the docs pages print (`readme_commands.PAGES`) is run once, as
printed (plus the size overrides of `readme_commands.OVERRIDES`), in a fresh process, in the pages'
order, in a temporary copy of the repository (the `readme` fixture of conftest.py: a user's `runs/`
is never touched, and a test selected alone runs the commands before it first). Each test checks
what its command printed or wrote against real values: the paper's numbers, a re-scoring of the
written predictions, the shared data's line counts, another command's output. The test command
itself is what CI runs (`.ci/run` runs it verbatim), so it is checked against `.ci/run`, not run
again."""
import json
import pathlib
import re
import shlex
import sys

import numpy as np
import pytest
import sacrebleu
import sentencepiece as spm

from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x.data import readers
from mcwq_t5x.evaluation import metrics
import mains
import readme_commands as rc
import scenarios

COMMANDS = rc.COMMANDS


def test_readme_commands_are_covered():
  assert ("Set-up and the two commands", rc.TEST_COMMAND) in COMMANDS
  assert rc.TEST_COMMAND in (mains.REPO / ".ci/run").read_text()  # CI runs the README's command
  assert len(COMMANDS) >= 15
  # Every docs page is read (a page left out would hold untested commands), README.md first.
  assert rc.PAGES[0] == "README.md"
  assert sorted(rc.PAGES[1:]) == sorted(
      f"docs/{p.name}" for p in (mains.REPO / "docs").glob("*.md"))
  for _, command in COMMANDS:
    assert command.startswith(("pip ", "python ", "echo ", "export ")), command
  # Every command the tests run is placed in the dependency table exactly once, and every entry
  # of the table is a README command.
  for i in range(len(COMMANDS)):
    if rc.runnable(i):
      rc.depends(i)
  for prefix, _ in rc.DEPENDS:
    rc.index_of(prefix)
  # Every command that trains or decodes gets the overrides that make it small.
  for _, command in COMMANDS:
    if any(m in command for m in (".train ", ".eval ", ".infer ", "benchmark.py")):
      assert rc.with_overrides(command, "/r") != command, command


# A folder or file under `runs/` that a command names (also as `$PWD/runs/...`; not the gin
# folders `gin/.../runs/`).
RUNS_ENTRY = re.compile(r"(?:^|(?<=[\s'\"=])|(?<=\$PWD/))runs/([\w.-]+)")


def test_each_page_runs_on_its_own():
  """A reader can follow any page alone, top to bottom, in a fresh clone: no command reads an
  output of another page's commands. Checked from the dependency table (`readme_commands.depends`:
  what each command reads, implicit paths included) and from the `runs/` entries the commands
  name: an `export` line names only what its page made before it, and a command names a `runs/`
  entry of another page only after its own page made it (a repeated command, such as the main job
  on the pages that read its run, makes it). The tests run each page's `export` lines for that
  page only (`readme_commands.env_of`)."""
  problems = []
  for i, (_, command) in enumerate(COMMANDS):
    page = rc.PAGE_OF[i]
    if rc.runnable(i):
      problems += [
          f"{page}: `{command[:80]}` reads what `{COMMANDS[d][1][:80]}` of {rc.PAGE_OF[d]} wrote"
          for d in rc.depends(i)
          if rc.PAGE_OF[d] != page
      ]
    named = set(RUNS_ENTRY.findall(command))
    here, elsewhere = set(), set()
    for j in range(i):
      (here if rc.PAGE_OF[j] == page else elsewhere).update(RUNS_ENTRY.findall(COMMANDS[j][1]))
    if command.startswith("export "):
      missing = named - here
    else:
      missing = set() if rc.same_as(i) != i else (named & elsewhere) - here
    problems += [
        f"{page}: `{command[:80]}` names runs/{n}, which no earlier command of {page} makes"
        for n in sorted(missing)
    ]
  assert not problems, "\n".join(problems)


def test_no_paragraph_repeats_within_a_page():
  """No page says the same thing twice: no sentence of 60 characters or more is in two paragraphs
  of one page (prose only: code blocks and tables are left out)."""
  repeated = []
  for page in ("README.md", "ARCHITECTURE.md", *rc.PAGES[1:], "preprocessing/README.md"):
    text = re.sub(r"```.*?```", "", (mains.REPO / page).read_text(encoding="utf-8"), flags=re.S)
    seen = {}
    for n, paragraph in enumerate(re.split(r"\n\s*\n", text)):
      if paragraph.lstrip().startswith("|"):
        continue
      for sentence in re.split(r"(?<=[.;:])\s+", " ".join(paragraph.split())):
        if len(sentence) >= 60 and seen.setdefault(sentence, n) != n:
          repeated.append(f"{page}: {sentence!r}")
  assert not repeated, "\n".join(repeated)


# The terms of docs/glossary.md (its headings' anchors) and how the pages write them.
GLOSSARY_TERMS = {
    "mcwq-and-cfq": r"\bCFQ\b",
    "placeholders": r"\bplaceholders?\b",
    "rir": r"\bRIR\b",
    "exact-match-and-bleu": r"\bexact match\b",
    "splits-and-parts": r"\brandom_split\b",
    "zero-shot": r"\bzero-shot\b",
    "gold-test-set": r"\bgold\b",
    "prefixed-tasks": r"_prefixed\b",
    "dbca-atoms-and-compounds": r"\bDBCA\b",
    "divergence-and-the-chernoff-coefficient": r"\bChernoff\b",
    "mcd-split": r"\bMCD\b",
    "complexity-level": r"\bcomplexity\b",
    "first-fit-and-greedy-packing": r"\bfirst-fit\b|\bgreedy packing\b",
    "unsafe_rbg": r"\bunsafe_rbg\b",
    "gin-files-macros-and-bindings": r"\bmacros?\b",
}


def _anchor(heading: str) -> str:
  """GitHub's anchor of a Markdown heading: lower case, punctuation but `-` and `_` dropped, spaces
  as `-`."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_glossary_terms_are_linked_where_they_first_appear():
  """Reading the README, then the docs pages in the README's order, each term of the glossary is
  linked to its entry in the paragraph (or table) where it first appears."""
  glossary = (mains.REPO / "docs/glossary.md").read_text(encoding="utf-8")
  anchors = {_anchor(h) for h in re.findall(r"^## (.+)$", glossary, re.M)}
  assert anchors == set(GLOSSARY_TERMS), anchors ^ set(GLOSSARY_TERMS)
  unlinked, first = [], {}
  for page in rc.PAGES:
    if page == "docs/glossary.md":
      continue
    text = re.sub(r"```.*?```", "", (mains.REPO / page).read_text(encoding="utf-8"), flags=re.S)
    for paragraph in re.split(r"\n\s*\n", text):
      prose = re.sub(r"\]\([^)]*\)", "]", paragraph)  # link targets are not prose
      for anchor, pattern in GLOSSARY_TERMS.items():
        if anchor in first or not re.search(pattern, prose):
          continue
        first[anchor] = page
        if f"glossary.md#{anchor})" not in paragraph:
          unlinked.append(f"{page}: {anchor!r} first appears unlinked in: {paragraph[:160]!r}")
  assert set(first) == set(GLOSSARY_TERMS), set(GLOSSARY_TERMS) - set(first)
  assert not unlinked, "\n".join(unlinked)


def test_readme_commands_run_in_the_tests_environment(readme):
  """`python` and `pip` of the README's commands are the environment that runs the tests (a
  virtualenv, a conda environment or a plain interpreter): a pinned package imports, and
  `sys.prefix` is the tests' own. A symlink to a virtualenv's interpreter would start the base
  Python, without the environment's packages."""
  probe = ("import sys, sacrebleu, seqio; "
           "print(sys.prefix); print(sys.executable); print(sacrebleu.__version__)")
  out = readme.shell(f"python -c {shlex.quote(probe)} && pip install -e .")
  assert out.returncode == 0, out.stderr[-3000:]
  prefix, executable, version = out.stdout.splitlines()[:3]
  print(f"README commands' interpreter: sys.prefix={prefix} sys.executable={executable} "
        f"sacrebleu {version}")
  pinned = [
      l for l in (mains.REPO / "requirements.txt").read_text().splitlines()
      if l.startswith("sacrebleu==")
  ]
  assert prefix == sys.prefix and [f"sacrebleu=={version}"] == pinned
  assert version == sacrebleu.__version__
  assert pathlib.Path(executable).resolve() == pathlib.Path(sys.executable).resolve()
  assert "already installed" in out.stdout


def _lines(path):
  return path.read_text(encoding="utf-8").splitlines()


def _main_job(repo):
  """The main job's predictions and metrics must agree with a re-scoring against the test set."""
  run = repo / "runs/tiny_random_split_en"
  preds = _lines(run / "predictions/mcwq_random_split_en_test.txt")
  gold = readers.read_split("random_split", "test", "en", mains.REPO.parent / "shared/mcwq")
  assert len(preds) == len(gold) == 6282
  scores = json.loads((run / "metrics/mcwq_random_split_en_test.json").read_text())
  rescored = metrics.exact_match_metric([e.rir for e in gold], preds)
  assert scores["exact_match"] == pytest.approx(rescored["exact_match"])
  assert scores["bleu"] == pytest.approx(metrics.bleu_metric([e.rir for e in gold], preds)["bleu"])
  assert scores["step"] == 4 and scores["num_examples"] == 6282
  steps = [json.loads(l)["step"] for l in _lines(run / "train_metrics.jsonl")]
  assert steps == [2, 4]


def _evaluate_main_job(repo, out):
  scores = json.loads(
      (repo / "runs/tiny_random_split_en/metrics/mcwq_random_split_en_test.json").read_text())
  # The command line prints the same exact match as the run's metrics file (same predictions).
  assert f"{scores['exact_match']:.1f}" in out["stdout"], out["stdout"][-2000:]


def _our_eval(repo, out):
  run = repo / "runs/tiny_random_split_en"
  preds = sorted(run.glob("eval_*/predictions/mcwq_random_split_en_test.txt")) or sorted(
      run.glob("**/predictions/mcwq_random_split_en_test.txt"))
  evaluated = [p for p in preds if p.parent.parent != run]
  assert evaluated, "the eval command wrote no predictions"
  # Same checkpoint, same first 16 test questions, greedy: the training run's final evaluation's
  # lines up to the shorter decoding length (eval decodes up to the 16 questions' longest target,
  # the training run's test up to 8 tokens; a 4-step model runs on to the limit).
  ours = _lines(evaluated[-1])
  theirs = _lines(run / "predictions/mcwq_random_split_en_test.txt")[:16]
  assert len(ours) == 16 and len(set(ours)) > 1
  for i, (a, b) in enumerate(zip(ours, theirs)):
    short, full = sorted((a, b), key=len)
    # A cut inside a byte-fallback character decodes to U+FFFD at the end of the shorter one.
    assert full.startswith(short.rstrip("\ufffd")), (i, a, b)
  assert "exact_match" in out["stdout"] or "exact match" in out["stdout"].lower()


def _infer_one(repo, out):
  del repo
  lines = out["stdout"].splitlines()
  assert len(lines) == 1 and lines[0].startswith(("ASK", "SELECT", "ERROR: ")), lines


def _t5x_tiny(repo, out):
  del out
  rows = _lines(repo / "runs/t5x/tiny_random_split_en/inference_eval/"
                "mcwq_random_split_en-metrics.jsonl")
  assert json.loads(rows[-1])["step"] == 4


def _t5x_eval(repo, out):
  del out
  rows = _lines(repo / "runs/t5x/mt5_small_mcd1_en/zeroshot_he/inference_eval/"
                "mcwq_mcd1_zeroshot_he_prefixed-metrics.jsonl")
  scores = json.loads(rows[-1])
  dev = best_checkpoint.read_metric(repo / "runs/t5x/mt5_small_mcd1_en", rc.T5X_DEV_LOSS)
  assert scores["step"] == best_checkpoint.best_of(dev, "min")  # the lowest dev loss
  assert {"exact_match", "bleu"} <= set(scores)


def _t5x_infer(repo, out):
  del out
  path = repo / "runs/t5x/mt5_small_mcd1_en/infer/mcwq_gold_he_prefixed-predict.jsonl-00000-of-00001"
  rows = [json.loads(l) for l in _lines(path)]
  assert len(rows) == 155  # every gold question, one prediction each
  questions = readers.read_split("gold", "test", "he", mains.REPO.parent / "shared/mcwq")
  first = rows[0]["inputs"]["inputs_pretokenized"]  # T5X writes the features it decoded
  assert first == "translate Hebrew to Sparql: " + questions[0].question
  assert rows[0]["inputs"]["targets_pretokenized"] == questions[0].rir


def _our_paper_run(repo, out):
  del out
  run = repo / "runs/mt5_small_mcd1_en"
  assert (run / f"checkpoint_{rc.OUR_PAPER_STEPS}" / "state").is_dir()
  scores = json.loads((run / f"metrics/{rc.OUR_PAPER_TASK}_test.json").read_text())
  assert scores["num_examples"] == 8


def _our_zeroshot(repo, out):
  del out
  path = sorted(
      (repo /
       "runs/mt5_small_mcd1_en").glob("**/predictions/mcwq_mcd1_zeroshot_he_prefixed_test.txt"))
  assert path and len(_lines(path[-1])) == 8


def _two_processes(repo, out):
  del out
  state = repo / f"runs/tiny_2proc/checkpoint_{rc.MULTIPROCESS_STEPS}/state"
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= {p.name for p in state.iterdir()}
  assert len(_lines(repo / "runs/tiny_2proc/predictions/mcwq_gold_he_test.txt")) == 8


def _benchmark(repo, out):
  """The tiny preset's JSON and Markdown table (tests/e2e/test_benchmark_script.py checks the
  figures)."""
  results = json.loads((repo / "runs/benchmark/benchmark.json").read_text())
  assert results["preset"] == "tiny" and results["complete"], results
  assert (repo / "runs/benchmark/benchmark.md").read_text() in out["stdout"], out["stdout"]


def _benchmark_t5x(repo, out):
  """The T5X mode's tiny preset: JSON and Markdown table (tests/e2e/test_benchmark_t5x.py checks
  the figures)."""
  results = json.loads((repo / "runs/benchmark_t5x/benchmark_t5x.json").read_text())
  assert (results["mode"], results["preset"], results["complete"]) == ("t5x", "tiny", True)
  assert (repo / "runs/benchmark_t5x/benchmark_t5x.md").read_text() in out["stdout"]


def _export_hf(repo, out):
  """The Transformers folder: greedy decoding up to the run's 64 target tokens by default (plain
  `model.generate()`), ordinary file modes, one line saying so; test_export_hf.py checks what
  transformers makes of it."""
  assert out["stdout"].startswith("wrote runs/tiny_random_split_en_hf: "
                                  "MT5ForConditionalGeneration ("), out["stdout"]
  assert out["stdout"].rstrip().endswith("(greedy, up to 64 new tokens)"), out["stdout"]
  folder = repo / "runs/tiny_random_split_en_hf"
  generation = json.loads((folder / "generation_config.json").read_text())
  assert generation["max_new_tokens"] == 64 and generation.get("num_beams", 1) == 1, generation
  assert (folder / "model.safetensors").stat().st_mode & 0o644 == 0o644
  assert json.loads((folder / "config.json").read_text())["d_model"] == 32


def _download_copy(repo, out):
  del out
  shared = mains.REPO.parent / "shared/mcwq"
  for rel in ("official/mcd1/dev.he.txt", "official/random_split/test.zh.txt"):
    assert (repo / "runs/mcwq_copy" / rel).read_bytes() == (shared / rel).read_bytes(), rel


def _inspect(repo, out):
  """The examples on stdout; on stderr progress lines only (`[  12 s] ...`: loading, reading, the
  count), none of TensorFlow's or SentencePiece's start-up lines."""
  del repo
  first = readers.read_split("mcd1", "dev", "he", mains.REPO.parent / "shared/mcwq")[0]
  assert first.question in out["stdout"] and first.rir in out["stdout"]
  progress = out["stderr"].splitlines()
  assert progress and all(re.match(r"\[ *\d+ s\] ", l) for l in progress), progress
  assert "loading SeqIO, TensorFlow and the MCWQ tasks" in progress[0]
  assert progress[-1].endswith("] 5,408 examples read"), progress  # the mcd1 dev questions


def _evaluate_published(repo, out):
  del repo
  assert "57.8" in out["stdout"]  # the paper's Table 4, Hebrew


def _report_published(repo, out):
  text = out["stdout"] + "".join(p.read_text() for p in (repo / "runs/report").glob("*.md"))
  for figure in ("77.6", "57.8", "55.0", "52.8"):  # the paper's Table 4 (mT5-small, mcd1)
    assert figure in text, figure


def _compare_published(repo, out):
  """The paper's Hebrew model (3,071 exact matches of 5,310) against zero-shot from English (19)."""
  del repo
  c = json.loads(out["stdout"])
  assert (c["n"], c["only_a"] + c["both"], c["only_b"] + c["both"]) == (5310, 3071, 19)
  assert "paired permutation test" in out["stderr"]


def _migrate(repo, out):
  """1,818 records migrate; all 228 whose question pattern MCWQ has give MCWQ's query, as
  docs/dataset_creation.md says and the command prints."""
  dataset = json.loads((repo / "runs/mcwq_sample/dataset.json").read_text())
  assert len(dataset) == 1818
  conformance = json.loads(out["stdout"])["mcwq_conformance"]
  assert conformance["mcwq"].endswith("shared/mcwq/official"), conformance  # the default
  assert conformance["question pattern in MCWQ"] == conformance["same query"] == 228


def _stats(repo, out):
  del out
  assert (repo / "runs/complexity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _translate(repo, out):
  assert json.loads(out["stdout"])["complete"] is True
  en = readers.read_split("cfq_sample", "dev", "en", repo / "runs/mcwq_sample")
  fr = readers.read_split("cfq_sample", "dev", "fr", repo / "runs/mcwq_sample")
  assert len(fr) == len(en) == 220 and [e.rir for e in fr] == [e.rir for e in en]


def _train_vocab(repo, out):
  del out
  sp = spm.SentencePieceProcessor(model_file=str(repo / "runs/mcwq_spm.model"))
  assert sp.get_piece_size() == 2000


def _newlang_report(repo, out):
  """The worked example: `tiny_en` (English, zero-shot French) and `tiny_fr` in the report."""
  assert "| model | split | en | he | kn | zh | fr |" in out["stdout"]
  assert "| tiny_fr | cfq_sample |" in out["stdout"] and "| tiny_en | cfq_sample |" in out["stdout"]
  results = json.loads((repo / "runs/newlang/report/results.json").read_text())
  got = {(r["model"], r["mode"], r["split"], r["language"]): r["n"] for r in results["runs"]}
  assert got == {
      ("tiny_en", "monolingual", "cfq_sample", "en"): 220,
      ("tiny_en", "zeroshot", "cfq_sample", "fr"): 220,
      ("tiny_fr", "monolingual", "cfq_sample", "fr"): 220
  }
  # Each run's metrics file is a re-scoring of its predictions.
  gold = [e.rir for e in readers.read_split("cfq_sample", "dev", "fr", repo / "runs/mcwq_sample")]
  for model, task in (("tiny_en", "mcwq_cfq_sample_en"), ("tiny_fr", "mcwq_cfq_sample_fr"),
                      ("tiny_en", "mcwq_cfq_sample_zeroshot_fr")):
    run = repo / "runs/newlang" / model
    preds = _lines(run / "predictions" / f"{task}_validation.txt")
    scores = json.loads((run / "metrics" / f"{task}_validation.json").read_text())
    assert len(preds) == 220
    np.testing.assert_allclose(scores["bleu"], metrics.bleu_metric(gold, preds)["bleu"], rtol=1e-6)


def _divergence(repo, out):
  del repo
  assert "| mcd1 | dev (5,408) | test (5,310) | 0.0003 | 0.0578 |" in out["stdout"], out["stdout"]


def _make_splits(repo, out):
  """The figures docs/splits.md states: sizes, the 4,669 questions in no part, the atom bound held
  between train and the whole hold-out, and the divergences of the table."""
  report_file = json.loads((repo / "runs/mcwq_splits/make_splits.json").read_text())
  assert json.loads(out["stdout"]) == report_file  # what the command prints
  mcd, rand = report_file["splits"]["mcd"], report_file["splits"]["random"]
  assert report_file["pool"] == 12445
  assert mcd["sizes"] == rand["sizes"] == {"train": 6222, "dev": 777, "test": 777}
  assert mcd["unused"] == rand["unused"] == 4669
  assert mcd["divergences"]["train/dev+test"]["atom"] <= 0.02
  stated = {
      ("mcd", "train/dev+test", "atom"): 0.019966,
      ("mcd", "train/test", "atom"): 0.020834,
      ("mcd", "train/dev", "atom"): 0.020613,
      ("mcd", "train/test", "compound"): 0.8089,
      ("random", "train/test", "atom"): 0.000944,
      ("random", "train/test", "compound"): 0.133258
  }
  for (name, pair, kind), value in stated.items():
    assert report_file["splits"][name]["divergences"][pair][kind] == pytest.approx(value, abs=5e-6)


def _gap_run(name):

  def check_run(repo, out):
    """Test predictions; the run monitors on the split's dev part (EVAL_SPLIT='validation'), so
    its log does not say that there is no held-out dev split."""
    preds = _lines(repo / f"runs/gap/{name}/predictions/mcwq_{name}_test.txt")
    assert len(preds) == 777
    assert "final evaluation decodes the last checkpoint (checkpoint_4)" in out["stderr"]
    assert "no held-out dev split" not in out["stderr"], out["stderr"][-3000:]
    assert "monitoring on the reported split" not in out["stderr"]

  return check_run


def _gap_report(repo, out):
  """The gap runs' report: every test question of both splits in the exact match by number of
  unseen compounds (the release has training parts), with its figure and error browser."""
  assert "report [" in out["stderr"]  # progress lines
  results = json.loads((repo / "runs/gap_report/results.json").read_text())
  assert {(r["model"], r["split"], r["n"]) for r in results["runs"]} == {("mcd_en", "mcd", 777),
                                                                         ("random_en", "random",
                                                                          777)}
  for r in results["runs"]:
    assert sum(b["n"] for b in r["by_unseen"].values()) == 777
    assert sum(b["correct"] for b in r["by_unseen"].values()) == round(r["exact_match"] * 7.77)
  mcd = next(r for r in results["runs"] if r["split"] == "mcd")
  rand = next(r for r in results["runs"] if r["split"] == "random")
  # The MCD test holds out compounds: far more of its questions have unseen ones (seed 0: all but
  # 59 of the 777, against all but 309 on the random split).
  assert (mcd["by_unseen"]["0"]["n"], rand["by_unseen"]["0"]["n"]) == (59, 309)
  assert not any("unseen compounds skipped" in m for m in results["messages"])
  for name in ("unseen_monolingual_mcd.png", "unseen_monolingual_random.png"):
    assert (repo / "runs/gap_report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert (repo / "runs/gap_report/html/index.html").is_file()


CHECKS = {
    rc.MAIN_JOB:
        lambda repo, out: _main_job(repo),
    rc.index_of("python -m mcwq_t5x.score --predictions runs/tiny_random_split_en"):
        _evaluate_main_job,
    rc.index_of("python -m t5x.train --gin_file=gin/tiny_random_split_en.gin"):
        _t5x_tiny,
    rc.OUR_EVAL:
        _our_eval,
    rc.index_of("echo"):
        _infer_one,
    rc.T5X_EVAL:
        _t5x_eval,
    rc.T5X_INFER:
        _t5x_infer,
    rc.OUR_PAPER_TRAIN:
        _our_paper_run,
    rc.index_of("python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/zeroshot/"):
        _our_zeroshot,
    rc.MULTIPROCESS_RUN:
        _two_processes,
    rc.BENCHMARK:
        _benchmark,
    rc.BENCHMARK_T5X:
        _benchmark_t5x,
    rc.index_of("python scripts/download_mcwq.py"):
        _download_copy,
    rc.index_of("python -m mcwq_t5x.inspect_task mcwq_mcd1_he"):
        _inspect,
    rc.index_of("python -m mcwq_t5x.score --predictions ../shared"):
        _evaluate_published,
    rc.index_of("python -m mcwq_t5x.report ../shared"):
        _report_published,
    rc.index_of("python -m mcwq_t5x.report --compare"):
        _compare_published,
    rc.index_of("python -m preprocessing.migrate"):
        _migrate,
    rc.index_of("python -m preprocessing.stats"):
        _stats,
    rc.index_of("python -m preprocessing.translate"):
        _translate,
    rc.index_of("python scripts/train_vocab.py"):
        _train_vocab,
    rc.NEWLANG_REPORT:
        _newlang_report,
    rc.index_of("python -m mcwq_t5x.export_hf"):
        _export_hf,
    rc.index_of("python -m mcwq_t5x.divergence"):
        _divergence,
    rc.index_of(rc.MAKE_SPLITS):
        _make_splits,
    rc.index_of(rc.GAP_MCD):
        _gap_run("mcd_en"),
    rc.index_of(rc.GAP_RANDOM):
        _gap_run("random_en"),
    rc.index_of("python -m mcwq_t5x.report runs/gap"):
        _gap_report,
}

# The test command is what CI runs; `export` lines set the variables of the commands after them.
# The commands of one chain (`readme_commands.chain`) run on one xdist worker.
RUN = [
    pytest.param(
        i, id=f"{i}:{COMMANDS[i][1][:60]}", marks=pytest.mark.xdist_group(f"readme-{rc.chain(i)}"))
    for i in range(len(COMMANDS))
    if rc.runnable(i)
]


@pytest.mark.parametrize("index", RUN)
def test_readme_command(index, readme):
  out = scenarios.check(readme.result(index))
  if index in CHECKS:
    CHECKS[index](readme.repo, out)
