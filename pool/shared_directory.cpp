// Pool calls built on all_gather: the shared-directory check and the
// compile-cache key.
#include <sodium.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "dew/hex.h"
#include "dew/log.h"
#include "dew/pool.h"
#include "dew/text.h"

namespace dew::runtime {
namespace {

std::vector<int> everyone(int size) {
  std::vector<int> ranks(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  return ranks;
}

// Processes grouped by what they report: report -> the ranks reporting it.
std::map<std::string, std::vector<int>> group_by(const Gathered& reports) {
  std::map<std::string, std::vector<int>> groups;
  for (std::size_t r = 0; r < reports.size(); ++r) groups[std::string(reports[r])].push_back(static_cast<int>(r));
  return groups;
}

std::set<std::string> lines_of(const std::string& text) {
  std::set<std::string> out;
  for (auto& line : split(text, '\n')) {
    if (!line.empty()) out.insert(std::move(line));
  }
  return out;
}

}  // namespace

Result<Done> Pool::check_shared_directory(const std::string& path) {
  namespace fs = std::filesystem;
  // Step 1: everybody writes a token (or says why it could not).
  auto random = random_hex(8);
  if (!random.ok()) return random.error();
  const std::string token = ".dew-shared-" + std::to_string(rank()) + "-" + random.value();
  const fs::path mine = fs::path(path) / token;
  std::string report = "ok:" + token;
  {
    std::ofstream out(mine);
    out << token;
    if (!out) report = "error:cannot write " + mine.string() + ": " + std::strerror(errno);
  }
  auto gathered = try_all_gather(report);
  std::error_code ignored;
  if (!gathered.ok()) {
    fs::remove(mine, ignored);
    return gathered.error();
  }
  const Gathered& tokens = gathered.value();
  std::vector<std::string> problems;
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    if (tokens[r].rfind("error:", 0) == 0)
      problems.push_back("process " + std::to_string(r) + ": " + std::string(tokens[r].substr(6)));
  }
  if (!problems.empty()) {
    fs::remove(mine, ignored);
    return invalid_argument("directory '" + path + "' is not usable by every process: " + dew::join(problems, "; "));
  }
  // Step 2: everybody says whose tokens it sees.
  std::vector<int> seen;
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    if (fs::exists(fs::path(path) / tokens[r].substr(3))) seen.push_back(static_cast<int>(r));
  }
  auto views = try_all_gather(dew::join(seen, ","));
  auto agreed = views.ok() ? try_agree("dew.shared-directory") : Result<Done>(views.error());
  fs::remove(mine, ignored);
  if (!agreed.ok()) return agreed;
  // "processes 0,1 see the tokens of processes 0,1; process 2 sees process 2's"
  const auto groups = group_by(views.value());
  if (groups.size() == 1 && groups.begin()->first == dew::join(everyone(size()), ",")) return Done{};
  std::vector<std::string> text;
  for (const auto& [view, who] : groups) {
    text.push_back(processes_text(who) + (who.size() == 1 ? " sees" : " see") + " the tokens of " +
                   (view.empty() ? "no process" : "processes " + view));
  }
  return invalid_argument("directory '" + path + "' is not one directory shared by all " + std::to_string(size()) +
                          " processes: " + dew::join(text, "; "));
}

void Pool::require_shared_directory(const std::string& path) { value_or_throw(check_shared_directory(path)); }

std::optional<std::string> Pool::compile_cache_key(const std::string& fingerprint) {
  return value_or_throw(try_compile_cache_key(fingerprint));
}

Result<std::optional<std::string>> Pool::try_compile_cache_key(const std::string& fingerprint) {
  auto gathered = try_all_gather(fingerprint);
  if (!gathered.ok()) return gathered.error();
  const Gathered& fingerprints = gathered.value();
  const auto groups = group_by(fingerprints);
  if (groups.size() == 1) {
    crypto_generichash_state hash;
    crypto_generichash_init(&hash, nullptr, 0, 32);
    for (const auto& fingerprint : fingerprints) {
      const std::string framed = std::to_string(fingerprint.size()) + ":" + std::string(fingerprint);
      crypto_generichash_update(&hash, reinterpret_cast<const unsigned char*>(framed.data()), framed.size());
    }
    unsigned char digest[32];
    crypto_generichash_final(&hash, digest, sizeof digest);
    return std::optional<std::string>(to_hex(digest));
  }
  // Name the lines that differ from process 0's fingerprint, per group.
  const auto reference = lines_of(std::string(fingerprints[0]));
  std::vector<std::string> text;
  for (const auto& [fingerprint, who] : groups) {
    if (who.front() == 0) continue;
    // Both sides: what they have that process 0 has not, and the other way.
    const auto theirs = lines_of(fingerprint);
    std::vector<std::string> differs, ours;
    for (const auto& line : theirs) {
      if (!reference.count(line)) differs.push_back(line);
    }
    for (const auto& line : reference) {
      if (!theirs.count(line)) ours.push_back(line);
    }
    text.push_back(processes_text(who) + " differ" + (who.size() == 1 ? "s" : "") +
                   " from process 0: " + (differs.empty() ? "no line of their own" : dew::join(differs, ", ")) +
                   " against process 0's " + (ours.empty() ? "no line of its own" : dew::join(ours, ", ")));
  }
  log_warn("compile cache off: the processes do not compile for the same accelerators: " + dew::join(text, "; "));
  return std::optional<std::string>();
}

}  // namespace dew::runtime
