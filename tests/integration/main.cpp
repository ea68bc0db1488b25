// One test program, one cluster: every integration suite (the plugin, pools
// under Slurm, the sbatch templates, dew launch) links into it.
#include <gtest/gtest.h>

#include "slurm_cluster.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dew::testing::add_slurm_cluster_environment();
  return RUN_ALL_TESTS();
}
