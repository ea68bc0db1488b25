// `dew launch`'s facts about the hosts: a free port on the first host (held
// on this machine, asked over ssh of a remote one), a given --port checked
// free there, and each host's GPUs for --devices-per-process.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>

#include "dew/coordinator_port.h"
#include "dew/exit_status.h"
#include "dew/framework_env.h"
#include "dew/hex.h"
#include "dew/log.h"
#include "dew/process.h"
#include "dew/supervisor.h"
#include "launch_edge.h"

namespace dew::cli {
namespace {

using namespace std::chrono_literals;
// The query asked of a remote host over ssh.
constexpr auto kQueryTimeout = 30s;

// A port free on this machine: a random one of `range` that binds
// (without SO_REUSEADDR, so no socket in any state uses it) and that no
// other dew launch has claimed. The TCP socket is held (close-on-exec) until
// just before rank 0 starts; the claim for the whole launch, so launches on
// one machine never draw the same port while either runs, even while rank 0
// is still starting up.
std::optional<int> hold_local_port(PortRange range, int& held) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    auto random = random_u32();
    if (!random.ok()) return std::nullopt;
    const int port = port_from_random(random.value(), range);
    // The claim: an abstract Unix socket named after the port (Linux: no file
    // to leave behind, gone when the launcher exits).
    const int lock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un name{};
    name.sun_family = AF_UNIX;
    const std::string label = "dew-launch-port-" + std::to_string(port);
    std::memcpy(name.sun_path + 1, label.data(), label.size());  // sun_path[0] == 0: abstract
    const auto name_size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + label.size());
    if (lock < 0 || bind(lock, reinterpret_cast<sockaddr*>(&name), name_size) != 0) {
      if (lock >= 0) close(lock);
      continue;  // another launch has it
    }
    held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    if (held >= 0 && bind(held, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
      return port;  // the claim stays open until the launcher exits
    }
    if (held >= 0) close(held);
    if (lock >= 0) close(lock);
    held = -1;
  }
  return std::nullopt;
}

// This machine's GPUs: the launcher's CUDA_VISIBLE_DEVICES, and the GPUs the
// driver shows (one entry each in /proc/driver/nvidia/gpus).
launch::HostDevices local_devices() {
  launch::HostDevices devices;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) devices.visible_devices = visible;
  std::error_code error;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", error), end; !error && it != end;
       it.increment(error)) {
    ++devices.gpu_count;
  }
  return devices;
}

// The query of a remote host over ssh (host_query_script).
Result<launch::HostAnswer> ask_host(const launch::LaunchOptions& options, const std::string& host, bool port,
                                    bool devices) {
  SpawnOptions query;
  query.argv = launch::ssh_prefix(options, host);
  query.argv.push_back(launch::host_query_script(port, devices, options.port.value_or(0)));
  auto reply = capture(query, kQueryTimeout);
  if (!reply.ok()) return reply.error();
  const auto& r = reply.value();
  if (r.timed_out || !WIFEXITED(r.wait_status) || WEXITSTATUS(r.wait_status) != 0) {
    const std::string how = r.timed_out ? "no answer in 30 s" : "ended with " + describe_wait_status(r.wait_status);
    const std::string said = last_line(r.err);
    return unavailable("cannot ask " + host + " for " + (port ? "a free port" : "its GPUs") + " over ssh (" + how +
                       (said.empty() ? "" : ": " + said) + "); " + launch::ssh_hint(host));
  }
  return launch::parse_host_reply(r.out, host, port, devices);
}

// A given --port on this machine: bound here (no SO_REUSEADDR, so a socket
// in any state on it refuses) and held until rank 0 starts.
std::optional<Stop> hold_given_port(int port, int& held) {
  held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  if (held >= 0 && bind(held, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) return std::nullopt;
  const std::string why = std::strerror(errno);
  if (held >= 0) close(held);
  held = -1;
  return Stop{"--port " + std::to_string(port) + ": the port is in use on this machine (" + why +
                  "); allowed: a port no socket uses here (or leave --port out for a free one)",
              2};
}

}  // namespace

std::optional<Stop> gather_host_facts(const LaunchArgs& args, launch::LaunchFacts& facts, std::vector<int>& held) {
  const launch::LaunchOptions& o = args.options;
  const auto hosts = launch::effective_hosts(o);
  // Every host's GPUs, for its processes' share (none with off).
  const bool devices = !o.every_device;
  // A remote first host is asked for a free port, or whether --port is free.
  const bool ask_port = hosts.front() != launch::kLocalHost && (!o.port || !args.dry_run);
  const auto no_free_port = [](PortRange range, const std::string& hint) {
    return Stop{"cannot find a free port from " + std::to_string(range.low) + " to " + std::to_string(range.high) +
                " on this machine (200 tries)" + hint};
  };
  if (o.port) {
    facts.port = *o.port;
    if (!ask_port && !args.dry_run) {
      held.push_back(-1);
      if (auto stop = hold_given_port(*o.port, held.back())) return stop;
    }
  } else if (!ask_port) {
    held.push_back(-1);
    auto port = hold_local_port(launch::kPortRange, held.back());
    if (!port) return no_free_port(launch::kPortRange, "; give --port");
    facts.port = *port;
  }
  if (!ask_port) {
    // The framework's rendezvous (MASTER_PORT, JAX_COORDINATOR_ADDRESS): a
    // port of its own, held as Dew's is until rank 0 starts.
    held.push_back(-1);
    auto port = hold_local_port(kFrameworkPortRange, held.back());
    if (!port) return no_free_port(kFrameworkPortRange, " for the framework's coordinator");
    facts.framework_port = *port;
  }
  if (args.dry_run) {
    if (ask_port) facts.framework_port_text = "FRAMEWORK_PORT";
    if (ask_port && !o.port) facts.port_text = "PORT";
    if (ask_port || !launch::all_local(o)) {
      log_info(std::string("--dry-run: remote hosts are not asked; the port shows as PORT and their GPUs ") +
               (o.devices_per_process ? "as indices" : "not at all (their share is known only once asked)"));
    }
  }
  std::vector<std::pair<std::string, std::future<Result<launch::HostAnswer>>>> asked;
  for (const auto& host : hosts) {
    if (host == launch::kLocalHost) {
      if (devices) facts.devices[host] = local_devices();
      continue;
    }
    const bool port = ask_port && host == hosts.front();
    if (args.dry_run) {
      // Not asked: as many as --devices-per-process needs, else none.
      if (o.devices_per_process)
        facts.devices[host] = {std::nullopt, static_cast<unsigned>(o.processes_per_host * *o.devices_per_process)};
      continue;
    }
    if (port || devices) asked.emplace_back(host, std::async(std::launch::async, ask_host, o, host, port, devices));
  }
  for (auto& [host, answer] : asked) {
    auto got = answer.get();
    if (!got.ok()) return Stop{got.error().message};
    if (got.value().port) facts.port = *got.value().port;
    if (got.value().framework_port) facts.framework_port = *got.value().framework_port;
    if (got.value().devices) facts.devices[host] = *got.value().devices;
  }
  return std::nullopt;
}

Result<std::string> draw_notice_tag(bool dry_run) {
  if (dry_run) return std::string(launch::kNoticeTagPlaceholder);
  return random_hex(8);
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const auto newline = t.rfind('\n');
  std::string line = newline == std::string::npos ? t : t.substr(newline + 1);
  std::erase(line, '\r');
  return line;
}

}  // namespace dew::cli
