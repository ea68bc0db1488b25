// libFuzzer target for dew launch's pure core (launch/dew/launch_plan.h).
//
// Input: byte 0 picks the line splitter's limit (1-64) and the chunk size
// (1-16) it is fed in; the rest is split at NUL bytes into words. Checked:
// the splitter's lines never hold '\n', never exceed the limit, and with the
// rest they give back the input; display_quote is one line of printable
// bytes; an --env error or a free-port reply error is one line; a parsed
// --env keeps NAME=VALUE; a relabelled srun line ends in exactly one '\n';
// an ssh command holds the words whole and the remote script is one word.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dew/launch_plan.h"
#include "fuzz_check.h"

namespace {

using namespace dew::launch;

bool one_line(const std::string& text) {
  for (const char c : text) {
    if (c == '\n' || c == '\r') return false;
  }
  return !text.empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t limit = 1 + data[0] % 64;
  const std::size_t chunk = 1 + (data[0] / 64) * 5 % 16;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);

  // Lines: whole, bounded, and nothing lost.
  LineSplitter splitter(limit);
  std::string rebuilt;
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < input.size(); at += chunk) {
    for (auto& line : splitter.feed(input.substr(at, chunk))) lines.push_back(std::move(line));
  }
  const auto rest = splitter.finish();
  for (const auto& line : lines) {
    FUZZ_CHECK(line.find('\n') == std::string::npos);
    FUZZ_CHECK(line.size() <= limit);
  }
  if (rest) FUZZ_CHECK(rest->find('\n') == std::string::npos && !rest->empty());

  // Words at NUL bytes.
  std::vector<std::string> words;
  std::size_t start = 0;
  while (start <= input.size()) {
    const std::size_t end = std::min(input.find('\0', start), input.size());
    words.emplace_back(input.substr(start, end - start));
    start = end + 1;
  }

  for (const auto& word : words) {
    const std::string shown_word = display_quote(word);
    for (const char c : shown_word) FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
    FUZZ_CHECK(one_line(shown(word)));
    const std::string relabelled = relabel_srun_line(word.substr(0, word.find('\n')));
    FUZZ_CHECK(!relabelled.empty() && relabelled.back() == '\n');
    FUZZ_CHECK(relabelled.find('\n') == relabelled.size() - 1);
    auto answer = parse_host_reply(word, "host", (data[0] & 4) != 0, (data[0] & 8) != 0);
    if (!answer.ok()) FUZZ_CHECK(one_line(answer.error().message));
    if (answer.ok() && answer.value().port) FUZZ_CHECK(*answer.value().port >= 1 && *answer.value().port <= 65535);
  }

  auto env = parse_env_options(words, (data[0] & 1) != 0, (data[0] & 2) != 0);
  if (env.ok()) {
    FUZZ_CHECK(env.value().size() == words.size());
    for (std::size_t i = 0; i < words.size(); ++i) {
      FUZZ_CHECK(is_shell_name(env.value()[i].first));
      FUZZ_CHECK(env.value()[i].first + "=" + env.value()[i].second == words[i]);
    }
  } else {
    FUZZ_CHECK(one_line(env.error().message));
  }

  LaunchOptions options;
  options.hosts = {words.front().empty() ? std::string("h") : words.front(), "localhost"};
  options.command = words;
  auto valid = validate(options);
  if (!valid.ok()) {
    FUZZ_CHECK(one_line(valid.error().message));
    return 0;
  }
  LaunchFacts facts;
  facts.port = 1234;
  facts.secret = "5ec2e7" + std::string(58, '0');
  facts.launcher_cwd = "/";
  LaunchOptions checked = valid.value();
  if ((data[0] & 16) != 0) {
    // The binding rule over hostile device lists: a plan or one line.
    checked.devices_per_process = 1 + data[0] % 3;
    facts.devices[options.hosts[0]] = HostDevices{words.back(), data[0] % 5u};
    facts.devices["localhost"] = HostDevices{std::nullopt, data[0] % 7u};
  }
  auto planned = plan_launch(checked, env.ok() ? env.value() : std::vector<EnvVar>{}, facts);
  if (!planned.ok()) {
    FUZZ_CHECK(one_line(planned.error().message));
    return 0;
  }
  const LaunchPlan& plan = planned.value();
  FUZZ_CHECK(plan.processes.size() == 2);
  const auto& remote = plan.processes[0];
  if (!remote.local) {
    FUZZ_CHECK(remote.argv.size() == 6);  // ssh -o BatchMode=yes -- HOST SCRIPT
    FUZZ_CHECK(remote.argv[4] == options.hosts[0]);
    // The secret goes over ssh's stdin, never on the command line.
    if (input.find(facts.secret) == std::string_view::npos) {
      FUZZ_CHECK(remote.argv[5].find(facts.secret) == std::string::npos);
    }
  }
  FUZZ_CHECK(plan.processes[1].argv == words);
  FUZZ_CHECK(dry_run_line(plan.processes[0]).find('\n') == std::string::npos);
  FUZZ_CHECK(dry_run_line(plan.processes[1]).find('\n') == std::string::npos);
  return 0;
}
