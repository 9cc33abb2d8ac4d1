"""Run under ``torchrun``: the recipe (``recipes/train.py`` with this script's arguments), with
``torch.distributed.destroy_process_group`` wrapped so that each process prints how many
``DistributedDataParallel`` models are still alive when its process group is destroyed.

A DDP model alive then can hold the group's last reference, and its destructor can hang the
process at exit (see `gno_ext.training.train`)."""

import gc
import runpy
import sys
from pathlib import Path

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

destroy = dist.destroy_process_group


def reporting_destroy(*args, **kwargs):
    alive = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    print(f"rank {dist.get_rank()}: DDP models alive at destroy_process_group: {alive} (backend {dist.get_backend()})",
          flush=True)
    return destroy(*args, **kwargs)


dist.destroy_process_group = reporting_destroy
train_py = Path(__file__).resolve().parents[2] / "recipes" / "train.py"
sys.argv = [str(train_py), *sys.argv[1:]]
runpy.run_path(str(train_py), run_name="__main__")
