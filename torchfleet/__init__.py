"""torchfleet: provision CPU clusters and run PyTorch DDP jobs on them with Ansible."""

__version__ = "0.1.0"
