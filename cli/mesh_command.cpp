// `dew mesh`: the device mesh for a MeshSpec over a topology file, this
// machine, or a CPU pool of P processes x D devices, as text or JSON.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "dew/mesh.h"
#include "dew/pool.h"
#include "dew/pool_topology.h"
#include "dew/text.h"
#include "dew/topology.h"

namespace dew::cli {
namespace {

// A CPU pool's bandwidth matrix is n x n: bound it well below what memory
// allows, and above any rehearsal pool.
constexpr int kMaxPoolDevices = 4096;

struct MeshOptions {
  std::string spec;
  std::vector<std::string> topology;  // one file per host
  bool pool = false;
  int processes = 0;
  int devices_per_process = 0;
  std::string devices;
  bool json = false;
};

// The topology's GPUs as one process and one granule (the file's).
Result<mesh::DeviceGraph> load_graph(const MeshOptions& options) {
  if (options.processes != 0 || options.devices_per_process != 0) {
    if (options.processes < 1 || options.devices_per_process < 1 ||
        options.processes > kMaxPoolDevices / options.devices_per_process) {
      return invalid_argument("--processes " + std::to_string(options.processes) + " x --devices-per-process " +
                              std::to_string(options.devices_per_process) +
                              " is not allowed; allowed: whole numbers >= 1 with at most " +
                              std::to_string(kMaxPoolDevices) + " devices in all");
    }
    return mesh::cpu_pool(options.processes, options.devices_per_process);
  }
  if (options.topology.size() > 1) return axes::files_device_graph(options.topology);
  const std::string file = options.topology.empty() ? "" : options.topology.front();
  auto loaded = file.empty() ? topology::detect_topology() : topology::load_topology_file(file);
  if (!loaded.ok()) return loaded.error();
  if (loaded.value().gpus.empty()) {
    return unavailable((file.empty() ? std::string("this machine") : file) +
                       " has no GPUs to lay out; give --topology FILE for another machine, or --processes P "
                       "--devices-per-process D for a CPU pool");
  }
  return axes::machine_graph(loaded.value());
}

std::string list(const std::vector<int>& values) {
  std::string out;
  for (const int value : values) out += (out.empty() ? "" : " ") + std::to_string(value);
  return "[" + out + "]";
}

std::string list_json(const std::vector<int>& values) {
  std::string out;
  for (const int value : values) out += (out.empty() ? "" : ", ") + std::to_string(value);
  return "[" + out + "]";
}

std::string gbps(double value) {
  if (!std::isfinite(value)) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

void print_text(const mesh::Mesh& mesh, std::ostream& out) {
  out << "mesh      " << mesh::format_mesh_shape(mesh.shape) << " (" << mesh.devices.size()
      << " devices), replicas=" << mesh.replicas << "\n";
  out << "layout    " << mesh::layout_name(mesh.layout);
  if (mesh.layout == mesh::Layout::kExplicit) {
    out << ": the given device order\n";
  } else {
    std::string names;
    for (const auto& name : mesh.granules) names += (names.empty() ? "" : " ") + name;
    out << " (" << (mesh.exact ? "exact" : "heuristic") << " placement): " << mesh.granules.size()
        << (mesh.granules.size() == 1 ? " granule" : " granules") << " of "
        << mesh::format_mesh_shape(mesh.granule_shape) << " (" << names << ")\n";
  }
  out << "devices   " << list(mesh.devices) << "\n";
  out << "processes " << list(mesh.processes) << "\n";
  out << "groups    per axis: devices -> processes\n";
  for (int a = 0; a < mesh::kAxisCount; ++a) {
    if (mesh.shape[a] < 2) continue;
    std::ostringstream line;
    line << "  " << mesh::kMeshAxes[a] << "=" << mesh.shape[a] << ":";
    for (std::size_t g = 0; g < mesh.groups[a].devices.size(); ++g) {
      line << "  " << list(mesh.groups[a].devices[g]) << " -> " << list(mesh.groups[a].processes[g]);
    }
    out << line.str() << "\n";
  }
  out << "score     slowest link per axis in GB/s, innermost first: this layout | plain id order\n";
  for (int a = mesh::kAxisCount - 1; a >= 0; --a) {
    if (mesh.shape[a] < 2) continue;
    out << "  " << mesh::kMeshAxes[a] << ": " << gbps(mesh.score.bottleneck[a]) << " | "
        << gbps(mesh.id_order_score.bottleneck[a]) << "\n";
  }
  for (const auto& note : mesh.notes) out << "note      " << note << "\n";
}

// --pool: every process of the pool runs it; the mesh over every process's
// real devices is the same on every rank. Process 0 prints it; with --json
// also every process's part (its devices and their positions), a line each.
int run_pool(const mesh::MeshSpec& spec, const std::optional<std::vector<int>>& order, bool json) {
  auto joined = join_pool();
  if (!joined.ok()) return report(joined.error(), kJoinFailedExitCode);
  runtime::Pool* pool = &joined.value();
  auto graph = axes::pool_device_graph(*pool);
  if (!graph.ok()) return report(graph.error());
  auto built = mesh::build_mesh(spec, graph.value(), order);
  if (!built.ok()) return report(built.error());
  const mesh::Mesh& m = built.value();
  // Process 0 alone writes: under srun, several tasks' long lines would
  // interleave in srun's output. Every rank's part is in the mesh.
  if (pool->rank() != 0) return 0;
  if (!json) {
    print_text(m, std::cout);
    return 0;
  }
  std::cout << mesh::mesh_to_json(m) << "\n";
  for (int process = 0; process < pool->size(); ++process) {
    std::vector<int> devices, positions;
    for (std::size_t k = 0; k < m.devices.size(); ++k) {
      if (m.processes[k] != process) continue;
      devices.push_back(m.devices[k]);
      positions.push_back(static_cast<int>(k));
    }
    std::cout << "{\"process\": " << process << ", \"devices\": " << list_json(devices)
              << ", \"positions\": " << list_json(positions) << "}\n";
  }
  std::cout.flush();
  return 0;
}

int run(const MeshOptions& options) {
  const auto fail = [](const Error& error) { return report(error); };
  auto spec = mesh::parse_mesh_spec(options.spec);
  if (!spec.ok()) return fail(spec.error());
  std::optional<std::vector<int>> order;
  if (!options.devices.empty()) {
    auto ids = mesh::parse_device_order(options.devices);
    if (!ids.ok()) return fail(ids.error().prefixed("--devices: "));
    order = ids.value();
  }
  if (options.pool) return run_pool(spec.value(), order, options.json);
  auto graph = load_graph(options);
  if (!graph.ok()) return fail(graph.error());
  auto built = mesh::build_mesh(spec.value(), graph.value(), order);
  if (!built.ok()) return fail(built.error());
  if (options.json) {
    std::cout << mesh::mesh_to_json(built.value()) << "\n";
  } else {
    print_text(built.value(), std::cout);
  }
  return 0;
}

}  // namespace

void add_mesh_command(CLI::App& app) {
  auto options = std::make_shared<MeshOptions>();
  CLI::App* command = app.add_subcommand(
      "mesh",
      "Lay a device mesh out for a MeshSpec: which device sits at each coordinate, the groups of every axis "
      "and the processes they span, and the slowest link per axis beside the plain id order's");
  command
      ->add_option("--spec", options->spec,
                   "Axis sizes and replicas: {\"fsdp\": 2, \"replicas\": 2} or fsdp=2,replicas=2 (axes data, stage, "
                   "fsdp, expert, tensor, sequence; unset axes are 1, data takes the devices left over; "
                   "replicas > 1 for hybrid sharding)")
      ->required();
  CLI::Option* topology = command->add_option(
      "--topology", options->topology,
      "Plan for the machine this file describes (hwloc XML, NCCL topology XML, saved nvidia-smi topo -m); "
      "given once per host, for several hosts (a granule each, replicas across them); default: this machine");
  CLI::Option* pool = command->add_flag(
      "--pool", options->pool,
      "Every process of this pool runs it (srun --dew-pool, srun --mpi=pmix, dew launch): each reads its host "
      "(DEW_TOPOLOGY_FILE, else live), the pool gathers them, process 0 prints the mesh (--json: and each "
      "process's part, a line each)");
  pool->excludes(topology);
  CLI::Option* processes = command->add_option("--processes", options->processes,
                                               "A CPU pool of this many processes (with --devices-per-process)");
  CLI::Option* per_process = command->add_option("--devices-per-process", options->devices_per_process,
                                                 "Devices of each process in the CPU pool");
  processes->needs(per_process);
  per_process->needs(processes);
  topology->excludes(processes);
  pool->excludes(processes);
  topology->excludes(per_process);
  command->add_option("--devices", options->devices,
                      "Fill the mesh row-major in exactly this device order, such as 0,2,1,3 (no placement)");
  command->add_flag("--json", options->json, "Print JSON for programs");
  command->callback([options] { run_subcommand("mesh", [&] { return run(*options); }); });
}

}  // namespace dew::cli
