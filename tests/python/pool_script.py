"""A training script's use of `import dew`, run by every process of a pool
(dew launch, srun --dew-pool, srun --mpi=pmix) in the tests.

    pool_script.py exchange        join, agree, all-gather, put/get; print the mesh and the kwargs
    pool_script.py contract        what every launcher hands a script (the task contract): identity,
                                   coordinator, the framework's variables, GPUs and the watchdog
    pool_script.py framework       what JAX's coordinator does: process 0 listens at the address
                                   jax_distributed_kwargs() gives, every other process connects to it
    pool_script.py raise RANK      RANK's data loader raises after the first agreement
    pool_script.py sleep RANK      RANK raises; the others sleep in time.sleep (C code)
    pool_script.py agree RANK      RANK raises; the others wait in an agreement
    pool_script.py unflushed RANK  every rank prints, logs (DEW_TEST_DIR/log.RANK) and writes a file
                                   (file.RANK) without flushing, and registers an atexit (atexit.RANK);
                                   RANK raises, the others wait in an agreement (or, with
                                   DEW_TEST_BLOCKED=sleep, in time.sleep); every finally: writes finally.RANK
    pool_script.py late RANK       RANK never comes to an agreement the others wait for with patience 1 s
    pool_script.py stall RANK      steps under dew.StepWatchdog() (the launcher's bound); RANK's third
                                   step blocks in a read that never returns
    pool_script.py stopped RANK    every rank prints READY; RANK sleeps (C code), the others wait for it in
                                   an agreement: for a stop from outside (scancel, preemption)
    pool_script.py exit-terminate RANK CODE
                                   every rank ends by itself, RANK by sys.exit(CODE); on RANK a thread
                                   calls std::terminate (no exception) once the exit is under way, as
                                   a library's worker ended by Python's finalization does (torch's gloo)
"""
import json
import os
import subprocess
import sys
import time

import dew


