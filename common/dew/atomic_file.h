// A file written whole or not at all: a temporary file beside it, fsync,
// rename, fsync of the directory. A reader never sees a half-written file,
// and a process killed while writing leaves the previous one. For `dew
// worker --out`, checkpoint manifests and cached datasets.
#pragma once

#include <string>
#include <string_view>

#include "dew/result.h"

namespace dew {

// Errors (kSystem) name the file and the step that failed.
Result<Done> write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace dew
