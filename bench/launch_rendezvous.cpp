// The trivial program `dew launch` starts in bench/launch_latency: every
// process meets process 0 at DEW_COORDINATOR_ADDRESS over TCP (process 0
// listens, the others connect, retrying until it does); once all have
// connected, process 0 prints "joined <CLOCK_REALTIME ns>" and releases
// them. The equivalent of MPI_Init + MPI_Barrier (bench/mpi_barrier.cpp).
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

long long now_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

int fail(const char* what) {
  std::perror(what);
  return 1;
}

}  // namespace

int main() {
  const char* id = std::getenv("DEW_PROCESS_ID");
  const char* count_text = std::getenv("DEW_PROCESS_COUNT");
  const char* address = std::getenv("DEW_COORDINATOR_ADDRESS");
  if (id == nullptr || count_text == nullptr || address == nullptr) {
    std::fprintf(stderr, "launch_rendezvous: run me under dew launch\n");
    return 2;
  }
  const int rank = std::atoi(id);
  const int count = std::atoi(count_text);
  const std::string where = address;
  const std::string host = where.substr(0, where.rfind(':'));
  const std::string port = where.substr(where.rfind(':') + 1);

  if (rank == 0) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    const int on = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    any.sin_port = htons(static_cast<std::uint16_t>(std::atoi(port.c_str())));
    if (bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0) return fail("bind");
    if (listen(listener, count) != 0) return fail("listen");
    std::vector<int> peers;
    while (static_cast<int>(peers.size()) < count - 1) {
      const int peer = accept(listener, nullptr, nullptr);
      if (peer < 0) return fail("accept");
      peers.push_back(peer);
    }
    std::printf("joined %lld\n", now_ns());
    std::fflush(stdout);
    for (const int peer : peers) {
      const char go = 'g';
      if (write(peer, &go, 1) != 1) return fail("write");
      close(peer);
    }
    return 0;
  }

  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) return fail("getaddrinfo");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      char go = 0;
      const bool released = read(fd, &go, 1) == 1;
      close(fd);
      freeaddrinfo(found);
      return released ? 0 : 1;
    }
    close(fd);
    if (std::chrono::steady_clock::now() > deadline) return fail("connect");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
