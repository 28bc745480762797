"""mmrlvr: reinforcement learning from verifiable rewards for vision-language models.

The package is a chain of small stages joined by plain typed values (see ``mmrlvr.types``):
data -> rollout -> rewards -> credit -> algos -> train -> store -> inspector. Each stage is importable
on its own; nothing here imports the trainer or Gradio at package import time.
"""

__version__ = "0.1.0"
