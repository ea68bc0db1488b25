// The model's parameters: which exist, how the tensor axis splits each, how
// they are grouped into buckets (the embedding's, then one per layer: what
// fsdp gathers and reduce-scatters at once), and their seeded initial values,
// the same for every layout. Private to train/.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dew/train.h"

namespace dew::train {

// How the tensor axis splits a parameter (a rows x cols matrix).
enum class Split {
  kNone,     // every tensor rank holds all of it
  kColumns,  // each holds cols / T columns (its heads, its hidden units)
  kRows,     // each holds rows / T rows
};

struct ParamSpec {
  std::string name;  // "layer1.wq"
  int rows = 0;
  int cols = 0;
  Split split = Split::kNone;
  bool gain = false;  // an RMSNorm gain: starts at 1; else a seeded normal scaled by init
  double init = 0.02;
  int id = 0;  // the parameter's number in the whole model: its seed stream
};

// Bucket 0: embedding (vocab x W), positions (length x W), final gain (1 x
// W). Bucket 1 + l: layer l's gain1, wq, wk, wv, wo, gain2, w1, w2.
std::vector<std::vector<ParamSpec>> model_buckets(const ModelConfig& model);

// The part of a parameter one tensor rank holds: rows x cols.
int local_rows(const ParamSpec& spec, int tensor_size);
int local_cols(const ParamSpec& spec, int tensor_size);
std::int64_t local_size(const ParamSpec& spec, int tensor_size);

// The values of tensor rank t's part, drawn for the whole parameter from
// the seed so that every layout starts from the same model.
template <typename T>
std::vector<T> initial_part(const ParamSpec& spec, int tensor_rank, int tensor_size, std::uint64_t seed);

// A bucket's parameters one after the other, this tensor rank's parts: the
// offset of each in the flat bucket, and the bucket's size.
struct BucketLayout {
  std::vector<std::int64_t> offsets;
  std::int64_t size = 0;
};
BucketLayout bucket_layout(const std::vector<ParamSpec>& bucket, int tensor_size);

// A stream of pseudo-random numbers from a seed and a few integers
// (splitmix64): the same on every machine and layout.
std::uint64_t mix(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0);
// A standard normal from two such numbers (Box-Muller).
double normal_of(std::uint64_t u1, std::uint64_t u2);

}  // namespace dew::train
