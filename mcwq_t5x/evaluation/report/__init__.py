"""Reproduction report: the MCWQ paper's result tables and analysis figures from predictions
(the command line is `python -m mcwq_t5x.report`). Modules: `discovery` (prediction files),
`gold` (gold queries), `build` (scores -> `Report`), `tables` (the table registry), `render`,
`figures`, `write` and `compare` (paired tests).

Reads every prediction file under RESULTS_DIR, scores it against the gold queries
(`mcwq_t5x.evaluation.metrics`), checks that it belongs to them and reads as UTF-8
(`mcwq_t5x.evaluation.prediction_checks`: a warning on stderr, in report.md and results.json
otherwise) and writes, under --out (default `./mcwq_report`):

  * `report.md`: all tables in Markdown, plus warnings, the list of files read and skipped
    analyses;
  * `table4_monolingual_{exact_match,bleu,equivalence}.csv` (paper Table 4: per split x
    language, with "MCD mean" = mean over the MCD splits present when there are two or more),
    and the published reference rows (`mcwq_t5x.evaluation.published`, marked "published:";
    `--no_published` leaves them out);
  * `table5_zeroshot_{exact_match,bleu,equivalence}.csv` (Table 5: English-trained models on
    he/kn/zh; the "en" column is the same model's monolingual English result);
  * `table6_gold_test.csv` (Table 6: test-intersection-MT vs test-intersection-gold);
  * every exact match with its 95% bootstrap confidence interval (`mcwq_t5x.evaluation.
    uncertainty`: percentile method, 10,000 resamples of the test examples, fixed seed 0): in
    the CSV files the columns `<column> 95% CI low` and `<column> 95% CI high` after the values,
    in report.md "77.6 (76.5–78.7)";
  * `unseen_compounds_exact_match.csv` and `unseen_compounds_costliest.csv`, and the figure
    `unseen_{mode}_{split}.png`: exact match by number of unseen compounds and the unseen
    compounds that cost most (`mcwq_t5x.evaluation.compounds`), for the splits whose training
    part `--data_dir` holds (a full release, a `preprocessing.make_splits` release; the shared
    copy of the published splits has none, and a note says so);
  * `seeds_exact_match.csv`: runs of one configuration with different seeds (model names
    `<configuration>_seed<k>`), mean ± 95% Student-t interval (`uncertainty.runs_interval`);
  * `error_categories.csv` (§6.2 counts per model/mode/split/language);
  * `split_divergences.csv`: DBCA atom and compound divergence (`mcwq_t5x.data.divergence`; Keysers et
    al. 2020) between the parts of every split reported on, for the parts `--data_dir` holds
    (dev/test in the shared copy; train/dev, train/test, dev/test in a full release);
  * `results.json` (every score; `--compare A B` adds the paired comparison of two prediction
    files, `compare`);
  * with `--html DIR`, the error browser `DIR/index.html` (`mcwq_t5x.evaluation.browser`), which
    each table cell of report.md links to;
  * figures (PNG, matplotlib Agg): `errors_{model}_{mode}_{split}.png` (error categories per
    language, Figures 5-6) and, when recursionDepth is known, `complexity_{model}_{mode}_{split}.png`
    (accuracy by complexity per language, Figure 4).

Splits and languages: the published ones (columns en, he, kn, zh; rows MCD1-3, MCD mean, Random)
and any other a prediction file names (`mcwq_t5x.train` output of a release's tasks, e.g.
`mcwq_cfq_sample_zeroshot_fr_test.txt`): other languages are further columns (sorted), other splits
further rows. `--split validation` scores the predictions on the validation (`dev`) part instead
of the test part (for a release without a test part, such as the migrated CFQ sample); the gold
test set and Table 6 are test-only.

Prediction layouts (one predicted RIR query per line, line-parallel with the gold file):

  1. upstream `mcwq/results/`: `{model}/{monolingual,zeroshot}/{split}/generated_predictions_{lang}.txt`
     and `..._{lang}-gold.txt` (predictions on the human-translated gold test set); split, mode
     and model are read from the file's full path, so RESULTS_DIR may be any directory above
     the files (a missing mode directory means "monolingual").
  2. simple: `predictions_{split}_{lang}.txt` and `predictions_{split}_{lang}-gold.txt`
     anywhere under RESULTS_DIR (split one of mcd1, mcd2, mcd3, random_split; `-gold` = the gold
     test set, scored by the model trained on that split). The model is the first directory
     below RESULTS_DIR (RESULTS_DIR's own name if the file lies directly in it); the mode is
     "zeroshot" if a directory on the way is named `zeroshot`, else "monolingual".
  3. `mcwq_t5x.train` output: `MODEL_DIR/predictions/{task}_test.txt` with the task names of
     `tasks/mcwq.py`: `mcwq_{split}_{lang}` (monolingual), `mcwq_{split}_zeroshot_{lang}`
     (zero-shot) and `mcwq_gold_{lang}` (gold test set; its split is that of the other test
     predictions in the directory, skipped if that is not unique), each also as `…_prefixed`.
     `mcwq_t5x.eval` writes the same files to `MODEL_DIR/eval_<step>/predictions/` (its default
     EVAL_OUTPUT_DIR; the generated eval files use `MODEL_DIR/{test,zeroshot,gold}_<lang>`).
     The model is the run's name: MODEL_DIR (the folder CHECKPOINT_PATH names), never
     `eval_<step>`; predictions written outside any MODEL_DIR (EVAL_OUTPUT_DIR=runs/zs_he) take
     the name of the run whose checkpoint their metrics JSON records (`checkpoint_run_name`). A
     second file of the same run and test set is skipped. Validation (`_validation.txt`)
     predictions are read only with `--split validation` (and then the test ones are not).

Gold queries: `{targets_dir}/{split}/test.{lang}.sparql` (RIR) and `{targets_dir}/gold/test.{lang}.sparql`;
when a split has no such file, `readers.read_split(split, "test", lang, data_dir)` (official
SPARQL converted to RIR, or the full release). recursionDepth (for Figure 4) comes from the
full release (`dataset.json` + `splits/` in --data_dir, default the parent of --targets_dir),
used only if its test queries equal the gold file's line by line; otherwise the figure is
skipped with a message.

Test-intersection (Table 6): the gold set's examples are found in the split's test set with
`metrics.match_test_intersection` (same RIR target, then the most similar question of the same
language); the MT and gold columns score the split's predictions and the gold-set predictions on
those matched examples only (like with like), the `(all n)` columns every gold example.
"""
from __future__ import annotations

