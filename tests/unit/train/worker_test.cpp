// run_worker in this process alone, its devices as threads over Gloo: every
// layout of 8 devices against one device, and a checkpoint resumed into
// another layout (also what the sanitizer build runs: the threads, the
// barriers, the shards and the state files under ASan+UBSan).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "dew/train.h"

namespace dew::train {
namespace {

runtime::Pool& alone() {
  static runtime::Pool pool = runtime::join();
  return pool;
}

std::vector<double> losses_of(const WorkerReport& r) {
  std::vector<double> losses = r.earlier_losses;
  for (const auto& s : r.steps) losses.push_back(s.loss);
  return losses;
}

WorkerOptions small(const std::string& mesh) {
  WorkerOptions o;
  o.mesh = mesh;
  o.devices_per_process = 8;
  o.steps = 3;
  o.dtype = Dtype::kFloat64;
  o.step_bound.reset();
  return o;
}

TEST(Worker, EveryKindOfLayoutTrainsAsOneDevice) {
  ASSERT_EQ(alone().size(), 1) << "run the unit tests outside any pool";
  auto one = run_one_device(alone(), small(""));
  ASSERT_TRUE(one.ok()) << one.error().message;
  for (const char* mesh : {"fsdp=8", "data=2,fsdp=2,tensor=2", "tensor=2,sequence=2,fsdp=2", "sequence=4,fsdp=2"}) {
    SCOPED_TRACE(mesh);
    auto run = run_worker(alone(), small(mesh));
    ASSERT_TRUE(run.ok()) << run.error().message;
    const auto a = losses_of(run.value()), b = losses_of(one.value());
    ASSERT_EQ(a.size(), 3u);
    for (std::size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-12) << "step " << k + 1;
  }
}

// --devices fills the mesh in the order given (no placement): the sequence
// axis on devices 0,4 / 1,5 / ... (across what would be two nodes), trained
// as the placed layout trains; a bad order names the entry and the form.
TEST(Worker, AGivenDeviceOrderLaysTheMeshOutAsGivenAndTrainsTheSame) {
  auto placed = run_worker(alone(), small("sequence=2,fsdp=4"));
  ASSERT_TRUE(placed.ok()) << placed.error().message;
  WorkerOptions across = small("sequence=2,fsdp=4");
  across.devices = "0,4,1,5,2,6,3,7";
  auto run = run_worker(alone(), across);
  ASSERT_TRUE(run.ok()) << run.error().message;
  EXPECT_EQ(run.value().mesh.devices, (std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_NE(placed.value().mesh.devices, run.value().mesh.devices);
  const auto a = losses_of(run.value()), b = losses_of(placed.value());
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-12) << "step " << k + 1;

  across.devices = "0,4,x";
  auto bad = run_worker(alone(), across);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error().message, ::testing::HasSubstr("--devices: 'x' in '0,4,x' is not allowed; allowed: device "
                                                        "ids (whole numbers >= 0) separated by commas"));
}

TEST(Worker, ACheckpointResumesIntoAnotherLayout) {
  const std::string dir = std::filesystem::temp_directory_path() / ("dew-worker-test-" + std::to_string(::getpid()));
  auto straight = run_worker(alone(), small("fsdp=8"));
  ASSERT_TRUE(straight.ok());
  WorkerOptions first = small("fsdp=4,tensor=2");
  first.steps = 2;
  first.checkpoint_dir = dir;
  first.checkpoint_every = 1;
  ASSERT_TRUE(run_worker(alone(), first).ok());
  WorkerOptions rest = small("sequence=2,fsdp=4");
  rest.checkpoint_dir = dir;
  rest.resume = Resume::kAlways;
  auto resumed = run_worker(alone(), rest);
  ASSERT_TRUE(resumed.ok()) << resumed.error().message;
  EXPECT_EQ(resumed.value().resumed_from, 2);
  const auto a = losses_of(resumed.value()), b = losses_of(straight.value());
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-12) << "step " << k + 1;
  std::filesystem::remove_all(dir);
}

// A requeued job stopped after saving its final step starts again: --resume
// auto finds the run complete, trains nothing and reports the whole run.
TEST(Worker, ResumeAutoOnTheFinalStepsCheckpointIsCompleteNotAnError) {
  const std::string dir = std::filesystem::temp_directory_path() / ("dew-worker-done-" + std::to_string(::getpid()));
  WorkerOptions o = small("fsdp=8");
  o.checkpoint_dir = dir;
  o.checkpoint_every = o.steps;
  auto whole = run_worker(alone(), o);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  o.resume = Resume::kIfAny;
  auto again = run_worker(alone(), o);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again.value().resumed_from, o.steps);
  EXPECT_EQ(again.value().steps.size(), 0u) << "nothing trained";
  EXPECT_EQ(losses_of(again.value()), losses_of(whole.value()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dew::train
