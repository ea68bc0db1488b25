// The collective checks every Communicator backend must pass, shared by the
// Gloo and NCCL communicator tests: each runs on every rank of a group of n,
// inside the test's own spawn of that backend's ranks.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "dew/comm.h"

namespace dew::comm::testing {

inline void check_all_to_all(Communicator& comm, int n) {
  const int chunk = 5;
  std::vector<float> send(std::size_t(n * chunk)), recv(send.size());
  for (int to = 0; to < n; ++to)
    for (int i = 0; i < chunk; ++i) send[std::size_t(to * chunk + i)] = float(comm.rank() * 1000 + to * 10 + i);
  auto done = comm.all_to_all<float>(send, recv);
  ASSERT_TRUE(done.ok()) << done.error().message;
  for (int from = 0; from < n; ++from)
    for (int i = 0; i < chunk; ++i)
      EXPECT_EQ(recv[std::size_t(from * chunk + i)], float(from * 1000 + comm.rank() * 10 + i));
}

inline void check_all_gather(Communicator& comm, int n) {
  std::vector<double> send = {comm.rank() + 0.5, comm.rank() * 2.0, -1.0};
  std::vector<double> recv(std::size_t(3 * n));
  auto done = comm.all_gather<double>(send, recv);
  ASSERT_TRUE(done.ok()) << done.error().message;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(recv[std::size_t(3 * r)], r + 0.5);
    EXPECT_EQ(recv[std::size_t(3 * r + 1)], r * 2.0);
    EXPECT_EQ(recv[std::size_t(3 * r + 2)], -1.0);
  }
}

// fp32 sums equal rank order's bit for bit where the backend adds in rank
// order (always for the shared all-to-all one; NCCL only up to 2 ranks),
// otherwise to fp32 rounding; fp64 quarters and integers are exact in any
// order.
inline void check_reduce_scatter(Communicator& comm, int n, bool rank_order) {
  const int chunk = 4;
  std::vector<float> send(std::size_t(n * chunk)), recv(chunk);
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = float(comm.rank() + 1) * 0.1f + float(i);
  auto done = comm.reduce_scatter(std::span<const float>(send), std::span<float>(recv));
  ASSERT_TRUE(done.ok()) << done.error().message;
  for (int i = 0; i < chunk; ++i) {
    float expected = 0;  // rank order, fp32
    for (int r = 0; r < n; ++r) expected += float(r + 1) * 0.1f + float(comm.rank() * chunk + i);
    if (rank_order) {
      EXPECT_EQ(recv[std::size_t(i)], expected);
    } else {
      EXPECT_FLOAT_EQ(recv[std::size_t(i)], expected);
    }
  }
  std::vector<double> send64(std::size_t(n * chunk)), recv64(chunk);
  for (std::size_t i = 0; i < send64.size(); ++i) send64[i] = double(comm.rank()) + double(i) * 0.25;
  done = comm.reduce_scatter(std::span<const double>(send64), std::span<double>(recv64));
  ASSERT_TRUE(done.ok()) << done.error().message;
  for (int i = 0; i < chunk; ++i) {
    double expected = 0;
    for (int r = 0; r < n; ++r) expected += double(r) + double(comm.rank() * chunk + i) * 0.25;
    EXPECT_EQ(recv64[std::size_t(i)], expected);
  }
  done = comm.barrier();
  EXPECT_TRUE(done.ok()) << done.error().message;
}

// Every rank ends with the same bits: each element summed in rank order in
// T (fp32 for float), for lengths that do and do not divide by the ranks
// (the padding is not seen), and an empty span is a no-op.
inline void check_all_reduce(Communicator& comm, int n, bool rank_order) {
  for (const std::size_t length : {std::size_t(1), std::size_t(7), std::size_t(64)}) {
    std::vector<float> data(length);
    for (std::size_t i = 0; i < length; ++i) data[i] = float(comm.rank() + 1) * 0.1f + float(i) * 1e-3f;
    auto done = comm.all_reduce(std::span<float>(data));
    ASSERT_TRUE(done.ok()) << done.error().message;
    for (std::size_t i = 0; i < length; ++i) {
      float expected = 0;  // rank order, fp32
      for (int r = 0; r < n; ++r) expected += float(r + 1) * 0.1f + float(i) * 1e-3f;
      if (rank_order) {
        EXPECT_EQ(data[i], expected) << "length " << length << ", element " << i;
      } else {
        EXPECT_FLOAT_EQ(data[i], expected) << "length " << length << ", element " << i;
      }
    }
    std::vector<double> data64(length);
    for (std::size_t i = 0; i < length; ++i) data64[i] = double(comm.rank() + 1) * 0.1 + double(i);
    done = comm.all_reduce(std::span<double>(data64));
    ASSERT_TRUE(done.ok()) << done.error().message;
    for (std::size_t i = 0; i < length; ++i) {
      double expected = 0;
      for (int r = 0; r < n; ++r) expected += double(r + 1) * 0.1 + double(i);
      if (rank_order) {
        EXPECT_EQ(data64[i], expected);
      } else {
        EXPECT_DOUBLE_EQ(data64[i], expected);
      }
    }
  }
  std::vector<float> none;
  EXPECT_TRUE(comm.all_reduce(std::span<float>(none)).ok());
}

// From every root in turn: every rank ends with the root's values; a root
// outside the group is refused with one line.
inline void check_broadcast(Communicator& comm, int n) {
  for (int root = 0; root < n; ++root) {
    std::vector<int> data(9, comm.rank() == root ? 100 + root : -1);
    auto done = comm.broadcast<int>(data, root);
    ASSERT_TRUE(done.ok()) << done.error().message;
    for (const int value : data) EXPECT_EQ(value, 100 + root) << "root " << root << " on rank " << comm.rank();
  }
  std::vector<int> data(2);
  auto refused = comm.broadcast<int>(data, n);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(refused.error().message, "broadcast: root " + std::to_string(n) +
                                         " is not allowed; allowed: a rank from 0 to " + std::to_string(n - 1));
}

// Twenty all-to-alls and barriers in a row, each larger than the last (a
// backend that keeps buffers must grow them).
inline void check_many_calls(Communicator& comm, int n) {
  for (int round = 0; round < 20; ++round) {
    const std::size_t per = std::size_t(1 + round * 37);
    std::vector<int> send(std::size_t(n) * per, comm.rank() + round);
    std::vector<int> recv(send.size());
    auto done = comm.all_to_all<int>(send, recv);
    ASSERT_TRUE(done.ok()) << done.error().message;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < per; ++i) EXPECT_EQ(recv[std::size_t(r) * per + i], r + round);
    done = comm.barrier();
    ASSERT_TRUE(done.ok()) << done.error().message;
  }
}

// On 2 ranks: sizes that do not fit are refused with one line each, and a
// refused call exchanged nothing (the communicator still works).
inline void check_size_errors(Communicator& comm) {
  using ::testing::HasSubstr;
  std::vector<float> send(3), recv(3);
  auto r = comm.all_to_all<float>(send, recv);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("all_to_all: 3 values to send and 3 to receive are not allowed"));
  std::vector<float> small(5);
  r = comm.all_gather<float>(send, small);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("all_gather: 20 bytes to receive is not allowed; allowed: 2 ranks x 12"));
  std::vector<float> one(2);
  r = comm.reduce_scatter(std::span<const float>(send), std::span<float>(one));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("reduce_scatter: 3 values to send is not allowed"));
  r = comm.barrier();
  EXPECT_TRUE(r.ok()) << r.error().message;
}

}  // namespace dew::comm::testing
