#!/usr/bin/env python3
"""scripts/check-includes against a real unity tree: a two-file Meson project
whose second file uses a function only the first file's header declares
(the shape of the bug that broke the README's build without unity). The
unity tree builds; the check names the file and fails; with the include
added it passes.

    check_includes_test.py SOURCE_ROOT
"""
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
check = os.path.join(root, "scripts", "check-includes")

FILES = {
    "meson.build": "project('p', 'cpp', default_options : ['cpp_std=c++20', 'werror=true'])\n"
                   "executable('p', 'a.cpp', 'b.cpp', 'main.cpp')\n",
    "helper.h": "#pragma once\nint helper();\n",
    "a.cpp": '#include "helper.h"\nint helper() { return 1; }\nint from_a() { return helper(); }\n',
    "b.cpp": "int from_b() { return helper() + 1; }\n",
    "main.cpp": "int from_a();\nint from_b();\nint main() { return from_a() + from_b() == 3 ? 0 : 1; }\n",
}


def run(command, cwd):
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True)


def fail(message, result=None):
    print(f"FAIL: {message}")
    if result is not None:
        print(result.stdout + result.stderr)
    sys.exit(1)


with tempfile.TemporaryDirectory() as project:
    for name, text in FILES.items():
        with open(os.path.join(project, name), "w") as out:
            out.write(text)
    setup = run(["meson", "setup", "build", "-Dunity=on", "-Dunity_size=8"], project)
    if setup.returncode != 0:
        fail("meson setup of the fixture project", setup)
    built = run(["ninja", "-C", "build"], project)
    if built.returncode != 0:
        fail("the unity tree should build (a.cpp brings helper.h into b.cpp's block)", built)

    caught = run([sys.executable, check, "build"], project)
    if caught.returncode != 1:
        fail(f"check-includes should fail on b.cpp, exit {caught.returncode}", caught)
    if "b.cpp does not compile on its own" not in caught.stdout or "helper" not in caught.stdout:
        fail("check-includes should name b.cpp and the undeclared helper", caught)
    if "a.cpp does not compile" in caught.stdout:
        fail("check-includes blamed a.cpp, which includes what it uses", caught)

    with open(os.path.join(project, "b.cpp"), "w") as out:
        out.write('#include "helper.h"\n' + FILES["b.cpp"])
    fixed = run([sys.executable, check, "build"], project)
    if fixed.returncode != 0 or "3 of 3 sources" not in fixed.stdout:
        fail("with the include added, check-includes should pass on all 3 sources", fixed)
print("check-includes catches a source that compiles only inside its unity block")
