// hwloc, for both an XML file (v1 or v2) and the live machine. The only file
// that includes <hwloc.h>: it turns hwloc's object tree into a Draft (where
// each GPU sits, its NVLink bundles) and leaves every rule to
// topology_build.cpp.
#include <hwloc.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "build.h"

namespace dew::topology::detail {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr double kMaxLinkGbps = 10000;  // PCIe 7.0 x16 is 242 GB/s

// hwloc copies enum attributes from XML without checking them
// (bridge_type="5-1" stores 5): read them as integers, not as the enum.
template <typename Enum>
std::underlying_type_t<Enum> raw(const Enum& value) {
  std::underlying_type_t<Enum> out;
  static_assert(sizeof out == sizeof value);
  std::memcpy(&out, &value, sizeof out);
  return out;
}

bool is_nvidia(hwloc_obj_t pci) { return pci->attr->pcidev.vendor_id == kNvidiaVendor; }

// Display controllers: VGA (0x0300), 3D (0x0302), other (0x0380).
bool is_gpu_pci(hwloc_obj_t pci) { return is_nvidia(pci) && (pci->attr->pcidev.class_id >> 8) == 0x03; }

// hwloc's NVML backend marks switches; without it they are NVIDIA
// "bridge, other" devices (0x0680), as on the p4d.
bool is_nvswitch(hwloc_obj_t pci) {
  if (pci->subtype != nullptr && std::strcmp(pci->subtype, "NVSwitch") == 0) return true;
  return is_nvidia(pci) && pci->attr->pcidev.class_id == 0x0680;
}

bool starts_with(const char* text, const char* prefix) {
  return text != nullptr && std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

// An OS device a GPU driver or runtime created: nvml*, cuda*, opencl*.
bool is_gpu_osdev(hwloc_obj_t osdev) {
  const auto type = raw(osdev->attr->osdev.type);
  if (type != HWLOC_OBJ_OSDEV_GPU && type != HWLOC_OBJ_OSDEV_COPROC) {
    return false;
  }
  return starts_with(osdev->name, "nvml") || starts_with(osdev->name, "cuda") || starts_with(osdev->name, "opencl");
}

std::string bus_id(hwloc_obj_t pci) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buffer;
}

std::string info(hwloc_obj_t obj, const char* name) {
  const char* value = hwloc_obj_get_info_by_name(obj, name);
  return value != nullptr ? value : "";
}

// The name the GPU's own software gives it, else the PCI database's.
std::string model_of(hwloc_obj_t pci) {
  for (const char* prefix : {"nvml", "cuda", "opencl"}) {
    for (hwloc_obj_t child = pci->io_first_child; child != nullptr; child = child->next_sibling) {
      if (child->type != HWLOC_OBJ_OS_DEVICE || !starts_with(child->name, prefix)) continue;
      std::string model = info(child, "GPUModel");
      if (!model.empty()) return model;
    }
  }
  return info(pci, "PCIDevice");
}

std::string bitmap_list(hwloc_const_bitmap_t bitmap) {
  if (bitmap == nullptr || hwloc_bitmap_iszero(bitmap)) return "";
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, bitmap) < 0 || text == nullptr) return "";
  std::string out(text);
  std::free(text);
  return out;
}

// Where the PCI device hangs: its host bridge and the PCIe switches on the
// way. hwloc lists every bridge; a switch is an upstream port over
// downstream ports, so below the root port bridges come in pairs and the
// upstream one names the switch.
PciPlace place_of(hwloc_topology_t topology, hwloc_obj_t pci) {
  PciPlace place;
  std::vector<hwloc_obj_t> bridges;  // nearest first
  hwloc_obj_t up = pci->parent;
  while (up != nullptr && up->type == HWLOC_OBJ_BRIDGE &&
         raw(up->attr->bridge.upstream_type) != HWLOC_OBJ_BRIDGE_HOST) {
    bridges.push_back(up);
    up = up->parent;
  }
  if (up != nullptr && up->type == HWLOC_OBJ_BRIDGE) {
    place.root = "hostbridge#" + std::to_string(up->gp_index);
  } else {
    place.root = "cpuside#" + std::to_string(up != nullptr ? up->gp_index : 0);
  }
  // Top first: [root port, upstream, downstream, upstream, downstream, ...].
  const std::vector<hwloc_obj_t> top_first(bridges.rbegin(), bridges.rend());
  for (std::size_t t = 1; t < top_first.size(); t += 2) {
    place.switches.push_back("bridge#" + std::to_string(top_first[t]->gp_index));
  }
  hwloc_obj_t cpu_side = hwloc_get_non_io_ancestor_obj(topology, pci);
  if (cpu_side != nullptr && cpu_side->nodeset != nullptr && hwloc_bitmap_weight(cpu_side->nodeset) == 1) {
    place.numa_node = hwloc_bitmap_first(cpu_side->nodeset);
  }
  return place;
}

struct Found {
  std::map<std::string, hwloc_obj_t> gpus;  // by bus id
  std::set<std::string> switches;
};

