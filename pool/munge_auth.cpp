// The only file that includes <munge.h>. libmunge is loaded when a pool
// first needs it (plain srun without DEW_POOL_SECRET), not linked: a program
// of libdew that never meets MUNGE (a mesh, a pool under srun --dew-pool or
// dew launch) runs where libmunge is not installed.
#include "munge_auth.h"

#include <dlfcn.h>
#include <munge.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "dew/task_contract.h"
#include "loaded_library.h"

namespace dew::runtime::munge_auth {
namespace {

// The calls Dew makes, typed by <munge.h>'s own declarations.
struct Library {
  decltype(&munge_ctx_create) ctx_create = nullptr;
  decltype(&munge_ctx_destroy) ctx_destroy = nullptr;
  decltype(&munge_ctx_set) ctx_set = nullptr;
  decltype(&munge_encode) encode = nullptr;
  decltype(&munge_decode) decode = nullptr;
  decltype(&munge_strerror) strerror = nullptr;
};

// libmunge's soname in Debian's libmunge2 (and every distribution since
// MUNGE 0.5): the library is never closed once loaded.
constexpr const char* kLibraryName = "libmunge.so.2";

Result<const Library*> library() {
  static const Result<Library> loaded = []() -> Result<Library> {
    auto opened = open_library(kLibraryName, RTLD_NOW | RTLD_LOCAL, "MUNGE's library", "libmunge2");
    if (!opened.ok()) return opened.error();
    void* handle = opened.value();
    Library calls;
    if (!bind_call(handle, "munge_ctx_create", calls.ctx_create) ||
        !bind_call(handle, "munge_ctx_destroy", calls.ctx_destroy) ||
        !bind_call(handle, "munge_ctx_set", calls.ctx_set) || !bind_call(handle, "munge_encode", calls.encode) ||
        !bind_call(handle, "munge_decode", calls.decode) || !bind_call(handle, "munge_strerror", calls.strerror)) {
      return unavailable(std::string(kLibraryName) +
                         " lacks a call Dew makes (munge_ctx_create, munge_ctx_set, "
                         "munge_encode, munge_decode, munge_strerror): not MUNGE 0.5's library");
    }
    return calls;
  }();
  if (!loaded.ok()) return loaded.error();
  return &loaded.value();
}

using Context = std::unique_ptr<std::remove_pointer_t<munge_ctx_t>, decltype(&munge_ctx_destroy)>;

Result<Context> context_for(const Library& munge, const Where& where) {
  Context ctx(munge.ctx_create(), munge.ctx_destroy);
  if (!ctx) return unavailable("MUNGE: cannot make a context (out of memory)");
  if (!where.socket.empty() && munge.ctx_set(ctx.get(), MUNGE_OPT_SOCKET, where.socket.c_str()) != EMUNGE_SUCCESS) {
    return invalid_argument("DEW_MUNGE_SOCKET='" + where.socket + "' is not allowed by MUNGE; allowed: a path");
  }
  return ctx;
}

std::string socket_text(const Where& where) {
  return where.socket.empty() ? std::string("MUNGE's default socket") : "DEW_MUNGE_SOCKET=" + where.socket;
}

}  // namespace

Where where_from_env() {
  const char* socket = std::getenv(contract::kMungeSocket.name);
  return Where{socket ? socket : ""};
}

Result<std::string> seal(const Where& where, std::string_view context, std::string_view secret) {
  auto munge = library();
  if (!munge.ok()) return munge.error();
  const Library& calls = *munge.value();
  auto ctx = context_for(calls, where);
  if (!ctx.ok()) return ctx.error();
  calls.ctx_set(ctx.value().get(), MUNGE_OPT_UID_RESTRICTION, getuid());
  const std::string payload = std::string(context) + "\n" + std::string(secret);
  char* credential = nullptr;
  const munge_err_t err =
      calls.encode(&credential, ctx.value().get(), payload.data(), static_cast<int>(payload.size()));
  if (err != EMUNGE_SUCCESS) {
    std::free(credential);
    return unavailable("MUNGE cannot make a credential (" + std::string(calls.strerror(err)) + ", through " +
                       socket_text(where) + ")");
  }
  std::string text(credential);
  std::free(credential);
  return text;
}

Result<std::string> open(const Where& where, std::string_view context, const std::string& credential) {
  auto munge = library();
  if (!munge.ok()) return munge.error();
  const Library& calls = *munge.value();
  auto ctx = context_for(calls, where);
  if (!ctx.ok()) return ctx.error();
  void* payload = nullptr;
  int length = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  const munge_err_t err = calls.decode(credential.c_str(), ctx.value().get(), &payload, &length, &uid, &gid);
  std::string text(static_cast<const char*>(payload ? payload : ""), payload ? static_cast<std::size_t>(length) : 0);
  std::free(payload);
  if (err != EMUNGE_SUCCESS) {
    return unavailable("process 0's MUNGE credential is not valid here (" + std::string(calls.strerror(err)) +
                       ", through " + socket_text(where) + ")");
  }
  if (uid != getuid()) {
    return unavailable("process 0's MUNGE credential was made by uid " + std::to_string(uid) + ", not this uid " +
                       std::to_string(getuid()) + ": not this pool's process 0");
  }
  const auto newline = text.find('\n');
  if (newline == std::string::npos || std::string_view(text).substr(0, newline) != context) {
    return unavailable("process 0's MUNGE credential is for '" + text.substr(0, std::min(newline, text.size())) +
                       "', not '" + std::string(context) + "': another step's service on this port");
  }
  return text.substr(newline + 1);
}

}  // namespace dew::runtime::munge_auth
