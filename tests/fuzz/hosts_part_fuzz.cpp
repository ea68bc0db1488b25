// libFuzzer target for a process's part of the pool's topology as it comes
// over the wire (decode_part), and hosts_graph and build_mesh over what it
// decodes. Input: byte 0 splits the rest into two parts (two processes).
// Checked: errors are one non-empty line; a decoded part encodes and
// decodes back to itself; a graph lists each claimed GPU once, with a
// square matrix; nothing crashes whatever the parts claim.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dew/pool_topology.h"
#include "fuzz_check.h"

namespace {

void check_message(const dew::Error& error) {
  FUZZ_CHECK(!error.message.empty());
  FUZZ_CHECK(error.message.find('\n') == std::string::npos);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > 4096) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::size_t cut = std::min<std::size_t>(data[0] * 8, text.size());
  std::vector<dew::mesh::HostPart> parts;
  for (const std::string& piece : {text.substr(0, cut), text.substr(cut)}) {
    auto part = dew::axes::decode_part(piece);
    if (!part.ok()) {
      check_message(part.error());
      continue;
    }
    auto again = dew::axes::decode_part(dew::axes::encode_part(part.value()));
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(again.value().gpus == part.value().gpus && again.value().host == part.value().host);
    parts.push_back(part.value());
  }
  if (parts.empty()) return 0;
  auto graph = dew::mesh::hosts_graph(parts);
  if (!graph.ok()) {
    check_message(graph.error());
    return 0;
  }
  const std::size_t n = graph.value().devices.size();
  FUZZ_CHECK(graph.value().bandwidth.size() == n * n);
  if (n > 0 && n <= 64) {
    auto built = dew::mesh::build_mesh(dew::mesh::MeshSpec{}, graph.value());
    if (!built.ok()) check_message(built.error());
  }
  return 0;
}
