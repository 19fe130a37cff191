#include "offload_link.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace gpt {
namespace {

std::optional<recompose::LinkModel>& given() {
  static std::optional<recompose::LinkModel> link;
  return link;
}

}  // namespace

recompose::LinkModel parse_link(std::string_view text) {
  const std::string t(text);
  recompose::LinkModel link;
  double* fields[] = {&link.d2h_bytes_per_second, &link.h2d_bytes_per_second,
                      &link.seconds_per_copy};
  const char* at = t.c_str();
  for (size_t i = 0; i < 3; ++i) {
    char* end = nullptr;
    *fields[i] = std::strtod(at, &end);
    if (end == at || (i < 2 ? *end != ',' : *end != '\0')) {
      throw std::invalid_argument(
          "'" + t + "' is not \"measure\" nor \"D2H,H2D,COST\" (\"53e9,35e9,10e-6\")");
    }
    at = end + 1;
  }
  if (!link.valid())
    throw std::invalid_argument("'" + t + "': bandwidths must be positive, the cost not negative");
  return link;
}

void set_link(std::string_view text) {
  if (text == "measure")
    given().reset();
  else
    given() = parse_link(text);
}

std::optional<recompose::LinkModel> link_for(const torch::Device& device) {
  if (given()) return given();
  if (!device.is_cuda()) return std::nullopt;
  static const recompose::LinkModel measured = recompose::measure_link(device);
  return measured;
}

recompose::LinkModel offload_link(const torch::Device& device) {
  return link_for(device).value_or(recompose::LinkModel::symmetric(10e9, 10e-6));
}

namespace {
double window_seconds = 0;
}

void set_offload_window(double seconds) { window_seconds = seconds; }
double offload_window() { return window_seconds; }

recompose::SolveOptions solve_options(const torch::Device& device) {
  recompose::SolveOptions options;
  if (auto link = link_for(device)) options.link(*link);
  return options;
}

}  // namespace gpt
