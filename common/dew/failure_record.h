// A failure said as data to the launcher that started the process, beside
// the line said for people: libdew's peers (a process ending because the
// pool named another as failed) and the plugin's verdict (a rank's own exit)
// each print one record line, and `dew launch` decides whom to blame and
// its exit code from those alone, never from the wording of a log line (a
// program that prints "ending: process 3 failed: ..." changes nothing).
//
//   <tag> dew-failure 1 <rank> <why as hex>
//
// where <tag> is DEW_NOTICE_TAG, random for each launch (dew launch sets it
// in every process's environment, and srun's for --slurm): a record is a
// line that holds the launch's own tag. Without it nothing is printed.
// Pure.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dew {

// The variable that carries the launch's tag.
inline constexpr const char* kNoticeTagVariable = "DEW_NOTICE_TAG";

struct FailureRecord {
  int rank = 0;     // the process named as failed
  std::string why;  // what the pool or the plugin said of it, one line
  friend bool operator==(const FailureRecord&, const FailureRecord&) = default;
};

// The record line, without a line break.
std::string encode_failure_record(std::string_view tag, const FailureRecord& record);

// The record in `line` (anywhere in it: srun and the launcher put labels
// before a task's lines); nullopt for a line that holds no record of this
// tag, or a malformed one. An empty tag matches nothing.
std::optional<FailureRecord> decode_failure_record(std::string_view tag, std::string_view line);

}  // namespace dew
