// The real two-node Slurm cluster the integration tests run against:
// scripts/slurm-testbed started once per test program in a fresh directory,
// with the freshly built spank_dew.so in its plugstack.conf.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "process.h"

namespace dew::testing {

class SlurmCluster {
 public:
  // Started by the global environment; tests reach it through cluster().
  void start();
  void stop();

  const std::string& dir() const { return dir_; }
  std::string conf() const { return dir_ + "/slurm.conf"; }
  const std::string& plugin() const { return plugin_; }
  // The root of the Slurm the cluster runs (DEW_SLURM_ROOT: scripts/test
  // --slurm 24.11), or "" for this machine's.
  const std::string& slurm_root() const { return slurm_root_; }
  static std::string source_root();

  // Environment for every client command: this cluster's SLURM_CONF, and no
  // SLURM_* leaking in from a caller that itself runs under Slurm.
  std::map<std::string, std::string> client_env(std::map<std::string, std::string> extra = {}) const;

  // `srun ARGS...` against this cluster, killed after `timeout`.
  RunResult srun(const std::vector<std::string>& args, std::map<std::string, std::string> extra_env = {},
                 std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  RunResult command(const std::vector<std::string>& argv, std::map<std::string, std::string> extra_env = {},
                    std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;

  // The address other nodes reach `node` at: its NodeAddr (each node's own
  // when run as root, where the cluster is --netns; else 127.0.0.1).
  std::string node_address(const std::string& node) const;

  // Rewrites the plugstack.conf that slurmstepd reads for new steps.
  void set_plugstack_args(const std::string& args) const;

  // A copy of slurm.conf whose plugstack.conf passes `args` to the plugin:
  // what srun alone reads when a test sets SLURM_CONF to it.
  std::string conf_with_plugstack_args(const std::string& name, const std::string& args) const;
  // A copy of slurm.conf whose plugstack.conf loads nothing: srun without
  // the plugin (for a test that sets SLURM_CONF to it).
  std::string conf_without_plugin() const;
  // The cluster's own munged's socket (DEW_MUNGE_SOCKET for plain srun).
  std::string munge_socket() const { return dir_ + "/munge/munge.socket.2"; }

 private:
  std::string dir_;
  std::string plugin_;
  std::string slurm_root_;
};

SlurmCluster& cluster();

// Registers the cluster as a GoogleTest global environment (call from main).
void add_slurm_cluster_environment();

}  // namespace dew::testing
