"""MCWQ data and the input pipeline: where the data lives (`paths`), readers of every published
form and the one writer of result files (`writers`), SPARQL and RIR, the SentencePiece
vocabularies, the TFDS builder, DBCA atoms and compounds (`divergence`), the SeqIO -> numpy
pipeline that feeds the engine (`pipeline`, `packing`) and the data of a training run
(`training_data`: its batches, this process's rows of each, the data position of a checkpoint).

Imports: other data modules only (TensorFlow and SeqIO where a module says so); nothing of the
engine, checkpoints, evaluation or stores.
"""
