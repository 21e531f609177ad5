"""What a study and its trials are: their rows parsed with the strategy registry (config.py)."""
