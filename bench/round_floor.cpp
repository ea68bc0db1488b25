// The floor under bench/pool --case round: the least a star of N processes
// on one machine takes for a round of a small all_gather through process 0.
// bench/pool runs it interleaved with Dew's pool (pool_worker rounds) and
// prints Dew's round over this one's, a ratio that holds still while the
// machine's load moves both absolute figures.
//
//   round_floor BYTES ROUNDS
//
// Started the way pool_worker is (DEW_PROCESS_ID, DEW_PROCESS_COUNT,
// DEW_COORDINATOR_ADDRESS=host:port, a numeric IPv4 host). Process 0 runs a
// server on that port in a thread of its own (one epoll loop, as Dew's
// service is one Asio thread in process 0). Every process, 0 included (Dew's
// process 0 is a client of its own service, over loopback), connects once
// (TCP_NODELAY, as Dew's) and sends its rank. Then, per round, each process
// sends BYTES bytes; once every process's part of the round is in, the server
// writes the round's whole payload, N x BYTES in rank order, to every
// connection (as Dew's all_gather reply carries every part). ROUNDS rounds
// after one uncounted; process 0 times each from just before its send to the
// last byte of its reply, as pool_worker times agree() + all_gather(), checks
// the parts after the clock stops, and prints "ROUNDS ms=t1,t2,...".
//
// What it does not do, so that what is left is the floor: no handshake or
// authentication (no HMAC proofs, no frame tags), no frame heads or lengths
// (every message has the one size), no heartbeats, no reader or heartbeat
// threads in the clients (a client reads its reply on its own thread), no
// patience or timeouts, no failure propagation (a lost connection ends the
// run), and no agreement: Dew's round is agree() then all_gather(), two round
// trips through the service; a round here is one.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "round_floor: " << what << "\n";
  std::exit(1);
}

[[noreturn]] void fail_errno(const std::string& what) { fail(what + ": " + std::strerror(errno)); }

struct Settings {
  int rank = 0;
  int size = 0;
  sockaddr_in server{};  // process 0's
  std::size_t bytes = 0;
  int rounds = 0;
};

int variable(const char* name) {
  const char* text = std::getenv(name);
  if (!text) fail(std::string(name) + " is not set");
  return std::atoi(text);
}

Settings settings_from(int argc, char** argv) {
  if (argc != 3) fail("usage: round_floor BYTES ROUNDS");
  Settings s;
  s.bytes = static_cast<std::size_t>(std::stoll(argv[1]));
  s.rounds = std::stoi(argv[2]);
  s.rank = variable("DEW_PROCESS_ID");
  s.size = variable("DEW_PROCESS_COUNT");
  const char* address = std::getenv("DEW_COORDINATOR_ADDRESS");
  const std::string text = address ? address : "";
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) fail("DEW_COORDINATOR_ADDRESS is not host:port");
  s.server.sin_family = AF_INET;
  s.server.sin_port = htons(static_cast<std::uint16_t>(std::stoi(text.substr(colon + 1))));
  if (inet_pton(AF_INET, text.substr(0, colon).c_str(), &s.server.sin_addr) != 1) {
    fail("DEW_COORDINATOR_ADDRESS's host is not a numeric IPv4 address");
  }
  if (s.size < 1 || s.rank < 0 || s.rank >= s.size || s.bytes == 0) fail("bad rank, size or bytes");
  return s;
}

// Process 0 holds a socket per process: 1,024 of them pass the usual soft
// limit of 1,024 descriptors.
void raise_file_limit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return;
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
}

void set_no_delay(int fd) {
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

// ---- the server (process 0's thread) ----

struct Connection {
  int fd = -1;
  int rank = -1;                  // once its first four bytes are in
  std::string inbox;              // bytes not yet taken
  std::size_t sent = 0;           // of the current reply
  bool reply_out = true;          // the whole current reply
  bool waiting_to_write = false;  // for room in its send buffer
};

class StarServer {
 public:
  explicit StarServer(const Settings& settings);
  void run();  // until every round is answered and written

 private:
  void accept_all();
  void read_from(Connection& c);
  void take_messages(Connection& c);
  void complete_round();
  void write_reply(Connection& c);
  void watch(Connection& c, std::uint32_t events);

  const Settings settings;
  int listener = -1;
  int epoll_fd = -1;
  std::vector<Connection> connections;
  std::string gathering;  // the round's parts as they come, at rank x BYTES
  std::string reply;      // the last complete round, being written
  int arrived = 0;        // parts of the round in gathering
  int answered = 0;       // rounds complete
  int writes_pending = 0;
};

StarServer::StarServer(const Settings& s) : settings(s), gathering(s.bytes * static_cast<std::size_t>(s.size), '\0') {
  listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int on = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (bind(listener, reinterpret_cast<const sockaddr*>(&s.server), sizeof s.server) != 0) fail_errno("bind");
  if (listen(listener, SOMAXCONN) != 0) fail_errno("listen");
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  epoll_event event{EPOLLIN, {.u64 = 0}};  // 0: the listener; i + 1: connections[i]
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listener, &event);
  connections.reserve(static_cast<std::size_t>(s.size));
}

