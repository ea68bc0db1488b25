// Summaries of repeated measurements, as the benchmarks print them.
#pragma once

#include <vector>

namespace dew {

// The middle value; for an even count the mean of the two middle values.
// 0 for no values.
double median(std::vector<double> values);

struct Summary {
  double min = 0;
  double median = 0;
  double max = 0;
};
Summary summarize(const std::vector<double>& values);

}  // namespace dew
