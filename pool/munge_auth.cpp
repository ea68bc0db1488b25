// The only file that includes <munge.h>.
#include "munge_auth.h"

#include <munge.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "dew/task_contract.h"

namespace dew::runtime::munge_auth {
namespace {

using Context = std::unique_ptr<std::remove_pointer_t<munge_ctx_t>, decltype(&munge_ctx_destroy)>;

Result<Context> context_for(const Where& where) {
  Context ctx(munge_ctx_create(), &munge_ctx_destroy);
  if (!ctx) return unavailable("MUNGE: cannot make a context (out of memory)");
  if (!where.socket.empty() && munge_ctx_set(ctx.get(), MUNGE_OPT_SOCKET, where.socket.c_str()) != EMUNGE_SUCCESS) {
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
  auto ctx = context_for(where);
  if (!ctx.ok()) return ctx.error();
  munge_ctx_set(ctx.value().get(), MUNGE_OPT_UID_RESTRICTION, getuid());
  const std::string payload = std::string(context) + "\n" + std::string(secret);
  char* credential = nullptr;
  const munge_err_t err =
      munge_encode(&credential, ctx.value().get(), payload.data(), static_cast<int>(payload.size()));
  if (err != EMUNGE_SUCCESS) {
    std::free(credential);
    return unavailable("MUNGE cannot make a credential (" + std::string(munge_strerror(err)) + ", through " +
                       socket_text(where) + ")");
  }
  std::string text(credential);
  std::free(credential);
  return text;
}

Result<std::string> open(const Where& where, std::string_view context, const std::string& credential) {
  auto ctx = context_for(where);
  if (!ctx.ok()) return ctx.error();
  void* payload = nullptr;
  int length = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  const munge_err_t err = munge_decode(credential.c_str(), ctx.value().get(), &payload, &length, &uid, &gid);
  std::string text(static_cast<const char*>(payload ? payload : ""), payload ? static_cast<std::size_t>(length) : 0);
  std::free(payload);
  if (err != EMUNGE_SUCCESS) {
    return unavailable("process 0's MUNGE credential is not valid here (" + std::string(munge_strerror(err)) +
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
