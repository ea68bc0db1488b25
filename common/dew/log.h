// The one logger of Dew's processes (spdlog underneath): every line goes to
// stderr with a single write(), behind the process's prefix ("[3] " for a
// process of a pool, "dew launch: " for the launcher), at or above the level
// DEW_LOG_LEVEL names. The plugin does not use it: inside slurmstepd every
// line goes through Slurm's own slurm_error/slurm_info.
#pragma once

#include <string>
#include <string_view>

#include "dew/result.h"
#include "dew/task_contract.h"

namespace dew {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// "trace", "debug", "info", "warn", "error", "off"; anything else is an
// Error (kInvalidArgument) naming the value and the allowed ones.
Result<LogLevel> parse_log_level(std::string_view text, std::string_view name = contract::kLogLevel.name);

// The level from DEW_LOG_LEVEL (default info), applied; an Error when the
// variable holds something else.
Result<LogLevel> configure_log_level_from_env();
void set_log_level(LogLevel level);
LogLevel log_level();

// What every following line starts with ("" for none).
void set_log_prefix(std::string_view prefix);

void log_trace(std::string_view line);
void log_debug(std::string_view line);
void log_info(std::string_view line);
void log_warn(std::string_view line);
void log_error(std::string_view line);

}  // namespace dew
