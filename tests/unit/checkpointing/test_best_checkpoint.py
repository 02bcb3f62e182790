"""The command `python -m mcwq_t5x.best_checkpoint` (mcwq_t5x/best_checkpoint.py): its help, and a
folder without checkpoints. How checkpoints are kept and chosen by a metric
(`mcwq_t5x.checkpointing.best_checkpoint`): tests/unit/entry_points/test_recipe.py; the metric
writer it reads: tests/unit/entry_points/test_train.py."""
import pytest

from mcwq_t5x import best_checkpoint as best_checkpoint_cli


def test_best_checkpoint_help(capsys):
  with pytest.raises(SystemExit):
    best_checkpoint_cli.main(["--help"])
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m mcwq_t5x.best_checkpoint") and "--metric" in out


def test_best_checkpoint_prints_the_newest_or_best(tmp_path, capsys):
  assert best_checkpoint_cli.main([str(tmp_path)]) == 1
  assert "no checkpoint" in capsys.readouterr().err
