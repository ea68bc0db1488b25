// The pool's put/get as a KeyValue, for ranks across processes.
#include "dew/axes.h"

namespace dew::axes {

KeyValue pool_key_value(runtime::Pool& pool, std::chrono::milliseconds timeout) {
  return KeyValue{[&pool](const std::string& key, const std::vector<char>& value) -> Result<Done> {
                    try {
                      pool.put(key, std::string(value.begin(), value.end()));
                      return Done{};
                    } catch (const runtime::PoolError& error) {
                      return Error{error.code(), error.what()};
                    }
                  },
                  [&pool, timeout](const std::string& key) -> Result<std::vector<char>> {
                    try {
                      const std::string value = pool.get(key, timeout);
                      return std::vector<char>(value.begin(), value.end());
                    } catch (const runtime::PoolError& error) {
                      return Error{error.code(), error.what()};
                    }
                  }};
}

}  // namespace dew::axes
