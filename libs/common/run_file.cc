#include "libs/common/run_file.h"

#include <yaml-cpp/yaml.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"

namespace rlfleet::common {

namespace {

// The sections every binary with their flags reads, and each key's flag.
const std::map<std::string, std::map<std::string, std::string>>& SharedSections() {
  static const auto* sections = new std::map<std::string, std::map<std::string, std::string>>{
      {"model",
       {{"dir", "model_dir"},
        {"d_model", "d_model"},
        {"n_layers", "n_layers"},
        {"n_heads", "n_heads"},
        {"max_seq_len", "max_seq_len"}}},
      {"transport",
       {{"data_plane", "data_plane"},
        {"data_plane_devices", "data_plane_devices"},
        {"data_plane_tls", "data_plane_tls"},
        {"data_plane_secret_file", "data_plane_secret_file"},
        {"numa", "numa"}}},
      {"nccl", {{"profile", "nccl_profile"}}},
  };
  return *sections;
}

// The sections one binary reads as its own flags, by binary.
const std::map<std::string, std::string>& OwnSections() {
  static const auto* sections = new std::map<std::string, std::string>{
      {"data", "rlfleet"},
      {"algorithm", "rlfleet"},
      {"run", "rlfleet"},
      {"controller", "rlfleet-controller"},
      {"rollout", "rlfleet-rollout"},
      {"reward", "rlfleet-reward"},
      {"buffer", "rlfleet-buffer"},
      {"trainer", "rlfleet-trainer"},
      {"weights", "rlfleet-weights"},
      {"gateway", "rlfleet-gateway"},
  };
  return *sections;
}

const std::set<std::string>& FleetKeys() {
  static const auto* keys = new std::set<std::string>{"rollouts"};
  return *keys;
}

int Line(const YAML::Node& node) { return node.Mark().line + 1; }

absl::Status Error(absl::string_view origin, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ":", line, ": ", what));
}

// A scalar as JSON: YAML 1.2's core schema for plain scalars (null, booleans, numbers),
// a string otherwise or when quoted.
nlohmann::ordered_json ScalarJson(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() != "!") {  // (a quoted scalar's tag is "!")
    if (s == "null" || s == "~" || s.empty()) return nullptr;
    if (s == "true" || s == "True") return true;
    if (s == "false" || s == "False") return false;
    int64_t i = 0;
    if (absl::SimpleAtoi(s, &i)) return i;
    double d = 0;
    if (absl::SimpleAtod(s, &d) && s.find_first_of("0123456789") != std::string::npos) return d;
  }
  return s;
}

absl::StatusOr<nlohmann::ordered_json> ToJson(const YAML::Node& node, absl::string_view origin, int depth = 0) {
  if (depth > 32) return Error(origin, Line(node), "nested too deep");
  if (node.IsScalar() || node.IsNull()) return node.IsNull() ? nlohmann::ordered_json(nullptr) : ScalarJson(node);
  nlohmann::ordered_json out = node.IsSequence() ? nlohmann::ordered_json::array() : nlohmann::ordered_json::object();
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (node.IsSequence()) {
      const YAML::Node item = *it;
      ASSIGN_OR_RETURN(out.emplace_back(), ToJson(item, origin, depth + 1));
    } else {
      const YAML::Node key = it->first, value = it->second;
      if (!key.IsScalar()) return Error(origin, Line(key), "a mapping key must be a scalar");
      ASSIGN_OR_RETURN(out[key.Scalar()], ToJson(value, origin, depth + 1));
    }
  }
  return out;
}

// A value as flag text: a scalar as written, a list of scalars joined by commas, a
// mapping as JSON.
absl::StatusOr<std::string> ValueText(const YAML::Node& value, absl::string_view origin, const std::string& key) {
  if (value.IsNull()) return std::string();
  if (value.IsScalar()) return value.Scalar();
  if (value.IsSequence()) {
    std::vector<std::string> items;
    for (const YAML::Node& item : value) {
      if (!item.IsScalar()) return Error(origin, Line(item), absl::StrCat("`", key, "`: a list of scalars only"));
      items.push_back(item.Scalar());
    }
    return absl::StrJoin(items, ",");
  }
  if (value.IsMap()) {
    ASSIGN_OR_RETURN(nlohmann::ordered_json json, ToJson(value, origin));
    return json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);  // (U+FFFD for bad UTF-8)
  }
  return Error(origin, Line(value), absl::StrCat("`", key, "`: not a value"));
}

// Every (section, key, value) of the document, checked against the schema.
struct Item {
  std::string section, key, value;
  int line;
};

