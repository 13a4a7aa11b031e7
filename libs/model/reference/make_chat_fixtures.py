#!/usr/bin/env python3
"""Makes the chat-template fixtures the C++ Jinja renderer is tested against.

  python3 libs/model/reference/make_chat_fixtures.py [--verify]

Reads libs/model/testdata/chat/{qwen2_5,qwen3,llama3_2}.jinja (the models' hub
"chat_template" strings, byte for byte) and writes, in the same folder:

  expected.json: a list of cases, each {"template", "name", "messages", "tools" (only
      when the case passes tools), "add_generation_prompt", "kwargs" (extra template
      kwargs: enable_thinking, date_string, ...), "special_tokens" (what the tokenizer
      puts into the template's scope), and "output" (the rendered text) or "error"
      (the message of the TemplateError the template raised through raise_exception)}.
  tokenizer_config.json: a small tokenizer_config.json carrying the Qwen2.5 template in
      "chat_template" and Qwen's special tokens, for a loader test.
  jinja_cases.json: small templates, one Jinja feature each (whitespace control,
      scoping, loops, slices, filters, tests, methods, literals, reprs), with what the
      same environment renders from them, or "error": true where jinja2 refuses.

Rendering mirrors transformers' `tokenizer.apply_chat_template(..., tokenize=False)`
as of transformers 4.51 .. 5.x (src/transformers/utils/chat_template_utils.py,
`_compile_jinja_template` / `render_jinja_template`, and
tokenization_utils_base.py `apply_chat_template`; the environment set-up is the same
in all of them):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[AssistantTracker, jinja2.ext.loopcontrols])
  env.filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=indent,
                                     separators=separators, sort_keys=sort_keys)
  env.globals["raise_exception"]: raises jinja2.exceptions.TemplateError(message)
  env.globals["strftime_now"]: datetime.now().strftime(format)
  template.render(messages=chat, tools=tool_schemas (None when not given),
                  documents=None, add_generation_prompt=...,
                  **{**tokenizer.special_tokens_map, **kwargs})

AssistantTracker (the {% generation %} tag) is left out: none of these templates use
it. special_tokens holds the named special tokens the tokenizer has set (transformers
4.x leaves unset ones out of special_tokens_map, so e.g. Qwen's bos_token is undefined
in the template); Qwen's additional_special_tokens list is left out as no template
reads it. Every Llama case passes date_string, so no output depends on today's date.

--verify (where transformers and tokenizers are installed) also renders every case
through a real transformers tokenizer's apply_chat_template and fails on any
difference. (Written without a transformers install at hand: not yet run. The
fixtures were checked against the one output of Qwen/Qwen3-0.6B's tokenizer that
trl's get_training_chat_template docstring prints; see trl_docstring_tool_call.)
"""
import copy
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(os.path.dirname(HERE), "testdata", "chat")

# What each model's tokenizer_config.json sets (Qwen/Qwen2.5-0.5B-Instruct,
# Qwen/Qwen3-0.6B: bos_token and unk_token null; meta-llama/Llama-3.2-1B-Instruct:
# no pad or unk token).
QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
SPECIAL_TOKENS = {
    "qwen2_5.jinja": QWEN_TOKENS,
    "qwen3.jinja": QWEN_TOKENS,
    "llama3_2.jinja": LLAMA_TOKENS,
}


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render(source, case):
    template = compile_template(source)
    kwargs = {**case["special_tokens"], **case["kwargs"]}
    return template.render(
        messages=copy.deepcopy(case["messages"]),
        tools=copy.deepcopy(case.get("tools")),
        documents=None,
        add_generation_prompt=case["add_generation_prompt"],
        **kwargs,
    )


# ---------------------------------------------------------------- shared inputs

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "How many days ahead"},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": []},
    },
}

UNICODE = "  Grüße aus Zürich! 你好，世界 🌍\n\tTabs, \"quotes\", back\\slash and <tags> & ampersands.\n\n  "
SYS = "You are a terse assistant."


def weather_call(args):
    return {"type": "function", "function": {"name": "get_weather", "arguments": args}}


