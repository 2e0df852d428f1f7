"""Pure functions on parameter trees, below the algorithms and the engine that both use them:
tree operations (``tree``: map, weighted sums, stacking), functional optimisers (``optim``:
gradient transformations with explicit state, as optax has them) and the seeded random streams
every run draws from (``rng``)."""
