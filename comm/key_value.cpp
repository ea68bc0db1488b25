// The in-process KeyValue store, for ranks that are threads of one process
// (the pool's is axes/key_value.cpp).
#include <condition_variable>
#include <map>
#include <mutex>

#include "dew/comm.h"

namespace dew::comm {

KeyValue local_key_value(std::chrono::milliseconds timeout) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::string, std::vector<char>> values;
  };
  auto shared = std::make_shared<Shared>();
  KeyValue kv;
  kv.put = [shared](const std::string& key, const std::vector<char>& value) -> Result<Done> {
    {
      std::lock_guard lock(shared->mutex);
      shared->values[key] = value;
    }
    shared->changed.notify_all();
    return Done{};
  };
  kv.get = [shared, timeout](const std::string& key) -> Result<std::vector<char>> {
    std::unique_lock lock(shared->mutex);
    if (!shared->changed.wait_for(lock, timeout, [&] { return shared->values.count(key) != 0; })) {
      return timeout_error("key-value store: no value for '" + key + "' after " + std::to_string(timeout.count()) +
                           " ms");
    }
    return shared->values[key];
  };
  return kv;
}

}  // namespace dew::comm
