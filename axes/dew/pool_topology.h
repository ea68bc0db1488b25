// The pool's topology (namespace dew::axes): every process reads its host's
// GPU topology, the pool gathers them over its key-value exchange (PMIx or
// the TCP service), and the devices of every process become one device graph
// with a granule per host (or per NVLink domain), for build_mesh:
//
//   auto pool = dew::runtime::join();
//   auto graph = dew::axes::pool_device_graph(pool);   // the same on every rank
//   auto mesh = dew::mesh::build_mesh(spec, graph.value());
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dew/export.h"
#include "dew/mesh.h"
#include "dew/pool.h"
#include "dew/result.h"
#include "dew/topology.h"

namespace dew::axes {

// What tells this process's host apart, and which of its GPUs it owns.
struct DEW_API LocalFacts {
  int process = 0;
  int local_rank = 0;
  int local_size = 1;
  std::string host_id;                         // DEW_HOST_ID, else the kernel's boot id
  std::string host_name;                       // for messages
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES
  bool topology_from_file = false;             // DEW_TOPOLOGY_FILE: its granule names no host
};

// This process's part (pure): its GPUs by bind_gpus's rule (dew/gpu_binding.h)
// as the plugin and dew launch apply it: CUDA_VISIBLE_DEVICES's entries
// (indices, or UUIDs resolved on the host; one that names no GPU there is
// refused), else its share of the host's GPUs by local rank; the granule is
// the topology's NVLink domain when it has one, else the host.
DEW_API Result<mesh::HostPart> local_part(const topology::Topology& host, const LocalFacts& facts);

// A part on the wire (JSON), and back with every field checked.
DEW_API std::string encode_part(const mesh::HostPart& part);
DEW_API Result<mesh::HostPart> decode_part(std::string_view text);

// One machine, one process owning all its GPUs, in the machine's own
// granule, its link matrix as read (dew mesh --topology FILE or on this
// machine, dew.build_mesh(topology=FILE)).
DEW_API mesh::DeviceGraph machine_graph(const topology::Topology& machine);

// Several hosts planned offline: one topology file per host, one process
// per host owning all its GPUs, a granule each (dew mesh --topology A
// --topology B, dew.build_mesh(topology=[...])).
DEW_API Result<mesh::DeviceGraph> files_device_graph(const std::vector<std::string>& files);

// Every process of the pool calls it: reads its host (DEW_TOPOLOGY_FILE, or
// live through hwloc and NVML), gathers every process's part, and returns
// the same graph on every rank (hosts_graph's errors name the host).
DEW_API Result<mesh::DeviceGraph> pool_device_graph(runtime::Pool& pool);

}  // namespace dew::axes
