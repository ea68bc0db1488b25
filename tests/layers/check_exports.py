#!/usr/bin/env python3
"""libdew's face: every function and class its installed headers declare is
marked DEW_API (dew/export.h), so that libdew.so, built with hidden
visibility, exports it; a declaration without it compiles in the tree (the
tests link the static libraries) and fails only a user's link. Checks the
headers meson.build installs (the *_public_headers lists): each
namespace-scope function declaration (not inline, constexpr or a template's
inline definition) and each class or struct definition.

    check_exports.py SOURCE_ROOT
"""
import glob
import re
import sys

root = sys.argv[1]
SKIP = re.compile(r"^(inline|constexpr|template|using|return|enum|namespace|#|//|typedef|static_assert|extern|friend|"
                  r"\}|private|public|protected|DEW_API)")
CLASS = re.compile(r"^(class|struct) (?!DEW_API)(\[\[\w+\]\] )?[A-Za-z_]+[^;]*\{$")

headers = []
for build in glob.glob(f"{root}/*/meson.build"):
    text = open(build, encoding="utf-8").read()
    for listing in re.findall(r"_public_headers = files\(([^)]*)\)", text):
        folder = build.rsplit("/", 1)[0]
        headers += [f"{folder}/{name}" for name in re.findall(r"'([^']+\.h)'", listing)]

found = []
for path in headers:
    lines = open(path, encoding="utf-8").read().split("\n")
    for number, line in enumerate(lines):
        if not line or line[0].isspace():
            continue
        if CLASS.match(line) and not line.startswith(("class [[nodiscard]] Result", "struct Done")):
            found.append(f"{path[len(root) + 1:]}:{number + 1}: {line.strip()}")
            continue
        if SKIP.match(line) or "(" not in line:
            continue
        statement, end = line, number
        while not re.search(r"[;{]\s*(//.*)?$", lines[end]) and end + 1 < len(lines):
            end += 1
            statement += lines[end]
        code = statement.split("//")[0].rstrip()
        if code.endswith(";") and "=" not in code.split("(")[0] and not lines[number - 1].startswith("template"):
            found.append(f"{path[len(root) + 1:]}:{number + 1}: {line.strip()}")
for line in found:
    print(f"not marked DEW_API (libdew.so would not export it): {line}")
print(f"{len(headers)} public headers, {len(found)} declarations not marked DEW_API")
sys.exit(1 if found or not headers else 0)
