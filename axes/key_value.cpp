// The pool's put/get as a KeyValue, for ranks across processes.
#include "dew/axes.h"

namespace dew::axes {

KeyValue pool_key_value(runtime::Pool& pool, std::chrono::milliseconds timeout) {
  return KeyValue{[&pool](const std::string& key, const std::vector<char>& value) {
                    return pool.try_put(key, std::string(value.begin(), value.end()));
                  },
                  [&pool, timeout](const std::string& key) -> Result<std::vector<char>> {
                    auto value = pool.try_get(key, timeout);
                    if (!value.ok()) return value.error();
                    return std::vector<char>(value.value().begin(), value.value().end());
                  }};
}

}  // namespace dew::axes
