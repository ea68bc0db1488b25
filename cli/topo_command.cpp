// `dew topo`: the GPU topology of this machine or of a saved file, printed
// like `nvidia-smi topo -m` (so users read it at a glance, and Dew reads its
// own output back), with the granule and the bandwidth estimates the mesh
// placement uses; --json for programs.
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "commands.h"
#include "dew/topology.h"

namespace dew::cli {
namespace {

using topology::Gpu;
using topology::PathClass;
using topology::Topology;

struct TopoOptions {
  std::string topology;
  bool json = false;
};

constexpr const char* kLegend =
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n";

std::string cell(const Topology& topology, std::size_t i, std::size_t j) {
  const std::size_t at = i * topology.size() + j;
  const std::string label = topology::path_class_label(topology.path[at], topology.nvlinks[at]);
  return label == "X" ? " X " : label;
}

std::string gbps_text(double gbps) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", gbps);
  return buffer;
}

void print_text(std::ostream& out, const Topology& topology) {
  const std::size_t n = topology.size();
  out << "Topology: " << topology.source << "\n";
  out << "GPUs: " << n << "    NUMA nodes: " << topology.numa_nodes << "\n";
  out << "Granule: " << topology.granule << "\n\n";
  if (n == 0) {
    out << "No NVIDIA GPU found.\n";
  } else {
    // The class matrix, tab-separated as nvidia-smi prints it.
    for (std::size_t j = 0; j < n; ++j) out << "\tGPU" << j;
    out << "\tCPU Affinity\tNUMA Affinity\n";
    bool unknown = false;
    for (std::size_t i = 0; i < n; ++i) {
      out << "GPU" << i;
      for (std::size_t j = 0; j < n; ++j) {
        out << "\t" << cell(topology, i, j);
        unknown = unknown || topology.path[i * n + j] == PathClass::kUnknown;
      }
      const Gpu& gpu = topology.gpus[i];
      out << "\t" << (gpu.cpu_affinity.empty() ? "N/A" : gpu.cpu_affinity) << "\t"
          << (gpu.numa_node ? std::to_string(*gpu.numa_node) : "N/A") << "\n";
    }
    out << "\n" << kLegend;
    if (unknown) out << "  ?    = The source does not say\n";

    out << "\nGPU\tPCI bus id\tNUMA\tModel\n";
    for (const Gpu& gpu : topology.gpus) {
      out << "GPU" << gpu.index << "\t" << (gpu.pci_bus_id.empty() ? "N/A" : gpu.pci_bus_id) << "\t"
          << (gpu.numa_node ? std::to_string(*gpu.numa_node) : "N/A") << "\t" << (gpu.model.empty() ? "N/A" : gpu.model)
          << "\n";
    }

    out << "\nBandwidth estimates, GB/s one way (NV#: links x per-link rate; PCIe: a share of the link):\n";
    for (std::size_t j = 0; j < n; ++j) out << "\tGPU" << j;
    out << "\n";
    for (std::size_t i = 0; i < n; ++i) {
      out << "GPU" << i;
      for (std::size_t j = 0; j < n; ++j) {
        out << "\t" << (i == j ? std::string(" X ") : gbps_text(topology.bandwidth_gbps[i * n + j]));
      }
      out << "\n";
    }
  }
  if (!topology.notes.empty()) {
    out << "\nNotes:\n";
    for (const std::string& note : topology.notes) out << "  - " << note << "\n";
  }
}

nlohmann::json to_json(const Topology& topology) {
  const std::size_t n = topology.size();
  nlohmann::json out;
  out["source"] = topology.source;
  out["granule"] = topology.granule;
  out["numa_nodes"] = topology.numa_nodes;
  out["gpus"] = nlohmann::json::array();
  for (const Gpu& gpu : topology.gpus) {
    out["gpus"].push_back({{"index", gpu.index},
                           {"pci_bus_id", gpu.pci_bus_id},
                           {"model", gpu.model},
                           {"numa_node", gpu.numa_node ? nlohmann::json(*gpu.numa_node) : nlohmann::json(nullptr)},
                           {"cpu_affinity", gpu.cpu_affinity}});
  }
  nlohmann::json path = nlohmann::json::array();
  nlohmann::json nvlinks = nlohmann::json::array();
  nlohmann::json bandwidth = nlohmann::json::array();
  for (std::size_t i = 0; i < n; ++i) {
    nlohmann::json path_row = nlohmann::json::array();
    nlohmann::json nvlink_row = nlohmann::json::array();
    nlohmann::json bandwidth_row = nlohmann::json::array();
    for (std::size_t j = 0; j < n; ++j) {
      path_row.push_back(topology::path_class_label(topology.path[i * n + j], topology.nvlinks[i * n + j]));
      nvlink_row.push_back(topology.nvlinks[i * n + j]);
      bandwidth_row.push_back(topology.bandwidth_gbps[i * n + j]);
    }
    path.push_back(std::move(path_row));
    nvlinks.push_back(std::move(nvlink_row));
    bandwidth.push_back(std::move(bandwidth_row));
  }
  out["path"] = std::move(path);
  out["nvlinks"] = std::move(nvlinks);
  out["bandwidth_gbps"] = std::move(bandwidth);
  out["notes"] = topology.notes;
  return out;
}

int run(const TopoOptions& options) {
  auto loaded = options.topology.empty() ? topology::detect_topology() : topology::load_topology_file(options.topology);
  if (!loaded.ok()) return report(loaded.error());
  std::ostringstream out;
  if (options.json) {
    out << to_json(loaded.value()).dump(2) << "\n";
  } else {
    print_text(out, loaded.value());
  }
  std::cout << out.str() << std::flush;
  return std::cout ? 0 : 1;
}

}  // namespace

void add_topo_command(CLI::App& app) {
  auto options = std::make_shared<TopoOptions>();
  CLI::App* topo =
      app.add_subcommand("topo",
                         "Show the GPU topology: path classes as `nvidia-smi topo -m` prints them, NUMA affinity, "
                         "the granule and bandwidth estimates");
  topo->add_option("--topology", options->topology,
                   "Read FILE instead of this machine: hwloc XML (v1 or v2), NCCL topology XML "
                   "(NCCL_TOPO_FILE), or the saved text of `nvidia-smi topo -m`")
      ->type_name("FILE");
  topo->add_flag("--json", options->json, "Print JSON for programs");
  topo->callback([options] { run_subcommand("topo", [&] { return run(*options); }); });
}

}  // namespace dew::cli
