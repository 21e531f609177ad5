"""Data: sources (built-in corpora, CSV/JSON/JSONL files, HF datasets) and task preparation."""
