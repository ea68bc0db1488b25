#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "dew/atomic_file.h"

namespace dew::train {
namespace {

namespace fs = std::filesystem;

std::string step_name(int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%06d", step);
  return name;
}

Result<Done> errno_error(const std::string& what, const std::string& path) {
  return system_error("checkpoint: cannot " + what + " " + path + ": " + std::strerror(errno));
}

// Closes on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Result<Done> write_all(int fd, const char* data, std::size_t size, off_t at, const std::string& path) {
  while (size > 0) {
    const ssize_t wrote = ::pwrite(fd, data, size, at);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      return errno_error("write", path);
    }
    data += wrote;
    size -= std::size_t(wrote);
    at += wrote;
  }
  return Done{};
}

// 64 lowercase hex digits (a BLAKE2b-256 digest as blake2b_hex writes it).
std::string hex_digest(const nlohmann::json& v, const char* what) {
  const std::string text = v.get<std::string>();
  if (text.size() != 64 || text.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw std::invalid_argument(std::string(what) + " is not 64 lowercase hex digits");
  }
  return text;
}

nlohmann::json model_json(const ModelConfig& m) {
  return {{"vocab", m.vocab},       {"width", m.width}, {"layers", m.layers}, {"heads", m.heads},
          {"kv_heads", m.kv_heads}, {"mlp", m.mlp},     {"length", m.length}};
}

}  // namespace

std::string state_path_of(const std::string& directory, int step) {
  return directory + "/" + step_name(step) + "/state.bin";
}

std::string dtype_name(Dtype dtype) { return dtype == Dtype::kFloat64 ? "fp64" : "fp32"; }

template <typename T>
Result<Done> write_state_runs(const std::string& path, int section, std::int64_t elements,
                              const std::vector<CanonicalRun>& runs, std::int64_t shard_first,
                              std::span<const T> values, const std::function<void()>& halfway) {
  std::error_code ignored;
  const std::string step_directory = fs::path(path).parent_path().string();
  fs::create_directories(step_directory, ignored);
  // The step's directory is opened without following a link (one planted
  // there would take the state out of the checkpoint directory), and the
  // state inside it through that descriptor.
  Fd directory{::open(step_directory.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  if (directory.fd < 0 && (errno == ELOOP || errno == ENOTDIR)) {
    return invalid_argument("checkpoint state: " + step_directory +
                            " is a symlink or not a directory; allowed: a directory Dew made, or none");
  }
  if (directory.fd < 0) return errno_error("open", step_directory);
  if (auto regular = refuse_unless_regular(path, "checkpoint state"); !regular.ok()) return regular;
  // O_NOFOLLOW and O_NONBLOCK: a symlink or FIFO that appears meanwhile is
  // refused, not followed or waited on; what opened must be a regular file.
  Fd file{::openat(directory.fd, fs::path(path).filename().c_str(),
                   O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644)};
  if (file.fd < 0) return errno_error("open", path);
  struct stat st {};
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return invalid_argument("checkpoint state: " + path + " is not a regular file; allowed: a regular file");
  }
  std::vector<double> run_values;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    if (halfway && k == runs.size() / 2) halfway();
    const CanonicalRun& run = runs[k];
    run_values.assign(values.begin() + (run.local - shard_first),
                      values.begin() + (run.local - shard_first + run.length));
    const off_t at = off_t((std::int64_t(section) * elements + run.canonical) * std::int64_t(sizeof(double)));
    auto wrote = write_all(file.fd, reinterpret_cast<const char*>(run_values.data()),
                           run_values.size() * sizeof(double), at, path);
    if (!wrote.ok()) return wrote;
  }
  return Done{};
}

template Result<Done> write_state_runs<float>(const std::string&, int, std::int64_t, const std::vector<CanonicalRun>&,
                                              std::int64_t, std::span<const float>, const std::function<void()>&);
template Result<Done> write_state_runs<double>(const std::string&, int, std::int64_t, const std::vector<CanonicalRun>&,
                                               std::int64_t, std::span<const double>, const std::function<void()>&);

Result<Done> sync_file(const std::string& path) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) return errno_error("open", path);
  if (::fsync(file.fd) != 0) return errno_error("fsync", path);
  return Done{};
}

Result<std::vector<double>> read_state(const std::string& path, std::int64_t elements) {
  const std::int64_t bytes = kStateSections * elements * std::int64_t(sizeof(double));
  std::error_code error;
  const auto size = fs::file_size(path, error);
  if (error) return not_found("checkpoint: cannot read " + path + ": " + error.message());
  if (std::int64_t(size) != bytes) {
    return invalid_argument("checkpoint " + path + " is " + std::to_string(size) + " bytes, the manifest says " +
                            std::to_string(bytes) + " (" + std::to_string(kStateSections) + " x " +
                            std::to_string(elements) + " values): cut short or extended after it was written");
  }
  std::vector<double> state(std::size_t(kStateSections * elements));
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(state.data()), std::streamsize(bytes));
  if (!in) return system_error("checkpoint: cannot read " + path);
  return state;
}

std::string model_text(const ModelConfig& model) { return model_json(model).dump(); }

