"""`python -m mcwq_t5x.evaluate`: the former name of `python -m mcwq_t5x.score`, kept as an alias.

The same arguments, output and exit status as `mcwq_t5x.score` (which scores a file of predictions
against a file of gold queries); the library code lives there. Not to be confused with
`python -m mcwq_t5x.eval`, the gin main that decodes a split with a checkpoint.
"""
import sys

from mcwq_t5x import score

if __name__ == "__main__":
  sys.exit(score.main())