def qwen2_5_cases():
    t = "qwen2_5.jinja"
    return [
        dict(template=t, name="single_user_gen", messages=[{"role": "user", "content": "Hello!"}],
             add_generation_prompt=True),
        dict(template=t, name="single_user_nogen", messages=[{"role": "user", "content": "Hello!"}],
             add_generation_prompt=False),
        dict(template=t, name="system_multi_turn", add_generation_prompt=True, messages=[
            {"role": "system", "content": SYS},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3+3?"},
        ]),
        dict(template=t, name="no_system_default_injected", add_generation_prompt=False, messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello. How can I help?"},
        ]),
        dict(template=t, name="unicode_whitespace", add_generation_prompt=True, messages=[
            {"role": "system", "content": "  padded system \n"},
            {"role": "user", "content": UNICODE},
            {"role": "assistant", "content": "\n leading newline, trailing spaces  "},
            {"role": "user", "content": ""},
        ]),
        dict(template=t, name="system_not_first", add_generation_prompt=True, messages=[
            {"role": "user", "content": "first"},
            {"role": "system", "content": "a mid-conversation system note"},
            {"role": "user", "content": "second"},
        ]),
        dict(template=t, name="tools_default_system", add_generation_prompt=True, tools=[WEATHER_TOOL, TIME_TOOL],
             messages=[
                 {"role": "user", "content": "Weather in Zürich and the time?"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     weather_call({"city": "Zürich", "unit": "celsius", "days": 2}),
                     {"type": "function", "function": {"name": "get_time", "arguments": {}}},
                 ]},
                 {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
                 {"role": "tool", "name": "get_time", "content": "14:05"},
             ]),
        dict(template=t, name="tools_with_system_full_turn", add_generation_prompt=False, tools=[WEATHER_TOOL],
             messages=[
                 {"role": "system", "content": SYS},
                 {"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": "Let me check.", "tool_calls": [
                     weather_call({"city": "Paris", "flags": [True, False, None], "ratio": 0.5})]},
                 {"role": "tool", "content": "sunny"},
                 {"role": "assistant", "content": "It is sunny in Paris."},
             ]),
        dict(template=t, name="tool_call_string_args_and_flat_call", add_generation_prompt=True,
             messages=[
                 {"role": "user", "content": "go"},
                 {"role": "assistant", "content": "", "tool_calls": [
                     weather_call("{\"city\": \"Oslo\"}"),
                     {"name": "get_time", "arguments": {"tz": "Europe/Oslo"}},
                 ]},
                 {"role": "tool", "content": "cold"},
                 {"role": "tool", "content": "09:00"},
                 {"role": "user", "content": "thanks"},
             ]),
    ]


