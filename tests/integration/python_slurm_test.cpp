// `import dew` under srun on the two-node test cluster: a Python script's
// pool under srun --dew-pool and srun --mpi=pmix joins, agrees, all-gathers
// and lays out the mesh of `dew mesh --json`; a rank whose loader raises
// ends the step, its traceback printed once and the plugin naming it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

#include "srun_output.h"
#include "test_paths.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string module_dir() {
  const char* dir = std::getenv("DEW_PYTHON_MODULE_DIR");
  return dir ? dir : "";
}

std::string script() { return std::string(std::getenv("DEW_SOURCE_ROOT")) + "/tests/python/pool_script.py"; }

TEST(PythonSlurm, AScriptsPoolUnderSrunExchangesAndLaysOutTheMesh) {
  if (module_dir().empty()) GTEST_SKIP() << "the dew Python module is not built (pybind11-dev missing)";
  auto mesh = run({dew_exe(), "mesh", "--spec", R"({"fsdp": 2, "replicas": 2})", "--processes", "4",
                   "--devices-per-process", "2", "--json"});
  std::smatch devices;
  ASSERT_TRUE(std::regex_search(mesh.out, devices, std::regex(R"re("devices":\[([0-9,]+)\])re"))) << mesh.out;
  std::string want = "\"mesh\": [" + std::regex_replace(devices[1].str(), std::regex(","), ", ") + "]";
  for (const std::vector<std::string>& mode : {std::vector<std::string>{"--dew-pool", "--dew-coordinator=127.0.0.1"},
                                               std::vector<std::string>{"--mpi=pmix"}}) {
    SCOPED_TRACE(mode.front());
    std::vector<std::string> args = mode;
    args.insert(args.end(), {"-N2", "--ntasks-per-node=2", "/usr/bin/python3", script(), "exchange"});
    auto r = cluster().srun(args, {{"PYTHONPATH", module_dir()}}, 60s);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_EQ(occurrences(r.out, "RESULT "), 4) << describe(r);
    EXPECT_EQ(occurrences(r.out, "\"gather\": [\"rank 0\", \"rank 1\", \"rank 2\", \"rank 3\"]"), 4) << r.out;
    EXPECT_EQ(occurrences(r.out, want), 4) << want << "\n" << r.out;
    EXPECT_EQ(occurrences(r.out, "\"xla_flags\": \"--xla_gpu_execution_terminate_timeout=30m\""), 4) << r.out;
  }
}

TEST(PythonSlurm, ARankThatRaisesEndsTheStepNamedOnce) {
  if (module_dir().empty()) GTEST_SKIP() << "the dew Python module is not built (pybind11-dev missing)";
  auto r = cluster().srun({"--dew-pool", "--dew-coordinator=127.0.0.1", "-N2", "--ntasks-per-node=2",
                           "/usr/bin/python3", script(), "sleep", "2"},
                          {{"PYTHONPATH", module_dir()}}, 60s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_EQ(occurrences(r.err, "Traceback (most recent call last)"), 1) << describe(r);
  EXPECT_EQ(occurrences(r.err, "dew: rank 2 ended with exit code 1"), 1) << describe(r);
  EXPECT_EQ(occurrences(r.err, "dew: rank "), 1) << describe(r);
}

}  // namespace
}  // namespace dew::testing
