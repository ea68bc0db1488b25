// libFuzzer target for the topology loaders (topology/dew/topology.h): any bytes
// as a topology file, through format detection and the hwloc XML, NCCL XML
// and nvidia-smi text readers, then assembly. A loaded topology must be
// well-formed; an error must be one line naming the input. A violated
// invariant traps. Seeds: tests/fixtures/topology.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "dew/topology.h"
#include "fuzz_check.h"

namespace {

using dew::topology::PathClass;
using dew::topology::Topology;

constexpr std::string_view kName = "fuzz-input";

void check_topology(const Topology& t) {
  const std::size_t n = t.size();
  FUZZ_CHECK(t.path.size() == n * n);
  FUZZ_CHECK(t.nvlinks.size() == n * n);
  FUZZ_CHECK(t.bandwidth_gbps.size() == n * n);
  FUZZ_CHECK(t.numa_nodes >= 0);
  FUZZ_CHECK(!t.source.empty());
  FUZZ_CHECK(!t.granule.empty());
  for (std::size_t i = 0; i < n; ++i) {
    FUZZ_CHECK(t.gpus[i].index == static_cast<int>(i));
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t at = i * n + j;
      const std::size_t mirror = j * n + i;
      FUZZ_CHECK((t.path[at] == PathClass::kSelf) == (i == j));
      FUZZ_CHECK(t.path[at] == t.path[mirror]);
      FUZZ_CHECK(t.nvlinks[at] == t.nvlinks[mirror]);
      FUZZ_CHECK((t.path[at] == PathClass::kNVLink) == (t.nvlinks[at] > 0));
      FUZZ_CHECK(std::isfinite(t.bandwidth_gbps[at]) && t.bandwidth_gbps[at] >= 0);
      FUZZ_CHECK(t.bandwidth_gbps[at] == t.bandwidth_gbps[mirror]);
      // Any link beats no link: NVLink pairs are never slower than zero.
      if (t.path[at] == PathClass::kNVLink) FUZZ_CHECK(t.bandwidth_gbps[at] > 0);
      const std::string label = dew::topology::path_class_label(t.path[at], t.nvlinks[at]);
      FUZZ_CHECK(!label.empty());
    }
  }
  for (const std::string& note : t.notes) FUZZ_CHECK(!note.empty() && note.find('\n') == std::string::npos);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view content(reinterpret_cast<const char*>(data), size);
  const auto format = dew::topology::detect_topology_format(content);
  FUZZ_CHECK(!dew::topology::format_name(format).empty());
  const auto result = dew::topology::parse_topology_text(content, kName);
  if (result.ok()) {
    check_topology(result.value());
  } else {
    const std::string& message = result.error().message;
    FUZZ_CHECK(message.rfind(std::string(kName) + ": ", 0) == 0);
    FUZZ_CHECK(message.size() > kName.size() + 2);
    // One line, whatever bytes the input held (messages quote input text).
    FUZZ_CHECK(message.find('\n') == std::string::npos);
  }
  return 0;
}
