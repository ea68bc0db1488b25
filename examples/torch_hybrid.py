"""Hybrid sharding with PyTorch through Dew: parameters sharded over the
mesh's fsdp axis, gradients all-reduced over its data axis (the replicas),
laid out by dew.build_mesh and turned into torch.distributed groups by
dew.torch_process_groups. fp64 throughout, so a pool's losses match one
process's.

    dew launch --processes-per-host 4 -- /usr/bin/python3 examples/torch_hybrid.py --fsdp 2 --out pool.json
    /usr/bin/python3 examples/torch_hybrid.py --out one.json          # one process: the reference

srun --dew-pool -N2 --ntasks-per-node=2 runs it the same way. torch 1.13's
gloo has no reduce_scatter: a gradient is all-reduced over the fsdp group and
each rank keeps its shard (the same numbers, more bytes).
"""
import argparse
import json

import dew
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--fsdp", type=int, default=1, help="processes each parameter is sharded over")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--out", help="rank 0 writes the losses and the groups here as JSON")
args = parser.parse_args()

pool = dew.prepare_process()  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; fast failure
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if world % args.fsdp:
    raise SystemExit(f"--fsdp {args.fsdp} does not divide the {world} processes")

ids, names = dew.build_mesh(dew.MeshSpec(fsdp=args.fsdp, replicas=world // args.fsdp), processes=world)
groups = dew.torch_process_groups(ids, names)
fsdp_group, data_group = groups["fsdp"], groups["data"]  # None: nothing to exchange over that axis

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).double()
full = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
shard_size = -(-full.numel() // args.fsdp)  # padded so every shard has the same size
padded = torch.cat([full, full.new_zeros(shard_size * args.fsdp - full.numel())])
index = dist.get_rank(fsdp_group) if fsdp_group is not None else 0
shard = padded[index * shard_size:(index + 1) * shard_size].clone()  # the only copy this rank keeps


def gathered_parameters():
    if fsdp_group is None:
        return shard.clone()
    parts = [torch.empty_like(shard) for _ in range(args.fsdp)]
    dist.all_gather(parts, shard, group=fsdp_group)
    return torch.cat(parts)


generator = torch.Generator().manual_seed(1)
BATCH = 32
inputs = torch.randn(args.steps, BATCH, 16, generator=generator, dtype=torch.float64)
targets = torch.randn(args.steps, BATCH, 1, generator=generator, dtype=torch.float64)
per_rank = BATCH // world
losses = []
for step in range(args.steps):
    torch.nn.utils.vector_to_parameters(gathered_parameters()[:full.numel()], model.parameters())
    model.zero_grad()
    x = inputs[step, rank * per_rank:(rank + 1) * per_rank]
    y = targets[step, rank * per_rank:(rank + 1) * per_rank]
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    grad = torch.nn.utils.parameters_to_vector(p.grad for p in model.parameters())
    grad = torch.cat([grad, grad.new_zeros(padded.numel() - grad.numel())])
    if fsdp_group is not None:
        dist.all_reduce(grad, group=fsdp_group)  # the fsdp group's sum; this rank keeps its shard
    grad = grad[index * shard_size:(index + 1) * shard_size]
    if data_group is not None:
        dist.all_reduce(grad, group=data_group)  # and the replicas' sum
    shard -= 0.1 * grad / world  # SGD on the mean gradient over the global batch
    total = loss.detach().clone()
    if world > 1:
        dist.all_reduce(total)
    losses.append(total.item() / world)
    if rank == 0:
        print(f"step {step}: loss {losses[-1]:.12f}", flush=True)

if rank == 0 and args.out:
    member = {name: group is not None for name, group in groups.items()}
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "world": world, "fsdp": args.fsdp, "mesh": ids.reshape(-1).tolist(),
                   "axes_with_groups": [n for n, has in member.items() if has]}, f)
dist.destroy_process_group()
