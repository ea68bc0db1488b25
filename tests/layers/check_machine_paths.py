#!/usr/bin/env python3
"""No file of the tree names a folder of the machine it was written on (a
path under /work, /root or /home): the documents, scripts and tests must be
true on a reader's machine and on CI's fresh one.

    check_machine_paths.py SOURCE_ROOT
"""
import re
import subprocess
import sys

root = sys.argv[1]
PATH = re.compile(r"(^|[\s'\"(=:`])(/(?:work|root|home)/\S*)")
files = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, text=True, check=True).stdout.splitlines()
found = []
for name in files:
    try:
        with open(f"{root}/{name}", encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                for match in PATH.finditer(line):
                    found.append(f"{name}:{number}: {match.group(2)}")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        continue
for line in found:
    print(f"a machine's folder: {line}")
print(f"{len(files)} files, {len(found)} naming a machine's folder")
sys.exit(1 if found else 0)
