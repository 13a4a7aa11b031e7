// Jinja templates as Hugging Face chat templates use them: the subset of Jinja that
// the Qwen2.5, Qwen3 and Llama 3 templates (and most others on the hub) are written in,
// rendered the way transformers renders them (jinja2's ImmutableSandboxedEnvironment
// with trim_blocks and lstrip_blocks, the loopcontrols extension, its own tojson, and
// the globals raise_exception and strftime_now).
//
// Supported: text, {{ }}, {% if / elif / else %}, {% for %} (tuple targets, an `if`
// filter, else, loop.index / index0 / revindex / first / last / length / previtem /
// nextitem, break, continue), {% set %} (names, namespace attributes, blocks),
// {% macro %}, {% generation %}; whitespace control (-, +); Python's literals,
// operators, comparisons, `in`, `~`, inline if/else, subscripts and slices; string
// methods (startswith, endswith, strip, lstrip, rstrip, split, rsplit, replace, upper,
// lower, title, capitalize, find, count), dict methods (items, keys, values, get); the
// filters length, count, tojson, string, trim, lower, upper, title, capitalize, safe,
// default, items, list, first, last, reverse, join, replace, int, float, abs, round,
// map, select, reject, selectattr, rejectattr, unique; the tests defined, undefined,
// none, string, boolean, true, false, integer, float, number, mapping, iterable,
// sequence, callable, lower, upper, odd, even, divisibleby, eq / equalto / sameas, ne,
// lt, gt, le, ge, in; the globals range, namespace, dict, raise_exception, strftime_now.
// Anything else (include, extends, call blocks, other filters...) is refused with an
// error naming it and its line, at parse time for statements and at render time for
// filters, tests and methods. Values keep Python's semantics: undefined prints as
// nothing, an attribute of an undefined value is an error, dicts keep insertion order.
#ifndef RLFLEET_LIBS_MODEL_JINJA_H_
#define RLFLEET_LIBS_MODEL_JINJA_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlfleet::model {

class JinjaTemplate {
 public:
  // INVALID_ARGUMENT naming `name`, the line and what does not parse or is not supported.
  static absl::StatusOr<std::unique_ptr<JinjaTemplate>> Parse(absl::string_view source, std::string name);
  ~JinjaTemplate();

  // Renders with the keys of `variables` (a JSON object) as the template's variables;
  // strftime_now formats `now` in the local time zone. INVALID_ARGUMENT for an error
  // while rendering (its line), or the template's own raise_exception message.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables, absl::Time now = absl::Now()) const;

  const std::string& name() const { return name_; }

  struct Tree;

 private:
  JinjaTemplate(std::string name, std::unique_ptr<Tree> tree);
  std::string name_;
  std::unique_ptr<Tree> tree_;
};

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_JINJA_H_
