// NCCL's topology XML (NCCL_TOPO_FILE, NCCL_TOPO_DUMP_FILE):
//   <system version="1">
//     <cpu numaid="0" affinity="0000ffff,0000ffff" arch="x86_64" ...>
//       <pci busid="0000:03:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
//         <pci busid="0000:07:00.0" class="0x030200" ...>
//           <gpu dev="0" sm="80" rank="0" gdr="1">
//             <nvlink target="0000:c3:00.0" count="2" tclass="0x068000"/>
// A <cpu> is a NUMA node and its root complex. NCCL folds each PCIe switch
// (upstream and downstream ports) into one <pci> of class 0x0604xx, so every
// bridge element here is a whole switch. An <nvlink> targets a GPU (its bus
// id), an NVSwitch (tclass 0x068000) or a CPU (POWER; not a GPU path).
#include <cctype>
#include <cstdlib>
#include <map>
#include <pugixml.hpp>
#include <set>
#include <string>
#include <vector>

#include "build.h"

namespace dew::topology::detail {
namespace {

// pugixml parses without recursion; this walk recurses, so bound it. Real
// files nest cpu > pci > pci > pci > gpu > nvlink: under 10.
constexpr int kMaxDepth = 64;
constexpr std::string_view kNvidiaVendor = "0x10de";

std::string lowercase(std::string text) {
  for (char& ch : text) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

struct Context {
  std::string root;
  std::vector<std::string> switches;
  std::optional<int> numa_node;
  std::string cpu_affinity;
};

struct RawLink {
  std::string gpu;
  std::string target;
  int count = 0;
  std::string tclass;
};

struct Reader {
  std::string name;
  Draft draft;
  std::vector<RawLink> links;
  std::set<std::string> bus_ids;
  std::set<std::string> numa_ids;
  int cpus = 0;

  Error fail(const std::string& problem) const { return invalid_argument(name + ": " + problem); }

  std::optional<Error> walk(pugi::xml_node node, const Context& context, int depth) {
    if (depth > kMaxDepth) return fail("elements nested more than " + std::to_string(kMaxDepth) + " deep");
    for (pugi::xml_node child : node.children()) {
      if (child.type() != pugi::node_element) continue;
      const std::string tag = child.name();
      std::optional<Error> error;
      if (tag == "cpu") {
        error = cpu(child, depth);
      } else if (tag == "pci") {
        error = pci(child, context, depth);
      } else if (tag == "gpu") {
        error = fail("<gpu dev=\"" + printable(child.attribute("dev").value()) +
                     "\"> outside a <pci> element: no bus id for it");
      }
      if (error) return error;
    }
    return std::nullopt;
  }

  std::optional<Error> cpu(pugi::xml_node node, int depth) {
    Context context;
    const std::string numaid = node.attribute("numaid").value();
    context.root = "cpu#" + std::to_string(cpus++);
    // NCCL writes numaid="-1" inside VMs: the node is unknown, not wrong.
    if (!numaid.empty() && numaid != "-1") {
      char* end = nullptr;
      long value = std::strtol(numaid.c_str(), &end, 10);
      if (end == numaid.c_str() || *end != '\0' || value < 0 || value > 1 << 20) {
        return fail("<cpu numaid=\"" + printable(numaid) + "\"> is not allowed; allowed: a NUMA node number or -1");
      }
      context.numa_node = static_cast<int>(value);
      numa_ids.insert(numaid);
    }
    if (pugi::xml_attribute affinity = node.attribute("affinity")) {
      auto list = cpumask_to_list(affinity.value());
      if (!list.ok()) return fail("<cpu numaid=\"" + printable(numaid) + "\">: " + list.error().message);
      context.cpu_affinity = list.value();
    }
    return walk(node, context, depth + 1);
  }

  std::optional<Error> pci(pugi::xml_node node, const Context& context, int depth) {
    const std::string raw = node.attribute("busid").value();
    auto bus_id = normalize_pci_bus_id(raw);
    if (!bus_id) {
      return fail("<pci busid=\"" + printable(raw) + "\"> is not a PCI address (domain:bus:device.function)");
    }
    if (!bus_ids.insert(*bus_id).second) return fail("two <pci> elements have busid " + *bus_id);
    const std::string pci_class = node.attribute("class").value();
    pugi::xml_node gpu = node.child("gpu");
    // A GPU: a <gpu> child (NCCL's own dumps), or a display controller
    // (class 0x03xxxx) without one, as cloud images' topology files write
    // them (often with only a class: no vendor). NCCL reads every 0x03xxxx
    // as a GPU; only a vendor attribute naming another vendor says it is not.
    const std::string vendor = lowercase(node.attribute("vendor").value());
    const bool display_gpu = pci_class.rfind("0x03", 0) == 0 && (vendor.empty() || vendor == kNvidiaVendor);
    if (gpu || display_gpu) return add_gpu(node, gpu, *bus_id, context);
    if (pci_class.rfind("0x0604", 0) == 0) {  // a PCIe switch
      Context below = context;
      below.switches.push_back(*bus_id);
      return walk(node, below, depth + 1);
    }
    return std::nullopt;  // a NIC, an NVMe drive: not on any GPU's path
  }

  std::optional<Error> add_gpu(pugi::xml_node pci_node, pugi::xml_node gpu, const std::string& bus_id,
                               const Context& context) {
    GpuSite site;
    site.gpu.pci_bus_id = bus_id;
    site.gpu.numa_node = context.numa_node;
    site.gpu.cpu_affinity = context.cpu_affinity;
    site.place = PciPlace{context.root, context.switches, context.numa_node};
    const int sm = gpu ? gpu.attribute("sm").as_int(0) : 0;
    site.nvlink_gbps_per_link = nvlink_gbps_per_link("", sm);
    // link_speed="16.0 GT/s PCIe", link_width="16".
    const double rate = std::strtod(pci_node.attribute("link_speed").value(), nullptr);
    site.pcie_gbps = pcie_link_gbps(rate, pci_node.attribute("link_width").as_int(0));
    // NVLinks sit under <gpu>; a file without one may give them under <pci>.
    for (pugi::xml_node link : (gpu ? gpu : pci_node).children("nvlink")) {
      const std::string target = link.attribute("target").value();
      const std::string count_text = link.attribute("count").value();
      char* end = nullptr;
      const long count = std::strtol(count_text.c_str(), &end, 10);
      if (count_text.empty() || *end != '\0' || count <= 0 || count > 1024) {
        draft.notes.push_back("dropped <nvlink target=\"" + printable(target) + "\" count=\"" + printable(count_text) +
                              "\"> of GPU " + bus_id + ": the count must be 1 to 1024 links");
        continue;
      }
      links.push_back(
          RawLink{bus_id, normalize_pci_bus_id(target).value_or(target), int(count), link.attribute("tclass").value()});
    }
    draft.gpus.push_back(std::move(site));
    return std::nullopt;
  }
};

}  // namespace

Result<Draft> read_nccl_xml(std::string_view content, std::string_view name) {
  Reader reader;
  reader.name = std::string(name);
  pugi::xml_document document;
  pugi::xml_parse_result parsed =
      document.load_buffer(content.data(), content.size(), pugi::parse_default, pugi::encoding_utf8);
  if (!parsed) return reader.fail(std::string("malformed XML: ") + parsed.description());
  pugi::xml_node system = document.child("system");
  if (!system) return reader.fail("no <system> element: not NCCL topology XML");

  if (auto error = reader.walk(system, Context{"system", {}, std::nullopt, ""}, 0)) return *error;

  Draft& draft = reader.draft;
  std::set<std::string> gpu_ids;
  for (const GpuSite& site : draft.gpus) gpu_ids.insert(site.gpu.pci_bus_id);
  for (const RawLink& raw : reader.links) {
    NvLinkBundle bundle;
    bundle.gpu = raw.gpu;
    bundle.links = raw.count;
    if (raw.target == raw.gpu) {
      draft.notes.push_back("dropped an NVLink of GPU " + raw.gpu + " to itself");
      continue;
    }
    if (gpu_ids.count(raw.target) != 0) {
      bundle.peer = raw.target;
    } else if (raw.tclass == "0x068000") {
      bundle.peer = "nvswitch:" + raw.target;
      bundle.peer_is_switch = true;
    } else if (raw.tclass.rfind("0x0600", 0) == 0) {
      continue;  // to a CPU (POWER's NVLink to the host): no GPU-to-GPU path
    } else {
      draft.notes.push_back("dropped an NVLink of GPU " + raw.gpu + " to " + printable(raw.target) +
                            ": no GPU with that bus id in the file, and not an NVSwitch (tclass 0x068000)");
      continue;
    }
    draft.nvlinks.push_back(bundle);
  }
  draft.numa_nodes = static_cast<int>(reader.numa_ids.size());
  if (draft.numa_nodes == 0) draft.numa_nodes = reader.cpus;
  draft.source = "NCCL topology XML (" + base_name(name) + ")";
  const std::string host_hash = system.child("cpu").attribute("host_hash").value();
  draft.granule = host_hash.empty() ? "file:" + base_name(name) : "host:" + host_hash;
  if (draft.gpus.empty()) draft.notes.push_back("no NVIDIA GPU found");
  if (draft.gpus.size() > 1 && reader.links.empty()) {
    draft.notes.push_back(
        "no NVLink data in the file: GPU pairs are classed by PCIe alone (NCCL's dump on a "
        "machine with NVLink lists them under each <gpu>)");
  }
  return std::move(reader.draft);
}

}  // namespace dew::topology::detail
