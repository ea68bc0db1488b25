// NVML through dlopen: the only file that loads libnvidia-ml. The few types
// and calls Dew needs are declared here from NVML's documented C ABI, so
// there is no build dependency on nvml.h or the CUDA toolkit.
#include "dew/nvml.h"

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <string>

namespace dew::topology {
namespace {

// --- The slice of NVML's ABI used here (nvml.h, API version 12). ---
using NvmlReturn = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
using NvmlDevice = void*;  // nvmlDevice_t
constexpr NvmlReturn kNvmlSuccess = 0;

// nvmlPciInfo_t, v3 layout. Older layouts (v1, v2) share everything up to
// and including pciDeviceId, which is all that is read, and are smaller.
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;  // device id << 16 | vendor id
  unsigned pci_subsystem_id;
  char bus_id[32];
};

// nvmlGpuFabricInfo_t (R530 and later).
struct NvmlFabricInfo {
  unsigned char cluster_uuid[16];
  NvmlReturn status;
  unsigned clique_id;
  unsigned char state;  // 3: NVML_GPU_FABRIC_STATE_COMPLETED
};
constexpr unsigned char kFabricCompleted = 3;

// nvmlIntNvLinkDeviceType_t.
constexpr int kRemoteGpu = 0x00;
constexpr int kRemoteIbmNpu = 0x01;
constexpr int kRemoteSwitch = 0x02;

// NVML_NVLINK_MAX_LINKS: 18 since Hopper; earlier GPUs answer fewer.
constexpr unsigned kMaxLinks = 18;
constexpr unsigned kNvidiaVendor = 0x10de;

using InitFn = NvmlReturn (*)();
using ShutdownFn = NvmlReturn (*)();
using CountFn = NvmlReturn (*)(unsigned*);
using HandleFn = NvmlReturn (*)(unsigned, NvmlDevice*);
using PciInfoFn = NvmlReturn (*)(NvmlDevice, NvmlPciInfo*);
using NameFn = NvmlReturn (*)(NvmlDevice, char*, unsigned);
using ComputeFn = NvmlReturn (*)(NvmlDevice, int*, int*);
using LinkStateFn = NvmlReturn (*)(NvmlDevice, unsigned, int*);
using RemotePciFn = NvmlReturn (*)(NvmlDevice, unsigned, NvmlPciInfo*);
using RemoteTypeFn = NvmlReturn (*)(NvmlDevice, unsigned, int*);
using FabricFn = NvmlReturn (*)(NvmlDevice, NvmlFabricInfo*);
using ErrorStringFn = const char* (*)(NvmlReturn);

class Library {
 public:
  Library() : handle_(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) {
      const char* why = dlerror();
      problem_ = why != nullptr ? why : "libnvidia-ml.so.1 cannot be loaded";
    }
  }
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  [[nodiscard]] bool loaded() const { return handle_ != nullptr; }
  [[nodiscard]] const std::string& problem() const { return problem_; }

  // The first of `names` the library has (newer versioned names first).
  template <typename Fn>
  Fn find(std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      if (void* symbol = dlsym(handle_, name)) return reinterpret_cast<Fn>(symbol);
    }
    return nullptr;
  }

 private:
  void* handle_;
  std::string problem_;
};

std::string bus_id_of(const NvmlPciInfo& pci) {
  char buffer[32];
  // NVML reports the device's slot, not its function: GPUs are function 0.
  std::snprintf(buffer, sizeof buffer, "%04x:%02x:%02x.0", pci.domain, pci.bus & 0xff, pci.device & 0x1f);
  return buffer;
}

std::string uuid_text(const unsigned char (&uuid)[16]) {
  std::string out;
  char byte[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(byte, sizeof byte, "%02x", uuid[i]);
    out += byte;
  }
  return out;
}

}  // namespace

