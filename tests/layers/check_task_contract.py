#!/usr/bin/env python3
"""Every DEW_* variable is named in one place: common/dew/task_contract.h.
A product source (not tests/ or bench/) that spells a name as a string
literal of its own ("DEW_PROCESS_ID", outside a comment), or uses a DEW_*
name the contract does not declare, fails; so does a declared name that no
source uses any more.

    check_task_contract.py SOURCE_ROOT
"""
import re
import subprocess
import sys

root = sys.argv[1]
CONTRACT = "common/dew/task_contract.h"
with open(f"{root}/{CONTRACT}", encoding="utf-8") as text:
    declared = dict(re.findall(r'inline constexpr Variable (k\w+)\{\s*"(DEW_\w+)"', text.read()))
files = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.cpp", "*.h"],
                       capture_output=True, text=True, check=True).stdout.splitlines()
LITERAL = re.compile(r'"(DEW_[A-Z0-9_]+)"')
USE = re.compile(r"contract::(k\w+)\.name")
found, used = [], set()
for name in files:
    if name == CONTRACT or name.startswith(("tests/", "bench/")):
        continue
    with open(f"{root}/{name}", encoding="utf-8") as text:
        for number, line in enumerate(text, 1):
            code = line.split("//", 1)[0]
            found += [f"{name}:{number}: \"{m.group(1)}\" (use dew::contract's)" for m in LITERAL.finditer(code)]
            for m in USE.finditer(code):
                used.add(m.group(1))
                if m.group(1) not in declared:
                    found.append(f"{name}:{number}: contract::{m.group(1)} is not declared in {CONTRACT}")
unused = sorted(set(declared) - used)
found += [f"{CONTRACT}: {k} ({declared[k]}) is declared but no source uses it" for k in unused]
for line in found:
    print(line)
print(f"{len(declared)} variables in {CONTRACT}; {len(found)} problems")
sys.exit(1 if found else 0)
