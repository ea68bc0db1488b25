#include "dew/pool_topology.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "dew/gpu_binding.h"
#include "dew/task_contract.h"
#include "dew/text.h"

namespace dew::axes {
namespace {

// An integer field in [low, high]; anything else (a float, a string, a huge
// number) is nullopt, never a conversion out of range.
std::optional<long long> whole(const nlohmann::json& j, long long low, long long high) {
  if (!j.is_number_integer()) return std::nullopt;
  const long long value =
      j.is_number_unsigned() && j.get<unsigned long long>() > 1ULL << 62 ? high + 1 : j.get<long long>();
  if (value < low || value > high) return std::nullopt;
  return value;
}

// The host's index of one CUDA_VISIBLE_DEVICES token: an index below its
// GPU count, or a GPU's UUID (as CUDA, a prefix naming one GPU alone).
Result<int> host_index(const topology::Topology& host, const std::string& token, const std::string& host_name) {
  if (auto index = parse_whole<int>(token)) {
    if (*index < static_cast<int>(host.gpus.size())) return *index;
    return invalid_argument("host " + host_name + ": CUDA_VISIBLE_DEVICES names GPU " + token + ", but the host has " +
                            counted(static_cast<long long>(host.gpus.size()), "GPU") + "; allowed: indices 0.." +
                            std::to_string(host.gpus.size() - 1) + " or the UUIDs of its GPUs");
  }
  std::optional<int> found;
  for (const topology::Gpu& gpu : host.gpus) {
    if (gpu.uuid.empty() || gpu.uuid.rfind(token, 0) != 0) continue;
    if (found) {
      return invalid_argument("host " + host_name + ": CUDA_VISIBLE_DEVICES entry " + dew::quoted(token) +
                              " names more than one GPU; allowed: a whole UUID or an index");
    }
    found = gpu.index;
  }
  if (found) return *found;
  return invalid_argument("host " + host_name + ": CUDA_VISIBLE_DEVICES entry " + dew::quoted(token) +
                          " is not the UUID of a GPU in its topology (" + host.source +
                          "; topology files list no UUIDs); allowed: indices, or the UUIDs live NVML reports");
}

}  // namespace

// Which GPUs the process owns is bind_gpus's rule, as the plugin and dew
// launch apply it: those CUDA_VISIBLE_DEVICES lists (indices or UUIDs, each
// resolved on the host, refused when it names no GPU there); without it, the
// process's share by local rank, as --devices-per-process would bind it.
Result<mesh::HostPart> local_part(const topology::Topology& host, const LocalFacts& f) {
  mesh::HostPart part;
  part.process = f.process;
  part.host = f.host_id;
  part.host_name = f.host_name;
  part.host_gpus = static_cast<int>(host.gpus.size());
  part.bandwidth = host.bandwidth_gbps;
  // A live NVLink domain ("<cluster uuid>/<clique>") spans hosts; "host:..."
  // and a file's name do not.
  const bool domain = !f.topology_from_file && !host.granule.empty() && host.granule.rfind("host:", 0) != 0;
  part.granule = domain ? host.granule : "host:" + f.host_id;
  if (part.host_gpus == 0) {
    return unavailable("host " + f.host_name + " has no GPUs in its topology (" + host.source + ")");
  }
  GpuBindingInput input;
  input.visible_devices = f.visible_devices;
  input.gpu_count = static_cast<unsigned>(part.host_gpus);
  input.local_process = static_cast<unsigned>(std::max(f.local_rank, 0));
  input.local_process_count = static_cast<unsigned>(std::max(f.local_size, 1));
  input.place = "host " + f.host_name;
  if (!f.visible_devices) {
    if (f.local_size < 1 || part.host_gpus % f.local_size != 0) {
      return invalid_argument("host " + f.host_name + ": " + counted(part.host_gpus, "GPU") + " do not split over " +
                              counted(f.local_size, "process", "processes") +
                              " there; allowed: CUDA_VISIBLE_DEVICES, or a process count dividing " +
                              std::to_string(part.host_gpus));
    }
    input.devices_per_process = static_cast<unsigned>(part.host_gpus / f.local_size);
  }
  auto binding = bind_gpus(input);
  if (!binding.ok()) return binding.error();
  const std::string owned = binding.value().visible_devices.value_or(f.visible_devices.value_or(""));
  if (owned.empty() || owned == "NoDevFiles") {
    return unavailable("host " + f.host_name + ": process " + std::to_string(f.process) +
                       " sees no GPU (CUDA_VISIBLE_DEVICES=" + dew::quoted(owned) + ")");
  }
  for (const std::string& token : split(owned, ',')) {
    auto index = host_index(host, token, f.host_name);
    if (!index.ok()) return index.error();
    part.gpus.push_back(index.value());
  }
  return part;
}

std::string encode_part(const mesh::HostPart& p) {
  return nlohmann::json{{"process", p.process}, {"host", p.host},           {"host_name", p.host_name},
                        {"granule", p.granule}, {"host_gpus", p.host_gpus}, {"bandwidth", p.bandwidth},
                        {"gpus", p.gpus}}
      .dump();
}

Result<mesh::HostPart> decode_part(std::string_view text) {
  const auto bad = [](const std::string& what) {
    return invalid_argument("pool topology: a process sent a part that is not one: " + what);
  };
  try {
    const auto j = nlohmann::json::parse(text);
    if (!j.is_object()) return bad("not a JSON object");
    mesh::HostPart p;
    const auto process = whole(j.at("process"), 0, 1 << 24);
    const auto gpus = whole(j.at("host_gpus"), 0, 4096);
    if (!process || !gpus) return bad("process or host_gpus is not a whole number in range");
    p.process = int(*process);
    p.host_gpus = int(*gpus);
    p.host = j.at("host").get<std::string>();
    p.host_name = j.at("host_name").get<std::string>();
    p.granule = j.at("granule").get<std::string>();
    for (const auto& value : j.at("bandwidth")) {
      if (!value.is_number() || !std::isfinite(value.get<double>())) return bad("a bandwidth that is not a number");
      p.bandwidth.push_back(value.get<double>());
    }
    for (const auto& gpu : j.at("gpus")) {
      const auto index = whole(gpu, 0, 4095);
      if (!index) return bad("a GPU index that is not a whole number from 0 to 4095");
      p.gpus.push_back(int(*index));
    }
    if (p.bandwidth.size() != std::size_t(p.host_gpus) * std::size_t(p.host_gpus)) {
      return bad(std::to_string(p.host_gpus) + " GPUs and a " + std::to_string(p.bandwidth.size()) + "-value matrix");
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
}

mesh::DeviceGraph machine_graph(const topology::Topology& machine) {
  mesh::DeviceGraph graph;
  for (const topology::Gpu& gpu : machine.gpus) graph.devices.push_back({gpu.index, 0, machine.granule});
  graph.bandwidth = machine.bandwidth_gbps;
  return graph;
}

Result<mesh::DeviceGraph> files_device_graph(const std::vector<std::string>& files) {
  std::vector<mesh::HostPart> parts;
  for (std::size_t k = 0; k < files.size(); ++k) {
    auto loaded = topology::load_topology_file(files[k]);
    if (!loaded.ok()) return loaded.error();
    LocalFacts facts;
    facts.process = static_cast<int>(k);
    facts.host_id = "file" + std::to_string(k);
    facts.host_name = files[k];
    facts.topology_from_file = true;
    auto part = local_part(loaded.value(), facts);
    if (!part.ok()) return part.error();
    parts.push_back(std::move(part.value()));
  }
  return mesh::hosts_graph(parts);
}

Result<mesh::DeviceGraph> pool_device_graph(runtime::Pool& pool) {
  LocalFacts facts;
  const runtime::Identity& identity = pool.identity();
  facts.process = pool.rank();
  facts.local_rank = identity.local_rank;
  facts.local_size = identity.local_size;
  const char* host_id = std::getenv(contract::kHostId.name);
  facts.host_id = host_id && *host_id ? host_id : topology::read_boot_id();
  if (facts.host_id.empty()) facts.host_id = identity.hostname;
  facts.host_name = identity.hostname;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) facts.visible_devices = visible;
  const char* file = std::getenv(contract::kTopologyFile.name);
  facts.topology_from_file = file && *file;
  auto host = facts.topology_from_file ? topology::load_topology_file(file) : topology::detect_topology();
  // Every process takes part in the gather, even one whose host failed, so
  // that the others hear its error instead of waiting.
  std::string mine;
  Result<mesh::HostPart> part = host.ok() ? local_part(host.value(), facts) : Result<mesh::HostPart>(host.error());
  mine = part.ok() ? encode_part(part.value()) : "error:" + part.error().message;
  std::vector<mesh::HostPart> parts;
  const auto all = pool.all_gather(mine);
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (all[p].rfind("error:", 0) == 0) {
      return unavailable("pool topology: process " + std::to_string(p) + ": " + std::string(all[p].substr(6)));
    }
    auto decoded = decode_part(all[p]);
    if (!decoded.ok()) return decoded.error();
    parts.push_back(std::move(decoded.value()));
  }
  return mesh::hosts_graph(parts);
}

}  // namespace dew::axes
