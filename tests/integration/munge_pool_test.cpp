// A pool under plain srun (no plugin, no DEW_POOL_SECRET): MUNGE stands for
// the secret. Process 0 seals a fresh secret in a MUNGE credential that only
// its uid can open, one per connection; the others open it. Against the test
// cluster's own munged (its socket given as DEW_MUNGE_SOCKET: a real
// cluster's is MUNGE's default).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dew/exit_status.h"
#include "munge_auth.h"
#include "slurm_cluster.h"
#include "srun_output.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string munge_socket() { return cluster().munge_socket(); }
int free_port() { return free_loopback_port(); }

TEST(MungeAuth, ASealedSecretOpensOnceForItsOwnStepOnly) {
  const runtime::munge_auth::Where where{munge_socket()};
  auto sealed = runtime::munge_auth::seal(where, "slurm step 42.0", "the secret");
  ASSERT_TRUE(sealed.ok()) << sealed.error().message;
  auto other = runtime::munge_auth::open(where, "slurm step 43.0", sealed.value());
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.error().message, HasSubstr("is for 'slurm step 42.0', not 'slurm step 43.0'"));

  auto again = runtime::munge_auth::seal(where, "slurm step 42.0", "the secret");
  ASSERT_TRUE(again.ok());
  auto opened = runtime::munge_auth::open(where, "slurm step 42.0", again.value());
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  EXPECT_EQ(opened.value(), "the secret");
  auto replayed = runtime::munge_auth::open(where, "slurm step 42.0", again.value());
  ASSERT_FALSE(replayed.ok()) << "MUNGE refuses a credential opened twice";
  EXPECT_THAT(replayed.error().message, HasSubstr("not valid here"));

  auto forged = runtime::munge_auth::open(where, "slurm step 42.0", "MUNGE:AAAA:");
  EXPECT_FALSE(forged.ok());
  auto nowhere = runtime::munge_auth::seal({"/nonexistent/munge.socket"}, "slurm step 42.0", "s");
  ASSERT_FALSE(nowhere.ok());
  EXPECT_THAT(nowhere.error().message, HasSubstr("DEW_MUNGE_SOCKET=/nonexistent/munge.socket"));
}

TEST(SlurmPool, PlainSrunWithoutASecretJoinsThroughMunge) {
  auto r =
      cluster().srun({"-N2", "--ntasks-per-node=2", pool_worker(), "exchange"},
                     {{"DEW_COORDINATOR_ADDRESS", cluster().node_address("n1") + ":" + std::to_string(free_port())},
                      {"DEW_MUNGE_SOCKET", munge_socket()}},
                     60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(occurrences(r.out, "gather=rank 0|rank 1|rank 2|rank 3 squares=0,1,4,9"), 4) << r.out;
  EXPECT_EQ(r.err.find("DEW_POOL_SECRET"), std::string::npos) << r.err;
}

// Plain srun: rank 2 exits before it joins. Slurm tells no one (the step
// goes on), so the others wait out the join's timeout; by 5 s every waiting
// line says so, and the end names rank 2 and the bound.
TEST(SlurmPool, PlainSrunARankGoneBeforeJoiningIsSaidWithinTenSecondsAndNamedAtTheBound) {
  auto r =
      cluster().srun({"-N2", "--ntasks-per-node=2", "/bin/sh", "-c",
                      "if [ \"$SLURM_PROCID\" = 2 ]; then exit 3; fi; exec '" + pool_worker() + "' join"},
                     {{"DEW_COORDINATOR_ADDRESS", cluster().node_address("n1") + ":" + std::to_string(free_port())},
                      {"DEW_MUNGE_SOCKET", munge_socket()},
                      {"DEW_JOIN_TIMEOUT_SECONDS", "8"}},
                     60s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("[0] waiting for every process to join the pool (5 s of 8 s): process 2 not connected "
                               "yet (under srun without --dew-pool a process that ended before joining is seen only "
                               "when the join's 8 s run out (DEW_JOIN_TIMEOUT_SECONDS); srun's own lines say whether "
                               "a task exited)"))
      << describe(r);
  EXPECT_THAT(r.err, HasSubstr("[1] waiting for every process to join the pool (5 s of 8 s): under srun without "
                               "--dew-pool"))
      << describe(r);
  EXPECT_THAT(r.err, HasSubstr("process 2 never joined the pool within 8 s (DEW_JOIN_TIMEOUT_SECONDS)")) << describe(r);
}

// Every process says so at once, with the join's default timeout (300 s):
// before, only process 0 did, and the others retried for the whole timeout.
TEST(SlurmPool, PlainSrunWithoutMungeOrASecretSaysWhatToSetOnEveryProcessAtOnce) {
  auto r =
      cluster().srun({"-N2", "--ntasks-per-node=2", pool_worker(), "exchange"},
                     {{"DEW_COORDINATOR_ADDRESS", cluster().node_address("n1") + ":" + std::to_string(free_port())},
                      {"DEW_MUNGE_SOCKET", "/nonexistent/munge.socket"}},
                     60s);
  EXPECT_EQ(r.exit_code, kJoinFailedExitCode) << describe(r);
  EXPECT_LT(r.seconds, 15.0) << describe(r);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(r.err, HasSubstr("[" + std::to_string(rank) +
                                 "] error: cannot join the pool: DEW_POOL_SECRET is not set and MUNGE cannot make a "
                                 "credential"))
        << describe(r);
  }
  EXPECT_THAT(r.err, HasSubstr("run munged (MUNGE), use srun --dew-pool, or export the same DEW_POOL_SECRET"));
}

}  // namespace
}  // namespace dew::testing
