// The canonical order of the model's state (every layout's shards cover it
// exactly once), the state file and manifest, and --drill's parsing.
#include "checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "canonical.h"
#include "dew/train.h"
#include "params.h"

namespace dew::train {
namespace {

using ::testing::HasSubstr;

struct TempDirectory {
  inline static int made = 0;
  std::string path = std::filesystem::temp_directory_path() /
                     ("dew-ckpt-test-" + std::to_string(::getpid()) + "-" + std::to_string(made++));
  TempDirectory() { std::filesystem::create_directories(path); }
  ~TempDirectory() { std::filesystem::remove_all(path); }
};

// A small model: its state is a few hundred values.
WorkerOptions small_options(std::uint64_t seed = 0) {
  WorkerOptions o;
  o.model = ModelConfig{11, 8, 1, 4, 2, 6, 5};
  o.steps = 20;
  o.seed = seed;
  return o;
}

std::int64_t elements_of(const ModelConfig& model) { return canonical_size(model_leaves(model_buckets(model))); }

// Value k of section `section` of a run seeded `seed`: another run's state
// has the same shape and other values.
double value_of(std::uint64_t seed, int section, std::int64_t k) {
  return 0.001 * double(k + 1) * (section + 1) + double(seed);
}

// The state of step `step` written as one device writes it, with `bad`
// (section, element) set to `poison`.
void write_state(const std::string& dir, const WorkerOptions& o, int step,
                 std::optional<std::pair<int, std::int64_t>> bad = std::nullopt, double poison = NAN) {
  const std::int64_t elements = elements_of(o.model);
  for (int section = 0; section < kStateSections; ++section) {
    std::vector<double> values(static_cast<std::size_t>(elements));
    for (std::int64_t k = 0; k < elements; ++k) values[std::size_t(k)] = value_of(o.seed, section, k);
    if (bad && bad->first == section) values[std::size_t(bad->second)] = poison;
    ASSERT_TRUE(
        write_state_runs<double>(state_path_of(dir, step), section, elements, {{0, 0, elements}}, 0, values).ok());
  }
}

Manifest manifest_of(const WorkerOptions& o, int step) {
  Manifest m;
  m.step = step;
  m.state = "step-" + std::string(6 - std::to_string(step).size(), '0') + std::to_string(step) + "/state.bin";
  m.elements = elements_of(o.model);
  m.dtype = dtype_name(o.dtype);
  m.model = o.model;
  m.batch = o.batch;
  m.seed = o.seed;
  m.learning_rate = o.learning_rate;
  m.mesh = "fsdp=8";
  m.losses = std::vector<double>(std::size_t(step), 1.5);
  return m;
}

// A checkpoint as the worker saves one: the state, then the seal.
Manifest save(const std::string& dir, const WorkerOptions& o, int step) {
  write_state(dir, o, step);
  const auto sealed = seal_checkpoint(dir, manifest_of(o, step));
  EXPECT_TRUE(sealed.ok()) << sealed.error().message;
  return read_manifest(dir).value();
}

std::string file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return blake2b_hex(std::span(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Every (tensor, fsdp) place writes its runs: each canonical element once.
TEST(Canonical, EveryLayoutsWritersCoverTheStateOnce) {
  ModelConfig model{11, 8, 2, 4, 2, 6, 5};
  const auto buckets = model_buckets(model);
  const auto leaves = model_leaves(buckets);
  const auto total = canonical_size(leaves);
  std::int64_t expected = 0;
  for (const auto& b : buckets)
    for (const auto& s : b) expected += std::int64_t(s.rows) * s.cols;
  EXPECT_EQ(total, expected);
  for (int tensor : {1, 2}) {
    for (int fsdp : {1, 2, 3, 4}) {
      SCOPED_TRACE("tensor " + std::to_string(tensor) + " fsdp " + std::to_string(fsdp));
      std::vector<int> written(std::size_t(total), 0), read(std::size_t(total), 0);
      for (int t = 0; t < tensor; ++t) {
        for (std::size_t b = 0; b < buckets.size(); ++b) {
          const auto size = bucket_layout(buckets[b], tensor).size;
          const auto chunk = (size + fsdp - 1) / fsdp;
          for (int f = 0; f < fsdp; ++f) {
            const auto first = chunk * f, last = std::min(size, first + chunk);
            for (auto replicated : {Replicated::kRankZeroOnly, Replicated::kEveryRank}) {
              for (const auto& run : canonical_runs(buckets, int(b), leaves, t, tensor, first, last, replicated)) {
                EXPECT_GE(run.local, first);
                EXPECT_LE(run.local + run.length, last);
                auto& counts = replicated == Replicated::kRankZeroOnly ? written : read;
                for (std::int64_t k = 0; k < run.length; ++k) counts[std::size_t(run.canonical + k)]++;
              }
            }
          }
        }
      }
      for (std::int64_t k = 0; k < total; ++k) {
        ASSERT_EQ(written[std::size_t(k)], 1) << "element " << k;
        ASSERT_GE(read[std::size_t(k)], 1) << "element " << k;
      }
    }
  }
}

// A tensor rank's part, read back through the runs, is initial_part's.
TEST(Canonical, RunsPlaceEachTensorPartWhereTheWholeParameterHasIt) {
  ModelConfig model{11, 8, 1, 4, 2, 6, 5};
  const auto buckets = model_buckets(model);
  const auto leaves = model_leaves(buckets);
  std::vector<double> whole(std::size_t(canonical_size(leaves)));
  std::size_t leaf = 0;
  for (const auto& bucket : buckets)
    for (const auto& spec : bucket) {
      const auto part = initial_part<double>(spec, 0, 1, 3);
      std::copy(part.begin(), part.end(), whole.begin() + leaves[leaf++].offset);
    }
  for (int t = 0; t < 2; ++t) {
    std::vector<double> flat;
    for (const auto& spec : buckets[1]) {
      const auto part = initial_part<double>(spec, t, 2, 3);
      flat.insert(flat.end(), part.begin(), part.end());
    }
    for (const auto& run :
         canonical_runs(buckets, 1, leaves, t, 2, 0, std::int64_t(flat.size()), Replicated::kEveryRank)) {
      for (std::int64_t k = 0; k < run.length; ++k) {
        ASSERT_EQ(flat[std::size_t(run.local + k)], whole[std::size_t(run.canonical + k)]);
      }
    }
  }
}

TEST(Checkpoint, ManifestRoundTripAndResumeRules) {
  TempDirectory dir;
  WorkerOptions o = small_options();
  const Manifest saved = save(dir.path, o, 10);
  auto back = read_manifest(dir.path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().step, 10);
  EXPECT_EQ(back.value().losses.size(), 10u);
  EXPECT_EQ(back.value().binding, saved.binding);
  EXPECT_TRUE(check_resumable(back.value(), o).ok());
  o.model.width = 64;
  EXPECT_THAT(check_resumable(back.value(), o).error().message, HasSubstr("was trained with model"));
  o.model.width = 8;
  o.dtype = Dtype::kFloat64;
  EXPECT_THAT(check_resumable(back.value(), o).error().message,
              HasSubstr("was trained with --dtype fp32, this run has fp64"));
  o.dtype = Dtype::kFloat32;
  o.steps = 10;
  EXPECT_THAT(check_resumable(back.value(), o).error().message, HasSubstr("allowed: --steps above 10"));
  // --resume auto (a requeued job's next start) on its own final step: complete, nothing to train.
  o.resume = Resume::kIfAny;
  EXPECT_TRUE(check_resumable(back.value(), o).ok());
  o.steps = 9;
  EXPECT_THAT(check_resumable(back.value(), o).error().message, HasSubstr("allowed: --steps above 10"));
  o.resume = Resume::kNo;
  EXPECT_THAT(read_manifest(dir.path + "/none").error().message, HasSubstr("no complete checkpoint"));
  EXPECT_THAT(read_state(dir.path + "/step-000011/state.bin", 5).error().message, HasSubstr("cannot read"));
}

TEST(Checkpoint, AManifestWithNumbersOutOfRangeIsAnError) {
  TempDirectory dir;
  const std::string model =
      R"("model": {"vocab": 64, "width": 32, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 64, "length": 16})";
  const std::string digests = R"("state_bytes": 72, "state_blake2b": ")" + std::string(64, 'a') +
                              R"(", "binding_blake2b": ")" + std::string(64, 'b') + "\"";
  for (const std::string step : {"1e23", "-3", "\"ten\"", "99999999999999999999999"}) {
    SCOPED_TRACE(step);
    std::ofstream(dir.path + "/manifest.json")
        << R"({"format": "dew-worker-checkpoint", "version": 2, "step": )" << step
        << R"(, "state": "s", "elements": 3, "dtype": "fp32", )" << model
        << R"(, "batch": 8, "seed": 0, "learning_rate": 0.003, "mesh": "m", "losses": [1.0], )" << digests << "}";
    auto m = read_manifest(dir.path);
    ASSERT_FALSE(m.ok());
    EXPECT_THAT(m.error().message, HasSubstr("is not a dew worker manifest"));
  }
}

TEST(Checkpoint, StateRunsLandAtTheirPlaces) {
  TempDirectory dir;
  const std::string path = state_path_of(dir.path, 3);
  const std::vector<float> shard = {1, 2, 3, 4};
  // Shard elements 10..13: 10-11 at canonical 0, 12-13 at canonical 4.
  ASSERT_TRUE(write_state_runs<float>(path, 1, 6, {{10, 0, 2}, {12, 4, 2}}, 10, shard).ok());
  ASSERT_TRUE(write_state_runs<float>(path, 2, 6, {{0, 5, 1}}, 0, std::vector<float>{9}).ok());
  auto state = read_state(path, 6);
  ASSERT_TRUE(state.ok()) << state.error().message;
  EXPECT_EQ(state.value()[6], 1);
  EXPECT_EQ(state.value()[7], 2);
  EXPECT_EQ(state.value()[10], 3);
  EXPECT_EQ(state.value()[11], 4);
  EXPECT_EQ(state.value()[17], 9);
  EXPECT_THAT(read_state(path, 7).error().message, HasSubstr("is 144 bytes, the manifest says 168"));
}

// ----------------------------------------------- checkpoints you can trust

TEST(CheckpointTrust, ASealedCheckpointResumesAndItsDigestIsB2sums) {
  TempDirectory dir;
  const WorkerOptions o = small_options();
  const Manifest m = save(dir.path, o, 10);
  const std::string path = state_path_of(dir.path, 10);
  EXPECT_EQ(m.state_bytes, 3 * elements_of(o.model) * 8);
  EXPECT_EQ(m.state_digest, file_digest(path));
  // BLAKE2b-256 as `b2sum -l 256` prints it (RFC 7693's "abc").
  const std::string abc = "abc";
  EXPECT_EQ(blake2b_hex(std::span(reinterpret_cast<const unsigned char*>(abc.data()), abc.size())),
            "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
  auto loaded = load_checkpoint(dir.path, o);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded.value().manifest.step, 10);
  EXPECT_EQ(loaded.value().state[5], value_of(0, 0, 5));
}

TEST(CheckpointTrust, FlippedBytesAreRefusedNamingTheFileAndBothDigests) {
  TempDirectory dir;
  const WorkerOptions o = small_options();
  const Manifest m = save(dir.path, o, 10);
  const std::string path = state_path_of(dir.path, 10);
  std::string bytes = read_file(path);
  for (std::size_t k = 100; k < 164; ++k) bytes[k] = char(bytes[k] ^ 0x5a);
  write_file(path, bytes);
  auto loaded = load_checkpoint(dir.path, o);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().message, "--resume: checkpoint " + path + ": digest " + m.state_digest +
                                        " expected, found " + file_digest(path) +
                                        " (BLAKE2b-256: the file was changed or replaced after it was written)");
  // A file of zeros, the same size: the digest refuses it too.
  write_file(path, std::string(bytes.size(), '\0'));
  EXPECT_THAT(load_checkpoint(dir.path, o).error().message,
              HasSubstr(": digest " + m.state_digest + " expected, found " + file_digest(path)));
}

TEST(CheckpointTrust, ACutOrExtendedStateIsRefusedWithBothSizes) {
  TempDirectory dir;
  const WorkerOptions o = small_options();
  const Manifest m = save(dir.path, o, 10);
  const std::string path = state_path_of(dir.path, 10);
  const std::string bytes = read_file(path);
  const std::string says = ", the manifest says " + std::to_string(m.state_bytes) + " ";
  write_file(path, bytes.substr(0, bytes.size() - 8));
  EXPECT_THAT(load_checkpoint(dir.path, o).error().message,
              HasSubstr("--resume: checkpoint " + path + " is " + std::to_string(m.state_bytes - 8) + " bytes" + says));
  write_file(path, bytes + std::string(8, '\0'));
  EXPECT_THAT(load_checkpoint(dir.path, o).error().message,
              HasSubstr("checkpoint " + path + " is " + std::to_string(m.state_bytes + 8) + " bytes" + says));
}

// The manifest edited by hand, consistently: the binding refuses it.
TEST(CheckpointTrust, AnEditedStepOrSeedIsRefusedByTheBinding) {
  TempDirectory dir;
  WorkerOptions o = small_options();
  const Manifest m = save(dir.path, o, 10);
  const std::string path = dir.path + "/manifest.json";
  const std::string as_written = read_file(path);
  auto j = nlohmann::json::parse(as_written);
  j["step"] = 12;
  j["losses"] = std::vector<double>(12, 1.5);
  write_file(path, j.dump(2));
  auto loaded = load_checkpoint(dir.path, o);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.error().message,
              HasSubstr("--resume: checkpoint " + path + ": binding " + m.binding + " expected, found "));
  EXPECT_THAT(loaded.error().message, HasSubstr("step 12): the manifest was edited after it was written"));
  j = nlohmann::json::parse(as_written);
  j["seed"] = 7;
  write_file(path, j.dump(2));
  o.seed = 7;
  EXPECT_THAT(load_checkpoint(dir.path, o).error().message, HasSubstr("the manifest was edited after it was written"));
  o.seed = 0;
  write_file(path, as_written);
  EXPECT_TRUE(load_checkpoint(dir.path, o).ok());
}

TEST(CheckpointTrust, AnotherRunsStateOfTheSameShapeIsRefused) {
  TempDirectory mine, other;
  const WorkerOptions o = small_options(1);
  const Manifest m = save(mine.path, o, 10);
  const Manifest theirs = save(other.path, small_options(2), 10);
  ASSERT_EQ(m.state_bytes, theirs.state_bytes);
  std::filesystem::copy_file(state_path_of(other.path, 10), state_path_of(mine.path, 10),
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_THAT(load_checkpoint(mine.path, o).error().message,
              HasSubstr(": digest " + m.state_digest + " expected, found " + theirs.state_digest + " ("));
  // Its digest copied into the manifest as well: the binding refuses that.
  auto j = nlohmann::json::parse(read_file(mine.path + "/manifest.json"));
  j["state_blake2b"] = theirs.state_digest;
  write_file(mine.path + "/manifest.json", j.dump());
  EXPECT_THAT(load_checkpoint(mine.path, o).error().message, HasSubstr("the manifest was edited after it was written"));
}

TEST(CheckpointTrust, AnOlderManifestWithoutADigestIsRefusedSayingHowToGoOn) {
  TempDirectory dir;
  const WorkerOptions o = small_options();
  save(dir.path, o, 10);
  auto j = nlohmann::json::parse(read_file(dir.path + "/manifest.json"));
  j["version"] = 1;
  for (const char* key : {"state_bytes", "state_blake2b", "binding_blake2b"}) j.erase(key);
  write_file(dir.path + "/manifest.json", j.dump(2));
  auto loaded = load_checkpoint(dir.path, o);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.error().message, "--resume: checkpoint " + dir.path +
                                        "/manifest.json records no digest of its state (a version 1 manifest, "
                                        "written before dew verified checkpoints), so it cannot be verified and is "
                                        "not resumed; allowed: a fresh start (without --resume, or another "
                                        "--checkpoint-dir)");
}

struct Poisoned {
  int section;
  std::int64_t element;
  double value;
  std::string says;
};

const std::vector<Poisoned> kPoisoned = {
    {0, 3, NAN, "parameters element 3 (embedding, its element 3) is nan"},
    {1, 100, INFINITY, "AdamW m element 100 (positions, its element 12) is inf"},
    {2, 130, -INFINITY, "AdamW v element 130 (final_gain, its element 2) is -inf"},
};

TEST(CheckpointTrust, ANonFiniteStateIsNotSavedAndTheLastCheckpointStays) {
  TempDirectory dir;
  const WorkerOptions o = small_options();
  save(dir.path, o, 5);
  const std::string manifest = read_file(dir.path + "/manifest.json");
  for (const auto& p : kPoisoned) {
    SCOPED_TRACE(p.says);
    write_state(dir.path, o, 10, std::make_pair(p.section, p.element), p.value);
    auto sealed = seal_checkpoint(dir.path, manifest_of(o, 10));
    ASSERT_FALSE(sealed.ok());
    EXPECT_EQ(sealed.error().message, "step 10: checkpoint " + state_path_of(dir.path, 10) + " not saved: its " +
                                          p.says +
                                          "; a checkpoint holds finite values only, so the step's directory is "
                                          "removed and " +
                                          dir.path + "/manifest.json still names the last checkpoint");
    EXPECT_FALSE(std::filesystem::exists(dir.path + "/step-000010"));
    EXPECT_EQ(read_file(dir.path + "/manifest.json"), manifest);
    EXPECT_TRUE(load_checkpoint(dir.path, o).ok());
  }
}

// A state written past the save's check (by hand here), digest and binding
// right: refused on load all the same.
TEST(CheckpointTrust, ANonFiniteStateIsRefusedOnLoadNamingTheSectionAndElement) {
  for (const auto& p : kPoisoned) {
    SCOPED_TRACE(p.says);
    TempDirectory dir;
    const WorkerOptions o = small_options();
    write_state(dir.path, o, 10, std::make_pair(p.section, p.element), p.value);
    Manifest m = manifest_of(o, 10);
    m.state_bytes = 3 * m.elements * 8;
    m.state_digest = file_digest(state_path_of(dir.path, 10));
    m.binding = binding_of(m);
    ASSERT_TRUE(write_manifest(dir.path, m).ok());
    auto loaded = load_checkpoint(dir.path, o);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.error().message, "--resume: checkpoint " + state_path_of(dir.path, 10) + ": its " + p.says +
                                          "; a checkpoint holds finite values only");
  }
}

