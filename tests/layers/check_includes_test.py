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

    # A tree without unity that compiled a.cpp and main.cpp alone (not
    # b.cpp): those are skipped, b.cpp is still checked and named.
    alone = run(["meson", "setup", "alone", "-Dunity=off"], project)
    objects = run(["ninja", "-C", "alone", "p.p/a.cpp.o", "p.p/main.cpp.o"], project)
    if alone.returncode != 0 or objects.returncode != 0:
        fail("the tree without unity should compile a.cpp and main.cpp", objects)
    rest = run([sys.executable, check, "build", "--compiled-alone-in", "alone"], project)
    if rest.returncode != 1 or "b.cpp does not compile on its own" not in rest.stdout:
        fail("check-includes --compiled-alone-in should still check and name b.cpp", rest)
    if "2 sources of unity blocks were compiled on their own in alone" not in rest.stdout \
            or "0 of 1 sources" not in rest.stdout:
        fail("check-includes --compiled-alone-in should skip a.cpp and main.cpp and check only b.cpp", rest)

    with open(os.path.join(project, "b.cpp"), "w") as out:
        out.write('#include "helper.h"\n' + FILES["b.cpp"])
    fixed = run([sys.executable, check, "build"], project)
    if fixed.returncode != 0 or "3 of 3 sources" not in fixed.stdout:
        fail("with the include added, check-includes should pass on all 3 sources", fixed)
print("check-includes catches a source that compiles only inside its unity block")
