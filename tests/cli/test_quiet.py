"""Issue 34: the tool's stdout is its table. Third-party lines that every trainwise process would print on this
machine are silenced at their source when trainwise is imported: DeepSpeed's "Setting accelerator to CPU" (on
stdout), transformers' FutureWarning about the `is_gradient_checkpointing` that peft reads, bitsandbytes' missing
Hub kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NOISE = ("Setting accelerator to CPU", "is_gradient_checkpointing", "kernels-community", "real_accelerator.py")

# what a trial does to a LoRA model, in a process that imported trainwise first (warnings on: -W default)
PROGRAM = """
import trainwise
from deepspeed.accelerator import get_accelerator
import peft, transformers
assert get_accelerator().device_name() == "cpu"
config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2)
model = transformers.LlamaForCausalLM(config)
model.gradient_checkpointing_enable()
peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
import logging
logging.getLogger("DeepSpeed").warning("another DeepSpeed warning")  # the filter drops only the one line
print("done")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU-only machine this is about")
def test_import_silences_third_party_lines_and_nothing_else():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("DS_ACCELERATOR", None)
    run = subprocess.run(
        [sys.executable, "-W", "default", "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-1] == "done"
    for line in NOISE:
        assert line not in run.stdout + run.stderr, (line, run.stdout, run.stderr)
    assert "another DeepSpeed warning" in run.stdout  # DeepSpeed's own logger still speaks
