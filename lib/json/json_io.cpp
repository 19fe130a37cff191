#include "json/json_io.h"

#include <recompose/checkpoint_error.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace recompose::detail::json {
namespace {

const Json& member(const Json& object, const char* key) {
  if (!object.is_object()) {
    throw std::invalid_argument(std::string("recompose: JSON: value with member '") + key +
                                "' must be an object");
  }
  const auto it = object.find(key);
  if (it == object.end())
    throw std::invalid_argument(std::string("recompose: JSON: missing member '") + key + "'");
  return *it;
}

[[noreturn]] void wrong_type(const char* key, const char* type) {
  throw std::invalid_argument(std::string("recompose: JSON: ") + key + " must be " + type);
}

}  // namespace

Json parse(std::string_view text) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw std::invalid_argument(std::string("recompose: JSON: ") + e.what());
  }
}

void read(const Json& object, const char* key, int64_t& out) {
  const Json& v = member(object, key);
  if (!v.is_number_integer()) wrong_type(key, "an integer");
  out = v.get<int64_t>();
}

void read(const Json& object, const char* key, double& out) {
  const Json& v = member(object, key);
  if (!v.is_number()) wrong_type(key, "a number");
  out = v.get<double>();
}

void read(const Json& object, const char* key, bool& out) {
  const Json& v = member(object, key);
  if (!v.is_boolean()) wrong_type(key, "true or false");
  out = v.get<bool>();
}

void read(const Json& object, const char* key, std::string& out) {
  const Json& v = member(object, key);
  if (!v.is_string()) wrong_type(key, "a string");
  out = v.get<std::string>();
}

const Json& array(const Json& object, const char* key) {
  const Json& v = member(object, key);
  if (!v.is_array()) wrong_type(key, "an array");
  return v;
}

double finite(double value) { return std::isfinite(value) ? value : 0.0; }

std::string dump(const Json& document) { return document.dump(2) + "\n"; }

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out)
    throw CheckpointError("recompose: cannot write " + path.string() +
                          " (does its folder exist, and may this process write there?)");
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw CheckpointError("recompose: cannot read " + path.string() +
                          " (does the file exist, and may this process read it?)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace recompose::detail::json
