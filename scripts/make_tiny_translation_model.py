#!/usr/bin/env python3
"""Writes a tiny Hugging Face translation model with RANDOM weights, offline, for trying the
translation pipeline (`python -m preprocessing.translate --backend hf`) without a download.

  python scripts/make_tiny_translation_model.py --out runs/tiny_mt_en_fr

A Marian encoder-decoder (1+1 layers of width 16) from a fixed seed, with a word-level
SentencePiece tokenizer trained on a few dozen target-language words. It was never trained: its
output is a deterministic string of target words, enough to run the mechanics end to end, not to
say anything about translation. Its vocabulary has no digits or capital M, so it never outputs a
placeholder: use `--keep-placeholders`. Needs `torch`, `transformers`, `sentencepiece`.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
from typing import Optional, Sequence

#: Target-language words the tokenizer knows (French; lower case, no digits, no "m" + digit).
WORDS = {
    "fr": ("qui quel quelle quels film films a est était été réalisé réalisateur produit "
           "producteur écrit scénariste monté monteur joué acteur actrice personnage épouse "
           "épousé frère sœur parent enfant employé fondé entreprise pays nationalité "
           "français américain espagnol britannique directeur de la le les un une et ou par "
           "avec pour dans sur son sa ses ce cette fut influencé distribué suivi"),
}


def build(out: pathlib.Path, language: str = "fr", seed: int = 0) -> int:
  """Writes the tokenizer and the random-weight model to `out`.

  Args:
    out: the model folder (created; files in it are overwritten).
    language: the target language (its word list in `WORDS`).
    seed: torch seed of the random initialisation (same seed, same weights and outputs).

  Returns:
    The number of model parameters.

  Raises:
    ValueError: no word list for `language`.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  if language not in WORDS:
    raise ValueError(f"no word list for language {language!r}; known: {sorted(WORDS)}")
  out.mkdir(parents=True, exist_ok=True)
  words = WORDS[language].split()
  with tempfile.TemporaryDirectory() as tmp:
    corpus = pathlib.Path(tmp) / "corpus.txt"
    # Every word once per line in turn, so that each is a piece of the word-level model.
    corpus.write_text(
        "\n".join(" ".join(words[i:] + words[:i]) for i in range(len(words))) + "\n",
        encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(pathlib.Path(tmp) / "sp"),
        model_type="word",
        vocab_size=len(words) + 3,
        hard_vocab_limit=False,
        character_coverage=1.0,
        pad_id=-1,
        bos_id=-1,
        eos_id=1,
        unk_id=0,
        minloglevel=2)
    model_bytes = (pathlib.Path(tmp) / "sp.model").read_bytes()
  return save_marian(out, model_bytes, seed, target_lang=language, source_lang="en")


def save_marian(out: pathlib.Path,
                sentencepiece_model: bytes,
                seed: int = 0,
                max_position_embeddings: int = 128,
                **tokenizer_args) -> int:
  """Writes a Marian tokenizer over a SentencePiece model (source and target side alike) and a
  random-weight `MarianMTModel` over its vocabulary (1+1 layers of width 16, 2 heads, MLP 32) to
  `out`, as `save_pretrained` folders.

  Args:
    out: the model folder (exists; files in it are overwritten).
    sentencepiece_model: the serialised SentencePiece model (with `<unk>` and `</s>`).
    seed: torch seed of the random initialisation.
    max_position_embeddings: the longest sequence the model takes.
    **tokenizer_args: further `MarianTokenizer` arguments (`target_lang`, `source_lang`).

  Returns:
    The number of model parameters.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  for name in ("source.spm", "target.spm"):
    (out / name).write_bytes(sentencepiece_model)
  sp = spm.SentencePieceProcessor(model_proto=sentencepiece_model)
  vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
  vocab["<pad>"] = len(vocab)
  (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
  tokenizer = transformers.MarianTokenizer(
      str(out / "source.spm"),
      str(out / "target.spm"),
      str(out / "vocab.json"),
      unk_token="<unk>",
      eos_token="</s>",
      pad_token="<pad>",
      **tokenizer_args)
  config = transformers.MarianConfig(
      vocab_size=len(vocab),
      d_model=16,
      encoder_layers=1,
      decoder_layers=1,
      encoder_attention_heads=2,
      decoder_attention_heads=2,
      encoder_ffn_dim=32,
      decoder_ffn_dim=32,
      max_position_embeddings=max_position_embeddings,
      pad_token_id=vocab["<pad>"],
      eos_token_id=vocab["</s>"],
      decoder_start_token_id=vocab["<pad>"])
  torch.manual_seed(seed)
  model = transformers.MarianMTModel(config).eval()
  model.save_pretrained(out)
  tokenizer.save_pretrained(out)
  return sum(p.numel() for p in model.parameters())


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Command line (module docstring); returns the exit status."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", type=pathlib.Path, required=True, help="model folder to write")
  parser.add_argument("--lang", default="fr", choices=sorted(WORDS), help="target language")
  parser.add_argument("--seed", type=int, default=0, help="torch seed of the random weights")
  args = parser.parse_args(argv)
  n = build(args.out, args.lang, args.seed)
  print(f"wrote a random-weight Marian model (en -> {args.lang}, {n:,} parameters, seed "
        f"{args.seed}; untrained: its output is unrelated to the input) to {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
