"""Reproduction report: the MCWQ paper's result tables and analysis figures from predictions
(the command line is `python -m mcwq_t5x.report`).

Every prediction file under RESULTS_DIR (`discovery`: three layouts) is scored against its gold
queries (`gold`), checked to belong to them (`prediction_checks`) and turned into a `Report`
(`build`): Tables 4-6 (test-intersection-MT vs -gold), 95% bootstrap intervals, the §6.2 error
categories, Figures 4-6, unseen compounds, seed spreads and DBCA split divergences, with the
published rows (`published`) beside them. `tables` is the table registry; `render`, `figures` and
`write` write report.md, one CSV per table, PNGs, results.json and the error browser; `compare`
is the paired test of two files. Splits and languages beyond the published ones are further rows
and columns.
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
