// The Slurm-step rules (dew/slurm_step.h): whose rank, rank 0's node, tasks
// on a node.
#include "dew/slurm_step.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "expect_error.h"

namespace {

using dew::Environment;
using dew::RankSource;
using ::testing::HasSubstr;

const Environment kStep = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_NODELIST", "n[1-2]"}};
const Environment kOmpi = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}};
const Environment kPmix = {{"PMIX_NAMESPACE", "slurm.pmix.1.0"}, {"PMIX_SERVER_URI41", "x"}, {"PMIX_RANK", "6"}};
const Environment kDew = {{"DEW_PROCESS_ID", "2"}, {"DEW_PROCESS_COUNT", "4"}};

Environment with(Environment base, const Environment& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

TEST(RankSource, FollowsThePoolsPrecedence) {
  EXPECT_EQ(dew::rank_source({}), RankSource::kNone);
  EXPECT_EQ(dew::rank_source(kDew), RankSource::kDew);
  EXPECT_EQ(dew::rank_source(with(kStep, kDew)), RankSource::kSlurm) << "srun --dew-pool: both say the same";
  EXPECT_EQ(dew::rank_source(with(kStep, kOmpi)), RankSource::kOpenMpi) << "mpirun inside an allocation";
  EXPECT_EQ(dew::rank_source(with(with(kStep, kOmpi), kPmix)), RankSource::kPmix);
  EXPECT_EQ(dew::rank_source({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}}), RankSource::kNone)
      << "a batch script is not a step";
  EXPECT_EQ(dew::rank_source(with(kDew, {{"PMIX_NAMESPACE", "x"}})), RankSource::kDew) << "no server URI";
  EXPECT_STREQ(dew::rank_variable(RankSource::kOpenMpi), "OMPI_COMM_WORLD_RANK");
  EXPECT_STREQ(dew::rank_variable(RankSource::kSlurm), "SLURM_PROCID");
  EXPECT_EQ(dew::rank_variable(RankSource::kNone), nullptr);
}

TEST(Rank0Node, TheFirstNodeForDistributionsThatSaySo) {
  for (const char* dist :
       {"", "block", "cyclic", "plane", "plane=4", "block:cyclic", "cyclic:block:fcyclic", "block,Pack", "*:*"}) {
    auto node = dew::rank0_node(std::string("gpu[07-08]"), std::string(dist));
    ASSERT_TRUE(node.ok()) << dist << ": " << node.error().message;
    EXPECT_EQ(node.value(), "gpu07") << dist;
  }
  EXPECT_EQ(dew::rank0_node(std::string("b,a"), std::nullopt).value(), "b");
}

TEST(Rank0Node, OtherDistributionsAndBadNodelistsAreNamed) {
  const auto message = dew::testing::message_of(dew::rank0_node(std::string("n1"), std::string("arbitrary")),
                                                dew::ErrorCode::kUnsupported);
  EXPECT_THAT(message, HasSubstr("'arbitrary'"));
  EXPECT_THAT(message, HasSubstr("allowed: block, cyclic, plane"));
  EXPECT_THAT(dew::testing::invalid_argument_of(dew::rank0_node(std::string("n[1-"), std::nullopt)),
              HasSubstr("SLURM_STEP_NODELIST: hostlist 'n[1-'"));
  dew::testing::message_of(dew::rank0_node(std::nullopt, std::nullopt), dew::ErrorCode::kNotFound);
}

TEST(TasksOnNode, ReadsSlurmsLayout) {
  EXPECT_EQ(dew::tasks_on_node("3,1", 0), 3);
  EXPECT_EQ(dew::tasks_on_node("3,1", 1), 1);
  EXPECT_EQ(dew::tasks_on_node("2(x2),1", 1), 2);
  EXPECT_EQ(dew::tasks_on_node("2(x2),1", 2), 1);
  EXPECT_EQ(dew::tasks_on_node("2(x2),1", 3), std::nullopt);
  EXPECT_EQ(dew::tasks_on_node("x", 0), std::nullopt);
  EXPECT_EQ(dew::tasks_on_node("2(x0)", 0), std::nullopt);
}

// A one-task step's environment as `srun -n1 env` printed it on the test
// cluster (Slurm 22.05; values shortened), and srun --mpi=pmix's PMIx
// variables: what remains once the task variables are dropped is no
// launcher's task, and the job's own variables stay.
TEST(TaskIdentityVariables, DroppedFromAStepsTaskLeaveNoRankSourceButTheJob) {
  const std::vector<std::string> names = {"SLURMD_NODENAME",
                                          "SLURM_CLUSTER_NAME",
                                          "SLURM_CONF",
                                          "SLURM_CPUS_ON_NODE",
                                          "SLURM_GTIDS",
                                          "SLURM_JOBID",
                                          "SLURM_JOB_ID",
                                          "SLURM_JOB_NODELIST",
                                          "SLURM_JOB_NUM_NODES",
                                          "SLURM_LAUNCH_NODE_IPADDR",
                                          "SLURM_LOCALID",
                                          "SLURM_NNODES",
                                          "SLURM_NODEID",
                                          "SLURM_NODELIST",
                                          "SLURM_NPROCS",
                                          "SLURM_NTASKS",
                                          "SLURM_PROCID",
                                          "SLURM_SRUN_COMM_HOST",
                                          "SLURM_SRUN_COMM_PORT",
                                          "SLURM_STEPID",
                                          "SLURM_STEP_ID",
                                          "SLURM_STEP_LAUNCHER_PORT",
                                          "SLURM_STEP_NODELIST",
                                          "SLURM_STEP_NUM_NODES",
                                          "SLURM_STEP_NUM_TASKS",
                                          "SLURM_STEP_TASKS_PER_NODE",
                                          "SLURM_SUBMIT_DIR",
                                          "SLURM_TASKS_PER_NODE",
                                          "SLURM_TASK_PID",
                                          "SLURM_TOPOLOGY_ADDR",
                                          "PMIX_GDS_MODULE",
                                          "PMIX_NAMESPACE",
                                          "PMIX_RANK",
                                          "PMIX_SERVER_TMPDIR",
                                          "PMIX_SERVER_URI2",
                                          "PMIX_SERVER_URI21",
                                          "PMIX_SERVER_URI4",
                                          "PMIX_VERSION",
                                          "OMPI_COMM_WORLD_RANK",
                                          "OMPI_COMM_WORLD_SIZE",
                                          "DEW_NODE_ID",
                                          "DEW_PROCESS_ID"};
  dew::Environment step;
  for (const auto& name : names) step[name] = "1";
  ASSERT_EQ(dew::rank_source(step), dew::RankSource::kPmix);
  dew::Environment left;
  for (const auto& [name, value] : step) {
    if (!dew::is_task_identity_variable(name)) left[name] = value;
  }
  left.erase("DEW_PROCESS_ID");
  EXPECT_EQ(dew::rank_source(left), dew::RankSource::kNone);
  for (const char* kept : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_CONF", "SLURM_TASKS_PER_NODE"})
    EXPECT_EQ(left.count(kept), 1u) << kept;
  for (const char* dropped : {"SLURM_PROCID", "SLURM_STEP_NODELIST", "PMIX_SERVER_URI21", "OMPI_COMM_WORLD_RANK",
                              "DEW_NODE_ID", "SLURM_SRUN_COMM_PORT"})
    EXPECT_EQ(left.count(dropped), 0u) << dropped;
}

}  // namespace
