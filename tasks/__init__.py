"""SeqIO task registrations of mcwq-t5x; importing this package registers the MCWQ tasks.

See `tasks/mcwq.py` for the task names (`mcwq_{split}_{lang}`, `mcwq_gold_{lang}`,
`mcwq_{split}_zeroshot_{lang}`, mixtures `mcwq_{split}_multilingual`).
"""
from tasks import mcwq  # noqa: F401  (registers the tasks)
