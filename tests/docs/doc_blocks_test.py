#!/usr/bin/env python3
"""Runs the documents' runnable blocks as a reader would, on the two-node test
cluster (scripts/slurm-testbed with this tree's spank_dew.so in its
plugstack), and checks the output they show.

    doc_blocks_test.py SOURCE_ROOT BUILD_ROOT [DOCUMENT.md...]

(default: README.md and every document under docs/ that has a marker)

A block is runnable when an HTML comment right before it says so:
  <!-- doc-test: file NAME -->   the block is written to NAME in the
                                 document's working folder (one per document)
  <!-- doc-test: run -->         each command runs there with bash and must
                                 exit 0 (a trailing backslash continues a line)
  <!-- doc-test: output -->      "$ COMMAND" lines, each followed by what that
                                 command prints on stdout: compared line by
                                 line, where a line "…" skips any number of
                                 lines and 127.0.0.1:PORT matches any port
  <!-- doc-test: admin-recipe --> the admin's build: its `meson setup` must
                                 use the options of the tree CI builds, tests
                                 and installs (scripts/build-options), plus
                                 only where to install and what to leave out

The reader's machine is stood in for as follows, and only so: `dew` is the
tree's (build/cli on PATH), `import dew` the tree's module (PYTHONPATH),
libdew comes through its uninstalled pkg-config file and LD_LIBRARY_PATH,
and `import jax` is a stand-in module (JAX is not packaged for Debian) whose
jax.distributed.initialize checks the arguments JAX's would need.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

MARKER = re.compile(r"<!-- doc-test: ([\w-]+)(?: (\S+))? -->\s*\n```[\w-]*\n(.*?)^```", re.S | re.M)
PORT = re.compile(r"127\.0\.0\.1:\d+")

JAX_STAND_IN = '''\
"""A stand-in for JAX in Dew's document tests: initialize() checks its
arguments as jax.distributed.initialize would need them, and connects
nowhere."""
def initialize(coordinator_address, num_processes, process_id, local_device_ids=None):
    host, _, port = coordinator_address.rpartition(":")
    assert host and 0 < int(port) < 65536, coordinator_address
    assert isinstance(num_processes, int) and 0 <= process_id < num_processes, (num_processes, process_id)
    assert local_device_ids is None or all(isinstance(d, int) for d in local_device_ids), local_device_ids
'''

failures = []


def fail(where, message):
    failures.append(f"{where}: {message}")
    print(f"FAIL {where}: {message}", flush=True)


def commands_of(block):
    """The block's commands: comments dropped, continued lines joined."""
    commands, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def matches(expected, actual):
    """Expected lines against actual ones: "…" skips lines, ports vary."""
    actual = [PORT.sub("127.0.0.1:PORT", line) for line in actual]
    expected = [PORT.sub("127.0.0.1:PORT", line) for line in expected]

    def walk(e, a):
        if e == len(expected):
            return a == len(actual)
        if expected[e].strip() == "…":
            return any(walk(e + 1, skip) for skip in range(a, len(actual) + 1))
        return a < len(actual) and expected[e] == actual[a] and walk(e + 1, a + 1)

    return walk(0, 0)


def site_options(root):
    text = open(os.path.join(root, "scripts", "build-options")).read()
    return shlex.split(re.search(r"^site_options=\((.*?)\)", text, re.M).group(1))


def check_admin_recipe(where, block, root):
    commands = commands_of(block)
    setup = next((shlex.split(c) for c in commands if c.startswith("meson setup ")), None)
    if setup is None:
        return fail(where, "no `meson setup` line")
    tree, options = setup[2], setup[3:]
    for option in site_options(root):
        if option not in options:
            fail(where, f"`meson setup` lacks {option}, an option of the tree CI builds (scripts/build-options)")
    allowed = set(site_options(root)) | {"-Dtests=false", "-Dbench=false"}
    for option in options:
        if option not in allowed and not option.startswith(("--prefix=", "-Dslurm_plugin_dir=")):
            fail(where, f"`meson setup` has {option}, which the tree CI builds does not (scripts/build-options)")
    for step in (f"meson compile -C {tree}", f"meson install -C {tree}"):
        if not any(c.startswith(step) for c in commands):
            fail(where, f"no `{step}` line")
    print(f"ok {where}: the admin's recipe is the configuration CI builds and installs", flush=True)


