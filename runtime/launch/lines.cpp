// The launcher's output: processes' bytes into whole lines with their rank,
// srun's labels turned into the same form, and which failure to name.
#include "dew/exit_status.h"
#include "dew/launch_plan.h"

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

}  // namespace dew::launch
