"""A PyTorch DDP training script written as torch users write them: env://
rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher),
the gloo backend, fp64, a seeded global batch split by rank. Nothing in it
knows Dew, except `--dew`, which adds the two lines Dew asks for on top.

    torch_ddp.py [--dew] [--steps N] [--out FILE] [--fail-rank R --fail-step S] [--keep-alive]

--out: rank 0 writes {"losses": [...], "world": W, "env": {...}} there.
--fail-rank/--fail-step: that rank's data loader raises at that step
(printing "RAISING <unix time>" first); --keep-alive also starts a
non-daemon thread that would keep the failing interpreter alive.
"""
import argparse
import json
import os
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--dew", action="store_true")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--out")
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-step", type=int, default=5)
parser.add_argument("--keep-alive", action="store_true")
args = parser.parse_args()

if args.dew:
    import dew
    dew.prepare_process()

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

GLOBAL_BATCH = 16

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()
ddp = DDP(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(args.steps, GLOBAL_BATCH, 8, generator=generator, dtype=torch.float64)
targets = torch.randn(args.steps, GLOBAL_BATCH, 1, generator=generator, dtype=torch.float64)
share = GLOBAL_BATCH // world

losses = []
for step in range(args.steps):
    if rank == args.fail_rank and step == args.fail_step:
        if args.keep_alive:
            threading.Thread(target=time.sleep, args=(600,)).start()
        print(f"RAISING {time.time():.3f}", flush=True)
        raise RuntimeError(f"data loader of rank {rank} failed at step {step}")
    x = inputs[step, rank * share:(rank + 1) * share]
    y = targets[step, rank * share:(rank + 1) * share]
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses.append(mean.item() / world)
    if rank == 0:
        print(f"step {step}: loss {losses[-1]:.9f}", flush=True)

if rank == 0 and args.out:
    names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"]
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "world": world, "env": {n: os.environ.get(n) for n in names}}, f)
dist.destroy_process_group()