absl::StatusOr<std::vector<Item>> ReadItems(absl::string_view text, absl::string_view origin) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::ParserException& e) {
    return Error(origin, e.mark.line + 1, absl::StrCat("not YAML: ", e.msg));
  }
  if (root.IsNull()) return std::vector<Item>{};
  if (!root.IsMap()) return Error(origin, Line(root), "a run file is a mapping of sections");
  std::vector<Item> items;
  std::set<std::string> sections;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const YAML::Node name = it->first;
    if (!name.IsScalar()) return Error(origin, Line(name), "a section name must be a scalar");
    const std::string& section = name.Scalar();
    const bool shared = SharedSections().count(section) != 0;
    if (!shared && OwnSections().count(section) == 0 && section != "fleet") {
      std::vector<std::string> known;
      for (const auto& [name, keys] : SharedSections()) known.push_back(name);
      for (const auto& [name, binary] : OwnSections()) known.push_back(name);
      known.push_back("fleet");
      return Error(origin, Line(name),
                   absl::StrCat("unknown section `", section, "` (sections: ", absl::StrJoin(known, ", "), ")"));
    }
    if (!sections.insert(section).second) {
      return Error(origin, Line(name), absl::StrCat("section `", section, "` given twice"));
    }
    const YAML::Node body = it->second;  // (a copy: the iterator's pair is a temporary)
    if (body.IsNull()) continue;
    if (!body.IsMap()) return Error(origin, Line(body), absl::StrCat("section `", section, "` must be a mapping"));
    std::set<std::string> keys;
    for (auto kv = body.begin(); kv != body.end(); ++kv) {
      const YAML::Node key_node = kv->first, value_node = kv->second;
      if (!key_node.IsScalar()) return Error(origin, Line(key_node), "a key must be a scalar");
      const std::string& key = key_node.Scalar();
      if (key.empty()) return Error(origin, Line(key_node), absl::StrCat("an empty key in section `", section, "`"));
      if (!keys.insert(key).second) {
        return Error(origin, Line(key_node), absl::StrCat("`", section, ".", key, "` given twice"));
      }
      if ((shared && SharedSections().at(section).count(key) == 0) ||
          (section == "fleet" && FleetKeys().count(key) == 0)) {
        std::vector<std::string> known;
        if (shared) {
          for (const auto& [k, flag] : SharedSections().at(section)) known.push_back(k);
        } else {
          known.assign(FleetKeys().begin(), FleetKeys().end());
        }
        return Error(origin, Line(key_node),
                     absl::StrCat("unknown key `", section, ".", key, "` (", section,
                                  " has: ", absl::StrJoin(known, ", "), ")"));
      }
      ASSIGN_OR_RETURN(std::string value, ValueText(value_node, origin, absl::StrCat(section, ".", key)));
      items.push_back({section, key, std::move(value), Line(key_node)});
    }
  }
  return items;
}

// yaml-cpp throws; everything that calls it goes through here.
template <typename F>
auto Guard(absl::string_view origin, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const YAML::Exception& e) {
    return Error(origin, e.mark.line + 1, e.msg);
  }
}

}  // namespace

bool IsRunFile(absl::string_view path) { return absl::EndsWith(path, ".yaml") || absl::EndsWith(path, ".yml"); }

absl::StatusOr<std::vector<ConfigEntry>> ParseRunFile(absl::string_view text, absl::string_view origin,
                                                      absl::string_view binary) {
  return Guard(origin, [&]() -> absl::StatusOr<std::vector<ConfigEntry>> {
    ASSIGN_OR_RETURN(std::vector<Item> items, ReadItems(text, origin));
    std::vector<ConfigEntry> entries;
    for (Item& item : items) {
      ConfigEntry entry;
      entry.line = item.line;
      entry.source = absl::StrCat(item.section, ".", item.key);
      entry.value = std::move(item.value);
      auto shared = SharedSections().find(item.section);
      if (shared != SharedSections().end()) {
        entry.key = shared->second.at(item.key);
        entry.optional = true;
      } else if (auto own = OwnSections().find(item.section); own != OwnSections().end() && own->second == binary) {
        entry.key = item.key;
      } else {
        continue;  // another binary's section, or deploy/local's
      }
      entries.push_back(std::move(entry));
    }
    return entries;
  });
}

absl::StatusOr<std::string> RunFileValue(absl::string_view text, absl::string_view origin,
                                         absl::string_view section_key) {
  return Guard(origin, [&]() -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(std::vector<Item> items, ReadItems(text, origin));
    for (const Item& item : items) {
      if (absl::StrCat(item.section, ".", item.key) == section_key) return item.value;
    }
    return absl::NotFoundError(absl::StrCat(origin, ": no `", section_key, "`"));
  });
}

absl::StatusOr<std::vector<ConfigEntry>> ReadRunFile(const std::string& path, absl::string_view binary) {
  ASSIGN_OR_RETURN(std::string text, ReadConfigFileText(path));
  return ParseRunFile(text, path, binary);
}

}  // namespace rlfleet::common
