// layout-parity's layouts and its verdict.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "dew/layout_parity.h"

namespace dew::train {
namespace {

TEST(Parity, EveryFactorisationOfEightDevicesOnceWithReplicasAndBothExchanges) {
  const auto layouts = parity_layouts(8);
  std::set<std::pair<std::string, std::string>> seen;
  int plain = 0;
  for (const auto& l : layouts) {
    EXPECT_TRUE(seen.insert({l.mesh, l.exchange}).second) << l.mesh << " twice";
    const bool sequence = l.mesh.find("sequence=") != std::string::npos;
    EXPECT_EQ(l.exchange == "auto", !sequence) << l.mesh;
    plain += l.mesh.find("replicas") == std::string::npos && l.exchange != "gather";
  }
  // 8 = 2^3 over four axes: C(6, 3) = 20 shapes.
  EXPECT_EQ(plain, 20);
  EXPECT_TRUE(seen.count({"data=2,fsdp=2,sequence=2,replicas=2", "gather"}));
  EXPECT_TRUE(seen.count({"data=8", "auto"}));
  EXPECT_EQ(parity_layouts(1).size(), 1u);
}

WorkerReport report_of(std::vector<double> losses, std::vector<double> gradient) {
  WorkerReport r;
  for (std::size_t k = 0; k < losses.size(); ++k) r.steps.push_back(StepRecord{int(k) + 1, losses[k], 0, {}});
  r.gradient = std::move(gradient);
  r.leaves = {{"embedding", 0, 2}, {"layer0.wq", 2, 1}, {"layer0.w1", 3, 1}, {"layer0.gain1", 4, 1}};
  return r;
}

TEST(Parity, ALayoutPassesWithinTheFloorAndFailsPastIt) {
  const auto reference = report_of({2.0, 1.0}, {0.1, 0.2, 0.3, 0.4, 0.5});
  const auto reordered = report_of({2.0 + 1e-7, 1.0}, {0.1 + 1e-6, 0.2, 0.3 + 1e-6, 0.4 + 1e-6, 0.5 + 1e-6});
  const auto close = report_of({2.0 - 2e-7, 1.0}, {0.1 - 3e-6, 0.2, 0.3, 0.4, 0.5});
  for (const auto& g : compare_to_reference(close, reference, reordered, 8, 0)) {
    EXPECT_TRUE(g.pass) << g.group << " " << g.deviation << " floor " << g.floor;
  }
  const auto off = report_of({2.0, 1.0}, {0.1, 0.2, 0.3 + 1e-3, 0.4, 0.5});
  for (const auto& g : compare_to_reference(off, reference, reordered, 8, 0)) {
    EXPECT_EQ(g.pass, g.group != "attention") << g.group;
  }
  // A step missing, or a gradient missing, fails.
  const auto short_run = report_of({2.0}, {0.1, 0.2, 0.3, 0.4, 0.5});
  EXPECT_FALSE(compare_to_reference(short_run, reference, reordered, 8, 0)[0].pass);
  const auto no_gradient = report_of({2.0, 1.0}, {});
  EXPECT_FALSE(compare_to_reference(no_gradient, reference, reordered, 8, 0)[1].pass);
}

// The slack is relative above 1: a loss of 4 off by 3e-9 (a floor that happened to be 1.5e-10) is a few units in
// its last place; a gradient value of 0.1 off by as much is not.
TEST(Parity, TheSlackGrowsWithTheValue) {
  const std::vector<double> gradient = {0.1, 0.2, 0.3, 0.4, 0.5};
  const auto reference = report_of({4.0, 4.0}, gradient);
  const auto reordered = report_of({4.0 + 1.5e-10, 4.0}, gradient);
  const auto layout = report_of({4.0 + 3e-9, 4.0}, {0.1 + 3e-9, 0.2, 0.3, 0.4, 0.5});
  const auto groups = compare_to_reference(layout, reference, reordered, 8, 1e-9);
  EXPECT_TRUE(groups[0].pass) << groups[0].group << " " << groups[0].deviation << " scale " << groups[0].scale;
  EXPECT_EQ(groups[0].scale, 4.0);
  EXPECT_FALSE(compare_to_reference(report_of({4.0 + 6e-9, 4.0}, gradient), reference, reordered, 8, 1e-9)[0].pass);
  for (const auto& g : groups) {
    if (g.group != "loss" && g.deviation > 0) {
      EXPECT_FALSE(g.pass) << g.group;
    }
  }
}

}  // namespace
}  // namespace dew::train