def qwen3_cases():
    t = "qwen3.jinja"
    return [
        dict(template=t, name="single_user_gen", messages=[{"role": "user", "content": "Hello!"}],
             add_generation_prompt=True),
        dict(template=t, name="single_user_nogen", messages=[{"role": "user", "content": "Hello!"}],
             add_generation_prompt=False),
        dict(template=t, name="enable_thinking_false_gen", messages=[{"role": "user", "content": "Hello!"}],
             add_generation_prompt=True, kwargs={"enable_thinking": False}),
        dict(template=t, name="enable_thinking_true_gen", messages=[{"role": "user", "content": "Hello!"}],
             add_generation_prompt=True, kwargs={"enable_thinking": True}),
        dict(template=t, name="system_multi_turn_think_in_content", add_generation_prompt=True,
             kwargs={"enable_thinking": False}, messages=[
                 {"role": "system", "content": SYS},
                 {"role": "user", "content": "What is 2+2?"},
                 {"role": "assistant", "content": "<think>\nAdd two and two.\n</think>\n\n4."},
                 {"role": "user", "content": "And 3+3?"},
             ]),
        dict(template=t, name="last_assistant_reasoning_content", add_generation_prompt=False, messages=[
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two.\n"},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "\n6.", "reasoning_content": "\nThree plus three is six.\n"},
        ]),
        dict(template=t, name="last_assistant_think_in_content", add_generation_prompt=False, messages=[
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "<think>\n\nthinking...\n\n</think>\n\n\nA"},
        ]),
        dict(template=t, name="last_assistant_no_reasoning", add_generation_prompt=False, messages=[
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"},
        ]),
        dict(template=t, name="unicode_whitespace", add_generation_prompt=True, messages=[
            {"role": "user", "content": UNICODE},
            {"role": "assistant", "content": "  spaced answer \n"},
            {"role": "user", "content": "<tool_response>\nnot a real tool response\n</tool_response>"},
        ]),
        dict(template=t, name="tools_reasoning_tool_calls", add_generation_prompt=True, tools=[WEATHER_TOOL, TIME_TOOL],
             messages=[
                 {"role": "system", "content": SYS},
                 {"role": "user", "content": "Weather in Zürich and the time?"},
                 {"role": "assistant", "content": None, "reasoning_content": "Need both tools.",
                  "tool_calls": [weather_call({"city": "Zürich", "unit": "celsius", "days": 2}),
                                 {"type": "function", "function": {"name": "get_time", "arguments": {}}}]},
                 {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21.5}"},
                 {"role": "tool", "name": "get_time", "content": "14:05"},
             ]),
        dict(template=t, name="tools_no_system_string_args", add_generation_prompt=False, tools=[WEATHER_TOOL],
             messages=[
                 {"role": "user", "content": "Oslo?"},
                 {"role": "assistant", "content": "Checking.", "tool_calls": [
                     weather_call("{\"city\": \"Oslo\"}"),
                     {"name": "get_time", "arguments": {"tz": "Europe/Oslo"}}]},
                 {"role": "tool", "content": "cold"},
                 {"role": "assistant", "content": "<think>\nIt said cold.\n</think>\n\nIt is cold in Oslo."},
             ]),
        # From the docstring of trl.chat_template_utils.get_training_chat_template, whose
        # output there was printed by Qwen/Qwen3-0.6B's tokenizer (checked in main()).
        dict(template=t, name="trl_docstring_tool_call", add_generation_prompt=False, messages=[
            {"role": "user", "content": "What is 2 * 3?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 2, "b": 3}}}]},
        ]),
    ]


def llama3_2_cases():
    t = "llama3_2.jinja"
    date = {"date_string": "26 Jul 2024"}
    return [
        dict(template=t, name="single_user_gen", messages=[{"role": "user", "content": "Hello!"}],
             add_generation_prompt=True, kwargs=date),
        dict(template=t, name="single_user_nogen", messages=[{"role": "user", "content": "Hello!"}],
             add_generation_prompt=False, kwargs=date),
        dict(template=t, name="system_multi_turn", add_generation_prompt=True, kwargs={"date_string": "01 Jan 2025"},
             messages=[
                 {"role": "system", "content": SYS},
                 {"role": "user", "content": "What is 2+2?"},
                 {"role": "assistant", "content": "4."},
                 {"role": "user", "content": "And 3+3?"},
             ]),
        dict(template=t, name="unicode_whitespace_trim", add_generation_prompt=True, kwargs=date, messages=[
            {"role": "system", "content": "\n  padded system  \n"},
            {"role": "user", "content": UNICODE},
            {"role": "assistant", "content": "  spaced answer \n"},
            {"role": "user", "content": "   "},
        ]),
        dict(template=t, name="tools_in_user_message", add_generation_prompt=True, kwargs=date,
             tools=[WEATHER_TOOL, TIME_TOOL], messages=[
                 {"role": "system", "content": SYS},
                 {"role": "user", "content": "  Weather in Zürich?  "},
                 {"role": "assistant", "tool_calls": [weather_call({"city": "Zürich", "days": 2, "ratio": 0.5,
                                                                    "flags": [True, None]})]},
                 {"role": "tool", "content": "{\"temp\": 21.5}"},
             ]),
        dict(template=t, name="tools_in_system_message", add_generation_prompt=False,
             kwargs={"date_string": "26 Jul 2024", "tools_in_user_message": False}, tools=[WEATHER_TOOL],
             messages=[
                 {"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": None, "tool_calls": [weather_call({"city": "Paris"})]},
                 {"role": "ipython", "content": {"temp": 18, "sky": "cloudy"}},
                 {"role": "assistant", "content": "Cloudy, 18 degrees."},
             ]),
        dict(template=t, name="custom_tools_kwarg", add_generation_prompt=True,
             kwargs={"date_string": "26 Jul 2024", "custom_tools": [TIME_TOOL]},
             messages=[{"role": "user", "content": "Time?"}]),
        dict(template=t, name="tool_message_list_content", add_generation_prompt=True, kwargs=date, messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [weather_call({"city": "Rome"})]},
            {"role": "tool", "content": ["sunny", 25]},
        ]),
        dict(template=t, name="error_multiple_tool_calls", add_generation_prompt=True, kwargs=date, messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [weather_call({"city": "Rome"}), weather_call({"city": "Oslo"})]},
        ]),
        dict(template=t, name="error_tools_without_user_message", add_generation_prompt=True, kwargs=date,
             tools=[WEATHER_TOOL], messages=[{"role": "system", "content": SYS}]),
    ]


