// The canonical order of the model's state (every layout's shards cover it
// exactly once), the state file and manifest, and --drill's parsing.
#include "checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "canonical.h"
#include "dew/train.h"
#include "params.h"

namespace dew::train {
namespace {

using ::testing::HasSubstr;

struct TempDirectory {
  std::string path = std::filesystem::temp_directory_path() / ("dew-ckpt-test-" + std::to_string(::getpid()));
  TempDirectory() { std::filesystem::create_directories(path); }
  ~TempDirectory() { std::filesystem::remove_all(path); }
};

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
  WorkerOptions o;
  o.steps = 20;
  Manifest m{10,       "step-000010/state.bin",     123, "fp32", o.model, o.batch, o.seed, o.learning_rate,
             "fsdp=8", std::vector<double>(10, 1.5)};
  ASSERT_TRUE(write_manifest(dir.path, m).ok());
  auto back = read_manifest(dir.path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().step, 10);
  EXPECT_EQ(back.value().losses.size(), 10u);
  EXPECT_TRUE(check_resumable(back.value(), o).ok());
  o.model.width = 64;
  EXPECT_THAT(check_resumable(back.value(), o).error().message, HasSubstr("was trained with model"));
  o.model.width = 32;
  o.dtype = Dtype::kFloat64;
  EXPECT_THAT(check_resumable(back.value(), o).error().message,
              HasSubstr("was trained with --dtype fp32, this run has fp64"));
  o.dtype = Dtype::kFloat32;
  o.steps = 10;
  EXPECT_THAT(check_resumable(back.value(), o).error().message, HasSubstr("allowed: --steps above 10"));
  EXPECT_THAT(read_manifest(dir.path + "/none").error().message, HasSubstr("no complete checkpoint"));
  EXPECT_THAT(read_state(dir.path + "/step-000010/state.bin", 5).error().message, HasSubstr("cannot read"));
}

TEST(Checkpoint, AManifestWithNumbersOutOfRangeIsAnError) {
  TempDirectory dir;
  const std::string model =
      R"("model": {"vocab": 64, "width": 32, "layers": 2, "heads": 4, "kv_heads": 2, "mlp": 64, "length": 16})";
  for (const std::string step : {"1e23", "-3", "\"ten\"", "99999999999999999999999"}) {
    SCOPED_TRACE(step);
    std::ofstream(dir.path + "/manifest.json")
        << R"({"format": "dew-worker-checkpoint", "version": 1, "step": )" << step
        << R"(, "state": "s", "elements": 3, "dtype": "fp32", )" << model
        << R"(, "batch": 8, "seed": 0, "learning_rate": 0.003, "mesh": "m", "losses": [1.0]})";
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
  EXPECT_THAT(read_state(path, 7).error().message, HasSubstr("its manifest says"));
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
