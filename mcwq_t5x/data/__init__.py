"""MCWQ data and the input pipeline: where the data lives (`paths`), readers of every published
form and the one writer of result files (`writers`), SPARQL and RIR, the SentencePiece
vocabularies, the TFDS builder, DBCA atoms and compounds (`divergence`), and the SeqIO -> numpy
pipeline that feeds the engine (`pipeline`, `packing`).

Imports: other data modules only (TensorFlow and SeqIO where a module says so); nothing of the
engine, checkpoints, evaluation or stores.
"""
