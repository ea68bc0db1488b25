#!/usr/bin/env python3
"""One error channel: no product source decides anything from an error's
words. An Error carries its ErrorCode, a failure its kind (PeerFailure's
stopped), a store's error its code through Gloo; reading them back out of
the text (`error.message.find("MUNGE")`, `e.what()` compared, a message's
prefix) is what this check fails on, in every .cpp and .h outside tests/
and bench/ (comments aside). So is catching the pool's PoolError to turn it
into an Error: the pool's try_ calls return Results; only the process's
terminate handler (pool/failure.cpp) and Python's exception translator
(python/module.cpp) see a thrown PoolError.

    check_error_text.py SOURCE_ROOT
"""
import re
import subprocess
import sys

root = sys.argv[1]
# An error's text searched or compared, or any text searched for prose
# (two words: "Timed out", "permission denied").
TEXT_TEST = re.compile(r"(message|what\(\))\)?\s*\.\s*(r?find|starts_with|ends_with|compare)\s*\(|"
                       r"(message|what\(\))\s*[!=]=|"
                       r'\.(r?find|starts_with|ends_with)\("[^"]*[A-Za-z]{2,} [A-Za-z]')
CATCHES_POOL_ERROR = re.compile(r"catch\s*\(\s*const\s+(dew::)?(runtime::)?PoolError")
MAY_CATCH_POOL_ERROR = {"pool/failure.cpp", "python/module.cpp"}
files = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.cpp", "*.h"],
                       capture_output=True, text=True, check=True).stdout.splitlines()
found = []
for name in files:
    if name.startswith(("tests/", "bench/")):
        continue
    with open(f"{root}/{name}", encoding="utf-8") as text:
        for number, line in enumerate(text, 1):
            code = line.split("//", 1)[0]
            if TEXT_TEST.search(code):
                found.append(f"decides from an error's words: {name}:{number}: {line.strip()}")
            if CATCHES_POOL_ERROR.search(code) and name not in MAY_CATCH_POOL_ERROR:
                found.append(f"catches PoolError (use the pool's try_ calls): {name}:{number}: {line.strip()}")
for line in found:
    print(line)
print(f"{len(files)} sources, {len(found)} deciding from an error's words or catching PoolError")
sys.exit(1 if found else 0)