// A longer state file left at the same step (a run killed while saving a
// larger model) is cut to this state's size before it is hashed.
TEST(CheckpointTrust, ALeftoverLongerStateIsCutBeforeTheSeal) {
  TempDirectory dir;
  const WorkerOptions o = small_options();
  std::filesystem::create_directories(dir.path + "/step-000010");
  write_file(state_path_of(dir.path, 10), std::string(10000, 'x'));
  const Manifest m = save(dir.path, o, 10);
  EXPECT_EQ(std::int64_t(std::filesystem::file_size(state_path_of(dir.path, 10))), m.state_bytes);
  EXPECT_TRUE(load_checkpoint(dir.path, o).ok());
}

TEST(Drill, ParsesKindRankAndStepAndNamesBadValues) {
  auto d = parse_drill("stall-before-checkpoint@3:12");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value().kind, Drill::Kind::kStallBeforeCheckpoint);
  EXPECT_EQ(d.value().rank, 3);
  EXPECT_EQ(d.value().step, 12);
  for (const char* bad : {"", "loader-throws", "loader-throws@1", "loader-throws@x:1", "loader-throws@1:0",
                          "explode@1:2", "loader-throws@1:2:3", "loader-throws@-1:2", "loader-throws@1:99999999"}) {
    SCOPED_TRACE(bad);
    auto r = parse_drill(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.error().message, HasSubstr("allowed: KIND@RANK:STEP"));
  }
}

}  // namespace
}  // namespace dew::train
