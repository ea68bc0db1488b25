#!/usr/bin/env python3
"""The SPANK plugin is built hardened (spank/meson.build): read-only
relocations bound at load (RELRO and BIND_NOW), the stack protector, and
fortified libc calls where the compiler could check them.

    check_hardening.py PLUGIN.so
"""
import re
import subprocess
import sys


def main():
    plugin = sys.argv[1]
    dynamic = subprocess.run(["readelf", "-d", plugin], capture_output=True, text=True, check=True).stdout
    segments = subprocess.run(["readelf", "-lW", plugin], capture_output=True, text=True, check=True).stdout
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", plugin], capture_output=True, text=True,
                             check=True).stdout
    problems = []
    if "GNU_RELRO" not in segments:
        problems.append("no GNU_RELRO segment (-Wl,-z,relro)")
    if not re.search(r"\(FLAGS\).*\bBIND_NOW\b", dynamic) and not re.search(r"\(FLAGS_1\).*\bNOW\b", dynamic):
        problems.append("relocations are not bound at load (-Wl,-z,now)")
    if "__stack_chk_fail" not in symbols:
        problems.append("no stack protector (-fstack-protector-strong): __stack_chk_fail is not used")
    if not re.search(r"__\w+_chk\b", symbols.replace("__stack_chk_fail", "")):
        problems.append("no fortified libc call (-D_FORTIFY_SOURCE=2)")
    for line in problems:
        print(f"{plugin}: {line}")
    print(f"hardening: {4 - len(problems)} of 4 checks hold")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
