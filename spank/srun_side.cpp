#include "srun_side.h"

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/spank.h>
}

// Provided by srun at run time (libslurmfull), declared by Slurm's own
// header; weak, as slurm_kill_job_step is (step_end.cpp).
#pragma weak slurm_load_ctl_conf
#pragma weak slurm_free_ctl_conf

#include "dew/hex.h"
#include "dew/slurm_step.h"
#include "node_lookup.h"

namespace dew::spank {

int look_up_rank0_node() {
  const char* nodelist = std::getenv("SLURM_NODELIST");
  const char* distribution = std::getenv("SLURM_DISTRIBUTION");
  auto node = rank0_node(nodelist ? std::optional<std::string>(nodelist) : std::nullopt,
                         distribution ? std::optional<std::string>(distribution) : std::nullopt);
  if (!node.ok()) return 0;  // each task names the problem
  const NodeLookup lookup = look_up_node(node.value());
  if (lookup.name_resolves) return 0;
  if (!lookup.node_address) {
    slurm_info("dew: process 0's node %s does not resolve here and has no NodeAddr: %s", node.value().c_str(),
               lookup.why_none.c_str());
  } else {
    // Which address the pool meets at, said once per step where it is not
    // the node's name (--dew-coordinator gives another).
    slurm_info("dew: process 0's node %s does not resolve here: the pool's coordinator is its NodeAddr %s",
               node.value().c_str(), lookup.node_address->c_str());
  }
  const std::string carried = node.value() + "=" + lookup.node_address.value_or("");
  return setenv(kRank0AddressCarrier, carried.c_str(), 1) == 0 ? 0 : -1;
}

namespace {

// Slurm's SrunPortRange, when the site sets one: the only ports its firewall
// lets the nodes reach srun on. srun has read slurm.conf, but only
// slurmctld's copy is public (one RPC, once per pool step).
std::optional<PortRange> srun_port_range() {
  if (slurm_load_ctl_conf == nullptr || slurm_free_ctl_conf == nullptr) return std::nullopt;
  slurm_conf_t* conf = nullptr;
  if (slurm_load_ctl_conf(0, &conf) != 0 || conf == nullptr) {
    slurm_verbose("dew: slurm_load_ctl_conf failed: the failure notices' port is one the kernel picks");
    return std::nullopt;
  }
  std::optional<PortRange> range;
  if (conf->srun_port_range != nullptr && conf->srun_port_range[0] != 0 &&
      conf->srun_port_range[0] <= conf->srun_port_range[1]) {
    range = PortRange{conf->srun_port_range[0], conf->srun_port_range[1]};
  }
  slurm_free_ctl_conf(conf);
  return range;
}

}  // namespace

int listen_for_notices(VerdictListener& listener) {
  const auto range = srun_port_range();
  const std::uint16_t port = listener.listen(range);
  if (port == 0) {
    if (range) {
      slurm_info(
          "dew: cannot listen for the nodes' failure notices on a free port of SrunPortRange=%u-%u: each "
          "node names its own",
          range->low, range->high);
    } else {
      slurm_info("dew: cannot listen for the nodes' failure notices: each node names its own");
    }
    return 0;
  }
  return setenv(kVerdictPortCarrier, std::to_string(port).c_str(), 1) == 0 ? 0 : -1;
}

int draw_pool_secret() {
  auto secret = random_hex(kSecretBytes);
  if (!secret.ok()) {
    slurm_error("dew: cannot draw the pool secret: %s", secret.error().message.c_str());
    return -1;
  }
  // Tasks inherit srun's environment at launch; SLURM_* survives --export=NONE.
  return setenv(kSecretCarrier, secret.value().c_str(), 1) == 0 ? 0 : -1;
}

}  // namespace dew::spank
