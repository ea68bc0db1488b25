// A failure said as data to the launcher that started the process, beside
// the line said for people: libdew's peers (a process ending because the
// pool named another as failed) and the plugin's verdict (a rank's own exit)
// each print one record line, and `dew launch` decides whom to blame and
// its exit code from those alone, never from the wording of a log line (a
// program that prints "ending: process 3 failed: ..." changes nothing).
//
//   <tag> dew-failure 2 <rank> <exit code> <node as hex> <seen at> <why as hex>
//
// where <tag> is DEW_NOTICE_TAG, random for each launch (dew launch sets it
// in every process's environment, and srun's for --slurm): a record is a
// line that holds the launch's own tag. Without it nothing is printed.
// <exit code> is the failed process's own (as a shell gives it: 128 + a
// signal) or "-" where the writer cannot know it (a peer); <node> is empty
// where unknown; <seen at> is the writer's wall clock, microseconds since
// the epoch, when it saw the failure.
// Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dew/task_contract.h"

namespace dew {

// The variable that carries the launch's tag.
inline constexpr const char* kNoticeTagVariable = contract::kNoticeTag.name;

struct FailureRecord {
  int rank = 0;                  // the process named as failed
  std::string why;               // what the pool or the plugin said of it, one line
  std::optional<int> exit_code;  // its own exit code (0 to 255), where the writer knows it
  std::string node;              // where it ran, where the writer knows it
  std::int64_t seen_at_us = 0;   // the writer's wall clock when it saw the failure
  friend bool operator==(const FailureRecord&, const FailureRecord&) = default;
};

// The wall clock now, as a record's seen_at_us.
std::int64_t failure_seen_now_us();

// The record line, without a line break.
std::string encode_failure_record(std::string_view tag, const FailureRecord& record);

// The record in `line` (anywhere in it: srun and the launcher put labels
// before a task's lines); nullopt for a line that holds no record of this
// tag, or a malformed one. An empty tag matches nothing.
std::optional<FailureRecord> decode_failure_record(std::string_view tag, std::string_view line);

}  // namespace dew
