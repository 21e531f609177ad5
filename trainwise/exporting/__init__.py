"""A plan written into the user's own training: TrainingArguments, TRL's SFTConfig, accelerate and DeepSpeed
configs, the scripts and the train command (scripts)."""
