// A node's accelerator topology: which GPUs it has, how each pair is joined
// (the path classes `nvidia-smi topo -m` prints) and at what bandwidth, which
// NUMA node each sits near, and the granule the node's devices belong to.
// Read from the live machine (hwloc, plus NVML loaded at run time) or from a
// file: hwloc XML (v1, v2), NCCL topology XML, or saved `nvidia-smi topo -m`.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dew/export.h"
#include "dew/result.h"

namespace dew::topology {

// How two GPUs are joined, best first, as `nvidia-smi topo -m` names it.
enum class PathClass {
  kSelf,     // X: the same GPU
  kNVLink,   // NV#: bonded NVLinks (see Topology::nvlinks for #)
  kPIX,      // at most one PCIe bridge
  kPXB,      // several PCIe bridges, no host bridge
  kPHB,      // through a PCIe host bridge (the CPU)
  kNODE,     // across host bridges within one NUMA node
  kSYS,      // across NUMA nodes (the SMP interconnect)
  kUnknown,  // the source does not say
};

struct DEW_API Gpu {
  int index = 0;                 // 0..n-1 in PCI bus order (as CUDA_DEVICE_ORDER=PCI_BUS_ID)
  std::string pci_bus_id;        // "0000:07:00.0"
  std::string model;             // "Tesla V100-SXM3-32GB"; empty when unknown
  std::string uuid;              // "GPU-5f1c2a3b-...": live NVML only; empty when unknown
  std::optional<int> numa_node;  // nearest NUMA node
  std::string cpu_affinity;      // nearby cores as a list, "0-11,24-35"; empty when unknown
};

struct DEW_API Topology {
  std::string source;  // "hwloc XML v2 (nvidiaDGX2.xml)", "live: hwloc + NVML", ...
  std::vector<Gpu> gpus;
  // n x n matrices over gpus, row-major: [i * n + j].
  std::vector<PathClass> path;
  std::vector<int> nvlinks;            // bonded NVLink count between i and j (0: none)
  std::vector<double> bandwidth_gbps;  // estimated GB/s between i and j, one way; 0 on the diagonal
                                       // (docs/design/topology.md has the table)
  int numa_nodes = 0;
  std::string granule;  // NVLink fabric "<cluster uuid>/<clique>", else "host:<boot id>";
                        // files: "host:<name the file gives>", else "file:<file name>"
  // What the source could not tell, said once each, e.g. "no NVLink data:
  // PCIe/NUMA classes only".
  std::vector<std::string> notes;

  [[nodiscard]] std::size_t size() const { return gpus.size(); }
};

// The format is detected from the content. A corrupt or truncated file is an
// Error naming the file and the problem.
DEW_API Result<Topology> load_topology_file(const std::string& path);

// The file formats `load_topology_file` reads.
enum class TopologyFormat {
  kHwlocXml,       // hwloc XML, v1 or v2 (`lstopo file.xml`)
  kNcclXml,        // NCCL's topology XML (NCCL_TOPO_FILE, NCCL_TOPO_DUMP_FILE)
  kNvidiaSmiText,  // the saved text of `nvidia-smi topo -m`
  kUnknown,
};

// Which format `content` is in, from the content alone: the XML root element
// (<topology> for hwloc, <system> for NCCL), else a matrix row "GPU0 X ...".
DEW_API TopologyFormat detect_topology_format(std::string_view content);

// "hwloc XML", "NCCL topology XML", "nvidia-smi topo -m text", "unknown".
DEW_API std::string_view format_name(TopologyFormat format);

// What load_topology_file does once the file is read: `name` stands for the
// file in errors and in Topology::source. The fuzz target's entry point.
DEW_API Result<Topology> parse_topology_text(std::string_view content, std::string_view name);

// A cell as `nvidia-smi topo -m` prints it: "X", "NV6", "PIX", ..., "SYS";
// "?" for kUnknown.
DEW_API std::string path_class_label(PathClass path, int nvlinks);

// This machine, now.
DEW_API Result<Topology> detect_topology();

// This host's kernel boot id (what tells hosts apart: two names of one host
// share it); empty where the kernel does not say.
DEW_API std::string read_boot_id();

// This process's accelerator fingerprint, one "name=value" per line: the
// platform, driver and library versions, device kinds and counts; the CPU
// model and ISA on a CPU-only machine. DEW_ACCELERATOR_FINGERPRINT replaces
// it (for pools that know better, and for tests). What a pool's
// compile_cache_key() hashes.
DEW_API std::string accelerator_fingerprint();

}  // namespace dew::topology