# The public names, as before the package was split.
from mcwq_t5x.evaluation import metrics  # noqa: F401
from mcwq_t5x.data import readers  # noqa: F401
from mcwq_t5x.evaluation.report.build import build  # noqa: F401
from mcwq_t5x.evaluation.report.build import split_divergences  # noqa: F401
from mcwq_t5x.evaluation.report.build import unseen_compounds  # noqa: F401
from mcwq_t5x.evaluation.report.common import *  # noqa: F401,F403
from mcwq_t5x.evaluation.report.compare import compare  # noqa: F401
from mcwq_t5x.evaluation.report.discovery import *  # noqa: F401,F403
from mcwq_t5x.evaluation.report.figures import figures  # noqa: F401
from mcwq_t5x.evaluation.report.gold import GoldSet  # noqa: F401
from mcwq_t5x.evaluation.report.render import merge_intervals, to_markdown, write_csv  # noqa: F401
from mcwq_t5x.evaluation.report.rows import columns, seed_groups  # noqa: F401
from mcwq_t5x.evaluation.report.tables import heading, Table, TABLES, tables  # noqa: F401
from mcwq_t5x.evaluation.report.write import comparison_markdown, format_p_value  # noqa: F401
from mcwq_t5x.evaluation.report.write import ProgressLines, write_report  # noqa: F401
from mcwq_t5x.evaluation.report.write import check_own_files, ForeignFileError  # noqa: F401
from mcwq_t5x.evaluation.report.write import MANIFEST, record_own_files  # noqa: F401
