// A file written whole or not at all: a temporary file beside it, fsync,
// rename, fsync of the directory. A reader never sees a half-written file,
// and a process killed while writing leaves the previous one. For `dew
// worker --out`, checkpoint manifests and cached datasets.
#pragma once

#include <string>
#include <string_view>

#include "dew/result.h"

namespace dew {

// Errors (kSystem) name the file and the step that failed. A `path` that
// exists and is not a regular file (a device, a FIFO, a directory, a socket,
// or a symlink, even to a regular file) is refused (kInvalidArgument) and
// left as it is: Dew replaces only what it would have written itself.
Result<Done> write_file_atomically(const std::string& path, std::string_view bytes);

// kInvalidArgument naming `path` and what it is, unless it does not exist or
// is a regular file (not followed through a symlink). `what` names the file
// in the error ("--out", "checkpoint state").
Result<Done> refuse_unless_regular(const std::string& path, std::string_view what);

}  // namespace dew
