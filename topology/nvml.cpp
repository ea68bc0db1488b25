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
using NvmlReturn = int;    // nvmlReturn_t; 0 is NVML_SUCCESS
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
using UuidFn = NvmlReturn (*)(NvmlDevice, char*, unsigned);
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

// The NVML calls Dew makes, found in the loaded library (nullptr: absent).
struct Calls {
  InitFn init;
  ShutdownFn shutdown;
  CountFn count_devices;
  HandleFn handle_of;
  PciInfoFn pci_info;
  NameFn name_of;
  UuidFn uuid_of;
  ComputeFn compute;
  LinkStateFn link_state;
  RemotePciFn remote_pci;
  RemoteTypeFn remote_type;
  FabricFn fabric;
  ErrorStringFn error_string;

  explicit Calls(Library& nvml)
      : init(nvml.find<InitFn>({"nvmlInit_v2", "nvmlInit"})),
        shutdown(nvml.find<ShutdownFn>({"nvmlShutdown"})),
        count_devices(nvml.find<CountFn>({"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"})),
        handle_of(nvml.find<HandleFn>({"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"})),
        pci_info(nvml.find<PciInfoFn>({"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"})),
        name_of(nvml.find<NameFn>({"nvmlDeviceGetName"})),
        uuid_of(nvml.find<UuidFn>({"nvmlDeviceGetUUID"})),
        compute(nvml.find<ComputeFn>({"nvmlDeviceGetCudaComputeCapability"})),
        link_state(nvml.find<LinkStateFn>({"nvmlDeviceGetNvLinkState"})),
        remote_pci(nvml.find<RemotePciFn>({"nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"})),
        remote_type(nvml.find<RemoteTypeFn>({"nvmlDeviceGetNvLinkRemoteDeviceType"})),
        fabric(nvml.find<FabricFn>({"nvmlDeviceGetGpuFabricInfo"})),
        error_string(nvml.find<ErrorStringFn>({"nvmlErrorString"})) {}

  std::string says(NvmlReturn code) const {
    const char* text = error_string != nullptr ? error_string(code) : nullptr;
    return text != nullptr ? std::string(text) : "NVML error " + std::to_string(code);
  }
};

// The active NVLinks of one GPU, bundled by the device at their far end.
std::vector<NvmlLinks> links_of(const Calls& nvml, NvmlDevice device) {
  std::map<std::string, NvmlLinks> by_remote;
  for (unsigned link = 0; link < kMaxLinks; ++link) {
    int active = 0;
    NvmlPciInfo remote{};
    if (nvml.link_state(device, link, &active) != kNvmlSuccess || active == 0) continue;
    if (nvml.remote_pci(device, link, &remote) != kNvmlSuccess) continue;
    NvmlLinks& entry = by_remote[bus_id_of(remote)];
    entry.remote_bus_id = bus_id_of(remote);
    entry.remote_is_nvidia = (remote.pci_device_id & 0xffff) == kNvidiaVendor;
    int type = -1;
    if (nvml.remote_type != nullptr && nvml.remote_type(device, link, &type) == kNvmlSuccess) {
      entry.kind = type == kRemoteGpu      ? NvmlPeer::kGpu
                   : type == kRemoteSwitch ? NvmlPeer::kSwitch
                   : type == kRemoteIbmNpu ? NvmlPeer::kCpu
                                           : NvmlPeer::kUnknown;
    }
    ++entry.links;
  }
  std::vector<NvmlLinks> links;
  for (auto& [id, entry] : by_remote) links.push_back(entry);
  return links;
}

NvmlGpu gpu_of(const Calls& nvml, NvmlDevice device, const NvmlPciInfo& pci) {
  NvmlGpu gpu;
  gpu.pci_bus_id = bus_id_of(pci);
  if (nvml.name_of != nullptr) {
    char name[96] = {};
    if (nvml.name_of(device, name, sizeof name - 1) == kNvmlSuccess) gpu.model = name;
  }
  if (nvml.uuid_of != nullptr) {
    char uuid[96] = {};  // NVML_DEVICE_UUID_V2_BUFFER_SIZE is 96
    if (nvml.uuid_of(device, uuid, sizeof uuid - 1) == kNvmlSuccess) gpu.uuid = uuid;
  }
  if (nvml.compute != nullptr) {
    int major = 0;
    int minor = 0;
    if (nvml.compute(device, &major, &minor) == kNvmlSuccess && major > 0 && major < 100) gpu.sm = major * 10 + minor;
  }
  if (nvml.link_state != nullptr && nvml.remote_pci != nullptr) gpu.links = links_of(nvml, device);
  if (nvml.fabric != nullptr) {
    NvmlFabricInfo info{};
    if (nvml.fabric(device, &info) == kNvmlSuccess && info.state == kFabricCompleted && info.status == kNvmlSuccess) {
      gpu.fabric = uuid_text(info.cluster_uuid) + "/" + std::to_string(info.clique_id);
    }
  }
  return gpu;
}

}  // namespace

NvmlReport read_nvml() {
  NvmlReport report;
  Library library;
  if (!library.loaded()) {
    report.problem = library.problem();
    return report;
  }
  const Calls nvml(library);
  if (nvml.init == nullptr || nvml.count_devices == nullptr || nvml.handle_of == nullptr || nvml.pci_info == nullptr) {
    report.problem =
        "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2 "
        "or nvmlDeviceGetPciInfo";
    return report;
  }
  if (NvmlReturn code = nvml.init(); code != kNvmlSuccess) {
    report.problem = "nvmlInit failed: " + nvml.says(code);
    return report;
  }
  unsigned count = 0;
  if (NvmlReturn code = nvml.count_devices(&count); code != kNvmlSuccess) {
    report.problem = "nvmlDeviceGetCount failed: " + nvml.says(code);
  } else {
    report.available = true;
    for (unsigned index = 0; index < count && index < 1024; ++index) {
      NvmlDevice device = nullptr;
      NvmlPciInfo pci{};
      if (nvml.handle_of(index, &device) != kNvmlSuccess || nvml.pci_info(device, &pci) != kNvmlSuccess) continue;
      report.gpus.push_back(gpu_of(nvml, device, pci));
    }
  }
  if (nvml.shutdown != nullptr) nvml.shutdown();
  return report;
}

}  // namespace dew::topology
