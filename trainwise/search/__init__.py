"""The search layer: what to measure next and what to recommend (the plan search's inputs live here)."""
