"""`import dew` in one process: MeshSpec and build_mesh against `dew mesh
--json`, choose_exchange against `dew attention-plan --json`, bad arguments,
a fuzz of MeshSpec strings, and pools under `dew launch` (the exchange, a
rank that raises, peers blocked in C code and in an agreement).

Run by meson test with PYTHONPATH=<build>/python and DEW_EXE set."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import unittest

import numpy as np

import dew

DEW = os.environ.get("DEW_EXE", "dew")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pool_script.py")
FIXTURES = os.environ.get("DEW_FIXTURES", "tests/fixtures")


def dew_json(*args):
    return json.loads(subprocess.check_output([DEW, *args]))


class Meshes(unittest.TestCase):
    def test_build_mesh_equals_dew_mesh_json(self):
        cases = [
            ({"fsdp": 2, "replicas": 2}, ["--processes", "4", "--devices-per-process", "2"],
             dict(processes=4, devices_per_process=2)),
            ("tensor=2,sequence=2", ["--topology", f"{FIXTURES}/topology/dgx1v.nccl-topo.xml"],
             dict(topology=f"{FIXTURES}/topology/dgx1v.nccl-topo.xml")),
            ({"fsdp": 4, "replicas": 2}, ["--topology", f"{FIXTURES}/topology/rtx3090-4gpu.nvidia-smi-topo.txt",
                                          "--topology", f"{FIXTURES}/topology/power8gpudistances.xml"],
             dict(topology=[f"{FIXTURES}/topology/rtx3090-4gpu.nvidia-smi-topo.txt",
                            f"{FIXTURES}/topology/power8gpudistances.xml"])),
        ]
        for spec, cli, kwargs in cases:
            with self.subTest(spec=spec):
                text = spec if isinstance(spec, str) else json.dumps(spec)
                want = dew_json("mesh", "--spec", text, "--json", *cli)
                ids, names = dew.build_mesh(spec, **kwargs)
                self.assertIsInstance(ids, np.ndarray)
                self.assertEqual(list(ids.shape), want["shape"])
                self.assertEqual(ids.reshape(-1).tolist(), want["devices"])
                self.assertEqual(list(names), want["axes"])
                self.assertEqual(dew.build_mesh(dew.MeshSpec(spec), **kwargs)[0].tolist(), ids.tolist())

    def test_mesh_spec(self):
        spec = dew.MeshSpec("fsdp=2,replicas=2")
        self.assertEqual(spec.sizes, {"fsdp": 2})
        self.assertEqual(spec.replicas, 2)
        self.assertEqual(str(spec), "fsdp=2,replicas=2")
        self.assertEqual(str(dew.MeshSpec({"tensor": 4})), "tensor=4")

    def test_bad_arguments_name_the_value(self):
        for bad, named in [("fsdp=two", "two"), ("petals=2", "petals"), ({"fsdp": -1}, "-1")]:
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError) as raised:
                    dew.MeshSpec(bad)
                self.assertIn(named, str(raised.exception))
        with self.assertRaises(TypeError):
            dew.MeshSpec(3)
        with self.assertRaises(ValueError) as raised:
            dew.build_mesh("fsdp=3", processes=4, devices_per_process=2)
        self.assertIn("3", str(raised.exception))
        with self.assertRaises(ValueError):
            dew.build_mesh("fsdp=2", processes=0, devices_per_process=2)
        with self.assertRaises(ValueError) as raised:
            dew.choose_exchange(heads=4, kv_heads=2, length=1024, sequence=2, mask="diagonal")
        self.assertIn("diagonal", str(raised.exception))

    def test_choose_exchange_equals_dew_attention_plan(self):
        for heads, kv, seq, mask in [(16, 8, 4, "causal"), (4, 4, 8, "none"), (32, 8, 2, "window=128")]:
            with self.subTest(heads=heads, kv=kv, seq=seq, mask=mask):
                text = subprocess.check_output([DEW, "attention-plan", "--heads", str(heads), "--kv-heads", str(kv),
                                                "--length", "4096", "--sequence", str(seq), "--mask", mask], text=True)
                lines = dict(re.match(r"(\w+)\s+(.*)", line).groups() for line in text.splitlines()
                             if re.match(r"(exchange|reason)\s", line))
                exchange, reason = dew.choose_exchange(heads=heads, kv_heads=kv, length=4096, sequence=seq,
                                                       mask=mask)
                self.assertEqual(exchange, lines["exchange"])
                self.assertEqual(reason, lines["reason"])

    def test_mesh_spec_fuzz(self):
        rng = random.Random(7)
        alphabet = "fsdptensorqucaeliy{}\":,= 0123456789-.x\x00\xff"
        for _ in range(3000):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
            try:
                spec = dew.MeshSpec(text)
            except ValueError as error:
                self.assertNotIn("\n", str(error))
                continue
            self.assertEqual(str(dew.MeshSpec(str(spec))), str(spec))


def launch(*args, timeout=60, env=None):
    start = time.monotonic()
    done = subprocess.run([DEW, "launch", "--processes-per-host", "4", "--", sys.executable, SCRIPT, *args],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    return done, time.monotonic() - start


class Pools(unittest.TestCase):
    def test_a_rank_that_exits_while_its_peers_wait_is_named_with_its_own_code(self):
        # sys.exit(3), and sys.exit(0) (leaving early), on process 0 (which
        # hosts the service) and on another, while the rest wait in agree():
        # this hung, or blamed the wrong rank, or peers died by SIGSEGV.
        for failing in (0, 2):
            for code in (3, 0):
                with self.subTest(rank=failing, code=code):
                    done, seconds = launch("exit", str(failing), str(code))
                    self.assertEqual(done.returncode, code or 1, done.stderr)
                    self.assertLess(seconds, 20, done.stderr)
                    if code:  # said by the exiting process itself, before its connections close
                        self.assertIn(f"[{failing}] error: sys.exit({code}): the program ended with exit code {code} "
                                      "while its pool ran", done.stderr)
                    else:
                        self.assertIn(f"process {failing} left the pool (its program ended) while the others wait "
                                      "for it at agreement 'never'", done.stderr)
                    self.assertRegex(done.stderr, rf"dew launch: rank {failing} on localhost (ended with exit code "
                                                  rf"{code}|failed: its peers ended because (process {failing} left|"
                                                  rf"sys\.exit\({code}\)))")
                    for crash in ("fatal signal", "exception not rethrown", "Traceback"):
                        self.assertNotIn(crash, done.stderr)

    def test_a_thread_ended_by_std_terminate_once_the_exit_is_under_way_is_not_a_failure(self):
        # torch's gloo worker, still freeing a tensor when the script ends,
        # takes the GIL after Python began finalizing and is ended through a
        # noexcept frame: std::terminate with no exception. That rank was
        # blamed for an "uncaught exception" and its peers ended 75 (CI, once
        # in ~80 torch runs under srun).
        # With sys.exit(3) the rank also says its own failure first, in
        # atexit: named with its code, the thread's end not blamed.
        for code in (0, 3):
            with self.subTest(code=code):
                done, _ = launch("exit-terminate", "2", str(code))
                self.assertEqual(done.returncode, code, done.stderr)
                self.assertIn("[2] warning: a thread ended in std::terminate (no exception) while the program was "
                              "already exiting: not a failure; the exit goes on", done.stderr)
                if code:
                    self.assertIn("[2] error: sys.exit(3): the program ended with exit code 3 while its pool ran",
                                  done.stderr)
                    self.assertIn("dew launch: rank 2 on localhost ended with exit code 3", done.stderr)
                else:
                    self.assertNotIn("ending: process", done.stderr)
                for wrong in ("uncaught exception", "fatal signal"):
                    self.assertNotIn(wrong, done.stderr)

    def test_a_pool_joins_agrees_gathers_and_lays_out_the_mesh(self):
        # The plugin would set JAX_LOCAL_DEVICE_IDS per task; here every process sees the same.
        done, _ = launch("exchange", env={"JAX_LOCAL_DEVICE_IDS": "0,1"})
        self.assertEqual(done.returncode, 0, done.stderr)
        results = {}
        for line in done.stdout.splitlines():
            match = re.match(r"\[(\d)\] RESULT (.*)", line)
            if match:
                results[int(match.group(1))] = json.loads(match.group(2))
        self.assertEqual(sorted(results), [0, 1, 2, 3], done.stdout)
        want = dew_json("mesh", "--spec", '{"fsdp": 2, "replicas": 2}', "--processes", "4",
                        "--devices-per-process", "2", "--json")
        for rank, r in results.items():
            self.assertEqual((r["rank"], r["size"], r["local_rank"], r["local_size"]), (rank, 4, rank, 4))
            self.assertEqual(r["gather"], [f"rank {k}" for k in range(4)])
            self.assertEqual(r["gets"], [f"hello from {k}" for k in range(4)])
            self.assertEqual(r["mesh"], want["devices"])
            self.assertIn("--xla_gpu_execution_terminate_timeout=30m", r["xla_flags"])
            # Joined: the secret is gone from os.environ and from a child's environment.
            self.assertFalse(r["secret_in_environ"])
            self.assertFalse(r["secret_in_child"])
            env = subprocess.run([DEW, "env", "--json"], capture_output=True, text=True,
                                 env=dict(os.environ, DEW_PROCESS_ID=str(rank), DEW_PROCESS_COUNT="4",
                                          DEW_COORDINATOR_ADDRESS="127.0.0.1:20001",
                                          DEW_FRAMEWORK_COORDINATOR=r["kwargs"]["coordinator_address"],
                                          DEW_POOL_SECRET="ab" * 32, JAX_LOCAL_DEVICE_IDS="0,1"))
            self.assertEqual(r["kwargs"]["local_device_ids"], [0, 1])
            self.assertEqual(r["kwargs"], json.loads(env.stdout)["jax_distributed_initialize"])

    def test_a_rank_stuck_in_a_read_past_the_launchers_bound_is_named_and_the_pool_ends(self):
        # dew launch --watchdog reaches dew.StepWatchdog() through DEW_WATCHDOG.
        start = time.monotonic()
        done = subprocess.run([DEW, "launch", "--processes-per-host", "3", "--watchdog", "2s", "--",
                               sys.executable, SCRIPT, "stall", "1"], capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 124, done.stderr)
        self.assertLess(time.monotonic() - start, 15, "the 2 s bound, not the default 30 minutes")
        self.assertEqual(done.stderr.count("[1] error: step 3 ran longer than its bound of 2s (StepWatchdog, DEW_WATCHDOG)"),
                         1, done.stderr)
        # Its own exit, or (that exit more than a second behind its peers'
        # 75s on a loaded machine) their word of it: rank 1, with its code.
        self.assertRegex(done.stderr, "dew launch: rank 1 on localhost (ended with exit code 124|failed: its peers "
                                      "ended because step 3 ran longer)")

    def test_a_patience_that_runs_out_names_the_late_rank_not_the_waiting_ones(self):
        done, seconds = launch("late", "2")
        self.assertNotIn(done.returncode, (0, 75), done.stderr)
        self.assertLess(seconds, 15)
        self.assertIn("process 2 never arrived", done.stderr)
        self.assertIn("dew launch: rank 2 on localhost failed: its peers ended because", done.stderr)
        for peer in (0, 1, 3):
            self.assertIn(f"[{peer}] ending: process 2 failed", done.stderr)

    def test_nothing_buffered_is_lost_when_the_pool_fails_fast(self):
        # The failing rank and every peer ended by its failure flush stdout, logging's handlers and open files,
        # run their finally: blocks (the peers' raise dew.PoolFailed in the agreement they wait in) and atexit.
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, DEW_TEST_DIR=d)
            env.pop("PYTHONUNBUFFERED", None)  # stdout block-buffered, as a pipe makes it
            start = time.monotonic()
            done = subprocess.run([DEW, "launch", "--processes-per-host", "4", "--", sys.executable, SCRIPT,
                                   "unflushed", "2"], capture_output=True, text=True, timeout=60, env=env)
            seconds = time.monotonic() - start
            self.assertEqual(done.returncode, 1, done.stderr)
            self.assertLess(seconds, 10)
            for rank in range(4):
                self.assertIn(f"[{rank}] printed by rank {rank}", done.stdout, done.stderr)
                for name, want in (("log", f"logged by rank {rank}"), ("file", f"written by rank {rank}"),
                                   ("finally", "finally ran"), ("atexit", "atexit ran")):
                    with open(os.path.join(d, f"{name}.{rank}")) as f:
                        self.assertIn(want, f.read(), f"{name}.{rank}: {done.stderr}")
            self.assertEqual(done.stderr.count("Traceback (most recent call last)"), 1, done.stderr)
            self.assertNotIn("PoolFailed", done.stderr)

    def test_a_peer_blocked_in_c_code_ends_within_the_exit_bound_and_a_second(self):
        # No launcher to SIGTERM them: the peers sleeping in time.sleep cannot unwind (no finally:), but their
        # open files are flushed and atexit runs, and they end with 75 by themselves, well within the bound.
        import socket
        import tempfile
        with tempfile.TemporaryDirectory() as d, socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            children = []
            for rank in range(3):
                env = dict(os.environ, DEW_PROCESS_ID=str(rank), DEW_PROCESS_COUNT="3", DEW_TEST_DIR=d,
                           DEW_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", DEW_POOL_SECRET="ef" * 32,
                           DEW_TEST_BLOCKED="sleep", DEW_EXIT_BOUND_SECONDS="1")
                env.pop("PYTHONUNBUFFERED", None)
                children.append(subprocess.Popen([sys.executable, SCRIPT, "unflushed", "1"], env=env,
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            outputs = [child.communicate(timeout=60) for child in children]
            ended = time.time()
            codes = [child.returncode for child in children]
            self.assertEqual(codes, [75, 1, 75], outputs)
            failed = os.path.getmtime(os.path.join(d, "finally.1"))  # the failing rank's own finally:
            self.assertLess(ended - failed, 1 + 1, outputs)
            for rank in (0, 2):
                self.assertFalse(os.path.exists(os.path.join(d, f"finally.{rank}")))
                for name, want in (("file", f"written by rank {rank}"), ("atexit", "atexit ran")):
                    with open(os.path.join(d, f"{name}.{rank}")) as f:
                        self.assertIn(want, f.read())
                self.assertIn(f"printed by rank {rank}", outputs[rank][0])

    def test_a_rank_that_raises_ends_the_pool_named_once_with_its_traceback(self):
        for mode in ("raise", "sleep", "agree"):
            with self.subTest(mode=mode):
                done, seconds = launch(mode, "2")
                self.assertEqual(done.returncode, 1, done.stderr)
                self.assertLess(seconds, 10)
                # Rank 2 prints the traceback once (its last line) and its error once; every peer names rank 2.
                self.assertEqual(done.stderr.count("[2] RuntimeError: the data loader of rank 2 cannot read shard 7"),
                                 1, done.stderr)
                self.assertEqual(done.stderr.count("[2] error: uncaught exception: RuntimeError: the data loader"), 1)
                self.assertEqual(done.stderr.count("Traceback (most recent call last)"), 1, done.stderr)
                # dew launch names rank 2: by its own exit, or, when that comes over 200 ms after its peers'
                # (a loaded machine under TSan, seen once in CI), by the cause its peers ended with.
                self.assertRegex(done.stderr, "dew launch: rank 2 on localhost (ended with exit code 1|failed: its "
                                 "peers ended because uncaught exception: RuntimeError: the data loader of rank 2)")
                self.assertIn("in load_batch", done.stderr)

    def test_peers_blocked_in_c_code_or_an_agreement_end_with_75_by_themselves(self):
        # No launcher to stop them: four processes started by hand, as a pool.
        import socket
        for mode in ("sleep", "agree"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            with self.subTest(mode=mode):
                children = []
                for rank in range(4):
                    env = dict(os.environ, DEW_PROCESS_ID=str(rank), DEW_PROCESS_COUNT="4",
                               DEW_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", DEW_POOL_SECRET="cd" * 32)
                    env.pop("XLA_FLAGS", None)
                    children.append(subprocess.Popen([sys.executable, SCRIPT, mode, "2"], env=env,
                                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                # Timed from the failing rank's own exit: starting four interpreters (slow under TSan) is not
                # what is measured, the peers' noticing is.
                children[2].wait(timeout=30)
                failed = time.monotonic()
                codes = [child.wait(timeout=30) for child in children]
                self.assertLess(time.monotonic() - failed, 2)
                errors = [child.stderr.read() for child in children]
                self.assertEqual(codes, [75, 75, 1, 75], errors)
                for peer in (0, 1, 3):
                    self.assertIn("ending: process 2 failed: uncaught exception: RuntimeError", errors[peer])


# In the ThreadSanitizer tree the module needs an interpreter that carries the TSan runtime
# (tests/python/tsan_python.cpp); a venv's python is Debian's python3, which cannot load it.
@unittest.skipIf(os.environ.get("DEW_SANITIZE") == "thread", "a venv's python3 cannot load a TSan-built module")
class Venv(unittest.TestCase):
    """The virtualenv of docs/guide/python.md: made from Debian's python3 with --system-site-packages, it imports dew (and
    numpy) from the system's site directory, and a pool of its interpreter runs under dew launch."""

    def test_the_module_imports_in_a_venv_with_system_site_packages_and_runs_a_pool(self):
        import tempfile
        module_dir = os.path.dirname(dew.__file__)
        with tempfile.TemporaryDirectory() as d:
            venv = os.path.join(d, "venv")
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True,
                           capture_output=True, timeout=120)
            python = os.path.join(venv, "bin", "python")
            # Where `meson install` puts the module is a system site directory the venv sees; the build tree
            # stands in for it here through a .pth file in the system-site chain (never a file of the machine).
            site = subprocess.check_output([python, "-c", "import site; print(site.getsitepackages()[0])"],
                                           text=True).strip()
            self.assertTrue(site.startswith(venv), site)
            with open(os.path.join(site, "dew-under-test.pth"), "w") as pth:
                pth.write(module_dir + "\n")
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)
            env["VIRTUAL_ENV"] = venv
            done = subprocess.run([python, "-c", "import sys, dew, numpy; print(sys.prefix, dew.__file__)"],
                                  capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn(venv, done.stdout)
            # And where `meson install` would put it is on that venv's path (for --prefix=/usr and /usr/local,
            # where Debian's python3 looks).
            if os.environ.get("DEW_PREFIX") in ("/usr", "/usr/local"):
                paths = subprocess.check_output([python, "-c", "import sys; print('\\n'.join(sys.path))"],
                                                text=True, env=env).split()
                self.assertIn(os.environ["DEW_PYTHON_INSTALL_DIR"], paths)
            done = subprocess.run([DEW, "launch", "--processes-per-host", "2", "--", python, SCRIPT, "exchange"],
                                  capture_output=True, text=True, env=env, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(done.stdout.count("RESULT "), 2, done.stdout)


class DesignPageApi(unittest.TestCase):
    """The design page's spelling of the API (issue 25)."""

    def test_mesh_spec_takes_axis_sizes_as_keywords(self):
        spec = dew.MeshSpec(fsdp=8, replicas=2)
        self.assertEqual(str(spec), str(dew.MeshSpec("fsdp=8,replicas=2")))
        self.assertEqual(spec.replicas, 2)
        self.assertEqual(spec.sizes, {"fsdp": 8})
        with self.assertRaisesRegex(TypeError, "not both"):
            dew.MeshSpec("fsdp=2", fsdp=2)
        with self.assertRaisesRegex(ValueError, "bogus"):
            dew.MeshSpec(bogus=2)

    def test_build_mesh_fills_the_listed_devices_in_their_order(self):
        # NVLink pairs 0-1 and 2-3: [0, 2, 1, 3] puts a two-way tensor axis across the pairs.
        ids, names = dew.build_mesh(dew.MeshSpec(fsdp=2, tensor=2), devices=[0, 2, 1, 3])
        tensor = names.index("tensor")
        groups = sorted(sorted(g) for g in np.moveaxis(ids, tensor, -1).reshape(-1, 2).tolist())
        self.assertEqual(groups, [[0, 2], [1, 3]])
        self.assertEqual(ids.reshape(-1).tolist(), [0, 2, 1, 3])
        with self.assertRaisesRegex(ValueError, "devices="):
            dew.build_mesh("fsdp=1", devices=[-1])

    def test_a_step_watchdog_bound_and_its_errors(self):
        self.assertEqual(dew.StepWatchdog(0.5).bound, 0.5)
        code = "import dew; w = dew.StepWatchdog(); print(w.bound)"
        for value, printed in ((None, "1800.0"), ("90s", "90.0"), ("off", "None")):
            env = dict(os.environ)
            env.pop("DEW_WATCHDOG", None)
            if value:
                env["DEW_WATCHDOG"] = value
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
            self.assertEqual(done.stdout.strip(), printed, done.stderr)
        with self.assertRaisesRegex(ValueError, "seconds=0.0 is not allowed"):
            dew.StepWatchdog(0)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, DEW_WATCHDOG="soon"))
        self.assertIn("DEW_WATCHDOG: 'soon' is not allowed", done.stderr)
        for bad in ("0", "1m", "-5"):
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                                  env=dict(os.environ, DEW_PACE_SECONDS=bad))
            self.assertIn(f"ValueError: DEW_PACE_SECONDS='{bad}' is not allowed; allowed: a whole number of seconds, "
                          "1 or more (default 60)", done.stderr)

    def test_a_step_that_overruns_ends_the_process_naming_it(self):
        code = ("import dew, time\nw = dew.StepWatchdog(0.3)\n"
                "with w.step(): time.sleep(0.05)\nwith w.step(): time.sleep(30)\n")
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, DEW_PROCESS_ID="3", DEW_PROCESS_COUNT="4"))
        self.assertEqual(done.returncode, 124, done.stderr)
        self.assertLess(time.monotonic() - start, 10)
        self.assertIn("[3] error: step 2 ran longer than its bound of 300 ms (StepWatchdog, DEW_WATCHDOG)", done.stderr)

    def test_a_join_that_fails_exits_69_unless_the_script_catches_it(self):
        env = dict(os.environ, DEW_PROCESS_ID="1", DEW_PROCESS_COUNT="2", DEW_COORDINATOR_ADDRESS="127.0.0.1:1",
                   DEW_POOL_SECRET="abc")
        done = subprocess.run([sys.executable, "-c", "import dew; dew.prepare_process()"], capture_output=True,
                              text=True, env=env, timeout=30)
        self.assertEqual(done.returncode, 69, done.stderr)
        self.assertIn("error: cannot join the pool: DEW_POOL_SECRET has 3 characters", done.stderr)
        caught = ("import dew\ntry: dew.prepare_process()\nexcept dew.PoolError as e: print('caught', e.code)\n"
                  "raise RuntimeError('later')\n")
        done = subprocess.run([sys.executable, "-c", caught], capture_output=True, text=True, env=env, timeout=30)
        self.assertIn("caught invalid argument", done.stdout, done.stderr)
        self.assertEqual(done.returncode, 1, "another exception ends it as Python does: " + done.stderr)

    def test_slurms_warning_does_not_interrupt_the_main_threads_system_calls(self):
        # Slurm's warning (SIGUSR1) comes whenever its periodic look finds it
        # due: inside torch's init_process_group it made TCPStore fail with
        # "Interrupted system call" (CI under load). From prepare_process() on
        # it marks a stop without interrupting the main thread; the next
        # stop_requested() is True. A forked child does not inherit the block.
        code = ("import ctypes, dew, os, signal, threading, time\n"
                "pool = dew.prepare_process()\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "class timespec(ctypes.Structure):\n"
                "    _fields_ = [('s', ctypes.c_long), ('ns', ctypes.c_long)]\n"
                "threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()\n"
                "left = timespec(0, 0)\n"
                "slept = libc.nanosleep(ctypes.byref(timespec(1, 0)), ctypes.byref(left))\n"
                "print('nanosleep', slept, ctypes.get_errno() if slept else 0)\n"
                "print('stop', pool.stop_requested())\n"
                "child = os.fork()\n"
                "if child == 0:\n"
                "    signal.signal(signal.SIGUSR1, signal.SIG_DFL)\n"
                "    time.sleep(5)\n"
                "    os._exit(0)\n"
                "time.sleep(0.5)\n"
                "os.kill(child, signal.SIGUSR1)\n"
                "print('child', os.waitpid(child, 0)[1] & 0x7f)\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("nanosleep 0 0\n", done.stdout, done.stderr)
        self.assertIn("stop True\n", done.stdout, done.stderr)
        self.assertIn(f"child {int(signal.SIGUSR1)}\n", done.stdout, "the child, back at SIGUSR1's default, ended by it")
        self.assertIn("got signal 10 (SIGUSR1): every process stops", done.stderr)

    def test_sigterm_from_a_launcher_flushes_and_runs_finally(self):
        import tempfile
        code = ("import dew, os, signal, sys, time\npool = dew.prepare_process()\nprint('unflushed')\n"
                "try:\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\n"
                "finally:\n    open(sys.argv[1], 'w').write('finally ran')\n")
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "finally")
            env = dict(os.environ)
            env.pop("PYTHONUNBUFFERED", None)
            done = subprocess.run([sys.executable, "-c", code, marker], capture_output=True, text=True, env=env,
                                  timeout=30)
            # Unwound, then ended by the signal itself: a stop, not exit code 143.
            self.assertEqual(done.returncode, -signal.SIGTERM, done.stderr)
            self.assertIn("stopped by signal 15 (SIGTERM) from outside the pool: ending", done.stderr)
            self.assertEqual(done.stdout, "unflushed\n")
            with open(marker) as f:
                self.assertEqual(f.read(), "finally ran")

    def test_fail_never_ends_a_pool_with_0_or_75_and_local_device_ids(self):
        code = ("import dew\npool = dew.prepare_process()\nprint(pool.local_device_ids)\n"
                "for c in (0, 75, 256):\n"
                "    try: pool.fail('x', c)\n"
                "    except ValueError as e: print(e)\n")
        env = dict(os.environ)
        env.pop("JAX_LOCAL_DEVICE_IDS", None)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertEqual(lines[0], "None")
        self.assertEqual(len([l for l in lines if "is not allowed; allowed: 1 to 255 except 75" in l]), 3, done.stdout)
        env["JAX_LOCAL_DEVICE_IDS"] = "2,3"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(done.stdout.splitlines()[0], "[2, 3]", done.stderr)


