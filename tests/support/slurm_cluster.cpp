#include "slurm_cluster.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace dew::testing {
namespace {

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::runtime_error(std::string(name) + " is not set: run the integration tests through `meson test`");
  }
  return value;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

class ClusterEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { cluster().start(); }
  void TearDown() override { cluster().stop(); }
};

}  // namespace

SlurmCluster& cluster() {
  static SlurmCluster instance;
  return instance;
}

void add_slurm_cluster_environment() { ::testing::AddGlobalTestEnvironment(new ClusterEnvironment); }

std::string SlurmCluster::source_root() { return required_env("DEW_SOURCE_ROOT"); }

void SlurmCluster::start() {
  // Another Slurm (scripts/test --slurm 24.11): its root, and the plugin
  // built against its headers (meson's test environment names this tree's).
  if (const char* root = std::getenv("DEW_SLURM_ROOT"); root != nullptr && *root != '\0') {
    slurm_root_ = root;
    plugin_ = required_env("DEW_SLURM_ROOT_PLUGIN");
  } else {
    plugin_ = required_env("DEW_SPANK_PLUGIN");
  }
  // Short: the munge socket path must fit in a sockaddr_un.
  char pattern[] = "/tmp/dew-slurm-XXXXXX";
  if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  std::vector<std::string> argv{source_root() + "/scripts/slurm-testbed", "start", dir_, "--plugin", plugin_};
  if (!slurm_root_.empty()) argv.insert(argv.end(), {"--slurm-root", slurm_root_});
  // As root (CI), nodes as on a real cluster: each in its own network
  // namespace with an address, a host name and a resolver of its own; srun
  // stays on this machine, where the node names do not resolve.
  if (geteuid() == 0) argv.push_back("--netns");
  auto started = run(argv, client_env(), std::chrono::seconds(90));
  std::cerr << started.out << started.err;
  if (started.exit_code != 0) {
    GTEST_FAIL() << "scripts/slurm-testbed start failed (exit " << started.exit_code << ")";
  }
  // Another Slurm's commands (srun, sbatch, ...) are its wrappers in DIR/bin:
  // first on this program's PATH, which every command it starts looks up
  // and inherits (dew launch --slurm's srun, a job script's srun).
  if (!slurm_root_.empty()) {
    const char* path = std::getenv("PATH");
    setenv("PATH", (dir_ + "/bin:" + (path != nullptr ? path : "/usr/bin:/bin")).c_str(), 1);
  }
}

void SlurmCluster::stop() {
  if (dir_.empty()) return;
  auto stopped = run({source_root() + "/scripts/slurm-testbed", "stop", dir_}, client_env(), std::chrono::seconds(60));
  if (stopped.exit_code != 0) std::cerr << stopped.out << stopped.err;
  // Keep the logs of a failed run for the reader; remove a clean one.
  if (!::testing::UnitTest::GetInstance()->Failed() && stopped.exit_code == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  } else {
    std::cerr << "slurm test cluster logs kept in " << dir_ << "/log\n";
  }
}

std::map<std::string, std::string> SlurmCluster::client_env(std::map<std::string, std::string> extra) const {
  std::map<std::string, std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text(*entry);
    if (text.rfind("SLURM_", 0) == 0 || text.rfind("SPANK_", 0) == 0 || text.rfind("DEW_", 0) == 0) {
      env[text.substr(0, text.find('='))] = "";  // removed
    }
  }
  if (!dir_.empty()) env["SLURM_CONF"] = conf();
  for (auto& [name, value] : extra) env[name] = value;
  return env;
}

RunResult SlurmCluster::srun(const std::vector<std::string>& args, std::map<std::string, std::string> extra_env,
                             std::chrono::milliseconds timeout) const {
  std::vector<std::string> argv{"srun"};
  argv.insert(argv.end(), args.begin(), args.end());
  return command(argv, std::move(extra_env), timeout);
}

RunResult SlurmCluster::command(const std::vector<std::string>& argv, std::map<std::string, std::string> extra_env,
                                std::chrono::milliseconds timeout) const {
  return run(argv, client_env(std::move(extra_env)), timeout);
}

std::string SlurmCluster::node_address(const std::string& node) const {
  const auto shown = command({"scontrol", "show", "node", node});
  std::smatch found;
  if (!std::regex_search(shown.out, found, std::regex("NodeAddr=(\\S+)"))) {
    throw std::runtime_error("scontrol show node " + node + " gave no NodeAddr: " + shown.out + shown.err);
  }
  return found[1];
}

void SlurmCluster::set_plugstack_args(const std::string& args) const {
  write_file(dir_ + "/plugstack.conf", "required " + plugin_ + (args.empty() ? "" : " " + args) + "\n");
}

std::string SlurmCluster::conf_with_plugstack_args(const std::string& name, const std::string& args) const {
  const std::string folder = dir_ + "/" + name;
  std::filesystem::create_directories(folder);
  write_file(folder + "/plugstack.conf", "required " + plugin_ + " " + args + "\n");
  const std::regex plugstack_line("^PlugStackConfig=.*$", std::regex::multiline);
  write_file(folder + "/slurm.conf",
             std::regex_replace(read_file(conf()), plugstack_line, "PlugStackConfig=" + folder + "/plugstack.conf"));
  return folder + "/slurm.conf";
}

std::string SlurmCluster::conf_without_plugin() const {
  const std::string folder = dir_ + "/no-plugin";
  std::filesystem::create_directories(folder);
  write_file(folder + "/plugstack.conf", "");
  const std::regex plugstack_line("^PlugStackConfig=.*$", std::regex::multiline);
  write_file(folder + "/slurm.conf",
             std::regex_replace(read_file(conf()), plugstack_line, "PlugStackConfig=" + folder + "/plugstack.conf"));
  return folder + "/slurm.conf";
}

}  // namespace dew::testing
