// The pure core every topology source feeds: where each GPU sits on PCIe,
// which NVLink bundles leave it, and how those become the path classes and
// bandwidth estimates of a Topology. Private to topology/: the readers
// (hwloc, NCCL XML, nvidia-smi text, NVML) fill a Draft, assemble() does the
// rest, so every source gets the same rules and the rules are testable
// without hwloc or a GPU.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dew/nvml.h"
#include "dew/result.h"
#include "dew/text.h"
#include "dew/topology.h"

namespace dew::topology::detail {

// Where a GPU hangs off the host: enough to name the PCIe path class
// between two GPUs the way `nvidia-smi topo -m` does.
struct PciPlace {
  std::string root;                   // the host bridge (root complex) above it
  std::vector<std::string> switches;  // PCIe switches between root and GPU, top first
  std::optional<int> numa_node;       // the NUMA node the root belongs to
};

struct GpuSite {
  Gpu gpu;                          // index is assigned by assemble()
  std::optional<PciPlace> place;    // absent when the source does not say
  double pcie_gbps = 0;             // the GPU's own PCIe link; 0: unknown
  double nvlink_gbps_per_link = 0;  // one NVLink, one direction; 0: unknown
};

// Bonded NVLinks leaving one GPU, to another GPU or to an NVSwitch.
struct NvLinkBundle {
  std::string gpu;   // the GPU's pci_bus_id
  std::string peer;  // a GPU's pci_bus_id, or an NVSwitch's id
  bool peer_is_switch = false;
  int links = 0;
  double gbps = 0;  // the bundle's bandwidth; 0: links x the GPU's per-link rate
};

struct Draft {
  std::string source;
  std::vector<GpuSite> gpus;
  std::vector<NvLinkBundle> nvlinks;
  int numa_nodes = 0;
  std::string granule;
  std::vector<std::string> notes;
  // Sources that state the classes instead of places (nvidia-smi text) give
  // them here, n x n in the order of `gpus`; empty otherwise.
  std::vector<PathClass> given_path;
  std::vector<int> given_nvlinks;
};

// The PCIe class between two placed GPUs. `single_numa`: the machine has at
// most one NUMA node, so two host bridges are NODE even when a side does not
// name its node.
PathClass pcie_path_class(const PciPlace& a, const PciPlace& b, bool single_numa);

// GPU-to-GPU NVLinks from bundles, in the order of `gpu_ids`. Direct bundles
// reported from both ends count once. All NVSwitches of one node form one
// non-blocking fabric (as NVIDIA wires them and as NCCL and hwloc's
// transitive closure model them), so two GPUs on switches get the smaller of
// their two switch link counts: the transitive closure through the switches.
struct NvLinkMatrix {
  std::vector<int> links;     // n x n
  std::vector<double> gbps;   // n x n
  bool guessed_rate = false;  // some bundle used fallback_gbps_per_link
};
NvLinkMatrix nvlink_matrix(const std::vector<GpuSite>& gpus, const std::vector<NvLinkBundle>& bundles,
                           double fallback_gbps_per_link);

// One NVLink's bandwidth in one direction, GB/s, from the compute capability
// (sm: 70 for 7.0; 0 when unknown) or else the model name; 0 when neither
// tells the generation.
double nvlink_gbps_per_link(std::string_view model, int sm);

// What `nvlink_gbps_per_link` falls back to when the generation is unknown.
inline constexpr double kDefaultNvlinkGbpsPerLink = 25.0;
// The most GPUs a topology may hold: its matrices are n x n. A node has 16
// at most today, an NVLink domain 72; 1024 leaves room and bounds memory.
inline constexpr std::size_t kMaxGpus = 1024;
// What a PCIe link is taken to be when the source does not say (Gen3 x16).
inline constexpr double kDefaultPcieGbps = 15.75;

// A PCIe link's bandwidth in GB/s from its transfer rate and width, e.g.
// 16 GT/s x16 -> 31.5 (128b/130b encoding from 8 GT/s up, 8b/10b below).
double pcie_link_gbps(double gigatransfers, int width);

// Estimated GB/s between two GPUs joined by `path` over PCIe links of
// `pcie_gbps` (the slower of the two ends). See docs/design/topology.md.
double pcie_bandwidth_gbps(PathClass path, double pcie_gbps);

// "0000ffff,0000ffff" (Linux cpumask: 32-bit hex words, most significant
// first) -> "0-15,32-47".
Result<std::string> cpumask_to_list(std::string_view mask);

// "0000:07:00.0" from "00000000:07:00.0", "0000:07:00", "7:0.0" ...:
// lower-case hex, 4-digit domain, 2-digit bus and device, function.
// nullopt when `text` is not a PCI address.
std::optional<std::string> normalize_pci_bus_id(std::string_view text);

// `text` as an error message may quote it (common's rule).
using dew::printable;

// The last path component: "nvidiaDGX2.xml" from "tests/x/nvidiaDGX2.xml".
std::string base_name(std::string_view path);

Topology assemble(Draft draft);

// The name of the first element of an XML document, past the declaration,
// comments and a DOCTYPE; empty when there is none.
std::string_view xml_root_name(std::string_view text);

// The whitespace-separated words of one line of `nvidia-smi topo -m` text,
// without the terminal escapes (bold, underline) nvidia-smi prints around
// the header, also when a paste kept "[4m" but lost the escape byte.
std::vector<std::string> smi_words(std::string_view line);

// Readers (one file each); `name` names the input in errors and `source`.
Result<Draft> read_hwloc_xml(std::string_view content, std::string_view name, int xml_version);
Result<Draft> read_nccl_xml(std::string_view content, std::string_view name);
Result<Draft> read_nvidia_smi_text(std::string_view content, std::string_view name);
// This machine through hwloc (PCIe, NUMA; NVLink only where hwloc has it).
Result<Draft> read_hwloc_live();

// Adds what NVML saw to a live Draft from hwloc: models, NVLink bundles
// (to GPUs and NVSwitches), the NVLink fabric as the granule; without NVML,
// a note that says so. `boot_id` names the host granule otherwise.
void merge_nvml(Draft& draft, const NvmlReport& report, std::string_view boot_id);

}  // namespace dew::topology::detail
