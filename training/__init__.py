"""fsdp-eks training: FSDP2 fine-tuning of Llama-family causal LMs.

Entry point: ``torchrun ... -m training.finetune --help``. The package knows Kubernetes only
through torchrun's environment and never imports Pulumi.
"""