def main():
    mode = sys.argv[1]
    if mode == "exit-terminate" and os.environ.get("RANK") == sys.argv[2]:  # set by every launcher
        terminate_once_the_exit_is_under_way()
    pool = dew.prepare_process()
    again = dew.prepare_process()
    assert again is pool, "prepare_process() returns the same pool every time"
    pool.agree("start")
    if mode == "exchange":
        parts = pool.all_gather(f"rank {pool.rank}".encode())
        pool.put(f"hello/{pool.rank}", f"hello from {pool.rank}".encode())
        gets = [pool.get(f"hello/{r}", 30).decode() for r in range(pool.size)]
        ids, names = dew.build_mesh({"fsdp": 2, "replicas": 2}, processes=pool.size, devices_per_process=2)
        print("RESULT " + json.dumps({
            "rank": pool.rank, "size": pool.size, "local_rank": pool.local_rank, "local_size": pool.local_size,
            "gather": [p.decode() for p in parts], "gets": gets,
            "mesh": ids.reshape(-1).tolist(), "shape": list(ids.shape), "axes": list(names),
            "kwargs": pool.jax_distributed_kwargs(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "secret_in_environ": "DEW_POOL_SECRET" in os.environ,
            "secret_in_child": subprocess.run(["sh", "-c", "echo ${DEW_POOL_SECRET:-none}"], capture_output=True,
                                              text=True).stdout.strip() != "none",
        }), flush=True)
        pool.agree("end")
        return
    if mode == "contract":
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "CUDA_VISIBLE_DEVICES", "JAX_LOCAL_DEVICE_IDS", "XLA_FLAGS")
        print("CONTRACT " + json.dumps({
            "rank": pool.rank, "size": pool.size, "local_rank": pool.local_rank, "local_size": pool.local_size,
            "coordinator": pool.coordinator, "host": os.uname().nodename, "node_id": os.environ.get("DEW_NODE_ID"),
            "watchdog": dew.StepWatchdog().bound, "env": {name: os.environ.get(name) for name in names},
        }), flush=True)
        pool.agree("end")
        return
    if mode == "framework":
        framework_rendezvous(pool)
        return
    failing = int(sys.argv[2])
    if mode == "stopped":
        print(f"READY {pool.rank}", flush=True)
        if pool.rank == failing:
            time.sleep(600)
        pool.agree("never")
        return
    if mode == "exit":  # the failing rank ends by sys.exit(CODE) while the others wait for it
        if pool.rank == failing:
            time.sleep(0.3)
            sys.exit(int(sys.argv[3]))
        pool.agree("never")
        return
    if mode == "exit-terminate":
        pool.agree("end")
        if pool.rank == failing:
            sys.exit(int(sys.argv[3]))
        return
    if mode == "unflushed":
        import atexit
        import logging
        where = os.environ["DEW_TEST_DIR"]
        logging.basicConfig(filename=os.path.join(where, f"log.{pool.rank}"), level=logging.INFO)
        logging.info("logged by rank %d", pool.rank)
        print(f"printed by rank {pool.rank}")  # stdout is a pipe: block-buffered, not flushed
        unflushed = open(os.path.join(where, f"file.{pool.rank}"), "w")  # never flushed nor closed
        unflushed.write(f"written by rank {pool.rank}\n")
        atexit.register(lambda: open(os.path.join(where, f"atexit.{pool.rank}"), "w").write("atexit ran"))
        pool.agree("written")
        try:
            if pool.rank == failing:
                load_batch(pool.rank)
            blocked = os.environ.get("DEW_TEST_BLOCKED", "agree")
            if blocked == "agree":
                pool.agree("never")  # a peer waiting for the failed rank
            time.sleep(600)  # a peer blocked in C code
        finally:
            with open(os.path.join(where, f"finally.{pool.rank}"), "w") as marker:
                marker.write("finally ran")
    if mode == "late":
        if pool.rank == failing:
            time.sleep(600)
        pool.agree("late", patience=1)
        return
    if mode == "stall":
        watchdog = dew.StepWatchdog()
        never, _ = os.pipe()
        for step in range(1, 6):
            with watchdog.step():  # this rank's own work; the agreement waits for the others
                if pool.rank == failing and step == 3:
                    os.read(never, 1)
            pool.agree(f"step {step}")
        return
    if pool.rank == failing:
        time.sleep(0.3)
        load_batch(pool.rank)
    if mode == "sleep":
        time.sleep(600)
    elif mode == "agree":
        pool.agree("never")
    time.sleep(600)


def terminate_once_the_exit_is_under_way():
    """A daemon thread calls std::terminate with no exception once the exit
    is under way: registered before prepare_process(), the atexit function
    that lets it go runs after dew's."""
    import atexit
    import ctypes
    import threading
    terminate = ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev  # loaded already, with dew
    go = threading.Event()
    threading.Thread(target=lambda: (go.wait(), terminate()), daemon=True).start()
    atexit.register(lambda: (go.set(), time.sleep(0.5)))


def framework_rendezvous(pool):
    import socket
    address = pool.jax_distributed_kwargs()["coordinator_address"]
    host, port = address.rsplit(":", 1)
    assert address == pool.coordinator == os.environ["JAX_COORDINATOR_ADDRESS"], (address, pool.coordinator)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == (host, port)
    assert os.environ["RANK"] == str(pool.rank) and os.environ["WORLD_SIZE"] == str(pool.size)
    heard = []
    if pool.rank == 0:
        server = socket.create_server(("", int(port)))  # JAX's coordinator binds every address
        pool.agree("listening")
        for _ in range(pool.size - 1):
            connection, _ = server.accept()
            heard.append(int(connection.recv(16).decode()))
            connection.close()
    else:
        pool.agree("listening")
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(str(pool.rank).encode())
    print("FRAMEWORK " + json.dumps({"rank": pool.rank, "address": address, "heard": sorted(heard),
                                     "dew": os.environ.get("DEW_COORDINATOR_ADDRESS")}), flush=True)
    pool.agree("done")


def load_batch(rank):
    raise RuntimeError(f"the data loader of rank {rank} cannot read shard 7")


if __name__ == "__main__":
    main()
