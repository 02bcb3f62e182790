"""Published MCWQ results, the reference rows ("published") of the report's Tables 4 and 5.

Each number is copied from its paper, nothing derived; exact match (percent) on the published
splits' test sets. Cui et al. (TACL 2022), "Compositional Generalization in Multilingual Semantic
Parsing over Wikidata", mT5-small+RIR, MCD1: Table 4 monolingual en 77.6, he 57.8, kn 55.0,
zh 52.8; Table 5 zero-shot he 0.4, kn 0.8, zh 0.1. Wang & Hershcovich (ACL 2023), "On Evaluating
Multilingual Compositional Generalization with Translated Datasets", mBART50, MCD mean:
monolingual en 55.2, zh 43.6; zero-shot zh 35.0. What a paper does not give stays empty.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

#: The "MCD mean" row of the report's tables (mean over the MCD splits).
MCD_MEAN = "MCD mean"


@dataclasses.dataclass(frozen=True)
class PublishedRow:
  """One published row: `system` and `title` as the paper names them, `citation` (authors, venue,
  year), `mode` "monolingual" (Table 4) or "zeroshot" (Table 5), `split` ("mcd1", ... or
  `MCD_MEAN`), `exact_match` {language: percent as printed}, `size` (the pretrained model) and
  `train_part` (the MCWQ part it was fine-tuned on: both papers train on `train`)."""
  system: str
  citation: str
  title: str
  mode: str
  split: str
  exact_match: Mapping[str, float]
  size: str = "mT5-small"
  train_part: str = "train"

  @property
  def label(self) -> str:
    """The row's model cell: "published: SYSTEM (CITATION)"."""
    return f"published: {self.system} ({self.citation})"


CUI_2022 = ("Cui et al., TACL 2022",
            "Compositional Generalization in Multilingual Semantic Parsing over Wikidata")
WANG_HERSHCOVICH_2023 = ("Wang & Hershcovich, ACL 2023",
                         "On Evaluating Multilingual Compositional Generalization with "
                         "Translated Datasets")

#: mBART50 (Tang et al., 2020) has one size, that of mBART-large (12+12 layers, 610M parameters).
MBART50_SIZE = "mBART-large-50"

ROWS = (
    PublishedRow("mT5-small+RIR", *CUI_2022, "monolingual", "mcd1", {
        "en": 77.6,
        "he": 57.8,
        "kn": 55.0,
        "zh": 52.8
    }),
    PublishedRow("mT5-small+RIR", *CUI_2022, "zeroshot", "mcd1", {
        "he": 0.4,
        "kn": 0.8,
        "zh": 0.1
    }),
    PublishedRow(
        "mBART50",
        *WANG_HERSHCOVICH_2023,
        "monolingual",
        MCD_MEAN, {
            "en": 55.2,
            "zh": 43.6
        },
        size=MBART50_SIZE),
    PublishedRow(
        "mBART50", *WANG_HERSHCOVICH_2023, "zeroshot", MCD_MEAN, {"zh": 35.0}, size=MBART50_SIZE),
)


def rows_for(mode: str) -> list[PublishedRow]:
  """The published rows of Table 4 (`mode` "monolingual") or Table 5 ("zeroshot")."""
  return [r for r in ROWS if r.mode == mode]
