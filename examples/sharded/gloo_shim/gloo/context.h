// Minimal declaration-only shim: the PyPI libtorch wheel ships ProcessGroupGloo.hpp
// but not the gloo headers it includes. ProcessGroupGloo only holds gloo types via
// shared_ptr/unique_ptr, so forward declarations suffice; all gloo code lives in
// libtorch_cpu.so. Only the one member that an inline function in
// ProcessGroupGloo.hpp touches is declared (it is out-of-line in libtorch_cpu).
#pragma once
#include <chrono>
namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
} // namespace gloo
