// `dew layout-parity`'s core: every layout of a device count, and how far a
// layout's training is from one device's, against the reference's own
// deviation when only the order of the batch's sums changes (the floor: the
// one-device reference run again with each step's sequences reversed).
#pragma once

#include <string>
#include <vector>

#include "dew/train.h"

namespace dew::train {

struct ParityLayout {
  std::string mesh;      // "data=2,fsdp=4"; "data=1" for one device
  std::string exchange;  // "auto" without a sequence axis, else "all-to-all" or "gather"
};

// Every combination of data, fsdp, tensor and sequence whose product is
// `devices`, each also with every replicas > 1 that divides data (the data
// axis spans the replica groups),
// and both exchanges where sequence > 1: in a fixed order, whether or not
// the rules allow them (plan_layout says).
std::vector<ParityLayout> parity_layouts(int devices);

// The parameter groups the table shows, then the loss.
inline constexpr const char* kParityGroups[] = {"loss", "embedding", "positions", "attention", "mlp", "norms"};

struct GroupDeviation {
  std::string group;
  double deviation = 0;  // max |layout - reference| over the group's values
  double floor = 0;      // max |reordered - reference| over the same values
  double scale = 0;      // max |reference| over them
  bool pass = false;     // deviation <= factor x floor + slack x max(1, scale)
};

// Every step's loss and step 1's gradient (capture_gradient) of `layout`
// against the reference and the reordered reference. slack: values this
// close count as equal whatever the floor (a few units in the last place),
// relative to the group's largest value above 1.
std::vector<GroupDeviation> compare_to_reference(const WorkerReport& layout, const WorkerReport& reference,
                                                 const WorkerReport& reordered, double factor, double slack);

}  // namespace dew::train