class Blocking(unittest.TestCase):
    CODE = """
import sys, threading, time, dew
pool = dew.prepare_process()
ticks = [0]
def count():
    while True:
        ticks[0] += 1
        time.sleep(0.01)
threading.Thread(target=count, daemon=True).start()
try:
    pool.get("never", float(sys.argv[1]))
except dew.PoolError as error:
    print(f"code={error.code} ticks={ticks[0]}", flush=True)
print("waited", flush=True)
"""

    def test_blocking_calls_release_the_gil(self):
        done = subprocess.run([sys.executable, "-c", self.CODE, "1"], capture_output=True, text=True, timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        ticks = int(re.search(r"ticks=(\d+)", done.stdout).group(1))
        self.assertIn("code=timeout", done.stdout)
        self.assertGreater(ticks, 30, "another thread ran while get() waited")

    def test_ctrl_c_interrupts_a_blocking_call(self):
        start = time.monotonic()
        child = subprocess.Popen([sys.executable, "-c", self.CODE, "60"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        child.send_signal(2)
        out, err = child.communicate(timeout=30)
        self.assertLess(time.monotonic() - start, 10)
        self.assertNotEqual(child.returncode, 0)
        self.assertIn("KeyboardInterrupt", err)
        self.assertNotIn("waited", out)


class ReadmeExample(unittest.TestCase):
    def test_the_readme_example_runs_as_written(self):
        readme = open(os.path.join(os.path.dirname(SCRIPT), "..", "..", "README.md")).read()
        block = readme.split("<!-- python example")[1].split("```python\n")[1].split("```")[0]
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"dew-readme-example-{os.getpid()}.py")
        with open(path, "w") as f:
            f.write(block)
        try:
            done = subprocess.run([DEW, "launch", "--processes-per-host", "4", "--", sys.executable, path],
                                  capture_output=True, text=True, timeout=60)
        finally:
            os.remove(path)
        self.assertEqual(done.returncode, 0, done.stderr)
        for rank in range(4):
            self.assertIn(f"[{rank}] process {rank} of 4: mesh {{'data': 4, 'stage': 1, 'fsdp': 2, 'expert': 1, "
                          f"'tensor': 1, 'sequence': 1}}", done.stdout)


if __name__ == "__main__":
    unittest.main()
