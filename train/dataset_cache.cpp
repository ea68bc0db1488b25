#include "dataset_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dew/atomic_file.h"
#include "dew/log.h"
#include "dew/task_contract.h"
#include "params.h"

namespace dew::train {
namespace {

constexpr char kMagic[8] = {'d', 'e', 'w', 'd', 'a', 't', 'a', '1'};

std::string hex(std::uint64_t value) {
  static const char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int k = 15; k >= 0; --k, value >>= 4) out[std::size_t(k)] = digits[value & 15];
  return out;
}

// The dataset depends on these and nothing else.
std::string file_name(const WorkerOptions& o) {
  const std::uint64_t h = mix(o.seed, std::uint64_t(o.steps), std::uint64_t(o.batch),
                              (std::uint64_t(o.model.length) << 32) | std::uint64_t(o.model.vocab));
  return "dataset-" + hex(h) + ".bin";
}

std::optional<Dataset> load(const std::string& path, const WorkerOptions& o) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  char magic[8];
  std::int32_t dims[3];
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char*>(dims), sizeof dims);
  if (!in || !std::equal(magic, magic + 8, kMagic) || dims[0] != o.steps || dims[1] != o.batch ||
      dims[2] != o.model.length) {
    return std::nullopt;
  }
  Dataset d{o.steps, o.batch, o.model.length, {}};
  d.tokens.resize(std::size_t(o.steps) * std::size_t(o.batch) * std::size_t(o.model.length + 1));
  in.read(reinterpret_cast<char*>(d.tokens.data()), std::streamsize(d.tokens.size() * sizeof(std::int32_t)));
  if (!in || in.peek() != std::char_traits<char>::eof()) return std::nullopt;
  for (const auto t : d.tokens) {
    if (t < 0 || t >= o.model.vocab) return std::nullopt;
  }
  return d;
}

bool store(const std::string& path, const Dataset& d) {
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  const std::int32_t dims[3] = {d.steps, d.batch, d.length};
  std::string bytes(kMagic, sizeof kMagic);
  bytes.append(reinterpret_cast<const char*>(dims), sizeof dims);
  bytes.append(reinterpret_cast<const char*>(d.tokens.data()), d.tokens.size() * sizeof(std::int32_t));
  if (auto written = write_file_atomically(path, bytes); !written.ok()) {
    log_warn("cache: " + written.error().message + "; running without the cache");
    return false;
  }
  return true;
}

}  // namespace

CachedDataset cached_dataset(const WorkerOptions& o, const std::optional<std::string>& key,
                             const std::string& cache_dir) {
  CachedDataset cached;
  if (!key || cache_dir.empty()) {
    cached.dataset = make_dataset(o);
    return cached;
  }
  cached.path = cache_dir + "/" + *key + "/" + file_name(o);
  if (auto found = load(cached.path, o)) {
    cached.dataset = std::move(*found);
    cached.found = true;
    return cached;
  }
  cached.dataset = make_dataset(o);
  return cached;
}

bool store_dataset(const CachedDataset& cached) {
  return cached.found || cached.path.empty() || store(cached.path, cached.dataset);
}

std::string default_cache_dir() {
  if (const char* dew = std::getenv(contract::kCacheDir.name); dew && *dew) return std::string(dew) + "/worker";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/dew/worker";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/dew/worker";
  return "";
}

}  // namespace dew::train
