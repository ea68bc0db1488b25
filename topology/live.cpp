// This machine, now: hwloc for where the GPUs sit, NVML (when the driver is
// there) for NVLinks and the NVLink fabric, the boot id for the host.
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "build.h"
#include "dew/nvml.h"
#include "dew/topology.h"

namespace dew::topology {
namespace detail {

void merge_nvml(Draft& draft, const NvmlReport& report, std::string_view boot_id) {
  if (!boot_id.empty()) draft.granule = "host:" + std::string(boot_id);
  if (!report.available) {
    draft.notes.push_back("NVML unavailable (" + report.problem + "): no NVLink data: PCIe/NUMA classes only");
    return;
  }
  draft.source += " + NVML";

  std::map<std::string, std::size_t> site_of;
  for (std::size_t i = 0; i < draft.gpus.size(); ++i) site_of.emplace(draft.gpus[i].gpu.pci_bus_id, i);
  std::set<std::string> nvml_gpus;
  for (const NvmlGpu& gpu : report.gpus) nvml_gpus.insert(gpu.pci_bus_id);

  std::set<std::string> fabrics;
  for (const NvmlGpu& gpu : report.gpus) {
    auto found = site_of.find(gpu.pci_bus_id);
    if (found == site_of.end()) {
      // NVML sees it, hwloc does not (a container hiding /sys): keep it,
      // without a PCIe place.
      GpuSite site;
      site.gpu.pci_bus_id = gpu.pci_bus_id;
      draft.gpus.push_back(std::move(site));
      found = site_of.emplace(gpu.pci_bus_id, draft.gpus.size() - 1).first;
      draft.notes.push_back("GPU " + gpu.pci_bus_id + " is seen by NVML but not by hwloc: its PCIe place is unknown");
    }
    GpuSite& site = draft.gpus[found->second];
    if (!gpu.model.empty()) site.gpu.model = gpu.model;  // the driver's name beats the PCI database's
    site.gpu.uuid = gpu.uuid;
    const double rate = nvlink_gbps_per_link(gpu.model, gpu.sm);
    if (rate > 0) site.nvlink_gbps_per_link = rate;
    for (const NvmlLinks& links : gpu.links) {
      NvLinkBundle bundle;
      bundle.gpu = gpu.pci_bus_id;
      bundle.links = links.links;
      const bool to_gpu = links.kind == NvmlPeer::kGpu ||
                          (links.kind == NvmlPeer::kUnknown && nvml_gpus.count(links.remote_bus_id) != 0);
      const bool to_switch =
          links.kind == NvmlPeer::kSwitch || (links.kind == NvmlPeer::kUnknown && !to_gpu && links.remote_is_nvidia);
      if (to_gpu) {
        bundle.peer = links.remote_bus_id;
      } else if (to_switch) {
        bundle.peer = "nvswitch:" + links.remote_bus_id;
        bundle.peer_is_switch = true;
      } else {
        continue;  // to a CPU: not a GPU-to-GPU path
      }
      draft.nvlinks.push_back(bundle);
    }
    if (!gpu.fabric.empty()) fabrics.insert(gpu.fabric);
  }
  if (!fabrics.empty()) {
    draft.granule = *fabrics.begin();
    if (fabrics.size() > 1) {
      draft.notes.push_back("this host's GPUs sit in " + std::to_string(fabrics.size()) +
                            " NVLink cliques; the granule is the first, " + *fabrics.begin());
    }
  }
}

}  // namespace detail

std::string read_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

Result<Topology> detect_topology() {
  auto draft = detail::read_hwloc_live();
  if (!draft.ok()) return draft.error();
  const std::string boot_id = read_boot_id();
  detail::merge_nvml(draft.value(), read_nvml(), boot_id);
  if (boot_id.empty() && draft.value().granule.empty()) {
    draft.value().granule = "host:unknown";
    draft.value().notes.push_back("no boot id in /proc/sys/kernel/random/boot_id: the host granule is unnamed");
  }
  return detail::assemble(std::move(draft.value()));
}

}  // namespace dew::topology
