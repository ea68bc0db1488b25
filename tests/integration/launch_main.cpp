// dew launch's integration tests: their own program (the --slurm cases use
// their own cluster), so they run apart from spank_integration.
#include <gtest/gtest.h>

#include "slurm_cluster.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dew::testing::add_slurm_cluster_environment();
  return RUN_ALL_TESTS();
}
