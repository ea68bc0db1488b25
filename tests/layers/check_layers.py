#!/usr/bin/env python3
"""The layers hold: every source file includes only its own folder's headers
and those of folders in lower layers (README.md, "Layout"), and a program
that links only the pool (its library, not libdew) links no hwloc, pugixml
or Gloo itself, nor PMIx or MUNGE, which the pool loads when it meets them
(its NEEDED entries).

    check_layers.py SOURCE_ROOT [POOL_ONLY_PROGRAM]

Also: the plugin (spank/) declares no Slurm function itself. Each comes
from Slurm's own header, so a signature that changed between versions
(slurm_kill_job_step: 22.05, 23.11, 25.11) fails to compile instead of
being called wrongly inside slurmstepd.

Prints one line per include that runs up or sideways, naming the file, the
header and both layers (and per hand-written Slurm declaration); exits 1 if
there is any.
"""
import pathlib
import re
import subprocess
import sys

# The layer of each folder of the tree (tests sit above them all).
LAYERS = {
    "common": 1,
    "topology": 2, "pool": 2, "mesh": 2, "comm": 2, "launch": 2, "spank": 2,
    "axes": 3, "attention": 3,
    "train": 4,
    "cli": 5, "python": 5, "bench": 5, "examples": 5,
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](dew/[\w./]+)[>"]', re.MULTILINE)


def header_owners(root):
    owners = {}
    for folder in LAYERS:
        for header in (root / folder / "dew").glob("*.h"):
            owners[f"dew/{header.name}"] = folder
    return owners


def check_includes(root):
    owners = header_owners(root)
    problems = []
    for folder, layer in LAYERS.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cpp", ".h"):
                continue
            for header in INCLUDE.findall(path.read_text(errors="replace")):
                owner = owners.get(header)
                if owner is None:
                    problems.append(f"{path.relative_to(root)}: includes {header}, which no folder has")
                elif owner != folder and LAYERS[owner] >= layer:
                    problems.append(f"{path.relative_to(root)} (layer {layer}, {folder}/) includes {header} "
                                    f"of {owner}/ (layer {LAYERS[owner]}): includes only run down")
    return problems


# A declaration (not a call): a return type before slurm_/spank_NAME(.
SLURM_DECLARATION = re.compile(r"^\s*(?:extern\s+)?(?:int|void|char\s*\*|uint\d+_t)\s+((?:slurm|spank)_\w+)\s*\(",
                               re.MULTILINE)


def check_slurm_declarations(root):
    problems = []
    for path in sorted((root / "spank").glob("*.[ch]*")):
        for name in SLURM_DECLARATION.findall(path.read_text(errors="replace")):
            if name.startswith("slurm_spank_"):
                continue  # the plugin's own entry points, which Slurm calls
            problems.append(f"{path.relative_to(root)}: declares Slurm's {name} by hand; include its header "
                            f"(slurm/slurm.h, slurm/spank.h) instead")
    return problems


def check_pool_only(program):
    dynamic = subprocess.run(["readelf", "-d", program], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", dynamic)
    if not any(name.startswith("libsodium") for name in needed):
        return [f"{program}: no libsodium among its NEEDED libraries ({', '.join(needed)}): not a pool program"]
    return [f"{program} links only the pool but needs {name}" for name in needed
            if name.startswith(("libhwloc", "libpugixml", "libgloo", "libpmix", "libmunge"))]


def main():
    root = pathlib.Path(sys.argv[1])
    problems = check_includes(root) + check_slurm_declarations(root)
    if len(sys.argv) > 2:
        problems += check_pool_only(sys.argv[2])
    for line in problems:
        print(line)
    folders = sum(1 for f in LAYERS if (root / f).is_dir())
    print(f"layers: {folders} folders checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
