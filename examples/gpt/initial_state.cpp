#include "initial_state.h"

#include <ATen/CPUGeneratorImpl.h>

#include <fstream>
#include <stdexcept>

namespace gpt {

void save_initial_state(const std::filesystem::path& path, GPTImpl& model) {
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& item : model.named_parameters())
    state.insert("param." + item.key(), item.value().detach().cpu());
  // Dropout draws from the global CPU generator, which building the model has already advanced.
  auto generator = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state.insert("cpu_rng_state", generator.get_state());
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(state));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace gpt