Found find_devices(hwloc_topology_t topology) {
  Found found;
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topology, nullptr); pci != nullptr;
       pci = hwloc_get_next_pcidev(topology, pci)) {
    if (is_gpu_pci(pci)) found.gpus.emplace(bus_id(pci), pci);
    if (is_nvswitch(pci)) found.switches.insert(bus_id(pci));
  }
  // A GPU an NVIDIA driver or runtime saw, whatever its PCI class says.
  for (hwloc_obj_t osdev = hwloc_get_next_osdev(topology, nullptr); osdev != nullptr;
       osdev = hwloc_get_next_osdev(topology, osdev)) {
    hwloc_obj_t parent = osdev->parent;
    if (is_gpu_osdev(osdev) && parent != nullptr && parent->type == HWLOC_OBJ_PCI_DEVICE && is_nvidia(parent) &&
        !is_nvswitch(parent)) {
      found.gpus.emplace(bus_id(parent), parent);
    }
  }
  return found;
}

// NVLink bundles from hwloc's "NVLinkBandwidth" matrices (MB/s). Rows may
// name a GPU through any of its OS devices; the values are symmetric.
std::vector<NvLinkBundle> nvlink_bundles(hwloc_topology_t topology, const Found& found,
                                         const std::map<std::string, double>& per_link, bool& has_matrix,
                                         bool& guessed_rate) {
  unsigned count = 0;
  if (hwloc_distances_get_by_name(topology, "NVLinkBandwidth", &count, nullptr, 0) != 0 || count == 0) return {};
  std::vector<hwloc_distances_s*> matrices(count, nullptr);
  if (hwloc_distances_get_by_name(topology, "NVLinkBandwidth", &count, matrices.data(), 0) != 0) return {};
  has_matrix = count > 0;

  auto endpoint = [&](hwloc_obj_t obj) -> std::pair<std::string, int> {  // id, 1 GPU / 2 switch / 0 other
    if (obj == nullptr) return {"", 0};
    if (obj->type == HWLOC_OBJ_OS_DEVICE) obj = obj->parent;
    if (obj == nullptr || obj->type != HWLOC_OBJ_PCI_DEVICE) return {"", 0};
    std::string id = bus_id(obj);
    if (found.gpus.count(id) != 0) return {id, 1};
    if (is_nvswitch(obj)) return {"nvswitch:" + id, 2};
    return {"", 0};
  };

  std::map<std::pair<std::string, std::string>, NvLinkBundle> bundles;
  for (unsigned m = 0; m < count; ++m) {
    const hwloc_distances_s* matrix = matrices[m];
    if (matrix == nullptr) continue;
    const unsigned n = matrix->nbobjs;
    std::vector<std::pair<std::string, int>> ends;
    for (unsigned i = 0; i < n; ++i) ends.push_back(endpoint(matrix->objs[i]));
    for (unsigned i = 0; i < n; ++i) {
      const auto& [from, from_kind] = ends[i];
      if (from_kind != 1) continue;
      for (unsigned j = 0; j < n; ++j) {
        const auto& [to, to_kind] = ends[j];
        const hwloc_uint64_t mbps = matrix->values[static_cast<std::size_t>(i) * n + j];
        if (to_kind == 0 || to == from || mbps == 0) continue;
        NvLinkBundle bundle;
        bundle.gpu = from;
        bundle.peer = to;
        bundle.peer_is_switch = to_kind == 2;
        bundle.gbps = static_cast<double>(mbps) / 1000.0;
        double rate = per_link.at(from);
        if (!(rate > 0)) {
          rate = kDefaultNvlinkGbpsPerLink;
          guessed_rate = true;
        }
        bundle.links = static_cast<int>(std::clamp(std::llround(bundle.gbps / rate), 1LL, 1024LL));
        auto key = std::make_pair(from, to);
        auto it = bundles.find(key);
        if (it == bundles.end() || it->second.gbps < bundle.gbps) bundles[key] = bundle;
      }
    }
  }
  for (unsigned m = 0; m < count; ++m) {
    if (matrices[m] != nullptr) hwloc_distances_release(topology, matrices[m]);
  }
  std::vector<NvLinkBundle> out;
  for (auto& [key, bundle] : bundles) out.push_back(std::move(bundle));
  return out;
}