Result<Done> write_manifest(const std::string& directory, const Manifest& m) {
  nlohmann::json j{{"format", "dew-worker-checkpoint"},
                   {"version", kManifestVersion},
                   {"step", m.step},
                   {"state", m.state},
                   {"elements", m.elements},
                   {"dtype", m.dtype},
                   {"model", model_json(m.model)},
                   {"batch", m.batch},
                   {"seed", m.seed},
                   {"learning_rate", m.learning_rate},
                   {"mesh", m.mesh},
                   {"losses", m.losses},
                   {"state_bytes", m.state_bytes},
                   {"state_blake2b", m.state_digest},
                   {"binding_blake2b", m.binding}};
  const std::string path = directory + "/manifest.json";
  if (auto written = write_file_atomically(path, j.dump(2) + "\n"); !written.ok()) {
    return written.error().prefixed("checkpoint: ");
  }
  // The manifest names the new state: the older ones are of no more use.
  std::error_code ignored;
  const std::string keep = step_name(m.step);
  for (const auto& entry : fs::directory_iterator(directory, ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name != keep) fs::remove_all(entry.path(), ignored);
  }
  return Done{};
}

Result<Manifest> read_manifest(const std::string& directory) {
  const std::string path = directory + "/manifest.json";
  std::ifstream in(path);
  if (!in) return not_found("--resume: no complete checkpoint in " + directory + " (no manifest.json)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    const auto j = nlohmann::json::parse(text.str());
    if (j.at("format") != "dew-worker-checkpoint") {
      return invalid_argument("checkpoint: " + path + " is not a dew worker manifest");
    }
    // Version 1 recorded no digest: its state cannot be told from a changed
    // one, and a silent unverified resume is what this refuses.
    if (j.at("version") == 1 || !j.contains("state_blake2b")) {
      return invalid_argument("--resume: checkpoint " + path + " records no digest of its state (a version " +
                              j.at("version").dump() +
                              " manifest, written before dew verified checkpoints), so it cannot be verified and "
                              "is not resumed; allowed: a fresh start (without --resume, or another --checkpoint-dir)");
    }
    if (j.at("version") != kManifestVersion) {
      return invalid_argument("checkpoint: " + path + " is a version " + j.at("version").dump() +
                              " manifest; this dew reads version " + std::to_string(kManifestVersion));
    }
    // Whole numbers in range only: a float or a huge number is an error,
    // never a conversion out of range.
    const auto whole = [](const nlohmann::json& v, const char* what) {
      if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > (1LL << 40)) {
        throw std::invalid_argument(std::string(what) + " is not a whole number from 0 to 2^40");
      }
      return v.get<long long>();
    };
    Manifest m;
    m.step = int(std::min(whole(j.at("step"), "step"), (1LL << 30)));
    m.state = j.at("state").get<std::string>();
    m.elements = whole(j.at("elements"), "elements");
    m.dtype = j.at("dtype").get<std::string>();
    const auto& model = j.at("model");
    const auto field = [&](const char* name) { return int(std::min(whole(model.at(name), name), (1LL << 30))); };
    m.model = ModelConfig{field("vocab"),    field("width"), field("layers"), field("heads"),
                          field("kv_heads"), field("mlp"),   field("length")};
    m.batch = int(std::min(whole(j.at("batch"), "batch"), (1LL << 30)));
    if (!j.at("seed").is_number_unsigned()) throw std::invalid_argument("seed is not a whole number");
    m.seed = j.at("seed").get<std::uint64_t>();
    m.learning_rate = j.at("learning_rate").get<double>();
    m.mesh = j.at("mesh").get<std::string>();
    m.losses = j.at("losses").get<std::vector<double>>();
    m.state_bytes = whole(j.at("state_bytes"), "state_bytes");
    m.state_digest = hex_digest(j.at("state_blake2b"), "state_blake2b");
    m.binding = hex_digest(j.at("binding_blake2b"), "binding_blake2b");
    if (m.step < 1 || m.elements < 1 || m.state.find("..") != std::string::npos || int(m.losses.size()) != m.step ||
        m.state_bytes != kStateSections * m.elements * std::int64_t(sizeof(double))) {
      return invalid_argument("checkpoint: " + path + " is inconsistent (step " + std::to_string(m.step) + ", " +
                              std::to_string(m.losses.size()) + " losses, " + std::to_string(m.elements) +
                              " values per section in " + std::to_string(m.state_bytes) + " bytes)");
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("checkpoint: " + path + " is not a dew worker manifest: " + e.what());
  } catch (const std::invalid_argument& e) {
    return invalid_argument("checkpoint: " + path + " is not a dew worker manifest: " + e.what());
  }
}

Result<Done> check_resumable(const Manifest& m, const WorkerOptions& o) {
  const auto differs = [&](const std::string& what, const std::string& saved, const std::string& now) {
    return invalid_argument("--resume: the checkpoint at step " + std::to_string(m.step) + " was trained with " + what +
                            " " + saved + ", this run has " + now + "; allowed: the same " + what);
  };
  if (model_text(m.model) != model_text(o.model)) return differs("model", model_text(m.model), model_text(o.model));
  if (m.dtype != dtype_name(o.dtype)) return differs("--dtype", m.dtype, dtype_name(o.dtype));
  if (m.batch != o.batch) return differs("--batch", std::to_string(m.batch), std::to_string(o.batch));
  if (m.seed != o.seed) return differs("--seed", std::to_string(m.seed), std::to_string(o.seed));
  if (m.learning_rate != o.learning_rate) {
    return differs("--learning-rate", std::to_string(m.learning_rate), std::to_string(o.learning_rate));
  }
  // A requeued job whose last start saved its final step (stopped before it
  // could exit) is complete: --resume auto has nothing left to train.
  const bool complete = m.step == o.steps && o.resume == Resume::kIfAny;
  if (m.step >= o.steps && !complete) {
    return invalid_argument("--resume: the checkpoint is at step " + std::to_string(m.step) + " and --steps is " +
                            std::to_string(o.steps) + "; allowed: --steps above " + std::to_string(m.step));
  }
  return Done{};
}

}  // namespace dew::train