TRL_DOCSTRING_OUTPUT = (
    '<|im_start|>user\nWhat is 2 * 3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n'
    '{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n'
)


def build_cases():
    templates = {}
    for name in SPECIAL_TOKENS:
        with open(os.path.join(CHAT, name), encoding="utf-8", newline="") as f:
            templates[name] = f.read()
    cases = []
    for raw in qwen2_5_cases() + qwen3_cases() + llama3_2_cases():
        case = {"template": raw["template"], "name": raw["name"], "messages": raw["messages"]}
        if "tools" in raw:
            case["tools"] = raw["tools"]
        case["add_generation_prompt"] = raw["add_generation_prompt"]
        case["kwargs"] = raw.get("kwargs", {})
        case["special_tokens"] = SPECIAL_TOKENS[raw["template"]]
        try:
            case["output"] = render(templates[raw["template"]], case)
        except jinja2.exceptions.TemplateError as e:
            if type(e) is not jinja2.exceptions.TemplateError:  # only raise_exception's errors are fixtures
                raise
            case["error"] = e.message
        cases.append(case)
    return templates, cases


def verify_with_transformers(templates, cases):
    import transformers
    from tokenizers import Tokenizer, models

    failures = 0
    for case in cases:
        tokens = case["special_tokens"]
        vocab = {"<unk>": 0}
        for v in tokens.values():
            vocab.setdefault(v, len(vocab))
        tok = transformers.PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")), **tokens)
        tok.chat_template = templates[case["template"]]
        kw = dict(case["kwargs"])
        if "tools" in case:
            kw["tools"] = case["tools"]
        try:
            got = {"output": tok.apply_chat_template(copy.deepcopy(case["messages"]), tokenize=False,
                                                     add_generation_prompt=case["add_generation_prompt"], **kw)}
        except jinja2.exceptions.TemplateError as e:
            got = {"error": e.message}
        want = {k: case[k] for k in ("output", "error") if k in case}
        if got != want:
            failures += 1
            print("MISMATCH", case["template"], case["name"], "\n  want:", repr(want), "\n  got: ", repr(got))
    print(f"transformers {transformers.__version__}: {len(cases) - failures}/{len(cases)} cases match")
    return failures == 0