// `live`: NVML, not hwloc, has this machine's NVLinks (Debian's hwloc has
// no NVML backend), so the live reader says what NVML gave instead.
Draft draft_of(hwloc_topology_t topology, bool live) {
  Draft draft;
  Found found = find_devices(topology);
  std::map<std::string, double> per_link;
  for (const auto& [id, pci] : found.gpus) {
    GpuSite site;
    site.gpu.pci_bus_id = id;
    site.gpu.model = model_of(pci);
    site.place = place_of(topology, pci);
    site.gpu.numa_node = site.place->numa_node;
    hwloc_obj_t cpu_side = hwloc_get_non_io_ancestor_obj(topology, pci);
    if (cpu_side != nullptr) site.gpu.cpu_affinity = bitmap_list(cpu_side->cpuset);
    // GB/s as the file says it; a value no PCIe link has (NaN, inf, 1e30) is unknown.
    const double link = pci->attr->pcidev.linkspeed;
    site.pcie_gbps = std::isfinite(link) && link > 0 && link < kMaxLinkGbps ? link : 0;
    site.nvlink_gbps_per_link = nvlink_gbps_per_link(site.gpu.model, 0);
    per_link[id] = site.nvlink_gbps_per_link;
    draft.gpus.push_back(std::move(site));
  }
  bool has_matrix = false;
  bool guessed_rate = false;
  // Past kMaxGpus the file is refused anyway; do not pay for its matrices.
  if (found.gpus.size() <= kMaxGpus) {
    draft.nvlinks = nvlink_bundles(topology, found, per_link, has_matrix, guessed_rate);
  }
  draft.numa_nodes = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);

  if (found.gpus.empty()) {
    draft.notes.push_back("no NVIDIA GPU found");
  } else if (!has_matrix && !live) {
    draft.notes.push_back(found.switches.empty()
                              ? std::string("no NVLink data: PCIe/NUMA classes only")
                              : std::to_string(found.switches.size()) +
                                    " NVSwitch devices present but no NVLink data: PCIe/NUMA classes only");
  }
  if (guessed_rate) draft.notes.push_back("NVLink generation unknown: links counted at 25 GB/s each");
  std::string host = info(hwloc_get_root_obj(topology), "HostName");
  if (!host.empty()) draft.granule = "host:" + host;
  return draft;
}

// hwloc dlopens its plugins (PCI, libxml, OpenCL, GL) when a process's first
// topology is created and closes them with its last: 25 ms for every file.
// One idle topology kept for the life of the process loads them once. It is
// never destroyed: closing the plugins at exit gains nothing, and what they
// allocated (the OpenCL loader's tables) would then show up as leaks.
void keep_plugins_loaded() {
  static const hwloc_topology_t anchor = [] {
    hwloc_topology_t raw = nullptr;
    return hwloc_topology_init(&raw) == 0 ? raw : nullptr;
  }();
  (void)anchor;
}

Result<TopologyPtr> new_topology(const std::string& what) {
  keep_plugins_loaded();
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return system_error(what + ": hwloc cannot start: " + std::strerror(errno));
  TopologyPtr topology(raw);
  // Keep every bridge: dropping the uninteresting ones would merge the PCIe
  // switches that tell PIX from PXB.
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  return topology;
}

}  // namespace

Result<Draft> read_hwloc_xml(std::string_view content, std::string_view name, int xml_version) {
  const std::string label(name);
  // hwloc reads the XML of its own major version and older ones; a newer
  // one fails deep inside it with a reason that does not say so.
  const unsigned api = hwloc_get_api_version();
  const int major = static_cast<int>(api >> 16);
  if (xml_version > major) {
    const std::string here =
        std::to_string(major) + "." + std::to_string((api >> 8) & 0xff) + "." + std::to_string(api & 0xff);
    return unsupported(label + ": hwloc XML version " + std::to_string(xml_version) + ".0 is hwloc " +
                       std::to_string(xml_version) + "'s format; Dew reads hwloc XML with the hwloc here, " + here +
                       ", which reads versions 1 to " + std::to_string(major) +
                       " (save the file with lstopo of hwloc " + std::to_string(major) +
                       " on that machine, or use its NCCL topology or nvidia-smi topo -m)");
  }
  auto topology = new_topology(label);
  if (!topology.ok()) return topology.error();
  // hwloc wants the buffer's size with its terminating NUL.
  const std::string buffer(content);
  if (buffer.size() >= static_cast<std::size_t>(INT32_MAX)) return invalid_argument(label + ": too large for hwloc");
  if (hwloc_topology_set_xmlbuffer(topology.value().get(), buffer.c_str(), static_cast<int>(buffer.size() + 1)) != 0) {
    return invalid_argument(label + ": hwloc cannot read this XML: " + std::strerror(errno));
  }
  if (hwloc_topology_load(topology.value().get()) != 0) {
    return invalid_argument(label + ": hwloc rejected it as a topology (" + std::strerror(errno) +
                            "): an element or attribute it needs is missing or invalid");
  }
  Draft draft = draft_of(topology.value().get(), false);
  draft.source = "hwloc XML v" + std::to_string(xml_version) + " (" + base_name(name) + ")";
  if (draft.granule.empty()) draft.granule = "file:" + base_name(name);
  return draft;
}

Result<Draft> read_hwloc_live() {
  auto topology = new_topology("this machine");
  if (!topology.ok()) return topology.error();
  if (hwloc_topology_load(topology.value().get()) != 0) {
    return unavailable(std::string("this machine: hwloc cannot read the topology: ") + std::strerror(errno));
  }
  Draft draft = draft_of(topology.value().get(), true);
  draft.source = "live: hwloc";
  return draft;
}

}  // namespace dew::topology::detail
