// resolve_identity() over environment fixtures: which source wins, what it
// says, and the one-line error for every malformed variable.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dew/pool.h"
#include "expect_error.h"

namespace {

using dew::runtime::Environment;
using dew::runtime::JoinOptions;
using dew::runtime::PoolSource;
using dew::runtime::resolve_identity;
using ::testing::HasSubstr;

const Environment kSlurmStep = {{"SLURM_PROCID", "5"},
                                {"SLURM_NTASKS", "8"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NODEID", "1"},
                                {"SLURM_STEP_NODELIST", "gpu[07-08]"},
                                {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                {"SLURM_JOB_ID", "1234"},
                                {"SLURM_STEP_ID", "0"}};

Environment with(Environment base, const Environment& more) {
  for (const auto& [k, v] : more) base[k] = v;
  return base;
}

struct Case {
  const char* name;
  Environment env;
  PoolSource source;
  int rank, size, local_rank, local_size;
  const char* coordinator;  // "" when none
};

class Precedence : public ::testing::TestWithParam<Case> {};

TEST_P(Precedence, PicksTheFirstSourceThatApplies) {
  const Case& c = GetParam();
  auto id = resolve_identity(c.env, JoinOptions{});
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(id.value().source, c.source) << dew::runtime::source_name(id.value().source);
  if (c.source != PoolSource::kPmix) {
    EXPECT_EQ(id.value().rank, c.rank);
    EXPECT_EQ(id.value().size, c.size);
    EXPECT_EQ(id.value().local_rank, c.local_rank);
    EXPECT_EQ(id.value().local_size, c.local_size);
  }
  EXPECT_EQ(id.value().coordinator ? id.value().coordinator->text() : "", c.coordinator);
  EXPECT_FALSE(id.value().why.empty());
}

const Environment kDew = {{"DEW_PROCESS_ID", "2"},
                          {"DEW_PROCESS_COUNT", "4"},
                          {"DEW_LOCAL_PROCESS_ID", "0"},
                          {"DEW_LOCAL_PROCESS_COUNT", "2"},
                          {"DEW_COORDINATOR_ADDRESS", "node0:29500"}};
const Environment kOmpi = {{"OMPI_COMM_WORLD_RANK", "3"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
const Environment kPmix = {{"PMIX_NAMESPACE", "slurm.pmix.12.0"},
                           {"PMIX_SERVER_URI41", "pmix-server.1;tcp4://127.0.0.1:1"}};

INSTANTIATE_TEST_SUITE_P(
    Sources, Precedence,
    ::testing::Values(
        Case{"nothing", {}, PoolSource::kAlone, 0, 1, 0, 1, ""},
        Case{"dew", kDew, PoolSource::kDew, 2, 4, 0, 2, "node0:29500"},
        Case{"dew_jax_address",
             {{"DEW_PROCESS_ID", "1"}, {"DEW_PROCESS_COUNT", "2"}, {"JAX_COORDINATOR_ADDRESS", "[fe80::1]:7"}},
             PoolSource::kDew,
             1,
             2,
             0,
             1,
             "[fe80::1]:7"},
        Case{"slurm_without_plugin", kSlurmStep, PoolSource::kSlurm, 5, 8, 1, 4,
             "gpu07:29488"},  // the plugin's formula: 20000 + (1234 * 32 + 0) mod 10000
        // The plugin sets Dew's variables to Slurm's own rank and count.
        Case{"slurm_with_plugin", with(kSlurmStep, with(kDew, {{"DEW_PROCESS_ID", "5"}, {"DEW_PROCESS_COUNT", "8"}})),
             PoolSource::kSlurm, 5, 8, 1, 4, "node0:29500"},
        Case{"slurm_one_task", with(kSlurmStep, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}), PoolSource::kAlone, 0,
             1, 1, 4, ""},
        Case{"batch_script_is_not_a_step",
             {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}},
             PoolSource::kAlone,
             0,
             1,
             0,
             1,
             ""},
        Case{"openmpi", kOmpi, PoolSource::kOpenMpi, 3, 4, 1, 2, ""},
        Case{"openmpi_inside_slurm", with(kSlurmStep, kOmpi), PoolSource::kOpenMpi, 3, 4, 1, 2, ""},
        Case{"openmpi_inside_one_task_allocation",
             with(with(kSlurmStep, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}), kOmpi), PoolSource::kOpenMpi, 3, 4,
             1, 2, ""},
        Case{"pmix_first", with(with(kSlurmStep, kOmpi), kPmix), PoolSource::kPmix, 0, 0, 0, 0, ""},
        Case{"pmix_namespace_alone_is_not_pmix", with(kDew, {{"PMIX_NAMESPACE", "x"}}), PoolSource::kDew, 2, 4, 0, 2,
             "node0:29500"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Inside an allocation (`srun --pty bash`, then a launcher that is not
// Dew's, or one that handed down its own task's variables), a process has
// Dew's variables for a pool of 4 and the interactive step's for one task:
// it used to resolve to "alone, rank 0 of 1" (four unconnected trainings,
// no error). Two sources that disagree refuse the join, naming both.
TEST(Disagreement, DewsVariablesAgainstAnInheritedSlurmStepOrMpirunAreRefusedNamingBoth) {
  const Environment one_task = with(kSlurmStep, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  const auto slurm = dew::testing::invalid_argument_of(resolve_identity(with(one_task, kDew), JoinOptions{}));
  EXPECT_THAT(slurm, HasSubstr("DEW_PROCESS_ID=2 DEW_PROCESS_COUNT=4 (a Dew launcher's)"));
  EXPECT_THAT(slurm, HasSubstr("SLURM_PROCID=0 SLURM_NTASKS=1 (a Slurm step's)"));
  const auto mpirun = dew::testing::invalid_argument_of(resolve_identity(with(kOmpi, kDew), JoinOptions{}));
  EXPECT_THAT(mpirun, HasSubstr("OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 (mpirun's)"));
  // Agreeing values are one identity said twice (the plugin's case).
  EXPECT_TRUE(resolve_identity(with(kOmpi, with(kDew, {{"DEW_PROCESS_ID", "3"}})), JoinOptions{}).ok());
}

// Without the plugin, rank 0's node comes from the plugin's own rule: a
// distribution that does not say which node runs rank 0 is refused, naming
// it and the way out, instead of guessing the nodelist's first node.
TEST(Precedence, ASlurmStepWhoseDistributionDoesNotSayWhereRank0RunsNeedsTheAddress) {
  for (const char* dist : {"block", "cyclic:cyclic", "plane=2"}) {
    auto id = resolve_identity(with(kSlurmStep, {{"SLURM_DISTRIBUTION", dist}}), JoinOptions{});
    ASSERT_TRUE(id.ok()) << dist << ": " << id.error().message;
    EXPECT_EQ(id.value().coordinator->host, "gpu07") << dist;
  }
  const auto message =
      dew::testing::message_of(resolve_identity(with(kSlurmStep, {{"SLURM_DISTRIBUTION", "arbitrary"}}), JoinOptions{}),
                               dew::ErrorCode::kUnsupported);
  EXPECT_THAT(message, HasSubstr("the distribution 'arbitrary' does not tell which node runs rank 0"));
  EXPECT_THAT(message, HasSubstr("DEW_COORDINATOR_ADDRESS=HOST:PORT"));
  auto given = resolve_identity(
      with(kSlurmStep, {{"SLURM_DISTRIBUTION", "arbitrary"}, {"DEW_COORDINATOR_ADDRESS", "n9:7"}}), JoinOptions{});
  ASSERT_TRUE(given.ok()) << given.error().message;
  EXPECT_EQ(given.value().coordinator->text(), "n9:7");
}

TEST(Precedence, OneSlurmTaskFormsAPoolWhenAskedTo) {
  JoinOptions options;
  options.multi_host = true;
  auto id = resolve_identity(with(kSlurmStep, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}), options);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id.value().source, PoolSource::kSlurm);
  EXPECT_EQ(id.value().size, 1);
}

// srun --dew-pool --dew-multi-host -n1: the plugin says so with DEW_MULTI_HOST=1.
TEST(Precedence, OneSlurmTaskFormsAPoolWhenThePluginSaysMultiHost) {
  const auto one_task = with(kSlurmStep, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  auto id = resolve_identity(with(one_task, {{"DEW_MULTI_HOST", "1"}}), JoinOptions{});
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(id.value().source, PoolSource::kSlurm);
  EXPECT_EQ(id.value().size, 1);
  EXPECT_EQ(resolve_identity(with(one_task, {{"DEW_MULTI_HOST", "0"}}), JoinOptions{}).value().source,
            PoolSource::kAlone);
  EXPECT_EQ(dew::testing::invalid_argument_of(resolve_identity(with(one_task, {{"DEW_MULTI_HOST", "yes"}}), {})),
            "DEW_MULTI_HOST='yes' is not allowed; allowed: 1 (a one-task step forms a pool of one) or 0");
}

TEST(Precedence, ExplicitOptionsWinOverEveryVariable) {
  JoinOptions options;
  options.rank = 1;
  options.size = 3;
  options.coordinator = "10.0.0.1:1234";
  auto id = resolve_identity(with(with(kSlurmStep, kOmpi), kPmix), options);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id.value().source, PoolSource::kExplicit);
  EXPECT_EQ(id.value().rank, 1);
  EXPECT_EQ(id.value().coordinator->text(), "10.0.0.1:1234");
}

// torchrun's worker environment (torch.distributed.run, --standalone,
// --nproc_per_node 2: the second worker).
const Environment kTorchrunWorker = {
    {"TORCHELASTIC_RUN_ID", "none"}, {"RANK", "1"},       {"WORLD_SIZE", "2"},          {"LOCAL_RANK", "1"},
    {"LOCAL_WORLD_SIZE", "2"},       {"GROUP_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};

TEST(Torchrun, AWorkerOfTorchrunIsRefusedNotMadeAPoolOfItsOwn) {
  const auto message =
      dew::testing::message_of(resolve_identity(kTorchrunWorker, JoinOptions{}), dew::ErrorCode::kUnsupported);
  EXPECT_THAT(message, HasSubstr("this process is a worker of torchrun (TORCHELASTIC_RUN_ID='none', RANK=1, "
                                 "WORLD_SIZE=2, LOCAL_RANK=1)"));
  EXPECT_THAT(message, HasSubstr("srun --dew-pool"));
  EXPECT_THAT(message, HasSubstr("dew launch"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(Torchrun, UnderASlurmStepTheRefusalNamesBothLaunchersFacts) {
  const auto message = dew::testing::message_of(resolve_identity(with(kSlurmStep, kTorchrunWorker), JoinOptions{}),
                                                dew::ErrorCode::kUnsupported);
  EXPECT_THAT(message, HasSubstr("RANK=1, WORLD_SIZE=2"));
  EXPECT_THAT(message, HasSubstr("SLURM_PROCID=5 counts torchrun's agents, not its workers"));
}

TEST(Torchrun, ExplicitRankAndSizeStillJoin) {
  JoinOptions options;
  options.rank = 1;
  options.size = 2;
  options.coordinator = "127.0.0.1:1234";
  EXPECT_EQ(resolve_identity(kTorchrunWorker, options).value().source, PoolSource::kExplicit);
}

struct Bad {
  const char* name;
  Environment env;
  const char* message;
};

class Malformed : public ::testing::TestWithParam<Bad> {};

TEST_P(Malformed, IsOneLineNamingTheVariable) {
  // Which variable and what it holds is the feature of these messages.
  const auto message = dew::testing::invalid_argument_of(resolve_identity(GetParam().env, JoinOptions{}));
  EXPECT_THAT(message, HasSubstr(GetParam().message));
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Variables, Malformed,
    ::testing::Values(
        Bad{"rank_not_below_size", with(kDew, {{"DEW_PROCESS_ID", "4"}}),
            "DEW_PROCESS_ID=4 is not below DEW_PROCESS_COUNT=4"},
        Bad{"size_zero", with(kDew, {{"DEW_PROCESS_ID", "0"}, {"DEW_PROCESS_COUNT", "0"}}),
            "DEW_PROCESS_COUNT=0: a pool has at least one process"},
        Bad{"rank_without_size", {{"DEW_PROCESS_ID", "0"}}, "DEW_PROCESS_ID is set but DEW_PROCESS_COUNT is not"},
        Bad{"size_without_rank", {{"DEW_PROCESS_COUNT", "2"}}, "DEW_PROCESS_COUNT is set but DEW_PROCESS_ID is not"},
        Bad{"rank_not_a_number", with(kDew, {{"DEW_PROCESS_ID", "two"}}),
            "DEW_PROCESS_ID: 'two' is not allowed; allowed: a whole number"},
        Bad{"negative", with(kDew, {{"DEW_PROCESS_ID", "-1"}}), "DEW_PROCESS_ID: '-1' is not allowed"},
        Bad{"coordinator_without_port", with(kDew, {{"DEW_COORDINATOR_ADDRESS", "node0"}}),
            "DEW_COORDINATOR_ADDRESS='node0' has no port"},
        Bad{"coordinator_bad_port", with(kDew, {{"DEW_COORDINATOR_ADDRESS", "node0:99999"}}),
            "port '99999' is not 1-65535"},
        Bad{"coordinator_port_zero", with(kDew, {{"DEW_COORDINATOR_ADDRESS", "node0:0"}}), "port '0' is not 1-65535"},
        Bad{"coordinator_no_host", with(kDew, {{"DEW_COORDINATOR_ADDRESS", ":80"}}), "has no host"},
        Bad{"ipv6_without_brackets", with(kDew, {{"DEW_COORDINATOR_ADDRESS", "fe80::1:80"}}), "in brackets"},
        Bad{"no_coordinator",
            {{"DEW_PROCESS_ID", "0"}, {"DEW_PROCESS_COUNT", "2"}},
            "neither DEW_COORDINATOR_ADDRESS nor JAX_COORDINATOR_ADDRESS"},
        Bad{"jax_address_bad",
            {{"DEW_PROCESS_ID", "0"}, {"DEW_PROCESS_COUNT", "2"}, {"JAX_COORDINATOR_ADDRESS", "h:x"}},
            "JAX_COORDINATOR_ADDRESS='h:x'"},
        Bad{"ompi_rank_too_big", with(kOmpi, {{"OMPI_COMM_WORLD_RANK", "4"}}),
            "OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"},
        Bad{"ompi_partial_local", with(kOmpi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "x"}}),
            "OMPI_COMM_WORLD_LOCAL_SIZE: 'x'"},
        Bad{"ompi_size_missing",
            {{"OMPI_COMM_WORLD_RANK", "1"}},
            "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"},
        Bad{"slurm_rank_too_big", with(kSlurmStep, {{"SLURM_PROCID", "8"}}),
            "SLURM_PROCID=8 is not below SLURM_NTASKS=8"},
        Bad{"slurm_ntasks_missing",
            {{"SLURM_PROCID", "1"}, {"SLURM_STEP_NODELIST", "n1"}},
            "SLURM_PROCID is set but SLURM_NTASKS is not"},
        Bad{"slurm_bad_localid", with(kSlurmStep, {{"SLURM_LOCALID", "a"}}), "SLURM_LOCALID: 'a'"},
        Bad{"slurm_bad_nodelist", with(kSlurmStep, {{"SLURM_STEP_NODELIST", "n[1-"}}), "SLURM_STEP_NODELIST"}),
    [](const ::testing::TestParamInfo<Bad>& info) { return std::string(info.param.name); });

TEST(Settings, OptionsThenVariablesThenDefaults) {
  auto defaults = dew::runtime::resolve_settings({}, JoinOptions{});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults.value().agreement_patience, std::chrono::hours(24));
  EXPECT_EQ(defaults.value().heartbeat_timeout, std::chrono::seconds(10));
  EXPECT_EQ(defaults.value().failure_grace, std::chrono::seconds(60));
  EXPECT_EQ(defaults.value().slow_after, std::chrono::seconds(30));
  EXPECT_EQ(dew::runtime::resolve_settings({{"DEW_SLOW_SECONDS", "0.5"}}, JoinOptions{}).value().slow_after,
            std::chrono::milliseconds(500));
  EXPECT_THAT(
      dew::testing::invalid_argument_of(dew::runtime::resolve_settings({{"DEW_SLOW_SECONDS", "never"}}, JoinOptions{})),
      HasSubstr("DEW_SLOW_SECONDS='never'"));

  auto from_env = dew::runtime::resolve_settings(
      {{"DEW_AGREEMENT_PATIENCE_SECONDS", "2.5"}, {"DEW_HEARTBEAT_TIMEOUT_SECONDS", "1"}}, JoinOptions{});
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env.value().agreement_patience, std::chrono::milliseconds(2500));
  EXPECT_EQ(from_env.value().heartbeat_timeout, std::chrono::seconds(1));

  JoinOptions options;
  options.agreement_patience = std::chrono::seconds(7);
  auto option_wins = dew::runtime::resolve_settings({{"DEW_AGREEMENT_PATIENCE_SECONDS", "2"}}, options);
  ASSERT_TRUE(option_wins.ok());
  EXPECT_EQ(option_wins.value().agreement_patience, std::chrono::seconds(7));

  // A fallback replaces only the built-in default: the variable still wins.
  JoinOptions quick;
  quick.failure_grace_fallback = std::chrono::milliseconds(1);
  EXPECT_EQ(dew::runtime::resolve_settings({}, quick).value().failure_grace, std::chrono::milliseconds(1));
  EXPECT_EQ(dew::runtime::resolve_settings({{"DEW_FAILURE_GRACE_SECONDS", "3"}}, quick).value().failure_grace,
            std::chrono::seconds(3));

  for (const char* bad : {"0", "-3", "soon", "", "1e99", "nan"}) {
    auto refused = dew::runtime::resolve_settings({{"DEW_FAILURE_GRACE_SECONDS", bad}}, JoinOptions{});
    EXPECT_THAT(dew::testing::invalid_argument_of(refused),
                HasSubstr(std::string("DEW_FAILURE_GRACE_SECONDS='") + bad + "'"));
  }
}

}  // namespace
