"""Training itself: THE loop (loop), compare's measured trial (trial), the training run (fit), models (presets,
GGUF, vision), the data (data/) and what a trial measures (measure/)."""
