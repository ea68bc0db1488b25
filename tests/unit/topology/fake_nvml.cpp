// A stand-in libnvidia-ml.so.1 for topology_nvml_test: the machines the
// tests run on have no NVIDIA driver, and this is how detect_topology()'s
// dlopen path is exercised end to end. It implements only the calls
// topology/nvml.cpp resolves, with the ABI NVML documents.
//
// FAKE_NVML_MODE selects the machine:
//   pairs   (default) 4 A100s, NVLink pairs (0,1) and (2,3) of 4 links each
//   switch  4 H100s, 6 links to each of 3 NVSwitches, fabric clique 7
//   nodriver nvmlInit fails as without a loaded driver
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct PciInfo {  // nvmlPciInfo_t (v3)
  char bus_id_legacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;
  unsigned pci_subsystem_id;
  char bus_id[32];
};

struct FabricInfo {  // nvmlGpuFabricInfo_t
  unsigned char cluster_uuid[16];
  int status;
  unsigned clique_id;
  unsigned char state;
};

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kDriverNotLoaded = 9;

std::string mode() {
  const char* value = std::getenv("FAKE_NVML_MODE");
  return value != nullptr ? value : "pairs";
}

unsigned index_of(void* device) { return static_cast<unsigned>(reinterpret_cast<std::size_t>(device)) - 1; }

void fill(PciInfo* pci, unsigned bus, unsigned vendor_device) {
  std::memset(pci, 0, sizeof *pci);
  pci->domain = 0;
  pci->bus = bus;
  pci->device = 0;
  pci->pci_device_id = vendor_device;
}

}  // namespace

extern "C" {

int nvmlInit_v2() { return mode() == "nodriver" ? kDriverNotLoaded : kSuccess; }
int nvmlShutdown() { return kSuccess; }
const char* nvmlErrorString(int code) { return code == kDriverNotLoaded ? "Driver Not Loaded" : "Unknown Error"; }

int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = 4;
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (index >= 4) return kInvalidArgument;
  *device = reinterpret_cast<void*>(static_cast<std::size_t>(index) + 1);
  return kSuccess;
}

int nvmlDeviceGetPciInfo_v3(void* device, PciInfo* pci) {
  fill(pci, 0x1a + index_of(device), 0x20b010de);
  return kSuccess;
}

int nvmlDeviceGetName(void*, char* name, unsigned length) {
  const char* model = mode() == "switch" ? "NVIDIA H100 80GB HBM3" : "NVIDIA A100-SXM4-80GB";
  std::strncpy(name, model, length);
  return kSuccess;
}

int nvmlDeviceGetUUID(void* device, char* uuid, unsigned length) {
  std::string text = "GPU-0000000" + std::to_string(index_of(device)) + "-aaaa-bbbb-cccc-dddddddddddd";
  std::strncpy(uuid, text.c_str(), length);
  return kSuccess;
}

int nvmlDeviceGetCudaComputeCapability(void*, int* major, int* minor) {
  *major = mode() == "switch" ? 9 : 8;
  *minor = 0;
  return kSuccess;
}

int nvmlDeviceGetNvLinkState(void*, unsigned link, int* active) {
  const unsigned links = mode() == "switch" ? 18 : 4;
  if (link >= 18) return kInvalidArgument;
  *active = link < links ? 1 : 0;
  return kSuccess;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* device, unsigned link, PciInfo* pci) {
  if (mode() == "switch") {
    fill(pci, 0xc0 + link / 6, 0x22a310de);  // NVIDIA, not a GPU NVML lists: a switch
  } else {
    const unsigned peer = index_of(device) ^ 1u;  // 0<->1, 2<->3
    fill(pci, 0x1a + peer, 0x20b010de);
  }
  (void)link;
  return kSuccess;
}

int nvmlDeviceGetGpuFabricInfo(void*, FabricInfo* info) {
  std::memset(info, 0, sizeof *info);
  if (mode() != "switch") return kNotSupported;
  for (int i = 0; i < 16; ++i) info->cluster_uuid[i] = static_cast<unsigned char>(0xa0 + i);
  info->status = kSuccess;
  info->clique_id = 7;
  info->state = 3;  // completed
  return kSuccess;
}

}  // extern "C"
