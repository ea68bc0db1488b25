// Device meshes for a MeshSpec: which device sits at which mesh coordinate.
//
// Pure code over an abstract device graph (ids, processes, granules and a
// bandwidth matrix): no hwloc, no I/O. The `dew mesh` command feeds it a
// topology file or a CPU pool; tests feed it matrices.
//
//   parse_mesh_spec   {"fsdp": 2, "replicas": 2} or fsdp=2,replicas=2
//   build_mesh        an explicit device order, placement, or hybrid sharding
//   place             the best local order of one granule's devices
//   score_layout      per axis, the slowest link inside the axis's groups
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dew/export.h"
#include "dew/result.h"

namespace dew::mesh {

// MESH_AXES, outermost first. The mesh is filled row-major, so the last axes
// get neighbouring devices: sequence and tensor exchange the most data.
enum class Axis : int { kData, kStage, kFsdp, kExpert, kTensor, kSequence };
inline constexpr int kAxisCount = 6;
inline constexpr std::array<std::string_view, kAxisCount> kMeshAxes = {"data",   "stage",  "fsdp",
                                                                       "expert", "tensor", "sequence"};

// Axis sizes in MESH_AXES order.
using MeshShape = std::array<int, kAxisCount>;

struct DEW_API MeshSpec {
  // Unset axes are 1, except data, which takes the devices left over.
  std::array<std::optional<int>, kAxisCount> sizes;
  // Groups of granules holding one full copy each (hybrid sharding); 1: none.
  int replicas = 1;
};

// A JSON object ({"fsdp": 2, "replicas": 2}) or a key=value list
// (fsdp=2,replicas=2), told apart by a leading '{'.
DEW_API Result<MeshSpec> parse_mesh_spec(std::string_view text);
DEW_API Result<MeshSpec> parse_mesh_spec_json(std::string_view text);
DEW_API Result<MeshSpec> parse_mesh_spec_pairs(std::string_view text);
// A device order for build_mesh (dew mesh --devices, dew worker --devices):
// device ids separated by commas, such as 0,2,1,3. The error names the bad
// entry and the allowed form; the caller prefixes its option's name.
DEW_API Result<std::vector<int>> parse_device_order(std::string_view text);
// key=value form of the axes that are set, then replicas when not 1;
// parse_mesh_spec reads it back to the same spec.
DEW_API std::string format_mesh_spec(const MeshSpec& spec);

// "data=4 fsdp=2": the axes of size > 1 in MESH_AXES order; "one device".
DEW_API std::string format_mesh_shape(const MeshShape& shape);

// The sizes for `devices` devices: unset axes 1, data the rest. Errors when
// the sizes do not multiply to the device count.
DEW_API Result<MeshShape> resolve_shape(const MeshSpec& spec, int devices);

struct DEW_API Device {
  int id = 0;           // what the mesh lists (a GPU index, a global device id)
  int process = 0;      // the process that owns it
  std::string granule;  // host or NVLink domain; the same for all in a CPU pool
};

struct DEW_API DeviceGraph {
  std::vector<Device> devices;
  // n x n link bandwidth in GB/s between devices[i] and devices[j],
  // row-major [i * n + j]; the diagonal is not read.
  std::vector<double> bandwidth;
};

// An n x n bandwidth matrix with link(i, j) off the diagonal and 0 on it:
// for graphs given by a rule (a CPU pool, NVLink pairs, tests, benchmarks).
DEW_API std::vector<double> bandwidth_matrix(int n, const std::function<double(int, int)>& link);

// P processes of D devices on one machine (the design page's rehearsal pool): ids
// 0..P*D-1 process by process, one shared granule, equal links.
DEW_API DeviceGraph cpu_pool(int processes, int devices_per_process);

// The id cpu_pool gives device `local` (0..devices_per_process-1) of process
// `process`: the one rule every process uses to find its own devices.
constexpr int cpu_device_id(int process, int devices_per_process, int local) {
  return process * devices_per_process + local;
}

// What one process of a pool knows of its host: the host's GPU topology
// (its links in GB/s, host_gpus x host_gpus) and which of its GPUs the
// process owns.
struct DEW_API HostPart {
  int process = 0;
  std::string host;       // what tells hosts apart: a boot id (two names of one host are one host)
  std::string host_name;  // for messages
  // The granule: the host's own ("host:<host>") unless hosts share an NVLink
  // domain (the same fabric cluster UUID and clique), which is one granule.
  std::string granule;
  int host_gpus = 0;
  std::vector<double> bandwidth;
  std::vector<int> gpus;  // host GPU indices this process owns, in its device order
};

// Between hosts the network, which no topology file describes: below every
// link inside a host, so that inner axes stay inside hosts.
inline constexpr double kBetweenHostsGbps = 1.0;

// The pool's devices (process by process), each in its part's granule
// (default "host:<host>"): links inside a host are the host's, between hosts
// of one NVLink domain the host's fastest, between other hosts
// kBetweenHostsGbps; an error names the host and the numbers when hosts have
// different GPU counts, when processes of one host read different
// topologies, or when two processes claim one GPU.
DEW_API Result<DeviceGraph> hosts_graph(const std::vector<HostPart>& parts);

// Per axis in MESH_AXES order, the smallest link bandwidth between two
// devices of one group of that axis; +infinity for an axis of size 1.
struct DEW_API Score {
  std::array<double, kAxisCount> bottleneck{};
};
// Axis by axis from the innermost (sequence, tensor, expert, fsdp, stage,
// data), higher is better: <0 when a is worse than b, 0 equal, >0 better.
DEW_API int compare_scores(const Score& a, const Score& b);

// The score of filling `shape` row-major with matrix indices `order`
// (order[k] = the device index at flat position k) over an n x n matrix.
// Needs: bandwidth.size() == n * n, product(shape) == order.size(), every
// index below n (build_mesh checks its graph before calling).
DEW_API Score score_layout(std::span<const double> bandwidth, int n, const MeshShape& shape,
                           std::span<const int> order);

// Exact up to this many devices in a granule; a heuristic above.
inline constexpr int kExactPlacementLimit = 16;

struct DEW_API Placement {
  std::vector<int> order;  // order[k] = the device index at flat position k
  bool exact = false;      // proven best; else the heuristic's (never worse than id order)
};

// The best order of n devices (n x n matrix of finite values) for `shape`
// (product n): the highest score; among equal scores, the lexicographically
// smallest order, so equal links keep the id order and every process
// computes the same result. Exact up to kExactPlacementLimit devices.
DEW_API Placement place(std::span<const double> bandwidth, int n, const MeshShape& shape);

enum class Layout {
  kExplicit,   // the caller's device order
  kPlacement,  // replicas = 1: granules in id order, each in the placed order
  kHybrid,     // replicas > 1: data across replica groups, fsdp across granules
};
DEW_API std::string_view layout_name(Layout layout);

struct DEW_API AxisGroups {
  // Each group's device ids along the axis; groups in row-major order of the
  // other axes' coordinates.
  std::vector<std::vector<int>> devices;
  // The processes each group's devices sit on: sorted, each once (the
  // design page's pool.json "fsdp_groups").
  std::vector<std::vector<int>> processes;
};

// The groups of `axis` over `values` laid out row-major in `shape` (a
// mesh's devices, or the processes they sit on): each group's values along
// the axis, the groups in row-major order of the other axes' coordinates.
// Needs: values.size() == product(shape), axis < shape.size().
DEW_API std::vector<std::vector<int>> groups_along(std::span<const int> shape, std::span<const int> values, int axis);

struct DEW_API Mesh {
  MeshShape shape{};
  int replicas = 1;
  Layout layout = Layout::kPlacement;
  std::vector<int> devices;    // device ids, row-major over shape
  std::vector<int> processes;  // the process of each entry of devices
  std::array<AxisGroups, kAxisCount> groups;
  // Granules in mesh order, with the block of the mesh one granule holds.
  std::vector<std::string> granules;
  MeshShape granule_shape{};
  bool exact = true;               // the local order is proven best (or given)
  Score score;                     // of this mesh
  Score id_order_score;            // of the same shape filled with ids in increasing order
  std::vector<std::string> notes;  // what the layout could not do, said once each
};

// An explicit `order` of device ids fills the mesh as given (replicas must be
// 1); otherwise replicas = 1 places each granule's devices and replicas > 1
// builds the hybrid mesh of JAX's create_hybrid_device_mesh.
DEW_API Result<Mesh> build_mesh(const MeshSpec& spec, const DeviceGraph& graph,
                                const std::optional<std::vector<int>>& order = std::nullopt);

// The mesh for programs: axes, shape, devices, "<axis>_groups" (processes,
// as the design page's pool.json), "<axis>_group_devices", scores (GB/s, null for
// size-1 axes), granules and notes.
DEW_API std::string mesh_to_json(const Mesh& mesh);

}  // namespace dew::mesh
