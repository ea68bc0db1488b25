// The groups of a mesh axis over the process pool (namespace dew::axes):
// the glue of pool/, mesh/, comm/ and topology/.
//
//   auto pool = dew::runtime::join();
//   auto mesh = dew::mesh::build_mesh(spec, dew::mesh::cpu_pool(pool.size(), 2));
//   // one thread per local device d:
//   auto comm = dew::axes::make_axis_communicator(pool, mesh.value(), dew::mesh::Axis::kSequence, d);
//
//   axis_member            pure: a device's group on an axis, its rank there,
//                          and the key prefix its group's rendezvous uses
//   pool_key_value         the pool's key-value exchange as a comm::KeyValue
//   reachable_address      the address peers reach this process at: the one
//                          this host routes to the pool's coordinator from
//   axis_rendezvous        the rank, size, store and key prefix of one round
//                          of a group, for any backend (Gloo, NCCL)
//   make_axis_communicator a Gloo communicator for the device's group
//
// The pool's topology (one device graph for build_mesh) is dew/pool_topology.h.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dew/comm.h"
#include "dew/export.h"
#include "dew/mesh.h"
#include "dew/pool.h"
#include "dew/result.h"

namespace dew::axes {

using comm::Communicator;
using comm::KeyValue;

struct DEW_API AxisMember {
  int group = 0;             // the group's index among the axis's groups
  int rank = 0;              // the device's position in its group
  int size = 1;              // devices in the group
  std::vector<int> devices;  // the group's device ids, in rank order
  // "dew/comm/<axis>/<group>-<digest of the group's ids>": groups with other
  // devices (of another mesh) never share keys.
  std::string prefix;
};

// Errors (kNotFound) name the device and the mesh's ids when the device is
// not in it.
DEW_API Result<AxisMember> axis_member(const mesh::Mesh& mesh, mesh::Axis axis, int device_id);

// put publishes under `key`; get waits up to `timeout` and returns an Error
// (kTimeout) naming the key when it does not come. It refers to `pool`,
// which must outlive it (and the communicators made with it).
DEW_API KeyValue pool_key_value(runtime::Pool& pool, std::chrono::milliseconds timeout);

// The local address of a route to the pool's coordinator (no packet is
// sent): every peer reached the coordinator, so this host is reachable at
// it. 127.0.0.1 for a pool without a coordinator (one process).
DEW_API Result<std::string> reachable_address(const runtime::Identity& identity);

// What any backend's rendezvous needs for device `device_id`'s group on
// `axis`: its rank and size, the pool's store, and this round's key prefix
// (each call is a new round for this device and group). For NCCL:
//   auto r = axis_rendezvous(pool, mesh, Axis::kSequence, device, 30s);
//   make_nccl_communicator({.rank = r.value().member.rank, .size = r.value().member.size,
//                           .device = local_gpu, .store = r.value().store, .prefix = r.value().prefix});
// The device must sit on this process (mesh.processes).
struct DEW_API AxisRendezvous {
  AxisMember member;
  KeyValue store;
  std::string prefix;
};
DEW_API Result<AxisRendezvous> axis_rendezvous(runtime::Pool& pool, const mesh::Mesh& mesh, mesh::Axis axis,
                                               int device_id, std::chrono::milliseconds timeout);

struct DEW_API AxisOptions {
  // Where this device's Gloo rank listens; default reachable_address().
  std::optional<std::string> hostname;
  // Bounds the rendezvous and every collective.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

// The Gloo communicator of device `device_id`'s group on `axis`. The device
// must sit on this process (mesh.processes).
DEW_API Result<std::unique_ptr<Communicator>> make_axis_communicator(runtime::Pool& pool, const mesh::Mesh& mesh,
                                                                     mesh::Axis axis, int device_id,
                                                                     const AxisOptions& options = {});

}  // namespace dew::axes
