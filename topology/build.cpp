// The rules that turn where GPUs sit and which NVLinks leave them into the
// classes and bandwidths of a Topology. Pure: no hwloc, no files, no NVML.
#include "build.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

namespace dew::topology::detail {
namespace {

constexpr long long kMaxLinks = 1 << 20;

bool contains_nocase(std::string_view text, std::string_view word) {
  if (word.size() > text.size()) return false;
  for (std::size_t i = 0; i + word.size() <= text.size(); ++i) {
    bool same = true;
    for (std::size_t k = 0; k < word.size() && same; ++k) {
      same = std::tolower(static_cast<unsigned char>(text[i + k])) == std::tolower(static_cast<unsigned char>(word[k]));
    }
    if (same) return true;
  }
  return false;
}

std::optional<unsigned long> parse_hex(std::string_view text, std::size_t max_digits) {
  if (text.empty() || text.size() > max_digits) return std::nullopt;
  unsigned long value = 0;
  for (char c : text) {
    int digit = 0;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    value = value * 16 + static_cast<unsigned long>(digit);
  }
  return value;
}

// The bandwidth one GPU's NVLinks carry, and whether it had to be guessed.
std::pair<double, bool> bundle_gbps(const NvLinkBundle& bundle, const GpuSite& site, double fallback) {
  if (bundle.gbps > 0) return {bundle.gbps, false};
  if (site.nvlink_gbps_per_link > 0) return {bundle.links * site.nvlink_gbps_per_link, false};
  return {bundle.links * fallback, true};
}

}  // namespace

PathClass pcie_path_class(const PciPlace& a, const PciPlace& b, bool single_numa) {
  if (a.root == b.root) {
    std::size_t shared = 0;
    while (shared < a.switches.size() && shared < b.switches.size() && a.switches[shared] == b.switches[shared]) {
      ++shared;
    }
    // No shared switch: the lowest common point is the host bridge itself.
    if (shared == 0) return PathClass::kPHB;
    // Both hang straight off the deepest shared switch: one switch crossed.
    if (a.switches.size() == shared && b.switches.size() == shared) return PathClass::kPIX;
    return PathClass::kPXB;
  }
  if (a.numa_node && b.numa_node) return *a.numa_node == *b.numa_node ? PathClass::kNODE : PathClass::kSYS;
  return single_numa ? PathClass::kNODE : PathClass::kSYS;
}

NvLinkMatrix nvlink_matrix(const std::vector<GpuSite>& gpus, const std::vector<NvLinkBundle>& bundles,
                           double fallback_gbps_per_link) {
  const std::size_t n = gpus.size();
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < n; ++i) index.emplace(gpus[i].gpu.pci_bus_id, i);

  // Sums in 64 bits, clamped when stored: a hostile file may list millions
  // of bundles.
  std::vector<long long> one_way_links(n * n, 0);
  std::vector<double> one_way_gbps(n * n, 0);
  std::vector<long long> switch_links(n, 0);
  std::vector<double> switch_gbps(n, 0);
  NvLinkMatrix out{std::vector<int>(n * n, 0), std::vector<double>(n * n, 0), false};

  for (const NvLinkBundle& bundle : bundles) {
    auto from = index.find(bundle.gpu);
    if (from == index.end() || bundle.links <= 0) continue;
    const std::size_t i = from->second;
    auto [gbps, guessed] = bundle_gbps(bundle, gpus[i], fallback_gbps_per_link);
    out.guessed_rate = out.guessed_rate || guessed;
    if (bundle.peer_is_switch) {
      switch_links[i] += bundle.links;
      switch_gbps[i] += gbps;
      continue;
    }
    auto to = index.find(bundle.peer);
    if (to == index.end() || to->second == i) continue;
    one_way_links[i * n + to->second] += bundle.links;
    one_way_gbps[i * n + to->second] += gbps;
  }

  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      // A direct bundle is usually reported from both of its ends: once.
      long long links = std::max(one_way_links[i * n + j], one_way_links[j * n + i]);
      double gbps = std::max(one_way_gbps[i * n + j], one_way_gbps[j * n + i]);
      if (switch_links[i] > 0 && switch_links[j] > 0) {
        links += std::min(switch_links[i], switch_links[j]);
        gbps += std::min(switch_gbps[i], switch_gbps[j]);
      }
      out.links[i * n + j] = static_cast<int>(std::min(links, kMaxLinks));
      out.gbps[i * n + j] = gbps;
    }
  }
  return out;
}

