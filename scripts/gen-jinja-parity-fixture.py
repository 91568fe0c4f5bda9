#!/usr/bin/env python3
"""Writes test/fixtures/chat-parity/jinja-features.json: small chat templates, each exercising one
feature where @huggingface/jinja (or the router's use of it) could render other text than Python's
Jinja2 does, with the text Python renders (or the error it raises).

- "render" cases: the template rendered by jinja2 in the environment transformers builds for chat
  templates (transformers/utils/chat_template_utils.py _compile_jinja_template: a sandboxed
  environment with trim_blocks, lstrip_blocks and loop controls; tojson as json.dumps with
  ensure_ascii=False; raise_exception raising a TemplateError). Its context is given as JSON text,
  read with Python's json, as vLLM reads a request's tool-call arguments and tools: key order and
  numbers as the text gives them.
- "continue" cases: transformers' render_jinja_template with continue_final_message=True, which
  cuts the rendering open after the final message's text (vLLM's continue_final_message).

Run: pip install transformers jinja2 && python3 scripts/gen-jinja-parity-fixture.py
"""
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "test", "fixtures", "chat-parity", "jinja-features.json")


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


# an object whose keys include array indices, which JavaScript enumerates first: Python keeps the text's order
ARGS = '{"args": {"z": 1, "10": 2.0, "2": 3, "a": {"9": 0, "1": [1, {"0": null, "b": true}]}, "__proto__": 4}}'
TOOLS = ('{"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",'
         ' "properties": {"b": {"type": "string"}, "10": {"type": "string"}, "2": {"type": "integer"}}}}}]}')
RENDER = [
    ("tojson keeps the key order of an object with array-index keys", "{{ args | tojson }}", ARGS),
    ("tojson with indent keeps it too", "{{ args.a | tojson(indent=2) }}", ARGS),
    ("items() iterates in the key order", "{% for k, v in args.items() %}{{ k }}={{ v | tojson }};{% endfor %}", ARGS),
    ("keys() in the key order", "{% for k in args.keys() %}{{ k }},{% endfor %}", ARGS),
    ("a tool schema's properties in their order", "{% for t in tools %}{{ t | tojson }}\n{% endfor %}", TOOLS),
    # what Jinja2 prints is Python's str(): None, True and False by name, a dict, list or tuple
    # as repr() writes it (the library writes nothing for None, `true`, and JSON)
    ("None, True and False print by their Python names",
     "{{ n }}|{{ t }}|{{ f }}|{{ u }}|{{ none }}|{{ true }}|{{ m.missing }}|{{ m.description }}",
     '{"n": null, "t": true, "f": false, "m": {"description": null}}'),
    ("a dict and a list print as repr() writes them", "{{ d }}|{{ d.l }}|{{ d.o }}|{{ [] }}|{{ {} }}|{{ (1, 'a') }}",
     '{"d": {"n": null, "b": false, "l": [1, 1.0, -0.0, 1e-07, 12345678901234567890, 2.5e300, "x"], "o": {"k": [true, {}]}}}'),
    ("repr() quotes and escapes strings as Python",
     "{{ d }}",
     '{"d": {"it\'s": "say \\"hi\\"", "both": "\'\\"", "ctl": "a\\nb\\tc\\r\\u0001\\u007f\\u0085\\u00a0\\u00ad",'
     ' "wide": "\\u00e9 \\u6771 \\ud83d\\ude80 \\u200b \\u2028 \\u3000 \\ue000 \\u0378", "bs": "C:\\\\path"}}'),
    ("~ and the string filter write str()",
     "{{ 'x' ~ n ~ t ~ d ~ l ~ 1.0 }}|{{ n | string }}{{ t | string }}{{ d | string }}{{ l | string }}|{{ u ~ 'y' }}",
     '{"n": null, "t": true, "d": {"a": 1}, "l": ["b", null]}'),
    ("a tool call's arguments printed as they are: the dict vLLM parsed them into",
     "{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments }}){% endfor %}",
     '{"m": {"tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Z\u00fcrich", "days": 2, "metric": true, "hint": null}}}]}}'),
    ("length counts code points", "{{ s | length }} {{ s | count }}", '{"s": "\\ud83d\\ude80\\u00e9e\\u0301"}'),
    ("an undefined value: '' by the string filter, Undefined inside a list",
     "[{{ m.x | string }}]{{ (m.x | string) | length }}{{ [m.missing] }}", '{"m": {}}'),
    ("join writes each item's str()", "{{ l | join(', ') }}|{{ l | join }}|{{ w | join('-') }}|{{ w | join(none) }}|{{ w | join(1) }}",
     '{"l": ["a", null, true, 1.0, {"k": [1, null]}], "w": [[1, "b"], ["c"]]}'),
    ("count is length on a list and a dict", "{{ l | count }} {{ d | count }}", '{"l": [1, 2, 3], "d": {"a": 1, "b": 2}}'),
    ("raise_exception raises the template's message",
     "{% if messages | length is even %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok",
     '{"messages": [{"role": "user"}, {"role": "user"}]}'),
]

CONTINUE_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}\n{% endfor %}"
KEEP_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
CONTINUE = [
    # the template trims the final text: the cut is rstrip()ped, with Python's whitespace
    ("rstrip takes U+0085, which trimEnd keeps", CONTINUE_TEMPLATE, "The answer\u0085"),
    ("rstrip takes U+001C-U+001F", CONTINUE_TEMPLATE, "The answer \u001f\u001c"),
    ("rstrip keeps U+FEFF, which trimEnd takes", CONTINUE_TEMPLATE, "The answer\ufeff"),
    ("trailing spaces trimmed", CONTINUE_TEMPLATE, "The answer  "),
    ("a template that keeps the spacing", KEEP_TEMPLATE, "The answer\ufeff "),
    # the tag is there but not the final text: transformers raises (vLLM answers 400)
    ("a template that changes the final text", "{% for m in messages %}{{ m.content | replace('answer', 'ANSWER') }}\n{% endfor %}",
     "The answer"),
]


def main():
    env = environment()
    cases = []
    for name, template, context_json in RENDER:
        case = {"kind": "render", "name": name, "template": template, "context_json": context_json}
        try:
            case["expected_text"] = env.from_string(template).render(**json.loads(context_json))
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        cases.append(case)
    for name, template, final in CONTINUE:
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": final}]
        case = {"kind": "continue", "name": name, "template": template, "messages": messages}
        try:
            rendered, _ = render_jinja_template([messages], chat_template=template, continue_final_message=True)
            case["expected_text"] = rendered[0]
        except ValueError as e:
            case["error"] = str(e).split("\n")[0]
        cases.append(case)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as fh:
        json.dump({"source": "scripts/gen-jinja-parity-fixture.py: jinja2 as transformers sets it up for chat templates",
                   "jinja2": jinja2.__version__, "cases": cases}, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
