#include "node_lookup.h"

#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

extern "C" {
#include <slurm/slurm.h>
}

// Provided by srun at run time (libslurmfull), declared by Slurm's own
// header; weak, as slurm_kill_job_step is (step_end.cpp).
#pragma weak slurm_load_node_single
#pragma weak slurm_free_node_info_msg

namespace dew::spank {
namespace {

bool resolves(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  return rc == 0;
}

}  // namespace

NodeLookup look_up_node(const std::string& node) {
  NodeLookup lookup;
  if (resolves(node)) return lookup;
  lookup.name_resolves = false;
  if (slurm_load_node_single == nullptr || slurm_free_node_info_msg == nullptr) {
    lookup.why_none = "slurm_load_node_single is not available in this process";
    return lookup;
  }
  node_info_msg_t* info = nullptr;
  // SHOW_ALL: the node even when it sits in a hidden partition.
  if (slurm_load_node_single(&info, const_cast<char*>(node.c_str()), SHOW_ALL) != 0 || info == nullptr) {
    lookup.why_none = std::string("slurm_load_node_single: ") + std::strerror(errno);
    return lookup;
  }
  if (info->record_count > 0 && info->node_array[0].node_addr != nullptr && *info->node_array[0].node_addr) {
    lookup.node_address = info->node_array[0].node_addr;
  } else {
    lookup.why_none = "Slurm's record of the node has no NodeAddr";
  }
  slurm_free_node_info_msg(info);
  return lookup;
}

}  // namespace dew::spank
