"""PyTorch through Dew's door, with Debian's python3-torch (CPU, gloo): a DDP
script written as torch users write them, unchanged under `dew launch` and
with `dew.prepare_process()` under `dew launch` and `mpirun`; its losses
against one process; a rank that raises; the hybrid example
(examples/torch_hybrid.py); dew.torch_process_groups; and the framework's
coordinator, which JAX's and torch's rendezvous bind, never Dew's port.
Under Slurm: tests/integration/python_slurm_test.cpp.

Run by meson test with PYTHONPATH=<build>/python, DEW_EXE and
DEW_SOURCE_ROOT set."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import dew

DEW = os.environ.get("DEW_EXE", "dew")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("DEW_SOURCE_ROOT", os.path.dirname(os.path.dirname(HERE)))
DDP = os.path.join(HERE, "torch_ddp.py")
POOL_SCRIPT = os.path.join(HERE, "pool_script.py")
HYBRID = os.path.join(ROOT, "examples", "torch_hybrid.py")
PYTHON = "/usr/bin/python3"

try:
    import torch  # noqa: F401
    import torch.distributed as dist
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def run(argv, timeout=120, env=None):
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    return done, time.monotonic() - start


def launch(count, *argv, timeout=120):
    return run([DEW, "launch", "--processes-per-host", str(count), "--", PYTHON, *argv], timeout)


def mpirun(count, *argv, timeout=120):
    return run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(count), "-x", "PYTHONPATH", PYTHON,
                *argv], timeout)


def losses_of(path):
    with open(path) as f:
        return json.load(f)


@unittest.skipUnless(HAVE_TORCH, "python3-torch is not installed (scripts/install-deps installs it)")
class TorchDdp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dew-torch-")
        one = os.path.join(cls.dir, "one.json")
        done, _ = launch(1, DDP, "--out", one)  # one process: the reference
        assert done.returncode == 0, done.stderr
        cls.one = losses_of(one)["losses"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def check_against_one_process(self, path, world):
        got = losses_of(path)
        self.assertEqual(got["world"], world)
        self.assertEqual(len(got["losses"]), len(self.one))
        gap = max(abs(a - b) for a, b in zip(got["losses"], self.one))
        self.assertLess(gap, 1e-6, (got["losses"], self.one))
        return got

    def test_an_unmodified_ddp_script_runs_under_dew_launch_and_matches_one_process(self):
        out = os.path.join(self.dir, "unmodified.json")
        done, _ = launch(4, DDP, "--out", out)
        self.assertEqual(done.returncode, 0, done.stderr)
        got = self.check_against_one_process(out, 4)
        self.assertEqual(got["env"]["RANK"], "0")
        self.assertEqual(got["env"]["LOCAL_WORLD_SIZE"], "4")
        self.assertEqual(got["env"]["MASTER_ADDR"], "127.0.0.1")
        self.assertGreaterEqual(int(got["env"]["MASTER_PORT"]), 10000)
        self.assertLessEqual(int(got["env"]["MASTER_PORT"]), 19999)

    def test_with_prepare_process_under_dew_launch_and_mpirun_it_matches_one_process(self):
        for name, start in (("dew launch", launch), ("mpirun", mpirun)):
            with self.subTest(launcher=name):
                if name == "mpirun" and shutil.which("mpirun") is None:
                    self.skipTest("mpirun not installed (openmpi-bin, from scripts/install-deps)")
                out = os.path.join(self.dir, f"dew-{name.replace(' ', '-')}.json")
                done, _ = start(4, DDP, "--dew", "--out", out)
                self.assertEqual(done.returncode, 0, done.stderr)
                self.check_against_one_process(out, 4)

    def test_a_taken_framework_port_is_stepped_past_and_the_script_trains(self):
        if shutil.which("mpirun") is None:
            self.skipTest("mpirun not installed (openmpi-bin, from scripts/install-deps)")
        with socket.socket() as listener:  # another server on the port the launcher gave
            listener.bind(("0.0.0.0", 0))
            listener.listen()
            taken = listener.getsockname()[1]
            out = os.path.join(self.dir, "stepped.json")
            done, _ = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", "-x", "PYTHONPATH",
                           "-x", f"DEW_FRAMEWORK_COORDINATOR=127.0.0.1:{taken}", PYTHON, DDP, "--dew", "--out", out])
        self.assertEqual(done.returncode, 0, done.stderr)
        got = self.check_against_one_process(out, 4)
        self.assertNotEqual(got["env"]["MASTER_PORT"], str(taken))
        self.assertIn(f"the framework's coordinator port {taken} (DEW_FRAMEWORK_COORDINATOR) is in use on this host; "
                      f"the pool uses {got['env']['MASTER_PORT']} instead", done.stderr)

    def test_a_rank_raising_at_step_5_ends_every_process_within_a_second_named_once(self):
        for keep_alive in (False, True):
            with self.subTest(keep_alive=keep_alive):
                argv = [DDP, "--dew", "--fail-rank", "2", "--fail-step", "5"] + (["--keep-alive"] if keep_alive else [])
                done, seconds = launch(4, *argv)
                ended = time.time()
                self.assertEqual(done.returncode, 1, done.stderr)
                raised = float(re.search(r"\[2\] RAISING ([0-9.]+)", done.stdout).group(1))
                self.assertLess(ended - raised, 1.0, done.stderr)
                self.assertEqual(done.stderr.count("Traceback (most recent call last)"), 1, done.stderr)
                self.assertEqual(done.stderr.count("[2] RuntimeError: data loader of rank 2 failed at step 5"), 1)
                self.assertIn("dew launch: rank 2 on localhost ended with exit code 1", done.stderr)
                for peer in (0, 1, 3):
                    self.assertIn(f"[{peer}] ending: process 2 failed: uncaught exception: RuntimeError", done.stderr)

    def test_a_stalled_rank_under_a_whole_step_watchdog_is_named_not_a_peer_waiting_for_it(self):
        # Each whole DDP step under dew.StepWatchdog(3): rank 2's data loader
        # stalls, so every rank's step outlives the bound (the peers wait in
        # backward's all-reduce). Each named itself before: rank 0, 3, 1.
        # (20 of 20: bench/frameworks --case stall.)
        for attempt in range(2):
            with self.subTest(attempt=attempt):
                done, seconds = launch(4, DDP, "--dew", "--watchdog", "3", "--stall-rank", "2", "--stall-step", "3")
                self.assertEqual(done.returncode, 124, done.stderr)
                self.assertLess(seconds, 30, done.stderr)
                self.assertIn("dew launch: rank 2 on localhost", done.stderr)
                self.assertEqual(done.stderr.count(
                    "[2] error: step 4 ran longer than its bound of 3s (StepWatchdog, DEW_WATCHDOG): rank 2 was not "
                    "inside a collective while ranks 0, 1, 3 waited for it inside a collective at step 4"), 1,
                    done.stderr)
                for peer in (0, 1, 3):
                    self.assertIn(f"[{peer}] ending: process 2 failed: step 4 ran longer", done.stderr)
                    self.assertNotIn(f"[{peer}] error:", done.stderr)

    def test_a_rank_stalled_between_watched_steps_is_named_by_the_peers_waiting_for_it(self):
        # Rank 1 stalls outside its watchdog's steps: its own bound never
        # passes; the peers' do, inside DDP's all-reduce, and they name it.
        done, _ = launch(3, DDP, "--dew", "--watchdog", "3", "--stall-rank", "1", "--stall-step", "2",
                         "--stall-outside-step")
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn("dew launch: rank 1 on localhost failed: its peers ended because it is behind: rank 1 gave no "
                      "step report (outside a watched step, or not answering) while ranks 0, 2 waited for it inside a "
                      "collective", done.stderr)

    def test_a_slow_rank_is_named_while_the_run_goes_on(self):
        # Rank 1's data loader takes 0.3 s more every step, inside the
        # watched step: its peers wait for it in DDP's all-reduce. With
        # 3-second windows process 0 names it, and the run still ends well.
        done, _ = run([DEW, "launch", "--processes-per-host", "4", "--", PYTHON, DDP, "--dew", "--watchdog", "60",
                       "--slow-rank", "1", "--slow-seconds", "0.3", "--steps", "40"], env={"DEW_PACE_SECONDS": "3"})
        self.assertEqual(done.returncode, 0, done.stderr)
        said = re.findall(r"\[0\] rank (\d) is slow: its own work took ([0-9.]+) s a step over the last 3 s", done.stderr)
        self.assertTrue(said, done.stderr)
        self.assertEqual({rank for rank, _ in said}, {"1"}, done.stderr)
        self.assertTrue(all(0.2 < float(work) < 0.5 for _, work in said), said)

    def test_a_stop_signal_to_one_rank_stops_every_rank_at_one_step_and_the_resumed_run_matches(self):
        # Slurm's time-limit warning (SIGUSR1) or a preemption's SIGTERM, to
        # one rank here: pool.stop_requested() is True on every rank at the
        # same step, rank 0 saves, all return 0; a second start resumes.
        for signum in (signal.SIGUSR1, signal.SIGTERM):
            with self.subTest(signal=signum.name):
                where = tempfile.mkdtemp(dir=self.dir)
                out = os.path.join(where, "losses.json")
                argv = [DEW, "launch", "--processes-per-host", "4", "--", PYTHON, DDP, "--dew", "--checkpoint", where,
                        "--step-sleep", "0.3", "--out", out]
                # The stop leaves the mark a job script asks for (DEW_STOP_MARK);
                # the resumed run, which ends its training, leaves none.
                mark, no_mark = os.path.join(where, "stopped"), os.path.join(where, "finished")
                first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env=dict(os.environ, DEW_STOP_MARK=mark))
                pids = {}
                for line in first.stdout:
                    match = re.match(r"\[(\d)\] PID (\d+)", line)
                    if match:
                        pids[int(match.group(1))] = int(match.group(2))
                    if line.startswith("[0] step 1:"):
                        os.kill(pids[2], signum)
                        break
                rest, err = first.communicate(timeout=60)
                self.assertEqual(first.returncode, 0, err)
                saved = re.search(r"\[0\] SAVED before step (\d+)", rest)
                self.assertIsNotNone(saved, rest + err)
                self.assertLess(int(saved.group(1)), 8)
                self.assertIn(f"[2] got signal {int(signum)} (SIG{signum.name[3:]}): every process stops", err)
                for rank in range(4):
                    self.assertIn(f"[{rank}] stopping at this stop_requested(), with every process: process 2 was "
                                  "asked to stop", err)
                self.assertTrue(os.path.isfile(mark) and os.path.getsize(mark) == 0, err)
                again, _ = run(argv, env={"DEW_STOP_MARK": no_mark})
                self.assertEqual(again.returncode, 0, again.stderr)
                self.assertFalse(os.path.exists(no_mark))
                self.assertIn(f"[0] RESUMED at step {saved.group(1)}", again.stdout)
                self.check_against_one_process(out, 4)

    def test_slurms_warning_before_the_first_stop_requested_is_kept_for_it(self):
        # Slurm sends its time-limit warning when its periodic look finds it
        # due: with a short limit, before the script's first step. From
        # prepare_process() on it marks a stop (it used to end the rank by
        # SIGUSR1's default, and the job with it); the first stop_requested()
        # stops every rank.
        where = tempfile.mkdtemp(dir=self.dir)
        argv = [DEW, "launch", "--processes-per-host", "4", "--", PYTHON, DDP, "--dew", "--checkpoint", where,
                "--out", os.path.join(where, "losses.json")]
        first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in first.stdout:
            match = re.match(r"\[2\] PID (\d+)", line)
            if match:
                os.kill(int(match.group(1)), signal.SIGUSR1)
                break
        rest, err = first.communicate(timeout=60)
        self.assertEqual(first.returncode, 0, err)
        self.assertIn("[0] SAVED before step 1", rest, err)
        self.assertIn("[2] got signal 10 (SIGUSR1): every process stops", err)

    def test_a_rank_ending_by_sys_exit_or_a_signal_mid_ddp_is_named_with_its_own_code(self):
        # Its peers wait in DDP's all-reduce (gloo), not in a pool call.
        # sys.exit(3) named rank 0 before, by the traceback of the gloo error
        # its closed connection raised there.
        for how, code, said in (("exit", 3, "ended with exit code 3"), ("os-exit", 3, "ended with exit code 3"),
                                ("kill", 128 + 9, "ended with signal 9 (SIGKILL)")):
            with self.subTest(how=how):
                done, _ = launch(4, DDP, "--dew", "--fail-rank", "1", "--fail-step", "5", "--fail-how", how)
                self.assertEqual(done.returncode, code, done.stderr)
                # Its own exit, or (its exit a moment behind its peers' 75s
                # on a loaded machine) the peers' word of it: rank 1 either way.
                self.assertRegex(done.stderr, f"dew launch: rank 1 on localhost ({re.escape(said)}|failed: its peers "
                                              "ended because)")
                self.assertNotIn("Traceback", done.stderr)
                for crash in ("exception not rethrown", "fatal signal"):
                    self.assertNotIn(crash, done.stderr)

    def test_a_rank_that_leaves_by_sys_exit_0_mid_ddp_is_named_not_the_peer_whose_collective_broke(self):
        # Its peers wait in DDP's all-reduce (gloo); their error there named
        # one of them ("process 0 failed: ... Connection closed by peer").
        done, _ = launch(4, DDP, "--dew", "--fail-rank", "1", "--fail-step", "5", "--fail-how", "exit0")
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn("ending: process 1 failed: process 1 left the pool (its program ended) while the others were "
                      "still running", done.stderr)
        self.assertIn("dew launch: rank 1 on localhost failed: its peers ended because process 1 left the pool",
                      done.stderr)
        for wrong in ("ending: process 0 failed", "ending: process 2 failed", "ending: process 3 failed",
                      "exception not rethrown", "fatal signal"):
            self.assertNotIn(wrong, done.stderr)

    def test_the_hybrid_example_matches_one_process(self):
        one, pool = os.path.join(self.dir, "hybrid-one.json"), os.path.join(self.dir, "hybrid-pool.json")
        done, _ = run([PYTHON, HYBRID, "--out", one])
        self.assertEqual(done.returncode, 0, done.stderr)
        done, _ = launch(4, HYBRID, "--fsdp", "2", "--out", pool)
        self.assertEqual(done.returncode, 0, done.stderr)
        a, b = losses_of(one), losses_of(pool)
        self.assertEqual((b["world"], b["fsdp"]), (4, 2))
        self.assertEqual(b["axes_with_groups"], ["data", "fsdp"])
        self.assertLess(max(abs(x - y) for x, y in zip(a["losses"], b["losses"])), 1e-6)


@unittest.skipUnless(HAVE_TORCH, "python3-torch is not installed (scripts/install-deps installs it)")
class TorchProcessGroups(unittest.TestCase):
    def test_bad_calls_name_what_is_wrong(self):
        ids, names = dew.build_mesh(dew.MeshSpec(fsdp=2), processes=2)
        with self.assertRaises(ValueError) as raised:
            dew.torch_process_groups(ids, names)
        self.assertIn("torch.distributed is not initialized", str(raised.exception))
        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
            try:
                with self.assertRaises(ValueError) as raised:
                    dew.torch_process_groups(ids, names)  # a mesh of 2 ranks in a world of 1
                self.assertIn("ids holds device 1", str(raised.exception))
                with self.assertRaises(ValueError) as raised:
                    dew.torch_process_groups(ids, names[:2])
                self.assertIn("ids has 6 axes but names has 2", str(raised.exception))
                one, names = dew.build_mesh(dew.MeshSpec(fsdp=1), processes=1)
                self.assertEqual(dew.torch_process_groups(one, names), {n: None for n in names})
            finally:
                dist.destroy_process_group()


@unittest.skipUnless(HAVE_TORCH, "python3-torch is not installed (scripts/install-deps installs it)")
class ReadmeTorchExample(unittest.TestCase):
    def test_the_readme_torch_script_prints_what_the_readme_shows(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        marker = readme.index("<!-- torch example")
        script = re.search(r"```python\n(.*?)```", readme[marker:], re.S).group(1)
        shown = re.search(r"```text\n\$ (dew launch [^\n]*)\n(.*?)```", readme[marker:], re.S)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "train.py"), "w") as f:
                f.write(script)
            argv = shown.group(1).split()
            done = subprocess.run([DEW, *argv[1:]], cwd=d, capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        port = re.compile(r"127\.0\.0\.1:\d+")
        self.assertEqual(port.sub("HOST:PORT", done.stdout), port.sub("HOST:PORT", shown.group(2)))


# A worker's view under torchrun: torchrun's facts before prepare_process(),
# what it raised, and the facts after (nothing may be rewritten).
TORCHRUN_WORKER = """
import json, os, dew
before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
try:
    dew.prepare_process()
    raised, code = None, None
