#include "json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace recompose::detail::json {
namespace {

struct Parser {
  std::string_view s;
  size_t i = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("JSON: " + what + " at offset " + std::to_string(i));
  }
  void skip() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
  }
  bool take(char c) {
    skip();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(std::string_view word) {
    if (s.substr(i, word.size()) != word) return false;
    i += word.size();
    return true;
  }

  std::string string_body() {
    expect('"');
    std::string out;
    while (true) {
      if (i >= s.size()) fail("unterminated string");
      char c = s[i++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) fail("unterminated escape");
      switch (char e = s[i++]) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          if (i + 4 > s.size()) fail("short \\u escape");
          unsigned code = 0;
          auto [p, ec] = std::from_chars(s.data() + i, s.data() + i + 4, code, 16);
          if (ec != std::errc() || p != s.data() + i + 4) fail("bad \\u escape");
          i += 4;
          if (code > 0x7f) fail("non-ASCII \\u escape");  // the writer never produces one
          out += static_cast<char>(code);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  Value value() {
    skip();
    if (i >= s.size()) fail("unexpected end");
    Value v;
    const char c = s[i];
    if (c == '{') {
      v.kind = Value::Kind::Object;
      ++i;
      if (take('}')) return v;
      do {
        skip();
        std::string key = string_body();
        expect(':');
        v.members.emplace_back(std::move(key), value());
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Value::Kind::Array;
      ++i;
      if (take(']')) return v;
      do v.items.push_back(value());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.text = string_body();
    } else if (literal("true")) {
      v.kind = Value::Kind::Bool, v.boolean_value = true;
    } else if (literal("false")) {
      v.kind = Value::Kind::Bool;
    } else if (literal("null")) {
    } else {
      const size_t start = i;
      while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '-' || s[i] == '+' ||
                              s[i] == '.' || s[i] == 'e' || s[i] == 'E')) {
        ++i;
      }
      if (start == i) fail("unexpected character");
      v.kind = Value::Kind::Number;
      v.text = std::string(s.substr(start, i - start));
      char* end = nullptr;
      std::strtod(v.text.c_str(), &end);
      if (end != v.text.c_str() + v.text.size()) fail("bad number '" + v.text + "'");
    }
    return v;
  }
};

[[noreturn]] void wrong_kind(std::string_view what, const char* kind) {
  throw std::invalid_argument("JSON: " + std::string(what) + " must be " + kind);
}

}  // namespace

const Value* Value::find(std::string_view key) const {
  if (kind != Kind::Object) wrong_kind("value with member '" + std::string(key) + "'", "an object");
  for (const auto& [k, v] : members) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value& Value::at(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw std::invalid_argument("JSON: missing member '" + std::string(key) + "'");
  return *v;
}

double Value::number(std::string_view what) const {
  if (kind != Kind::Number) wrong_kind(what, "a number");
  return std::strtod(text.c_str(), nullptr);
}

int64_t Value::integer(std::string_view what) const {
  if (kind != Kind::Number) wrong_kind(what, "an integer");
  int64_t out = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || p != text.data() + text.size()) wrong_kind(what, "an integer");
  return out;
}

bool Value::boolean(std::string_view what) const {
  if (kind != Kind::Bool) wrong_kind(what, "true or false");
  return boolean_value;
}

const std::string& Value::string(std::string_view what) const {
  if (kind != Kind::String) wrong_kind(what, "a string");
  return text;
}

const std::vector<Value>& Value::array(std::string_view what) const {
  if (kind != Kind::Array) wrong_kind(what, "an array");
  return items;
}

Value parse(std::string_view text) {
  Parser p{text};
  Value v = p.value();
  p.skip();
  if (p.i != text.size()) p.fail("trailing characters");
  return v;
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(c));
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string number(double v) {
  if (!std::isfinite(v)) return "0";  // JSON has no inf/nan; the formats only hold finite values
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);  // reads back to the same double
  return buffer;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace recompose::detail::json
