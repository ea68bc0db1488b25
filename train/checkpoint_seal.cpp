// Checkpoints you can trust (checkpoint.h): the digest and binding process 0
// seals a checkpoint with, the refusal of a state that is not finite, and
// the checks --resume makes before step 1.
#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint.h"
#include "dew/hex.h"

namespace dew::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSectionNames[kStateSections] = {"parameters", "AdamW m", "AdamW v"};

// Read back and hashed a piece at a time: process 0 holds no second copy of
// the whole state while saving.
constexpr std::size_t kReadBackValues = std::size_t(1) << 17;  // 1 MiB

class Blake2b {
 public:
  Blake2b() {
    // sodium_init picks the fastest BLAKE2b for this CPU; it fails only
    // without an entropy source, which hashing does not need.
    if (sodium_init() < 0) {
      // The portable BLAKE2b runs: the same digest, slower.
    }
    crypto_generichash_init(&state_, nullptr, 0, crypto_generichash_BYTES);
  }
  void update(const void* data, std::size_t size) {
    crypto_generichash_update(&state_, static_cast<const unsigned char*>(data), size);
  }
  std::string hex() {
    unsigned char digest[crypto_generichash_BYTES];
    crypto_generichash_final(&state_, digest, sizeof digest);
    return to_hex(digest);
  }

 private:
  crypto_generichash_state state_;
};

// Every bit of a double: hexadecimal floating point.
std::string exact(double x) {
  char text[48];
  std::snprintf(text, sizeof text, "%a", x);
  return text;
}

}  // namespace

