#pragma once
// Op attributes: a small ordered map from name to int / float / bool / string / int list.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace shardwise {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  Attrs& set(std::string name, AttrValue value);
  bool has(std::string_view name) const;
  const AttrValue* find(std::string_view name) const;

  // Typed getters: the default is returned when the attribute is absent; a present attribute of
  // the wrong kind is an Error naming it. get_int accepts a bool; get_float accepts an int;
  // get_ints accepts a single int as a one-element list.
  int64_t get_int(std::string_view name, int64_t fallback) const;
  int64_t get_int(std::string_view name) const;  // required
  double get_float(std::string_view name, double fallback) const;
  bool get_bool(std::string_view name, bool fallback) const;
  std::string get_string(std::string_view name, std::string_view fallback) const;
  std::vector<int64_t> get_ints(std::string_view name, std::vector<int64_t> fallback) const;
  std::vector<int64_t> get_ints(std::string_view name) const;  // required

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  bool empty() const { return items_.empty(); }
  std::string to_string() const;  // "axis=[0,1],keepdim=true"

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

// Parses "k=v,k2=[1,2],flag=true,alpha=0.5,mode=sum". Integers stay integers, lists are int
// lists, true/false are bools, anything else that parses as a number is a float, the rest strings.
Attrs parse_attrs(std::string_view text);

}  // namespace shardwise
