// The planner's JSON files (plans, profiles) through nlohmann/json: members kept in the order
// they are written, typed reads whose errors say which member is wrong, and whole-file I/O.
// Internal to lib/planner: no public header includes nlohmann.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace recompose::detail::json {

using Json = nlohmann::ordered_json;

// Parses `text`. Throws std::invalid_argument ("JSON: ..." with where it failed) if it is no JSON.
Json parse(std::string_view text);

// Members of an object, typed. Each throws std::invalid_argument naming the member if `object` is
// not an object, the member is missing, or it has another type (integer: an exact integer).
int64_t integer(const Json& object, const char* key);
double number(const Json& object, const char* key);
bool boolean(const Json& object, const char* key);
std::string string(const Json& object, const char* key);
const Json& array(const Json& object, const char* key);

// A number JSON can hold: the formats only hold finite values, and non-finite ones are written as 0.
double finite(double value);

// The whole document, indented, as save() writes it.
std::string dump(const Json& document);

// Whole-file text I/O for save()/load(); throw std::runtime_error naming the file on failure.
void write_text(const std::filesystem::path& path, const std::string& text);
std::string read_text(const std::filesystem::path& path);

}  // namespace recompose::detail::json
