#include "shardwise/core/attrs.h"

#include <charconv>

#include "shardwise/core/error.h"

namespace shardwise {
namespace {

std::string value_to_string(const AttrValue& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return fmt::format("{}", *d);
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  return fmt::format("[{}]", fmt::join(std::get<std::vector<int64_t>>(v), ","));
}

const char* kind_name(const AttrValue& v) {
  switch (v.index()) {
    case 0: return "an integer";
    case 1: return "a number";
    case 2: return "a bool";
    case 3: return "a string";
    default: return "an integer list";
  }
}

bool parse_int(std::string_view s, int64_t& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

}  // namespace

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (const auto& [k, v] : items) set(k, v);
}

Attrs& Attrs::set(std::string name, AttrValue value) {
  for (auto& [k, v] : items_) {
    if (k == name) {
      v = std::move(value);
      return *this;
    }
  }
  items_.emplace_back(std::move(name), std::move(value));
  return *this;
}

const AttrValue* Attrs::find(std::string_view name) const {
  for (const auto& [k, v] : items_) {
    if (k == name) return &v;
  }
  return nullptr;
}

bool Attrs::has(std::string_view name) const { return find(name) != nullptr; }

int64_t Attrs::get_int(std::string_view name, int64_t fallback) const {
  const AttrValue* v = find(name);
  if (!v) return fallback;
  if (auto* i = std::get_if<int64_t>(v)) return *i;
  if (auto* b = std::get_if<bool>(v)) return *b;
  fail("attribute '{}' must be an integer, got {} ({})", name, kind_name(*v), value_to_string(*v));
}

int64_t Attrs::get_int(std::string_view name) const {
  SW_CHECK(has(name), "missing required integer attribute '{}'", name);
  return get_int(name, 0);
}

double Attrs::get_float(std::string_view name, double fallback) const {
  const AttrValue* v = find(name);
  if (!v) return fallback;
  if (auto* d = std::get_if<double>(v)) return *d;
  if (auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  fail("attribute '{}' must be a number, got {} ({})", name, kind_name(*v), value_to_string(*v));
}

bool Attrs::get_bool(std::string_view name, bool fallback) const {
  const AttrValue* v = find(name);
  if (!v) return fallback;
  if (auto* b = std::get_if<bool>(v)) return *b;
  if (auto* i = std::get_if<int64_t>(v); i && (*i == 0 || *i == 1)) return *i == 1;
  fail("attribute '{}' must be true or false, got {} ({})", name, kind_name(*v), value_to_string(*v));
}

std::string Attrs::get_string(std::string_view name, std::string_view fallback) const {
  const AttrValue* v = find(name);
  if (!v) return std::string(fallback);
  if (auto* s = std::get_if<std::string>(v)) return *s;
  fail("attribute '{}' must be a string, got {} ({})", name, kind_name(*v), value_to_string(*v));
}

std::vector<int64_t> Attrs::get_ints(std::string_view name, std::vector<int64_t> fallback) const {
  const AttrValue* v = find(name);
  if (!v) return fallback;
  if (auto* l = std::get_if<std::vector<int64_t>>(v)) return *l;
  if (auto* i = std::get_if<int64_t>(v)) return {*i};
  fail("attribute '{}' must be an integer list such as [0,1], got {} ({})", name, kind_name(*v),
       value_to_string(*v));
}

std::vector<int64_t> Attrs::get_ints(std::string_view name) const {
  SW_CHECK(has(name), "missing required integer-list attribute '{}'", name);
  return get_ints(name, {});
}

std::string Attrs::to_string() const {
  std::string out;
  for (const auto& [k, v] : items_) {
    if (!out.empty()) out += ',';
    out += k + "=" + value_to_string(v);
  }
  return out;
}

Attrs parse_attrs(std::string_view text) {
  Attrs attrs;
  size_t pos = 0;
  while (pos < text.size()) {
    // Split on commas that are not inside brackets.
    size_t end = pos;
    int depth = 0;
    while (end < text.size() && (text[end] != ',' || depth > 0)) {
      if (text[end] == '[') ++depth;
      if (text[end] == ']') --depth;
      ++end;
    }
    std::string_view item = text.substr(pos, end - pos);
    size_t eq = item.find('=');
    SW_CHECK(eq != std::string_view::npos && eq > 0,
             "cannot read attribute '{}': write attributes as name=value, e.g. axis=[0,1],keepdim=true",
             item);
    std::string name(item.substr(0, eq));
    std::string_view value = item.substr(eq + 1);
    int64_t i = 0;
    if (value == "true" || value == "false") {
      attrs.set(name, value == "true");
    } else if (parse_int(value, i)) {
      attrs.set(name, i);
    } else if (value.size() >= 2 && value.front() == '[' && value.back() == ']') {
      std::vector<int64_t> list;
      std::string_view inner = value.substr(1, value.size() - 2);
      size_t p = 0;
      while (p < inner.size()) {
        size_t q = inner.find_first_of(",:", p);
        if (q == std::string_view::npos) q = inner.size();
        SW_CHECK(parse_int(inner.substr(p, q - p), i), "attribute '{}': '{}' in {} is not an integer",
                 name, inner.substr(p, q - p), value);
        list.push_back(i);
        p = q + 1;
      }
      attrs.set(name, std::move(list));
    } else {
      double d = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), d);
      if (ec == std::errc() && ptr == value.data() + value.size() && !value.empty()) {
        attrs.set(name, d);
      } else {
        attrs.set(name, std::string(value));
      }
    }
    pos = end + 1;
  }
  return attrs;
}

}  // namespace shardwise
