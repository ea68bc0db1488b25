// `dew launch --slurm`: the launch handed to srun inside an allocation, with
// Dew's SPANK plugin (srun --dew-pool) when srun loads it, and without it
// the secret, coordinator and watchdog the plugin would have given.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>

#include "dew/coordinator_port.h"
#include "dew/exit_status.h"
#include "dew/failure_timings.h"
#include "dew/hex.h"
#include "dew/hostlist.h"
#include "dew/log.h"
#include "dew/process.h"
#include "dew/supervisor.h"
#include "launch_edge.h"

namespace dew::cli {
namespace {

using namespace std::chrono_literals;
// srun gets longer than local processes: it relays the signal to every node
// and cancels the step.
constexpr auto kSrunGrace = timings::kSrunStopGrace;

// What srun's environment gets besides --env (launch::slurm_environment):
// a fresh secret (a placeholder in a dry run), the allocation's first node
// and a drawn port for a coordinator given in part.
Result<std::vector<launch::EnvVar>> slurm_env_additions(const launch::LaunchOptions& options, bool plugin, bool dry_run,
                                                        const std::string& notice_tag) {
  std::string secret(launch::kSecretPlaceholder);
  if (!dry_run && !plugin) {
    auto drawn = random_hex(32);
    if (!drawn.ok()) return drawn.error();
    secret = drawn.value();
  }
  std::optional<std::string> first_node;
  if (const char* nodes = std::getenv("SLURM_JOB_NODELIST")) {
    if (auto hosts = expand_hostlist(nodes); hosts.ok() && !hosts.value().empty()) first_node = hosts.value().front();
  }
  auto random = random_u32();
  if (!random.ok()) return random.error();
  std::optional<std::string> xla_flags;
  if (const char* flags = std::getenv("XLA_FLAGS")) xla_flags = flags;
  return launch::slurm_environment(options, plugin, secret, notice_tag, first_node,
                                   port_from_random(random.value(), launch::kPortRange), xla_flags);
}

}  // namespace

int run_slurm(const launch::LaunchOptions& options, const std::vector<launch::EnvVar>& env, bool dry_run) {
  SpawnOptions help_options;
  help_options.argv = {"srun", "--help"};
  auto help = capture(help_options, 30s);
  if (!help.ok() || !WIFEXITED(help.value().wait_status) || WEXITSTATUS(help.value().wait_status) != 0) {
    const std::string why =
        help.ok() ? "ended with " + describe_wait_status(help.value().wait_status) + ": " + last_line(help.value().err)
                  : help.error().message;
    log_error("--slurm: `srun --help` failed (" + why + "); is Slurm's srun on PATH?");
    return 1;
  }
  const bool plugin = launch::srun_has_dew_pool(help.value().out);
  auto argv = launch::srun_command(options, plugin);
  if (!argv.ok()) {
    log_error(argv.error().message);
    return 2;
  }
  auto drawn_tag = draw_notice_tag(dry_run);
  if (!drawn_tag.ok()) {
    log_error(drawn_tag.error().message);
    return 1;
  }
  const std::string notice_tag = drawn_tag.value();
  const auto added = slurm_env_additions(options, plugin, dry_run, notice_tag);
  if (!added.ok()) {
    log_error(added.error().message);
    return 1;
  }
  // The additions first; a user's XLA_FLAGS is in the merged one already.
  auto all_env = added.value();
  for (const auto& entry : env) {
    const bool merged =
        std::any_of(all_env.begin(), all_env.end(), [&](const auto& a) { return a.first == entry.first; });
    if (!merged) all_env.push_back(entry);
  }
  if (dry_run) {
    std::vector<std::string> words;
    if (!all_env.empty()) words.emplace_back("env");
    for (const auto& [name, value] : all_env) words.push_back(name + "=" + value);
    words.insert(words.end(), argv.value().begin(), argv.value().end());
    launch::write_all(1, "slurm: " + launch::display_words(words) + "\n");
    return 0;
  }
  launch::Supervisor supervisor(std::chrono::duration_cast<std::chrono::milliseconds>(kSrunGrace), notice_tag);
  SpawnOptions srun_options;
  srun_options.argv = argv.value();
  srun_options.env = env_changes(all_env);
  srun_options.die_with_parent = true;
  auto srun = spawn(srun_options);
  if (!srun.ok()) {
    log_error(srun.error().message);
    return exit_code_of(127 << 8);
  }
  launch::Running running;
  running.rank = -1;
  running.host = "srun";
  running.io = srun.value();
  supervisor.add(std::move(running));
  return supervisor.run();
}

}  // namespace dew::cli
