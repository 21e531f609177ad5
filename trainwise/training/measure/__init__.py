"""Measurements: step timing, memory, environment."""
