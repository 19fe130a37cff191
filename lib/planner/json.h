// A small JSON reader and writer for plans and profiles (no dependency for two file formats).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace recompose::detail::json {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean_value = false;
  std::string text;  // String: the string; Number: its literal (integers are read exactly)
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;

  // Typed access; each throws std::invalid_argument naming `what` when the kind differs.
  const Value& at(std::string_view key) const;  // member of an object, which must exist
  const Value* find(std::string_view key) const;  // member of an object, or null
  double number(std::string_view what = "value") const;
  int64_t integer(std::string_view what = "value") const;
  bool boolean(std::string_view what = "value") const;
  const std::string& string(std::string_view what = "value") const;
  const std::vector<Value>& array(std::string_view what = "value") const;
};

// Throws std::invalid_argument with the offset of the first error.
Value parse(std::string_view text);

// Literals for a writer: a quoted, escaped string; a number that reads back to the same double.
std::string quote(std::string_view s);
std::string number(double v);

// Whole-file text I/O for save()/load(); throw std::runtime_error naming the file on failure.
void write_text(const std::filesystem::path& path, const std::string& text);
std::string read_text(const std::filesystem::path& path);

}  // namespace recompose::detail::json
