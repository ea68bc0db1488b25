// What a checkpoint's digest costs against the save itself, through the
// worker's own functions (train/checkpoint.h). A save as dew worker makes it
// on one device: every section of the state written with pwrite at its
// canonical runs, fsync, then either the manifest alone (the save before
// digests) or seal_checkpoint (the state read back, BLAKE2b-256 and the
// finite check in one pass, the binding, the manifest). The two kinds of
// save alternate, each into a fresh step directory as the worker's are;
// then the last state is read for a resume, alone and verified
// (load_checkpoint). Prints per model the medians and the ratios with /
// without, measured in the same run.
//
//   checkpoint_digest [--runs N] [--sizes default,worker,large] [--dir DIR] [--smoke]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "canonical.h"
#include "checkpoint.h"
#include "dew/median.h"
#include "dew/text.h"
#include "params.h"

namespace {

using namespace dew::train;
using Clock = std::chrono::steady_clock;

// dew worker's default model, bench/worker's, and one of 25 M parameters.
const std::map<std::string, ModelConfig> kModels = {
    {"default", ModelConfig{}},
    {"worker", ModelConfig{256, 128, 4, 8, 4, 512, 64}},
    {"large", ModelConfig{4096, 512, 8, 8, 4, 2048, 256}},
};

struct Options {
  int runs = 7;
  std::vector<std::string> sizes = {"default", "worker", "large"};
  std::string dir;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "checkpoint_digest: %s\nusage: checkpoint_digest [--runs N] [--sizes default,worker,large] "
               "[--dir DIR] [--smoke]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--smoke") {
      o.runs = 1;
      o.sizes = {"default"};
      continue;
    }
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--runs") {
      o.runs = std::atoi(value.c_str());
    } else if (flag == "--sizes") {
      o.sizes = dew::split(value, ',');
    } else if (flag == "--dir") {
      o.dir = value;
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (o.runs < 1) usage("--runs must be 1 or more");
  for (const auto& size : o.sizes) {
    if (!kModels.count(size)) usage("--sizes: '" + size + "' is not default, worker or large");
  }
  return o;
}

void check(const dew::Result<dew::Done>& done) {
  if (!done.ok()) {
    std::fprintf(stderr, "checkpoint_digest: %s\n", done.error().message.c_str());
    std::exit(1);
  }
}

// One device holding the whole model (tensor 1, fsdp 1): its flat buckets
// and the canonical runs each is written in.
struct Device {
  std::vector<std::vector<float>> buckets;
  std::vector<std::vector<CanonicalRun>> runs;
  std::int64_t elements = 0;
};

Device device_of(const ModelConfig& model) {
  const auto buckets = model_buckets(model);
  const auto leaves = model_leaves(buckets);
  Device d;
  d.elements = canonical_size(leaves);
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::vector<float> flat;
    for (const auto& spec : buckets[b]) {
      const auto part = initial_part<float>(spec, 0, 1, 0);
      flat.insert(flat.end(), part.begin(), part.end());
    }
    const auto size = std::int64_t(flat.size());
    d.runs.push_back(canonical_runs(buckets, int(b), leaves, 0, 1, 0, size, Replicated::kRankZeroOnly));
    d.buckets.push_back(std::move(flat));
  }
  return d;
}

// One save of step `step`; returns its seconds and, with the digest, the
// seal's own.
std::pair<double, double> save(const std::string& dir, const ModelConfig& model, const Device& d, int step,
                               bool digest) {
  const auto start = Clock::now();
  const std::string path = state_path_of(dir, step);
  for (int section = 0; section < kStateSections; ++section) {
    for (std::size_t b = 0; b < d.buckets.size(); ++b) {
      check(write_state_runs<float>(path, section, d.elements, d.runs[b], 0, std::span<const float>(d.buckets[b])));
    }
  }
  check(sync_file(path));
  Manifest m;
  m.step = step;
  m.state = std::filesystem::relative(path, dir).string();
  m.elements = d.elements;
  m.dtype = "fp32";
  m.model = model;
  m.batch = 8;
  m.learning_rate = WorkerOptions{}.learning_rate;
  m.mesh = "fsdp=1";
  m.losses.assign(std::size_t(step), 1.0);
  const auto written = Clock::now();
  check(digest ? seal_checkpoint(dir, m) : write_manifest(dir, m));
  const auto end = Clock::now();
  return {std::chrono::duration<double>(end - start).count(), std::chrono::duration<double>(end - written).count()};
}

// Reading the state to resume from: alone (read_state, the load before
// digests) and verified (load_checkpoint: the binding, the size, BLAKE2b-256
// of the bytes read, the finite check).
std::pair<double, double> resume(const std::string& dir, const ModelConfig& model, const Device& d, int step) {
  WorkerOptions o;
  o.model = model;
  o.steps = step + 1;
  const auto start = Clock::now();
  if (!read_state(state_path_of(dir, step), d.elements).ok()) std::exit(1);
  const auto read = Clock::now();
  const auto loaded = load_checkpoint(dir, o);
  const auto end = Clock::now();
  if (!loaded.ok()) {
    std::fprintf(stderr, "checkpoint_digest: %s\n", loaded.error().message.c_str());
    std::exit(1);
  }
  return {std::chrono::duration<double>(read - start).count(), std::chrono::duration<double>(end - read).count()};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::string dir = o.dir;
  if (dir.empty()) dir = std::filesystem::temp_directory_path() / ("checkpoint-digest-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::printf("Checkpoint save and resume, without the digest and with it (%d interleaved runs each; medians, s; %s)\n",
              o.runs, dir.c_str());
  std::printf("%-8s %9s %9s %9s %6s %9s %9s %9s %9s %6s\n", "model", "state MB", "save", "sealed", "ratio", "seal",
              "manifest", "read", "verified", "ratio");
  int step = 1;
  for (const auto& size : o.sizes) {
    const ModelConfig& model = kModels.at(size);
    const Device d = device_of(model);
    std::vector<double> plain, sealed, seal, manifest, read, verified;
    for (int run = 0; run < o.runs; ++run) {
      const auto [without, manifest_seconds] = save(dir, model, d, step++, false);
      const auto [with, seal_seconds] = save(dir, model, d, step++, true);
      plain.push_back(without);
      manifest.push_back(manifest_seconds);
      sealed.push_back(with);
      seal.push_back(seal_seconds);
    }
    for (int run = 0; run < o.runs; ++run) {
      const auto [alone, verify] = resume(dir, model, d, step - 1);
      read.push_back(alone);
      verified.push_back(verify);
    }
    const double bytes = double(kStateSections * d.elements * std::int64_t(sizeof(double)));
    std::printf("%-8s %9.1f %9.4f %9.4f %6.2f %9.4f %9.4f %9.4f %9.4f %6.2f\n", size.c_str(), bytes / 1e6,
                dew::median(plain), dew::median(sealed), dew::median(sealed) / dew::median(plain), dew::median(seal),
                dew::median(manifest), dew::median(read), dew::median(verified),
                dew::median(verified) / dew::median(read));
  }
  std::filesystem::remove_all(dir);
  return 0;
}
