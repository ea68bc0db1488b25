// The task contract: one small script (pool_script.py contract) under every
// launcher a user reaches Dew by, on the two-node test cluster (4 stand-in
// GPUs a node) and on this machine, and the same contract comes out
// (task_contract.h): rank, count, local rank, one coordinator that is the
// framework's, torch's variables, the watchdog's default and each
// process's GPUs. dew launch over ssh is checked in launch_ssh_test.cpp.
#include "task_contract.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "launch_helpers.h"
#include "slurm_cluster.h"

namespace dew::testing {
namespace {

using namespace std::chrono_literals;

std::string contract_script() { return std::string(std::getenv("DEW_SOURCE_ROOT")) + "/tests/python/pool_script.py"; }
std::map<std::string, std::string> python_env() {
  const char* dir = std::getenv("DEW_PYTHON_MODULE_DIR");
  return {{"PYTHONPATH", dir ? dir : ""}};
}
std::vector<std::string> script_argv() { return {"/usr/bin/python3", contract_script(), "contract"}; }
std::vector<std::string> with(std::vector<std::string> head, const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// Each node's 4 GPUs (Slurm's CUDA_VISIBLE_DEVICES for --gres=gpu:4), two
// processes a node: Dew's launchers give each its half.
const GpuContract kDewShares{std::vector<std::string>{"0,1", "2,3"}, std::nullopt};
// Launchers that are not Dew's: what Slurm gave stays.
const GpuContract kSlurmsGpus{std::nullopt, "0,1,2,3"};

class TaskContract : public ::testing::Test {
 protected:
  void SetUp() override {
    if (python_env()["PYTHONPATH"].empty()) GTEST_SKIP() << "the dew Python module is not built";
  }
};

TEST_F(TaskContract, SrunDewPool) {
  auto r = cluster().srun(with({"--dew-pool", "-N2", "--ntasks-per-node=2", "--gres=gpu:4"}, script_argv()),
                          python_env(), 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 2, 2, kDewShares);
}

TEST_F(TaskContract, PlainSrunWithMunge) {
  auto env = python_env();
  env["DEW_MUNGE_SOCKET"] = cluster().munge_socket();
  auto r = cluster().srun(with({"-N2", "--ntasks-per-node=2", "--gres=gpu:4"}, script_argv()), env, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 2, 2, kSlurmsGpus);
}

TEST_F(TaskContract, SrunMpiPmix) {
  auto r = cluster().srun(with({"--mpi=pmix", "-N2", "--ntasks-per-node=2", "--gres=gpu:4"}, script_argv()),
                          python_env(), 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 2, 2, kSlurmsGpus);
}

TEST_F(TaskContract, DewLaunchSlurmWithThePlugin) {
  auto r = cluster().command(with({"salloc", "-N2", "--ntasks-per-node=2", "--gres=gpu:4", "--quiet", dew_exe(),
                                   "launch", "--slurm", "--processes-per-host", "2", "--"},
                                  script_argv()),
                             python_env(), 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 2, 2, kDewShares);
}

// Without the plugin dew launch hands srun the secret and the watchdog;
// srun starts the tasks, so their GPUs are Slurm's.
TEST_F(TaskContract, DewLaunchSlurmWithoutThePlugin) {
  auto env = python_env();
  env["SLURM_CONF"] = cluster().conf_without_plugin();
  auto r = cluster().command(with({"salloc", "-N2", "--ntasks-per-node=2", "--gres=gpu:4", "--quiet", dew_exe(),
                                   "launch", "--slurm", "--processes-per-host", "2", "--"},
                                  script_argv()),
                             env, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 2, 2, kSlurmsGpus);
}

// Inside an allocation's one-task step (after `srun --pty bash`): dew
// launch's processes are the pool, with the step's 4 GPUs shared out.
TEST_F(TaskContract, DewLaunchInsideAOneTaskStep) {
  auto r = cluster().srun(
      with({"-N1", "-n1", "--gres=gpu:4", dew_exe(), "launch", "--processes-per-host", "2", "--"}, script_argv()),
      python_env(), 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 1, 2, kDewShares);
}

TEST_F(TaskContract, DewLaunchOnThisMachine) {
  auto env = python_env();
  env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3";
  auto r = dew_launch(with({"--processes-per-host", "2", "--"}, script_argv()), env, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 1, 2, kDewShares);
}

TEST_F(TaskContract, Mpirun) {
  auto env = python_env();
  env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3";
  auto r = run(with({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x",
                     "CUDA_VISIBLE_DEVICES"},
                    script_argv()),
               env, 60s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_task_contract(r, 1, 2, GpuContract{std::nullopt, "0,1,2,3"});
}

}  // namespace
}  // namespace dew::testing
