"""What a full fine-tuning process loads: peft only for LoRA, the rollout reader (pandas) only to read.

Each is ~65-100 MiB of resident memory in every training process (issue 17: the toy's peak RSS vs TRL).
"""

import subprocess
import sys

CODE = """
import sys
import mmrlvr.models, mmrlvr.store, mmrlvr.train.checkpoint, mmrlvr.train.runtime, mmrlvr.train.trainer
from mmrlvr.store import atomic_write_json, RolloutWriter
from mmrlvr.models.lora import is_peft_model
import torch
assert not is_peft_model(torch.nn.Linear(2, 2))
print(sorted(m for m in ("peft", "pandas", "mmrlvr.store.reader") if m in sys.modules))
"""


def test_training_imports_leave_peft_and_the_reader_out():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_store_still_exports_every_name():
    import mmrlvr.store as store

    for name in store.__all__:
        assert getattr(store, name) is not None
    from mmrlvr.store import RolloutReader  # the reader, on first use

    assert RolloutReader.__module__ == "mmrlvr.store.reader"