# One feature each; rendered with `variables` in the same environment as the templates.
JINJA_CASES = [
    # Whitespace: trim_blocks, lstrip_blocks, - and + markers, comments, trailing newline.
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter\n", {}),
    ("lstrip_blocks", "line\n    {% if true %}\n    in\n    {% endif %}\nend", {}),
    ("lstrip_not_mid_line", "a  {% if true %}b{% endif %}  c", {}),
    ("minus_both", "a  \n  {%- if true -%}  \n b \n {%- endif -%}\n  c", {}),
    ("plus_keeps", "x\n  {%+ if true %}y{% endif +%}\nz", {}),
    ("var_minus", "a \n {{- 'b' -}} \n c", {}),
    ("var_no_lstrip", "a\n  {{ 'b' }}\n  c", {}),
    ("comment", "a\n  {# note #}\nb {#- x -#} c", {}),
    ("crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("after_trimmed_newline", "{% for i in [1, 2] %}\n  {% if i %}\n  {{ i }}\n  {% endif %}\n{% endfor %}", {}),
    # Scoping and loops.
    ("set_in_loop_scoped", "{% set x = 'out' %}{% for i in range(3) %}{% if i == 0 %}{% set x = 'in' %}{% endif %}"
     "[{{ x }}]{% endfor %}{{ x }}", {}),
    ("set_in_if_not_scoped", "{% if true %}{% set x = 1 %}{% endif %}{{ x }}", {}),
    ("namespace", "{% set ns = namespace(n=0, found=false) %}{% for i in [3, 4, 5] %}{% set ns.n = ns.n + i %}"
     "{% if i == 4 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.found }}", {}),
    ("loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    ("loop_prev_next", "{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}", {}),
    ("loop_filter_else", "{% for x in xs if x > 1 %}{{ x }}/{{ loop.length }} {% else %}none{% endfor %}"
     "{% for x in [] %}x{% else %}empty{% endfor %}", {"xs": [1, 2, 3]}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}"
     "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}",
     {"d": {"b": 1, "a": [2]}}),
    ("nested_loop", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}"
     "{{ loop.index }};{% endfor %}", {}),
    ("reassign_loop_var", "{% for m in ms %}{% set m = m.f %}{{ m }}{% endfor %}", {"ms": [{"f": 1}, {"f": 2}]}),
    ("macro", "{% macro f(a, b=2) %}<{{ a }}-{{ b }}>{% endmacro %}{{ f(1) }}{{ f(1, b=3) }}{{ f('x', 'y') }}", {}),
    ("set_block", "{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]", {}),
    # Expressions.
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2.5 }} {{ 'ab' * 2 }}"
     " {{ 'a' ~ 1 ~ none }} {{ [1] + [2] }} {{ 10 - 3 * 2 }}", {}),
    ("compare", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' in 'cat' }} {{ 'k' in d }} {{ 2 not in [1] }} {{ 1 == 1.0 }}"
     " {{ true == 1 }} {{ none == none }} {{ 'b' > 'a' }}", {"d": {"k": 1}}),
    ("logic", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ not [] }} {{ none or [] }} {{ 'y' if 0 else 'n' }}"
     " [{{ 'y' if false }}]", {}),
    ("literals", "{{ [1, 'a', none, 1.5, {'k': true}, (1,), ()] }} {{ {'a': 1, 'b': 'x'} }} {{ \"it's\" }}"
     " {{ 'q\\'s' }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-5 }} {{ True }} {{ None }}", {}),
    ("subscripts", "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[::-1] }} {{ xs[:2] }} {{ xs[::2] }} {{ s[1:3] }}"
     " {{ s[-1] }} {{ d['k'] }} {{ d.k }} {{ xs.0 }} [{{ xs[9] }}] [{{ d.missing }}] {{ s[::-1] }}",
     {"xs": [1, 2, 3], "s": "héllo", "d": {"k": "v"}}),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ t.strip('x\\n') }}|{{ t.split('\\n') }}"
     "|{{ s.split() }}|{{ s.split(None, 1) }}|{{ t.rsplit('x', 1) }}|{{ s.startswith('  a') }}|{{ s.endswith(('z', ' ')) }}"
     "|{{ s.replace('a', 'A') }}|{{ s.upper() }}|{{ 'Ab cd'.lower() }}|{{ 'ab cd'.title() }}|{{ 'aBC'.capitalize() }}"
     "|{{ s.find('b') }}|{{ s.count('a') }}", {"s": "  a b\ta  ", "t": "x\nhixx\nx"}),
    ("dict_methods", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('a') }} {{ d.get('z', 0) }} {{ d.get('z') }}",
     {"d": {"a": 1, "b": 2}}),
    ("filters", "{{ xs|length }} {{ s|length }} {{ '  t  '|trim }} {{ 5|string }} {{ xs|first }} {{ xs|last }}"
     " {{ xs|reverse|list }} {{ xs|join(',') }} {{ u|default('d') }} {{ ''|default('e', true) }} {{ 'A'|lower }}"
     " {{ '3'|int + 1 }} {{ 'x'|int }} {{ '2.5'|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ [1, 1, 2]|unique|list }}",
     {"xs": [1, 2, 3], "s": "日本語"}),
    ("map_select", "{{ ms|map(attribute='n')|list }} {{ ms|selectattr('ok')|map(attribute='n')|join }}"
     " {{ ms|rejectattr('n', 'equalto', 1)|map(attribute='n')|list }} {{ xs|select('odd')|list }}"
     " {{ xs|reject('even')|list }} {{ xs|map('string')|join('-') }}",
     {"ms": [{"n": 1, "ok": True}, {"n": 2, "ok": False}], "xs": [1, 2, 3]}),
    ("tojson", "{{ d|tojson }}\n{{ d|tojson(indent=2) }}\n{{ d|tojson(sort_keys=true) }}\n{{ [] | tojson(indent=2) }}"
     "\n{{ 'é\"\\n'|tojson }}\n{{ d|tojson(separators=(',', ':')) }}",
     {"d": {"z": [1, 2.5, None, True, {}], "a": "ü\t<>&"}}),
    ("tests", "{{ u is defined }} {{ u is undefined }} {{ n is none }} {{ s is string }} {{ d is mapping }}"
     " {{ s is iterable }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ false is false }}"
     " {{ xs is sequence }} {{ 3 is odd }} {{ 4 is divisibleby(2) }} {{ 1 is not none }} {{ not u is defined }}"
     " {{ 'a' is in('abc') }} {{ 2 is eq(2) }} {{ u is iterable }} {{ n is iterable }}",
     {"n": None, "s": "x", "d": {}, "xs": [1]}),
    ("undefined_prints_empty", "[{{ u }}][{{ d.x }}][{{ xs[5] }}]", {"d": {}, "xs": []}),
    ("filter_binds_tighter", "{{ 'a' + s | trim + 'b' }} {{ not xs|length == 1 }} {{ -2|abs }}",
     {"s": "  x  ", "xs": [1]}),
    ("strftime_guarded", "{% if strftime_now is defined %}{{ strftime_now('%Y') is string }}{% endif %}", {}),
    ("print_none_bool", "{{ none }} {{ true }} {{ 3.0 }} {{ -0.5 }} {{ 100000000000000000000.0 }}", {}),
    # Errors: jinja2 refuses these.
    ("error_undefined_attr", "{{ d.x.y }}", {"d": {}}),
    ("error_raise", "{{ raise_exception('bad input') }}", {}),
    ("error_unclosed_if", "{% if true %}x", {}),
    ("error_unknown_filter", "{{ 1|nosuchfilter }}", {}),
    ("error_add_types", "{{ 1 + 'a' }}", {}),
    ("error_call_undefined", "{{ nosuch() }}", {}),
    ("error_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("error_iterate_int", "{% for a in 3 %}{% endfor %}", {}),
]


