"""Run under ``torchrun --nproc_per_node N``: the DRO objective and gradients of one fixed global
batch, split over N processes (gloo on CPU). Rank 0 writes loss and gradients to ``argv[1]``.

The model is a small GNO with K = 4 gated kernels, so processes route their samples to
different kernels (kernels a process does not select get no gradient there).
"""

import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs

from gno_ext.models import GNO
from gno_ext.schema import BoundarySpec
from gno_ext.training.objective import global_objective

GLOBAL = 8

accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
rank, world = accelerator.process_index, accelerator.num_processes
torch.manual_seed(0)
model = GNO(latent=16, patch=4, depth=2, heads=2, n_kernels=4)
g = torch.Generator().manual_seed(1)
u_in = torch.randn(GLOBAL, 1, 1, 16, 16, generator=g)
u_out = torch.randn(GLOBAL, 1, 1, 16, 16, generator=g)
theta = torch.logspace(-2, 0, GLOBAL)[:, None]
groups = torch.tensor([0, 0, 1, 2, 2, 2, 3, 1])  # groups of unequal sizes, spread over the processes
model = accelerator.prepare(model)
per = GLOBAL // world
sl = slice(rank * per, (rank + 1) * per)
pred = model(u_in[sl], theta=theta[sl], bc=BoundarySpec.periodic(2, per))
per_sample = (pred - u_out[sl]).pow(2).flatten(1).mean(1)
# the relative temperature (the training default): its mean group loss must be the global batch's
loss, backward_loss, _ = global_objective(per_sample, groups[sl], 4, dro=True, tau=2.0, temperature="relative")
accelerator.backward(backward_loss)
if rank == 0:
    grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in accelerator.unwrap_model(model).named_parameters()}
    torch.save({"loss": loss, "grads": grads}, sys.argv[1])