except dew.PoolError as e:
    raised, code = str(e), e.code
after = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
print("WORKER " + json.dumps({"before": before, "after": after, "raised": raised, "code": code}), flush=True)
"""


@unittest.skipUnless(HAVE_TORCH, "python3-torch is not installed (scripts/install-deps installs it)")
class Torchrun(unittest.TestCase):
    """prepare_process() in torchrun's workers (torch.distributed.run, what
    `torchrun` runs) refuses with one line saying what to run instead; it
    neither rewrites torchrun's RANK and WORLD_SIZE nor forms a pool of one
    per worker."""

    def torchrun(self, *argv):
        # Debian's torchrun (torch 1.13) crashes at start on Python 3.11
        # unless told where its workers' output goes.
        with tempfile.TemporaryDirectory() as logs:
            return run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "--redirects", "1", "--tee", "1", "--log_dir", logs, *argv], timeout=180)[0]

    def test_each_worker_is_refused_and_torchruns_variables_stay(self):
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "worker.py")
            with open(script, "w") as f:
                f.write(TORCHRUN_WORKER)
            done = self.torchrun(script)
        self.assertEqual(done.returncode, 0, done.stderr)
        workers = [json.loads(m) for m in re.findall(r"WORKER (\{.*\})", done.stdout)]
        self.assertEqual(sorted(w["before"]["RANK"] for w in workers), ["0", "1"], done.stdout)
        for worker in workers:
            self.assertEqual(worker["after"], worker["before"])
            self.assertEqual(worker["before"]["WORLD_SIZE"], "2")
            self.assertEqual(worker["code"], "unsupported")
            self.assertIn("this process is a worker of torchrun (TORCHELASTIC_RUN_ID=", worker["raised"])
            self.assertIn(f"RANK={worker['before']['RANK']}, WORLD_SIZE=2", worker["raised"])
            self.assertIn("srun --dew-pool", worker["raised"])
            self.assertNotIn("\n", worker["raised"])

    def test_an_unmodified_ddp_script_with_prepare_process_fails_at_once_and_trains_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "losses.json")
            done = self.torchrun(DDP, "--dew", "--out", out)
            self.assertNotEqual(done.returncode, 0, done.stderr)
            self.assertFalse(os.path.exists(out), "a worker trained alone and wrote rank 0's losses")
        self.assertIn("this process is a worker of torchrun", done.stderr)


class FrameworkCoordinator(unittest.TestCase):
    """What JAX's coordinator and torch's TCPStore do after prepare_process():
    process 0 binds the address jax_distributed_kwargs() gives, the peers
    connect to it; never Dew's own port."""

    def check(self, done):
        self.assertEqual(done.returncode, 0, done.stderr)
        # mpirun forwards the ranks' output in chunks: lines may run together.
        found = [json.loads(m) for m in re.findall(r"FRAMEWORK (\{[^{}]*\})", done.stdout)]
        self.assertEqual(len(found), 3, done.stdout)
        zero = next(f for f in found if f["rank"] == 0)
        self.assertEqual(zero["heard"], [1, 2])
        self.assertEqual({f["address"] for f in found}, {zero["address"]})
        if zero["dew"]:
            self.assertNotEqual(zero["address"], zero["dew"])
        return zero["address"]

    def test_process_0_binds_it_and_the_peers_connect_under_dew_launch_and_mpirun(self):
        self.check(launch(3, POOL_SCRIPT, "framework")[0])
        if shutil.which("mpirun"):
            self.check(mpirun(3, POOL_SCRIPT, "framework")[0])

    def test_two_pools_at_once_get_distinct_framework_ports(self):
        argv = [DEW, "launch", "--processes-per-host", "3", "--", PYTHON, POOL_SCRIPT, "framework"]
        first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        second = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        addresses = []
        for child in (first, second):
            out, err = child.communicate(timeout=120)
            addresses.append(self.check(subprocess.CompletedProcess(argv, child.returncode, out, err)))
        self.assertNotEqual(addresses[0], addresses[1])


if __name__ == "__main__":
    unittest.main()