def build_jinja_cases():
    out = []
    for name, source, variables in JINJA_CASES:
        case = {"name": name, "template": source, "variables": variables}
        try:
            case["output"] = compile_template(source).render(**copy.deepcopy(variables))
        except (jinja2.exceptions.TemplateError, TypeError, ValueError):
            case["error"] = True
        if name.startswith("error_") != ("error" in case):
            raise SystemExit(f"jinja case {name}: expected {'an error' if name.startswith('error_') else 'output'},"
                             f" got {case}")
        out.append(case)
    return out


def main():
    jinja_cases = build_jinja_cases()
    with open(os.path.join(CHAT, "jinja_cases.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(jinja_cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(jinja_cases)} jinja cases to {CHAT}/jinja_cases.json")
    templates, cases = build_cases()
    trl = [c for c in cases if c["name"] == "trl_docstring_tool_call"][0]
    assert trl["output"] == TRL_DOCSTRING_OUTPUT, trl["output"]

    with open(os.path.join(CHAT, "expected.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")

    config = {
        "add_bos_token": False,
        "bos_token": None,
        "chat_template": templates["qwen2_5.jinja"],
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    path = os.path.join(CHAT, "tokenizer_config.json")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["chat_template"] == templates["qwen2_5.jinja"]

    print(f"wrote {len(cases)} cases ({sum('error' in c for c in cases)} errors) to {CHAT}/expected.json")
    if "--verify" in sys.argv[1:] and not verify_with_transformers(templates, cases):
        sys.exit(1)


if __name__ == "__main__":
    main()
