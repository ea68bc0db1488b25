"""A PyTorch DDP training script written as torch users write them: env://
rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher),
the gloo backend, fp64, a seeded global batch split by rank. Nothing in it
knows Dew, except `--dew`, which adds the two lines Dew asks for on top.

    torch_ddp.py [--dew] [--steps N] [--out FILE] [--fail-rank R --fail-step S [--fail-how HOW]] [--keep-alive]
                 [--watchdog SECONDS] [--stall-rank R --stall-step S] [--slow-rank R --slow-seconds T]
                 [--checkpoint DIR [--step-sleep S] [--linger S]]

--out: rank 0 writes {"losses": [...], "world": W, "env": {...}} there.
--fail-rank/--fail-step: that rank's data loader fails at that step
(printing "RAISING <unix time>" first): by raising (--fail-how raise, the
default), sys.exit(3) (exit), sys.exit(0) (exit0), os._exit(3) (os-exit) or SIGKILL
(kill);
--keep-alive also starts a
non-daemon thread that would keep the failing interpreter alive.
--watchdog: each whole step (data, forward, backward, optimizer) runs under
dew.StepWatchdog(SECONDS); --stall-rank/--stall-step: that rank's data
loader stalls there (10 minutes, printing "STALLING"); --slow-rank: that
rank's data loader takes T seconds more every step; --stall-outside-step:
the stall comes before the watched step, not inside it.
--checkpoint (with --dew): resumable, as a script meant for time limits and preemption is
written: it loads DIR/state.pt when there is one, calls pool.stop_requested() after every
step, and when it is True rank 0 saves the state (whole file or none) and every rank returns;
each rank prints "PID <pid>" first; --step-sleep slows each step; --linger: after the
last step rank 0 prints "LINGERING" and every rank waits S seconds before it ends.
"""
import argparse
import json
import os
import signal
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
parser.add_argument("--fail-how", choices=["raise", "exit", "exit0", "os-exit", "kill"], default="raise")
parser.add_argument("--watchdog", type=float)
parser.add_argument("--stall-rank", type=int, default=-1)
parser.add_argument("--stall-step", type=int, default=3)
parser.add_argument("--stall-outside-step", action="store_true")
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-seconds", type=float, default=0.0)
parser.add_argument("--checkpoint")
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--linger", type=float, default=0.0)
args = parser.parse_args()

if args.dew or args.watchdog:
    import dew
pool = dew.prepare_process() if args.dew else None

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

watchdog = dew.StepWatchdog(args.watchdog) if args.watchdog else None


def stall_here(step):
    if rank == args.stall_rank and step == args.stall_step:
        print(f"STALLING {time.time():.3f}", flush=True)
        time.sleep(600)


def one_step(step):
    if rank == args.fail_rank and step == args.fail_step:
        if args.keep_alive:
            threading.Thread(target=time.sleep, args=(600,)).start()
        print(f"RAISING {time.time():.3f}", flush=True)
        if args.fail_how == "exit":
            sys.exit(3)
        if args.fail_how == "exit0":
            sys.exit(0)
        if args.fail_how == "os-exit":
            os._exit(3)
        if args.fail_how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"data loader of rank {rank} failed at step {step}")
    if not args.stall_outside_step:
        stall_here(step)
    if rank == args.slow_rank:
        time.sleep(args.slow_seconds)
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


losses = []
first = 0
state_file = os.path.join(args.checkpoint, "state.pt") if args.checkpoint else None
if state_file and os.path.exists(state_file):
    state = torch.load(state_file)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    first, losses = state["next_step"], state["losses"]
    print(f"RESUMED at step {first}", flush=True)
if args.checkpoint:
    print(f"PID {os.getpid()}", flush=True)


def save(next_step):
    if rank != 0:
        return
    partial = state_file + ".partial"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "next_step": next_step,
                "losses": losses}, partial)
    os.replace(partial, state_file)  # whole or not at all
    print(f"SAVED before step {next_step}", flush=True)


for step in range(first, args.steps):
    time.sleep(args.step_sleep)
    if args.stall_outside_step:
        stall_here(step)
    if watchdog:
        with watchdog.step():
            one_step(step)
    else:
        one_step(step)
    if args.checkpoint and pool.stop_requested():
        save(step + 1)
        break

if rank == 0 and args.out:
    names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"]
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "world": world, "env": {n: os.environ.get(n) for n in names}}, f)
if args.linger:
    if rank == 0:
        print("LINGERING", flush=True)
    time.sleep(args.linger)
dist.destroy_process_group()