NvmlReport read_nvml() {
  NvmlReport report;
  Library nvml;
  if (!nvml.loaded()) {
    report.problem = nvml.problem();
    return report;
  }
  auto init = nvml.find<InitFn>({"nvmlInit_v2", "nvmlInit"});
  auto shutdown = nvml.find<ShutdownFn>({"nvmlShutdown"});
  auto count_devices = nvml.find<CountFn>({"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
  auto handle_of = nvml.find<HandleFn>({"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  auto pci_info = nvml.find<PciInfoFn>({"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"});
  auto name_of = nvml.find<NameFn>({"nvmlDeviceGetName"});
  auto compute = nvml.find<ComputeFn>({"nvmlDeviceGetCudaComputeCapability"});
  auto link_state = nvml.find<LinkStateFn>({"nvmlDeviceGetNvLinkState"});
  auto remote_pci = nvml.find<RemotePciFn>({"nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"});
  auto remote_type = nvml.find<RemoteTypeFn>({"nvmlDeviceGetNvLinkRemoteDeviceType"});
  auto fabric = nvml.find<FabricFn>({"nvmlDeviceGetGpuFabricInfo"});
  auto error_string = nvml.find<ErrorStringFn>({"nvmlErrorString"});

  if (init == nullptr || count_devices == nullptr || handle_of == nullptr || pci_info == nullptr) {
    report.problem = "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2 "
                     "or nvmlDeviceGetPciInfo";
    return report;
  }
  auto says = [&](NvmlReturn code) {
    const char* text = error_string != nullptr ? error_string(code) : nullptr;
    return text != nullptr ? std::string(text) : "NVML error " + std::to_string(code);
  };
  if (NvmlReturn code = init(); code != kNvmlSuccess) {
    report.problem = "nvmlInit failed: " + says(code);
    return report;
  }
  unsigned count = 0;
  if (NvmlReturn code = count_devices(&count); code != kNvmlSuccess) {
    report.problem = "nvmlDeviceGetCount failed: " + says(code);
    if (shutdown != nullptr) shutdown();
    return report;
  }
  report.available = true;
  for (unsigned index = 0; index < count && index < 1024; ++index) {
    NvmlDevice device = nullptr;
    NvmlPciInfo pci{};
    if (handle_of(index, &device) != kNvmlSuccess || pci_info(device, &pci) != kNvmlSuccess) continue;
    NvmlGpu gpu;
    gpu.pci_bus_id = bus_id_of(pci);
    if (name_of != nullptr) {
      char name[96] = {};
      if (name_of(device, name, sizeof name - 1) == kNvmlSuccess) gpu.model = name;
    }
    if (compute != nullptr) {
      int major = 0;
      int minor = 0;
      if (compute(device, &major, &minor) == kNvmlSuccess && major > 0 && major < 100) gpu.sm = major * 10 + minor;
    }
    if (link_state != nullptr && remote_pci != nullptr) {
      std::map<std::string, NvmlLinks> by_remote;
      for (unsigned link = 0; link < kMaxLinks; ++link) {
        int active = 0;
        NvmlPciInfo remote{};
        if (link_state(device, link, &active) != kNvmlSuccess || active == 0) continue;
        if (remote_pci(device, link, &remote) != kNvmlSuccess) continue;
        NvmlLinks& entry = by_remote[bus_id_of(remote)];
        entry.remote_bus_id = bus_id_of(remote);
        entry.remote_is_nvidia = (remote.pci_device_id & 0xffff) == kNvidiaVendor;
        int type = -1;
        if (remote_type != nullptr && remote_type(device, link, &type) == kNvmlSuccess) {
          entry.kind = type == kRemoteGpu      ? NvmlPeer::kGpu
                       : type == kRemoteSwitch ? NvmlPeer::kSwitch
                       : type == kRemoteIbmNpu ? NvmlPeer::kCpu
                                               : NvmlPeer::kUnknown;
        }
        ++entry.links;
      }
      for (auto& [id, entry] : by_remote) gpu.links.push_back(entry);
    }
    if (fabric != nullptr) {
      NvmlFabricInfo info{};
      if (fabric(device, &info) == kNvmlSuccess && info.state == kFabricCompleted && info.status == kNvmlSuccess) {
        gpu.fabric = uuid_text(info.cluster_uuid) + "/" + std::to_string(info.clique_id);
      }
    }
    report.gpus.push_back(std::move(gpu));
  }
  if (shutdown != nullptr) shutdown();
  return report;
}

}  // namespace dew::topology
