"""The real T5X on our engine: `models.EncoderDecoderModel`, a subclass of T5X's
`t5x.models.EncoderDecoderModel` whose module is `engine.network.Transformer` and whose losses and
scores are `engine.losses.fused_loss`'s, for the real T5X's gin files (`python -m t5x.train`).

Imports: T5X (only this wing does; it is needed only where T5X is installed) and the engine;
nothing else of the project, and no other wing or main imports this one (the real T5X imports it
from a gin file).
"""
