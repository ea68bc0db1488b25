// libpmix is loaded when a process first meets a PMIx server (srun
// --mpi=pmix, mpirun), not linked: a program of libdew started otherwise
// (srun --dew-pool, dew launch, a mesh alone) runs where libpmix is not
// installed. So no PMIx call is made by name here, and none of <pmix.h>'s
// macros that make one (PMIX_VALUE_RELEASE, PMIX_INFO_LOAD,
// PMIX_INFO_DESTRUCT): each goes through the table below.
#include "pmix_session.h"

#include <dlfcn.h>
#include <pmix.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "loaded_library.h"

namespace dew::runtime {
namespace {

// The calls Dew makes, typed by <pmix.h>'s own declarations.
struct PmixCalls {
  decltype(&PMIx_Init) init = nullptr;
  decltype(&PMIx_Finalize) finalize = nullptr;
  decltype(&PMIx_Get) get = nullptr;
  decltype(&PMIx_Get_nb) get_nb = nullptr;
  decltype(&PMIx_Put) put = nullptr;
  decltype(&PMIx_Commit) commit = nullptr;
  decltype(&PMIx_Fence_nb) fence_nb = nullptr;
  decltype(&PMIx_Abort) abort = nullptr;
  decltype(&PMIx_Error_string) error_string = nullptr;
  decltype(&PMIx_Value_destruct) value_destruct = nullptr;
  decltype(&PMIx_Info_load) info_load = nullptr;
};

// Debian's libpmix2 (PMIx 4): the soname Slurm's and Open MPI's PMIx use.
constexpr const char* kPmixLibrary = "libpmix.so.2";

// Loaded once, never closed.
Result<const PmixCalls*> load_pmix() {
  static const Result<PmixCalls> loaded = []() -> Result<PmixCalls> {
    // RTLD_GLOBAL: PMIx's own plugins bind to its symbols.
    auto opened =
        open_library(kPmixLibrary, RTLD_NOW | RTLD_GLOBAL, "a PMIx server is here but PMIx's library", "libpmix2");
    if (!opened.ok()) return opened.error();
    void* handle = opened.value();
    PmixCalls c;
    const bool all = bind_call(handle, "PMIx_Init", c.init) && bind_call(handle, "PMIx_Finalize", c.finalize) &&
                     bind_call(handle, "PMIx_Get", c.get) && bind_call(handle, "PMIx_Get_nb", c.get_nb) &&
                     bind_call(handle, "PMIx_Put", c.put) && bind_call(handle, "PMIx_Commit", c.commit) &&
                     bind_call(handle, "PMIx_Fence_nb", c.fence_nb) && bind_call(handle, "PMIx_Abort", c.abort) &&
                     bind_call(handle, "PMIx_Error_string", c.error_string) &&
                     bind_call(handle, "PMIx_Value_destruct", c.value_destruct) &&
                     bind_call(handle, "PMIx_Info_load", c.info_load);
    if (!all) return unavailable(std::string(kPmixLibrary) + " lacks a call Dew makes: not PMIx 4's library");
    return c;
  }();
  if (!loaded.ok()) return loaded.error();
  return &loaded.value();
}

// Set by PmixSession::init before any other call here.
const PmixCalls* g_pmix = nullptr;

pmix_proc_t g_self;

// PMIX_VALUE_RELEASE and PMIX_INFO_DESTRUCT, through the table.
void release(pmix_value_t* value) {
  g_pmix->value_destruct(value);
  std::free(value);
}
void destruct(pmix_info_t& info) {
  if (!PMIX_INFO_IS_PERSISTENT(&info)) g_pmix->value_destruct(&info.value);
}

// PMIX_LOAD_NSPACE bounds and terminates the copy.
void load_nspace(pmix_proc_t& proc, const char* nspace) { PMIX_LOAD_NSPACE(proc.nspace, nspace); }

std::string describe(pmix_status_t status) { return std::string(g_pmix->error_string(status)); }

// A job-level value of this namespace (rank wildcard).
Result<std::uint32_t> job_u32(const char* key, const pmix_proc_t& proc) {
  pmix_value_t* value = nullptr;
  const pmix_status_t status = g_pmix->get(&proc, key, nullptr, 0, &value);
  if (status != PMIX_SUCCESS || value == nullptr) {
    return unavailable(std::string("PMIx_Get(") + key + "): " + describe(status));
  }
  std::uint32_t out = 0;
  switch (value->type) {
    case PMIX_UINT32:
      out = value->data.uint32;
      break;
    case PMIX_UINT16:
      out = value->data.uint16;
      break;
    case PMIX_INT:
      out = static_cast<std::uint32_t>(value->data.integer);
      break;
    case PMIX_UINT64:
      out = static_cast<std::uint32_t>(value->data.uint64);
      break;
    default: {
      const auto type = value->type;  // read before the release frees it
      release(value);
      return unavailable(std::string("PMIx_Get(") + key + "): unexpected value type " + std::to_string(type));
    }
  }
  release(value);
  return out;
}

}  // namespace

Result<std::unique_ptr<PmixSession>> PmixSession::init() {
  auto calls = load_pmix();
  if (!calls.ok()) return calls.error();
  g_pmix = calls.value();
  const pmix_status_t status = g_pmix->init(&g_self, nullptr, 0);
  if (status != PMIX_SUCCESS) return unavailable("PMIx_Init: " + describe(status));
  std::unique_ptr<PmixSession> session(new PmixSession());
  auto& id = session->identity_;
  id.rank = static_cast<int>(g_self.rank);
  id.nspace = g_self.nspace;
  pmix_proc_t job;
  PMIX_PROC_CONSTRUCT(&job);
  load_nspace(job, g_self.nspace);
  job.rank = PMIX_RANK_WILDCARD;
  auto size = job_u32(PMIX_JOB_SIZE, job);
  if (!size.ok()) return size.error();
  id.size = static_cast<int>(size.value());
  // Per-process values are asked of this process itself.
  if (auto local = job_u32(PMIX_LOCAL_RANK, g_self); local.ok()) id.local_rank = static_cast<int>(local.value());
  if (auto local_size = job_u32(PMIX_LOCAL_SIZE, job); local_size.ok())
    id.local_size = static_cast<int>(local_size.value());
  if (auto node = job_u32(PMIX_NODEID, g_self); node.ok()) id.node = static_cast<int>(node.value());
  pmix_value_t* host = nullptr;
  if (g_pmix->get(&g_self, PMIX_HOSTNAME, nullptr, 0, &host) == PMIX_SUCCESS && host != nullptr) {
    if (host->type == PMIX_STRING && host->data.string != nullptr) id.hostname = host->data.string;
    release(host);
  }
  if (id.rank < 0 || id.rank >= id.size) {
    return internal_error("PMIx gives rank " + std::to_string(id.rank) + " outside a job of " +
                          std::to_string(id.size));
  }
  return session;
}

PmixSession::~PmixSession() { g_pmix->finalize(nullptr, 0); }

const PmixIdentity& PmixSession::identity() const { return identity_; }

void PmixSession::fill(Identity& id) const {
  id.rank = identity_.rank;
  id.size = identity_.size;
  id.local_rank = identity_.local_rank;
  id.local_size = identity_.local_size;
  id.node = identity_.node;
  id.hostname = identity_.hostname;
}

namespace {

// A fence's completion, shared with PMIx's callback. Left behind (never
// freed) when the wait gives up: the callback may still come.
struct FenceWait {
  std::mutex mutex;
  std::condition_variable done;
  std::optional<pmix_status_t> status;
};

void fence_done(pmix_status_t status, void* data) {
  auto* wait = static_cast<FenceWait*>(data);
  std::lock_guard lock(wait->mutex);
  wait->status = status;
  wait->done.notify_all();
}

// PMIx_Fence bounded by `timeout` on this side too: Slurm's PMIx server does
// not honour PMIX_TIMEOUT, and a process that never calls the fence would
// hold every other one in it for good.
pmix_status_t fence_within(const pmix_proc_t& all, const pmix_info_t* info, std::size_t ninfo,
                           std::chrono::milliseconds timeout) {
  auto* wait = new FenceWait;
  const pmix_status_t started = g_pmix->fence_nb(&all, 1, info, ninfo, fence_done, wait);
  if (started != PMIX_SUCCESS) {
    delete wait;
    return started;
  }
  std::unique_lock lock(wait->mutex);
  if (!wait->done.wait_for(lock, timeout + std::chrono::seconds(1), [&] { return wait->status.has_value(); })) {
    return PMIX_ERR_TIMEOUT;  // `wait` stays for the callback that may still come
  }
  const pmix_status_t status = *wait->status;
  lock.unlock();
  delete wait;
  return status;
}

// Put and Commit of `bytes` under `key`, for every process of the job.
Result<Done> post(const std::string& key, const std::string& bytes) {
  pmix_value_t value;
  PMIX_VALUE_CONSTRUCT(&value);
  value.type = PMIX_BYTE_OBJECT;
  value.data.bo.bytes = const_cast<char*>(bytes.data());
  value.data.bo.size = bytes.size();
  pmix_status_t status = g_pmix->put(PMIX_GLOBAL, key.c_str(), &value);
  if (status != PMIX_SUCCESS) return unavailable("PMIx_Put: " + describe(status));
  status = g_pmix->commit();
  if (status != PMIX_SUCCESS) return unavailable("PMIx_Commit: " + describe(status));
  return Done{};
}

}  // namespace

Result<std::vector<std::string>> PmixSession::all_gather(const std::string& bytes, std::chrono::milliseconds timeout) {
  // A fresh key per round: PMIx keeps every committed value, and a reused
  // key could return an earlier round's bytes (NVSHMEM's bootstrap does so).
  const std::string key = "dew.gather." + std::to_string(round_++);
  if (auto posted = post(key, bytes); !posted.ok()) return posted.error();

  pmix_proc_t all;
  PMIX_PROC_CONSTRUCT(&all);
  load_nspace(all, identity_.nspace.c_str());
  all.rank = PMIX_RANK_WILDCARD;
  pmix_info_t info[2];
  bool collect = true;
  const int seconds = static_cast<int>(std::min<long long>(std::max<long long>(timeout.count() / 1000, 1), 1 << 30));
  std::memset(info, 0, sizeof info);
  (void)g_pmix->info_load(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  (void)g_pmix->info_load(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
  pmix_status_t status = fence_within(all, info, 2, timeout);
  destruct(info[0]);
  destruct(info[1]);
  if (status != PMIX_SUCCESS) {
    const std::string what = "PMIx_Fence for all_gather round " + std::to_string(round_ - 1) + ": " + describe(status);
    if (status == PMIX_ERR_TIMEOUT) {
      return timeout_error(what + " (some process never arrived within " + std::to_string(seconds) + " s)");
    }
    return unavailable(what);
  }
  std::vector<std::string> out;
  out.reserve(static_cast<std::size_t>(identity_.size));
  for (int rank = 0; rank < identity_.size; ++rank) {
    pmix_proc_t proc;
    PMIX_PROC_CONSTRUCT(&proc);
    load_nspace(proc, identity_.nspace.c_str());
    proc.rank = static_cast<pmix_rank_t>(rank);
    pmix_value_t* got = nullptr;
    status = g_pmix->get(&proc, key.c_str(), nullptr, 0, &got);
    if (status != PMIX_SUCCESS || got == nullptr || got->type != PMIX_BYTE_OBJECT) {
      if (got) release(got);
      return unavailable("PMIx_Get(" + key + ") of process " + std::to_string(rank) + ": " + describe(status));
    }
    out.emplace_back(got->data.bo.bytes, got->data.bo.size);
    release(got);
  }
  return out;
}

namespace {

// A PMIx_Get_nb's answer, shared with its callback; left behind when the
// wait gives up (the callback may still come).
struct GetWait {
  std::mutex mutex;
  std::condition_variable done;
  std::optional<pmix_status_t> status;
  std::string bytes;
};

void get_done(pmix_status_t status, pmix_value_t* value, void* data) {
  auto* wait = static_cast<GetWait*>(data);
  std::lock_guard lock(wait->mutex);
  if (status == PMIX_SUCCESS && value != nullptr && value->type == PMIX_BYTE_OBJECT) {
    wait->bytes.assign(value->data.bo.bytes, value->data.bo.size);
  } else if (status == PMIX_SUCCESS) {
    status = PMIX_ERR_BAD_PARAM;
  }
  wait->status = status;
  wait->done.notify_all();
}

}  // namespace

Result<std::string> PmixSession::from_process_zero(const std::string& key, const std::string& bytes,
                                                   std::chrono::milliseconds timeout) {
  if (identity_.rank == 0) {
    if (auto posted = post(key, bytes); !posted.ok()) return posted.error();
    return bytes;
  }
  pmix_proc_t zero;
  PMIX_PROC_CONSTRUCT(&zero);
  load_nspace(zero, identity_.nspace.c_str());
  zero.rank = 0;
  // A process on process 0's node may ask before process 0 has posted: the
  // local server answers NOT-FOUND rather than waiting. Asked again until
  // the deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto* wait = new GetWait;
    const pmix_status_t started = g_pmix->get_nb(&zero, key.c_str(), nullptr, 0, get_done, wait);
    if (started != PMIX_SUCCESS) {
      delete wait;
      return unavailable("PMIx_Get_nb(" + key + ") of process 0: " + describe(started));
    }
    std::unique_lock lock(wait->mutex);
    if (!wait->done.wait_until(lock, deadline, [&] { return wait->status.has_value(); })) {
      return timeout_error("process 0 never posted the coordinator over PMIx within " +
                           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
                           " s (DEW_JOIN_TIMEOUT_SECONDS)");  // `wait` stays for a late callback
    }
    const pmix_status_t status = *wait->status;
    std::string got = std::move(wait->bytes);
    lock.unlock();
    delete wait;
    if (status == PMIX_SUCCESS) return got;
    if (status != PMIX_ERR_NOT_FOUND || std::chrono::steady_clock::now() >= deadline) {
      return unavailable("PMIx_Get(" + key + ") of process 0: " + describe(status));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void PmixSession::abort(int code, const std::string& message) {
  pmix_proc_t all;
  PMIX_PROC_CONSTRUCT(&all);
  load_nspace(all, identity_.nspace.c_str());
  all.rank = PMIX_RANK_WILDCARD;
  g_pmix->abort(code, message.c_str(), &all, 1);
}

}  // namespace dew::runtime
