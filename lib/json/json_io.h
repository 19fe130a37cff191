// recompose's JSON documents (the planner's plans and profiles, the ledger's JSON and Chrome
// trace) through nlohmann/json: members kept in the order they are written, typed reads whose
// errors say which member is wrong, and whole-file I/O. Internal to the library: no public header
// includes nlohmann.
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

// Member `key` of `object` into `out`, typed. Throws std::invalid_argument naming the member if
// `object` is not an object, the member is missing, or it has another type (an integer must be
// an exact integer).
void read(const Json& object, const char* key, int64_t& out);
void read(const Json& object, const char* key, double& out);
void read(const Json& object, const char* key, bool& out);
void read(const Json& object, const char* key, std::string& out);
const Json& array(const Json& object, const char* key);

// read() for each pair: read_members(o, "calls", m.calls, "name", m.name).
inline void read_members(const Json&) {}
template <class T, class... Rest>
void read_members(const Json& object, const char* key, T& out, Rest&... rest) {
  read(object, key, out);
  read_members(object, rest...);
}

// A number JSON can hold: the formats only hold finite values, and non-finite ones are written as
// 0.
double finite(double value);

// The whole document, indented, as save() writes it.
std::string dump(const Json& document);

// Whole-file text I/O for save()/load(); throw CheckpointError (a std::runtime_error) naming the
// file on failure.
void write_text(const std::filesystem::path& path, const std::string& text);
std::string read_text(const std::filesystem::path& path);

}  // namespace recompose::detail::json