void StarServer::run() {
  std::vector<epoll_event> events(256);
  while (answered < settings.rounds + 1 || writes_pending > 0) {
    const int n = epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("epoll_wait");
    for (int i = 0; i < n; ++i) {
      const auto& event = events[static_cast<std::size_t>(i)];
      if (event.data.u64 == 0) {
        accept_all();
        continue;
      }
      Connection& c = connections[event.data.u64 - 1];
      if (event.events & EPOLLOUT) write_reply(c);
      if (event.events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_from(c);
    }
  }
  for (auto& c : connections) close(c.fd);
  close(listener);
  close(epoll_fd);
}

void StarServer::accept_all() {
  for (;;) {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return;
      fail_errno("accept");
    }
    if (connections.size() == static_cast<std::size_t>(settings.size)) fail("more connections than processes");
    set_no_delay(fd);
    connections.emplace_back().fd = fd;
    epoll_event event{EPOLLIN, {.u64 = connections.size()}};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
  }
}

void StarServer::read_from(Connection& c) {
  char buffer[64 << 10];
  for (;;) {
    const ssize_t n = recv(c.fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      c.inbox.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (answered < settings.rounds + 1) {
      fail("process " + std::to_string(c.rank) + " closed its connection before the last round");
    }
    // Done with its last reply, it left while others still read theirs.
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
    return;
  }
  take_messages(c);
}

// A client sends its next part only once it has the whole previous round, so
// a connection holds at most one part of one round.
void StarServer::take_messages(Connection& c) {
  if (c.rank < 0 && c.inbox.size() >= sizeof(std::int32_t)) {
    std::int32_t rank = 0;
    std::memcpy(&rank, c.inbox.data(), sizeof rank);
    if (rank < 0 || rank >= settings.size) fail("a client sent rank " + std::to_string(rank));
    c.rank = rank;
    c.inbox.erase(0, sizeof rank);
  }
  if (c.rank < 0 || c.inbox.size() < settings.bytes) return;
  c.inbox.copy(gathering.data() + static_cast<std::size_t>(c.rank) * settings.bytes, settings.bytes);
  c.inbox.erase(0, settings.bytes);
  if (++arrived == settings.size) complete_round();
}

// Every reply of the previous round is out by now: each of this round's parts
// was sent after its process read that reply whole.
void StarServer::complete_round() {
  reply.swap(gathering);
  gathering.resize(reply.size());
  arrived = 0;
  ++answered;
  writes_pending = settings.size;
  for (auto& c : connections) {
    c.sent = 0;
    c.reply_out = false;
    write_reply(c);
  }
}

void StarServer::write_reply(Connection& c) {
  if (c.reply_out) return;
  while (c.sent < reply.size()) {
    const ssize_t n = send(c.fd, reply.data() + c.sent, reply.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return watch(c, EPOLLIN | EPOLLOUT);
    fail_errno("send to process " + std::to_string(c.rank));
  }
  if (c.waiting_to_write) watch(c, EPOLLIN);
  c.reply_out = true;
  --writes_pending;
}

void StarServer::watch(Connection& c, std::uint32_t events) {
  c.waiting_to_write = (events & EPOLLOUT) != 0;
  const auto index = static_cast<std::uint64_t>(&c - connections.data()) + 1;
  epoll_event event{events, {.u64 = index}};
  epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &event);
}

// ---- the clients (every process) ----

// Process 0's server may not listen yet: retried, as Dew's join retries.
int connect_to_server(const Settings& s) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&s.server), sizeof s.server) == 0) {
      set_no_delay(fd);
      return fd;
    }
    close(fd);
    if (Clock::now() > deadline) fail_errno("connect");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void send_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_errno("send");
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void receive_all(int fd, char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = recv(fd, data, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) fail("the server closed the connection");
    if (n < 0) fail_errno("recv");
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

char letter_of(int rank) { return static_cast<char>('a' + rank % 26); }

bool gathered_right(const std::string& parts, const Settings& s) {
  for (int rank = 0; rank < s.size; ++rank) {
    const auto at = static_cast<std::size_t>(rank) * s.bytes;
    for (std::size_t i = at; i < at + s.bytes; ++i) {
      if (parts[i] != letter_of(rank)) return false;
    }
  }
  return true;
}

int play_rounds(const Settings& s) {
  const int fd = connect_to_server(s);
  const std::int32_t rank = s.rank;
  send_all(fd, reinterpret_cast<const char*>(&rank), sizeof rank);
  const std::string part(s.bytes, letter_of(s.rank));
  std::string parts(s.bytes * static_cast<std::size_t>(s.size), '\0');
  std::string times;
  for (int round = -1; round < s.rounds; ++round) {
    const auto start = Clock::now();
    send_all(fd, part.data(), part.size());
    receive_all(fd, parts.data(), parts.size());
    const auto took = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (!gathered_right(parts, s)) {
      std::cout << "ROUNDS wrong gather in round " << round << std::endl;
      return 1;
    }
    if (round < 0) continue;
    if (!times.empty()) times += ',';  // not "," + string: GCC 12's -Wrestrict misfires on it at -O3
    times += std::to_string(took);
  }
  close(fd);
  if (s.rank == 0) std::cout << "ROUNDS ms=" << times << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = settings_from(argc, argv);
  if (settings.rank != 0) return play_rounds(settings);
  raise_file_limit();
  StarServer server(settings);  // listening before its own client connects
  std::thread serving([&] { server.run(); });
  const int code = play_rounds(settings);
  serving.join();
  return code;
}
