#pragma once
// Declares the v1 interface only (GLOO_STORE_HAS_STORE_V2 left undefined), enough for
// ProcessGroupGloo::GlooStore's `override`s to compile. Never instantiate GlooStore
// from code compiled against this shim (its vtable would not match the real one).
#include <chrono>
#include <string>
#include <vector>
namespace gloo::rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};
} // namespace gloo::rendezvous