double nvlink_gbps_per_link(std::string_view model, int sm) {
  // One link, one direction, as NVIDIA specifies each generation.
  switch (sm) {
    case 60:
      return 20.0;  // NVLink 1 (P100)
    case 70:
    case 72:
    case 75:
      return 25.0;  // NVLink 2 (V100, Xavier, Turing)
    case 80:
      return 25.0;  // NVLink 3 (A100)
    case 86:
      return 14.0625;  // NVLink 3 on GA10x (RTX 3090, A40, A6000)
    case 90:
      return 25.0;  // NVLink 4 (H100, H200)
    case 100:
    case 103:
      return 50.0;  // NVLink 5 (B200, GB200, B300)
    default:
      break;
  }
  // Names: the more specific first ("A100" before "A10").
  struct Rule {
    std::string_view word;
    double gbps;
  };
  static constexpr std::array<Rule, 19> kRules{{
      {"P100", 20.0},     {"V100", 25.0},   {"A100", 25.0},        {"A800", 25.0},         {"A30", 25.0},
      {"H100", 25.0},     {"H200", 25.0},   {"H800", 25.0},        {"H20", 25.0},          {"B200", 50.0},
      {"B100", 50.0},     {"B300", 50.0},   {"RTX 3090", 14.0625}, {"A6000", 14.0625},     {"A5000", 14.0625},
      {"A4500", 14.0625}, {"A40", 14.0625}, {"TITAN V", 25.0},     {"Quadro GV100", 25.0},
  }};
  for (const Rule& rule : kRules) {
    if (contains_nocase(model, rule.word)) return rule.gbps;
  }
  return 0.0;
}

double pcie_link_gbps(double gigatransfers, int width) {
  // PCIe 7.0 runs 128 GT/s and links are at most x32: anything beyond is no
  // PCIe link, so unknown.
  if (!(gigatransfers > 0) || gigatransfers > 1000 || width <= 0 || width > 64) return 0.0;
  // PCIe 3.0 and later encode 128 bits in 130; 1.x and 2.0 use 8b/10b.
  const double efficiency = gigatransfers >= 8.0 ? 128.0 / 130.0 : 0.8;
  return gigatransfers * width * efficiency / 8.0;
}

double pcie_bandwidth_gbps(PathClass path, double pcie_gbps) {
  // Share of the slower end's link two GPUs reach, by how far apart they
  // are (docs/design/topology.md). SYS: 0.4 x 15.75 = 6.3 GB/s, what an
  // all-to-all moved across the sockets of a PCIe 3.0 box of RTX 3090s.
  switch (path) {
    case PathClass::kPIX:
      return pcie_gbps * 1.0;
    case PathClass::kPXB:
      return pcie_gbps * 0.9;
    case PathClass::kPHB:
      return pcie_gbps * 0.7;
    case PathClass::kNODE:
      return pcie_gbps * 0.6;
    case PathClass::kSYS:
      return pcie_gbps * 0.4;
    default:
      return 0.0;
  }
}