std::string value_text(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char text[48];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

std::string blake2b_hex(std::span<const unsigned char> bytes) {
  Blake2b hash;
  hash.update(bytes.data(), bytes.size());
  return hash.hex();
}

std::string binding_of(const Manifest& m) {
  // One line per field, each value length-prefixed: no two manifests share
  // a text, whatever their strings hold.
  std::string text = "dew-worker-checkpoint " + std::to_string(kManifestVersion) + "\n";
  const auto field = [&](const char* key, const std::string& value) {
    text += std::string(key) + " " + std::to_string(value.size()) + ":" + value + "\n";
  };
  std::string losses;
  for (double loss : m.losses) losses += exact(loss) + " ";
  field("step", std::to_string(m.step));
  field("state", m.state);
  field("state_bytes", std::to_string(m.state_bytes));
  field("state_blake2b", m.state_digest);
  field("elements", std::to_string(m.elements));
  field("dtype", m.dtype);
  field("model", model_text(m.model));
  field("batch", std::to_string(m.batch));
  field("seed", std::to_string(m.seed));
  field("learning_rate", exact(m.learning_rate));
  field("mesh", m.mesh);
  field("losses", losses);
  return blake2b_hex(std::span(reinterpret_cast<const unsigned char*>(text.data()), text.size()));
}

std::optional<std::string> first_non_finite(std::span<const double> values, std::int64_t first_index,
                                            std::int64_t elements, const ModelConfig& model) {
  const auto bad = std::find_if(values.begin(), values.end(), [](double x) { return !std::isfinite(x); });
  if (bad == values.end()) return std::nullopt;
  const std::int64_t index = first_index + (bad - values.begin());
  const std::int64_t section = std::min<std::int64_t>(index / elements, kStateSections - 1);
  const std::int64_t element = index - section * elements;
  std::string where = std::string(kSectionNames[section]) + " element " + std::to_string(element);
  for (const auto& leaf : model_leaves(model_buckets(model))) {
    if (element >= leaf.offset && element < leaf.offset + leaf.size) {
      where += " (" + leaf.name + ", its element " + std::to_string(element - leaf.offset) + ")";
    }
  }
  return where + " is " + value_text(*bad);
}

Result<Done> seal_checkpoint(const std::string& directory, Manifest m) {
  const std::string path = directory + "/" + m.state;
  const std::int64_t values = kStateSections * m.elements;
  const std::int64_t bytes = values * std::int64_t(sizeof(double));
  std::error_code error;
  const auto size = std::int64_t(fs::file_size(path, error));
  if (error) return system_error("checkpoint: cannot read back " + path + ": " + error.message());
  if (size < bytes) {
    return internal_error("checkpoint " + path + " is " + std::to_string(size) + " bytes once every process wrote, " +
                          "expected " + std::to_string(bytes));
  }
  // A file an earlier run left at this step (killed while saving a larger
  // model) keeps its tail: every byte before the end is this run's.
  if (size > bytes) {
    fs::resize_file(path, std::uintmax_t(bytes), error);
    if (error) return system_error("checkpoint: cannot cut " + path + ": " + error.message());
    if (auto synced = sync_file(path); !synced.ok()) return synced;
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<double> chunk(kReadBackValues);
  Blake2b hash;
  for (std::int64_t done = 0; done < values;) {
    const auto count = std::size_t(std::min<std::int64_t>(std::int64_t(chunk.size()), values - done));
    if (!in.read(reinterpret_cast<char*>(chunk.data()), std::streamsize(count * sizeof(double)))) {
      return system_error("checkpoint: cannot read back " + path);
    }
    if (auto bad = first_non_finite(std::span(chunk.data(), count), done, m.elements, m.model)) {
      // Nothing of a state that cannot be trained from is kept; the manifest,
      // written last, still names the last good checkpoint.
      in.close();
      fs::remove_all(fs::path(path).parent_path(), error);
      const bool earlier = fs::exists(directory + "/manifest.json");
      return invalid_argument(
          "step " + std::to_string(m.step) + ": checkpoint " + path + " not saved: its " + *bad +
          "; a checkpoint holds finite values only, so the step's directory is removed and " +
          (earlier ? directory + "/manifest.json still names the last checkpoint" : "no checkpoint is written"));
    }
    hash.update(chunk.data(), count * sizeof(double));
    done += std::int64_t(count);
  }
  m.state_bytes = bytes;
  m.state_digest = hash.hex();
  m.binding = binding_of(m);
  return write_manifest(directory, m);
}

Result<Checkpoint> load_checkpoint(const std::string& directory, const WorkerOptions& o) {
  auto manifest = read_manifest(directory);
  if (!manifest.ok()) return manifest.error();
  const Manifest& m = manifest.value();
  // The binding first: an edited step or seed would otherwise be judged as
  // if it were what trained the state.
  if (const std::string found = binding_of(m); found != m.binding) {
    return invalid_argument("--resume: checkpoint " + directory + "/manifest.json: binding " + m.binding +
                            " expected, found " + found + " (BLAKE2b-256 of its fields as they are, step " +
                            std::to_string(m.step) +
                            "): the manifest was edited after it was written, so its step, state, model, seed, "
                            "batch, dtype, learning rate, mesh or losses are not the ones bound to its state; "
                            "allowed: the manifest as written, or a fresh start without --resume");
  }
  if (auto fits = check_resumable(m, o); !fits.ok()) return fits.error();
  const auto elements = canonical_size(model_leaves(model_buckets(o.model)));
  if (m.elements != elements) {
    return invalid_argument("--resume: the checkpoint holds " + std::to_string(m.elements) +
                            " values per section; this model has " + std::to_string(elements));
  }
  const std::string path = directory + "/" + m.state;
  auto state = read_state(path, elements);
  if (!state.ok()) return state.error().prefixed("--resume: ");
  const std::string found = blake2b_hex(
      std::span(reinterpret_cast<const unsigned char*>(state.value().data()), state.value().size() * sizeof(double)));
  if (found != m.state_digest) {
    return invalid_argument("--resume: checkpoint " + path + ": digest " + m.state_digest + " expected, found " +
                            found + " (BLAKE2b-256: the file was changed or replaced after it was written)");
  }
  // Verified bytes can still be a state no checkpoint should hold (one
  // written by hand, or past the save's check).
  if (auto bad = first_non_finite(state.value(), 0, elements, o.model)) {
    return invalid_argument("--resume: checkpoint " + path + ": its " + *bad +
                            "; a checkpoint holds finite values only");
  }
  return Checkpoint{std::move(manifest.value()), std::move(state.value())};
}

}  // namespace dew::train
