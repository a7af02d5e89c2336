"""The planning layer: what a job needs and what it will cost, on paper, before anything exists.

The GPU instance profiles (``hardware``), the memory estimate (``memory_fit``), FSDP's scaling
over nodes (``scaling_model``) and the forecast of speed and money (``forecast``). The GPU
peaks, the model shapes and the FLOPs per token are the training package's (training/hardware.py,
training/shapes.py), which the fine-tune reads at run time; this layer imports them. It imports
neither Pulumi nor torch (tests/infra/test_imports.py runs it with both blocked): the settings
rules, the offline plan and docs/benchmarks/report.py use it without a cloud SDK or a GPU stack.
"""