Result<std::string> cpumask_to_list(std::string_view mask) {
  // Words are 32 bits; 1024 of them is 32768 CPUs, far above any machine.
  constexpr std::size_t kMaxWords = 1024;
  std::vector<std::uint32_t> words;  // most significant first, as written
  std::size_t start = 0;
  while (true) {
    std::size_t comma = mask.find(',', start);
    std::string_view word =
        mask.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (word.size() > 2 && word[0] == '0' && (word[1] == 'x' || word[1] == 'X')) word.remove_prefix(2);
    if (word.empty()) {
      words.push_back(0);  // hwloc writes all-zero words as nothing: "0x3,,0x0"
    } else {
      auto value = parse_hex(word, 8);
      if (!value) {
        return invalid_argument("cpu mask '" + printable(mask) +
                                "' is not allowed; allowed: comma-separated words of up to 8 hex digits");
      }
      words.push_back(static_cast<std::uint32_t>(*value));
    }
    if (words.size() > kMaxWords) {
      return invalid_argument("cpu mask has more than " + std::to_string(kMaxWords) + " words; allowed: at most " +
                              std::to_string(kMaxWords));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  std::string out;
  long run_start = -1;
  long previous = -2;
  auto flush = [&] {
    if (run_start < 0) return;
    if (!out.empty()) out += ',';
    out += std::to_string(run_start);
    if (previous > run_start) out += "-" + std::to_string(previous);
  };
  const long total_bits = static_cast<long>(words.size()) * 32;
  for (long bit = 0; bit < total_bits; ++bit) {
    const std::uint32_t word = words[words.size() - 1 - static_cast<std::size_t>(bit / 32)];
    if (((word >> (bit % 32)) & 1u) == 0) continue;
    if (bit != previous + 1) {
      flush();
      run_start = bit;
    }
    previous = bit;
  }
  flush();
  return out;
}

std::optional<std::string> normalize_pci_bus_id(std::string_view text) {
  // [domain:]bus:device[.function], all hex.
  std::size_t last_colon = text.rfind(':');
  if (last_colon == std::string_view::npos) return std::nullopt;
  std::string_view head = text.substr(0, last_colon);
  std::string_view tail = text.substr(last_colon + 1);
  std::string_view domain_text = "0";
  std::string_view bus_text = head;
  if (std::size_t colon = head.find(':'); colon != std::string_view::npos) {
    domain_text = head.substr(0, colon);
    bus_text = head.substr(colon + 1);
  }
  std::string_view device_text = tail;
  std::string_view function_text = "0";
  if (std::size_t dot = tail.find('.'); dot != std::string_view::npos) {
    device_text = tail.substr(0, dot);
    function_text = tail.substr(dot + 1);
  }
  auto domain = parse_hex(domain_text, 8);
  auto bus = parse_hex(bus_text, 2);
  auto device = parse_hex(device_text, 2);
  auto function = parse_hex(function_text, 1);
  if (!domain || !bus || !device || !function || *device > 0x1f || *function > 7) return std::nullopt;
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%04lx:%02lx:%02lx.%lx", *domain, *bus, *device, *function);
  return std::string(buffer);
}

std::string base_name(std::string_view path) {
  std::size_t slash = path.find_last_of('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

namespace {

// What assemble() had to guess, said once each in the notes.
struct Guesses {
  bool nvlink_rate = false;
  bool pcie = false;
  bool unknown_path = false;
};

// The class and NVLink count of pair (i, j), and the NVLinks' bandwidth:
// as the source states them, or from the places and bundles it gives.
PathClass pair_path(const Draft& draft, const NvLinkMatrix& nv, std::size_t i, std::size_t j, int& links,
                    double& nvlink_gbps, Guesses& guessed) {
  const auto& sites = draft.gpus;
  const std::size_t at = i * sites.size() + j;
  if (!draft.given_path.empty()) {
    const PathClass path = draft.given_path[at];
    links = path == PathClass::kNVLink ? draft.given_nvlinks[at] : 0;
    if (links > 0) {
      double rate = std::min(sites[i].nvlink_gbps_per_link, sites[j].nvlink_gbps_per_link);
      if (!(rate > 0)) {
        rate = kDefaultNvlinkGbpsPerLink;
        guessed.nvlink_rate = true;
      }
      nvlink_gbps = links * rate;
    }
    return path;
  }
  links = nv.links[at];
  nvlink_gbps = nv.gbps[at];
  if (links > 0) return PathClass::kNVLink;
  if (sites[i].place && sites[j].place) return pcie_path_class(*sites[i].place, *sites[j].place, draft.numa_nodes <= 1);
  return PathClass::kUnknown;
}

// PCIe bandwidth of a pair: the slower of the two GPUs' links, or Gen3 x16.
double pcie_gbps(const GpuSite& a, const GpuSite& b, PathClass path, Guesses& guessed) {
  double link = (a.pcie_gbps > 0 && b.pcie_gbps > 0) ? std::min(a.pcie_gbps, b.pcie_gbps)
                                                     : (a.pcie_gbps > 0 ? a.pcie_gbps : b.pcie_gbps);
  if (!(link > 0)) {
    link = kDefaultPcieGbps;
    guessed.pcie = true;
  }
  return pcie_bandwidth_gbps(path, link);
}

void fill_matrices(const Draft& draft, Topology& topology, Guesses& guessed) {
  const std::size_t n = draft.gpus.size();
  NvLinkMatrix nv = nvlink_matrix(draft.gpus, draft.nvlinks, kDefaultNvlinkGbpsPerLink);
  guessed.nvlink_rate = nv.guessed_rate;
  topology.path.assign(n * n, PathClass::kUnknown);
  topology.nvlinks.assign(n * n, 0);
  topology.bandwidth_gbps.assign(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t at = i * n + j;
      if (i == j) {
        topology.path[at] = PathClass::kSelf;
        continue;
      }
      int links = 0;
      double nvlink_gbps = 0;
      const PathClass path = pair_path(draft, nv, i, j, links, nvlink_gbps, guessed);
      topology.path[at] = path;
      topology.nvlinks[at] = links;
      if (path == PathClass::kNVLink) {
        topology.bandwidth_gbps[at] = nvlink_gbps;
      } else if (path == PathClass::kUnknown) {
        guessed.unknown_path = true;
      } else {
        topology.bandwidth_gbps[at] = pcie_gbps(draft.gpus[i], draft.gpus[j], path, guessed);
      }
    }
  }
}

}  // namespace

Topology assemble(Draft draft) {
  Topology topology;
  topology.source = std::move(draft.source);
  topology.numa_nodes = draft.numa_nodes;
  topology.granule = std::move(draft.granule);
  std::vector<GpuSite>& sites = draft.gpus;
  // CUDA_DEVICE_ORDER=PCI_BUS_ID order, when every GPU has a bus id (given
  // matrices keep the order the file numbers them in).
  const bool all_bus_ids =
      std::all_of(sites.begin(), sites.end(), [](const GpuSite& s) { return !s.gpu.pci_bus_id.empty(); });
  if (draft.given_path.empty() && all_bus_ids) {
    std::stable_sort(sites.begin(), sites.end(),
                     [](const GpuSite& a, const GpuSite& b) { return a.gpu.pci_bus_id < b.gpu.pci_bus_id; });
  }
  Guesses guessed;
  fill_matrices(draft, topology, guessed);
  for (std::size_t i = 0; i < sites.size(); ++i) {
    topology.gpus.push_back(std::move(sites[i].gpu));
    topology.gpus.back().index = static_cast<int>(i);
  }
  std::vector<std::string> notes = std::move(draft.notes);
  if (guessed.nvlink_rate) notes.push_back("NVLink generation unknown: 25 GB/s per link assumed");
  if (guessed.pcie) notes.push_back("PCIe link speed unknown: Gen3 x16 (15.75 GB/s) assumed");
  if (guessed.unknown_path) {
    notes.push_back("some GPU pairs have no path class: the source does not place every GPU on PCIe");
  }
  std::set<std::string> seen;
  for (std::string& note : notes) {
    if (seen.insert(note).second) topology.notes.push_back(std::move(note));
  }
  return topology;
}

}  // namespace dew::topology::detail
