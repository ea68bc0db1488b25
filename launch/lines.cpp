// The launcher's output: processes' bytes into whole lines with their rank,
// srun's labels turned into the same form, and which failure to name.
#include <algorithm>
#include <csignal>
#include <cstring>

#include "dew/exit_status.h"
#include "dew/launch_plan.h"
#include "dew/text.h"

namespace dew::launch {

std::vector<std::string> LineSplitter::feed(std::string_view chunk) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < chunk.size()) {
    const std::size_t newline = chunk.find('\n', start);
    const std::size_t end = newline == std::string_view::npos ? chunk.size() : newline;
    std::size_t take = end - start;
    const std::size_t room = max_line_ - pending_.size();
    if (take >= room) {  // too long: cut here
      pending_.append(chunk.substr(start, room));
      lines.push_back(std::move(pending_));
      pending_.clear();
      start += room;
      continue;
    }
    pending_.append(chunk.substr(start, take));
    if (newline == std::string_view::npos) break;
    lines.push_back(std::move(pending_));
    pending_.clear();
    start = newline + 1;
  }
  return lines;
}

std::optional<std::string> LineSplitter::finish() {
  if (pending_.empty()) return std::nullopt;
  std::string rest = std::move(pending_);
  pending_.clear();
  return rest;
}

std::string rank_line(int rank, std::string_view line) {
  std::string out = "[" + std::to_string(rank) + "] ";
  out.reserve(out.size() + line.size() + 1);
  out.append(line);
  out += '\n';
  return out;
}

std::string relabel_srun_line(std::string_view line) {
  std::size_t i = 0;
  while (i < line.size() && line[i] == ' ') ++i;
  const std::size_t digits = i;
  while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
  if (i > digits && i - digits <= 9 && line.substr(i, 2) == ": ") {
    return rank_line(std::stoi(std::string(line.substr(digits, i - digits))), line.substr(i + 2));
  }
  if (i > digits && i - digits <= 9 && line.substr(i) == ":") {  // an empty labelled line
    return rank_line(std::stoi(std::string(line.substr(digits, i - digits))), "");
  }
  std::string out(line);
  out += '\n';
  return out;
}

std::size_t pick_failure(const std::vector<std::pair<int, int>>& failures) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < failures.size(); ++i) {
    const auto key = [&](std::size_t k) { return std::pair(is_peer_failure(failures[k].second), failures[k].first); };
    if (key(i) < key(best)) best = i;
  }
  return best;
}

namespace {

// "0,2-3" -> {0, 2, 3}; nullopt for anything else (or more than 100000 tasks).
std::optional<std::vector<int>> task_list(std::string_view text) {
  std::vector<int> tasks;
  for (const auto& part : split(text, ',')) {
    const auto dash = part.find('-');
    const auto first = parse_whole<int>(part.substr(0, dash));
    const auto last = dash == std::string::npos ? first : parse_whole<int>(part.substr(dash + 1));
    if (!first || !last || *last < *first || *last - *first > 100000 || tasks.size() > 100000) return std::nullopt;
    for (int task = *first; task <= *last; ++task) tasks.push_back(task);
  }
  return tasks;
}

// srun's words for a task's end: "Exited with exit code N", or the signal's
// strsignal() text ("Killed", "Terminated", "Segmentation fault (core dumped)").
std::optional<int> srun_end_code(std::string_view text) {
  constexpr std::string_view kExited = "Exited with exit code ";
  if (text.substr(0, kExited.size()) == kExited) return parse_whole<int>(text.substr(kExited.size()));
  if (text.size() > 14 && text.substr(text.size() - 14) == " (core dumped)") text.remove_suffix(14);
  for (int signal = 1; signal < NSIG; ++signal) {
    const char* name = strsignal(signal);
    if (name != nullptr && text == name) return 128 + signal;
  }
  return std::nullopt;
}

}  // namespace

std::optional<SrunTaskEnd> srun_task_end(std::string_view line) {
  constexpr std::string_view kStart = "srun: error: ";
  if (line.substr(0, kStart.size()) != kStart) return std::nullopt;
  line.remove_prefix(kStart.size());
  const std::size_t host_end = line.find(": task");
  if (host_end == std::string_view::npos) return std::nullopt;
  line.remove_prefix(host_end + 2);
  const std::size_t word_end = line.find(' ');
  if (word_end == std::string_view::npos ||
      (line.substr(0, word_end) != "task" && line.substr(0, word_end) != "tasks")) {
    return std::nullopt;
  }
  line.remove_prefix(word_end + 1);
  const std::size_t colon = line.find(": ");
  if (colon == std::string_view::npos) return std::nullopt;
  auto tasks = task_list(line.substr(0, colon));
  auto code = srun_end_code(line.substr(colon + 2));
  if (!tasks || !code) return std::nullopt;
  return SrunTaskEnd{std::move(*tasks), *code};
}

int slurm_exit_code(int srun_code, const std::vector<SrunTaskEnd>& ends, const std::optional<PeerBlame>& blame) {
  if (srun_code == 0) return 0;
  if (blame && blame->exit_code && *blame->exit_code != 0) {
    return *blame->exit_code == kPeerFailedExitCode ? 1 : *blame->exit_code;
  }
  if (blame) {
    for (const auto& end : ends) {
      const bool named = std::find(end.tasks.begin(), end.tasks.end(), blame->rank) != end.tasks.end();
      if (named && end.code != 0) return end.code == kPeerFailedExitCode ? 1 : end.code;
    }
  }
  // A task's own code before the signals that end a step (SIGTERM, SIGKILL).
  for (bool own : {true, false}) {
    for (const auto& end : ends) {
      const bool step_end = end.code == 128 + SIGTERM || end.code == 128 + SIGKILL;
      if (end.code != 0 && end.code != kPeerFailedExitCode && (!own || !step_end)) return end.code;
    }
  }
  return srun_code == kPeerFailedExitCode ? 1 : srun_code;
}

}  // namespace dew::launch
