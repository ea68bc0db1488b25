// accelerator_fingerprint(): what a compiled executable depends on. GPU
// libraries are dlopened, as NVML is, so a CPU-only machine needs none.
#include <dlfcn.h>

#include <fstream>
#include <set>
#include <sstream>

#include "dew/nvml.h"
#include "dew/task_contract.h"
#include "dew/topology.h"

namespace dew::topology {
namespace {

// Calls `int fn(int*)` from the first library of `names` that has it.
std::optional<int> library_version(std::initializer_list<const char*> names, const char* symbol) {
  for (const char* name : names) {
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!handle) continue;
    std::optional<int> version;
    if (void* fn = dlsym(handle, symbol)) {
      int value = 0;
      if (reinterpret_cast<int (*)(int*)>(fn)(&value) == 0) version = value;
    }
    dlclose(handle);
    if (version) return version;
  }
  return std::nullopt;
}

// `size_t fn(void)`, as cudnnGetVersion.
std::optional<std::size_t> plain_version(std::initializer_list<const char*> names, const char* symbol) {
  for (const char* name : names) {
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!handle) continue;
    std::optional<std::size_t> version;
    if (void* fn = dlsym(handle, symbol)) version = reinterpret_cast<std::size_t (*)()>(fn)();
    dlclose(handle);
    if (version) return version;
  }
  return std::nullopt;
}

// The ISA extensions a CPU compiler targets.
std::string cpu_lines() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::string model = "unknown";
  std::set<std::string> flags;
  static const std::set<std::string> kIsa = {"sse4_2",   "avx",      "avx2",        "fma",         "avx512f",
                                             "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_tile",
                                             "amx_bf16", "asimd",    "sve"};
  while (std::getline(cpuinfo, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && model == "unknown") model = value;
    if ((key == "flags" || key == "Features") && flags.empty()) {
      std::istringstream words(value);
      std::string word;
      while (words >> word) {
        if (kIsa.count(word)) flags.insert(word);
      }
    }
  }
  std::string isa;
  for (const auto& flag : flags) isa += (isa.empty() ? "" : ",") + flag;
  return "cpu.model=" + model + "\ncpu.isa=" + isa + "\n";
}

}  // namespace

std::string accelerator_fingerprint() {
  if (const char* given = std::getenv(contract::kAcceleratorFingerprint.name)) return given;
  const auto nvml = read_nvml();
  if (!nvml.available || nvml.gpus.empty()) return "platform=cpu\n" + cpu_lines();

  std::ostringstream out;
  out << "platform=cuda\n";
  if (auto driver = library_version({"libcuda.so.1"}, "cuDriverGetVersion")) out << "cuda.driver=" << *driver << "\n";
  if (auto runtime = library_version({"libcudart.so", "libcudart.so.13", "libcudart.so.12"}, "cudaRuntimeGetVersion")) {
    out << "cuda.runtime=" << *runtime << "\n";
  }
  if (auto cudnn = plain_version({"libcudnn.so", "libcudnn.so.9", "libcudnn.so.8"}, "cudnnGetVersion"))
    out << "cudnn=" << *cudnn << "\n";
  if (auto cublas = plain_version({"libcublas.so", "libcublas.so.13", "libcublas.so.12"}, "cublasGetCudartVersion")) {
    out << "cublas.cudart=" << *cublas << "\n";
  }
  out << "gpu.count=" << nvml.gpus.size() << "\n";
  for (std::size_t i = 0; i < nvml.gpus.size(); ++i) {
    const auto& gpu = nvml.gpus[i];
    int nvlinks = 0;
    for (const auto& link : gpu.links) nvlinks += link.links;
    out << "gpu." << i << "=" << gpu.model << " sm_" << gpu.sm << " nvlinks=" << nvlinks << "\n";
  }
  return out.str();
}

}  // namespace dew::topology
