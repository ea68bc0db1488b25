// What libdew exports. Its libraries are compiled with hidden visibility
// (meson.build: gnu_symbol_visibility), so the shared library's symbol table
// holds only the public API, marked DEW_API in the installed headers: a
// program cannot come to depend on an internal name (the wire format, the
// MUNGE glue, Asio's and nlohmann's templates), and the library loads faster.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define DEW_API __attribute__((visibility("default")))
// An internal class nested in an exported one (an opaque State).
#define DEW_LOCAL __attribute__((visibility("hidden")))
#else
#define DEW_API
#define DEW_LOCAL
#endif
