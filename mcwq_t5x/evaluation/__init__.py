"""Evaluation: decoding a split with a model (`prediction`), a training run's periodic and final
evaluations and the choice of its decoded checkpoint (`training_eval`), the paper's metrics
(exact match on RIR, BLEU, equivalence, error categories), scoring files (`score`;
`prediction_checks`: does a prediction file belong to its gold lines, is it UTF-8), execution
accuracy on a SPARQL store (`execution`) and the reproduction report (`report`) with its analyses:
bootstrap intervals and paired tests (`uncertainty`), unseen compounds (`compounds`), published
reference rows (`published`) and the HTML error browser (`browser`).

Imports: the data, engine, checkpointing and stores wings and other evaluation modules.
"""