def run_command(where, command, folder, env):
    print(f"$ {command}", flush=True)
    try:
        done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=180)
    except subprocess.TimeoutExpired:
        fail(where, f"`{command}` did not end within 180 s")
        return None
    if done.returncode != 0:
        fail(where, f"`{command}` exited {done.returncode}; its stderr ends:\n{done.stderr[-1500:]}")
        return None
    return done.stdout


def check_document(path, root, env):
    text = open(path).read()
    name = os.path.relpath(path, root)
    outputs = {}
    with tempfile.TemporaryDirectory(prefix="dew-doc-") as folder:
        for match in MARKER.finditer(text):
            kind, argument, block = match.groups()
            where = f"{name}:{text.count(chr(10), 0, match.start()) + 1}"
            if kind == "file":
                with open(os.path.join(folder, argument), "w") as out:
                    out.write(block)
            elif kind == "run":
                for command in commands_of(block):
                    stdout = run_command(where, command, folder, env)
                    if stdout is not None:
                        outputs[command] = stdout
            elif kind == "output":
                shown = re.split(r"^\$ (.*)\n", block, flags=re.M)[1:]
                for command, expected in zip(shown[::2], shown[1::2]):
                    stdout = outputs.get(command)
                    if stdout is None:
                        stdout = run_command(where, command, folder, env)
                    if stdout is None:
                        continue
                    if matches(expected.splitlines(), stdout.splitlines()):
                        print(f"ok {where}: `{command}` prints what the document shows", flush=True)
                    else:
                        fail(where, f"`{command}` printed\n{stdout}\ninstead of\n{expected}")
            elif kind == "admin-recipe":
                check_admin_recipe(where, block, root)
            else:
                fail(where, f"unknown doc-test marker '{kind}'; known: file, run, output, admin-recipe")


def main():
    root, build, documents = sys.argv[1], sys.argv[2], sys.argv[3:]
    if not documents:
        documents = ["README.md"] + sorted(
            os.path.relpath(os.path.join(top, f), root)
            for top, _, files in os.walk(os.path.join(root, "docs")) for f in files
            if f.endswith(".md") and "<!-- doc-test:" in open(os.path.join(top, f)).read())
    with tempfile.TemporaryDirectory(prefix="dew-doc-cluster-") as cluster, \
            tempfile.TemporaryDirectory(prefix="dew-doc-jax-") as stand_ins:
        os.makedirs(os.path.join(stand_ins, "jax"))
        with open(os.path.join(stand_ins, "jax", "__init__.py"), "w") as out:
            out.write("from . import distributed\n")
        with open(os.path.join(stand_ins, "jax", "distributed.py"), "w") as out:
            out.write(JAX_STAND_IN)
        env = dict(os.environ)
        env.update({
            "PATH": os.path.join(build, "cli") + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": os.pathsep.join([os.path.join(build, "python"), stand_ins]),
            "PKG_CONFIG_PATH": os.path.join(build, "meson-uninstalled"),
            "LD_LIBRARY_PATH": build,
            "SLURM_CONF": os.path.join(cluster, "slurm.conf"),
            "OPENBLAS_NUM_THREADS": "1",
        })
        testbed = os.path.join(root, "scripts", "slurm-testbed")
        plugin = os.path.join(build, "spank", "spank_dew.so")
        started = subprocess.run([testbed, "start", cluster, "--plugin", plugin], capture_output=True, text=True)
        try:
            if started.returncode != 0:
                fail("the test cluster", f"did not start:\n{started.stdout}{started.stderr}")
            else:
                for document in documents:
                    check_document(os.path.join(root, document), root, env)
        finally:
            subprocess.run([testbed, "stop", cluster], capture_output=True)
    if failures:
        print(f"{len(failures)} documented blocks do not do what their documents say")
        return 1
    print("every runnable block does what its document says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
