// What NVML says about this machine's GPUs: NVLinks and the NVLink fabric.
// Public for the pool's accelerator fingerprint. NVML is loaded at run time (dlopen
// "libnvidia-ml.so.1", as NCCL does), so Dew builds and runs where there is
// no NVIDIA driver; then `available` is false and `problem` says why.
#pragma once

#include <string>
#include <vector>

#include "dew/export.h"

namespace dew::topology {

enum class NvmlPeer { kGpu, kSwitch, kCpu, kUnknown };

struct DEW_API NvmlLinks {
  std::string remote_bus_id;  // "0000:07:00.0"
  bool remote_is_nvidia = false;
  NvmlPeer kind = NvmlPeer::kUnknown;  // NVML's own word, where it has the call
  int links = 0;                       // active links to that remote device
};

struct DEW_API NvmlGpu {
  std::string pci_bus_id;
  std::string model;
  int sm = 0;  // compute capability x 10; 0: unknown
  std::vector<NvmlLinks> links;
  std::string fabric;  // "<cluster uuid>/<clique id>" once registered; empty otherwise
  std::string uuid;    // "GPU-5f1c2a3b-...", as CUDA_VISIBLE_DEVICES may name it; empty: unknown
};

struct DEW_API NvmlReport {
  bool available = false;
  std::string problem;  // why not, e.g. "libnvidia-ml.so.1: cannot open shared object file: ..."
  std::vector<NvmlGpu> gpus;
};

// Loads NVML, reads every GPU, unloads it. Never fails: a missing library,
// driver or symbol is a report with available = false.
DEW_API NvmlReport read_nvml();

}  // namespace dew::topology
