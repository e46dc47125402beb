#!/usr/bin/env python3
"""Generates pkg/tokenize's reference fixtures from HuggingFace transformers.

For each tokenizer directory (tokenizer.json + tokenizer_config.json, fetched by
`make fixtures` into .cache/tokenizers/<name>/) it writes
<out>/<name>.json.gz holding:

  plain: [{text, ids, ids_special}]  ids with add_special_tokens=False / True
  chat:  [{messages, tools, add_generation_prompt, kwargs, rendered, ids}]
         rendered by tokenizer.apply_chat_template(tokenize=False), then
         encoded with add_special_tokens=False, as vLLM does for chat.

Everything is deterministic (seeded); the corpus is built here, not downloaded.
Each encoding is cross-checked against the tokenizers library on its own.

Usage: gen.py --cache .cache/tokenizers --out pkg/tokenize/testdata [name...]
(no names: every family fetch.sh fetches)
Needs: pip install tokenizers transformers jinja2 (see hack/requirements-tokenizer.txt).
"""

import argparse
import gzip
import json
import os
import random
import sys

import tokenizers
import transformers
from transformers import AutoTokenizer

SEED = 20261130


def handcrafted():
    t = [
        "Hello world",
        "Hello  world",
        "Hello   world   ",
        "  leading spaces",
        "trailing spaces   ",
        "tabs\tand\t\ttabs",
        "line\nbreaks\n\nand\n\n\nmore",
        "windows\r\nline\r\nendings\r\n",
        "mixed \t\n \r\n  whitespace \n\t ",
        " ",
        "\n",
        "\t",
        "                                                                ",
        "\n\n\n\n\n\n\n\n\n\n",
        "a" + " " * 300 + "b",
        "x\n" + " " * 37 + "y",
        "I'm here, you're there, he's gone, we've been, they'll go, I'd say",
        "I'M HERE, YOU'RE THERE, HE'S GONE, WE'VE BEEN, THEY'LL GO, I'D SAY",
        "don't won't can't shouldn't 'tis 's 't 're",
        "It's a dog's life'S end",
        "The quick brown fox jumps over the lazy dog.",
        "Numbers: 1 12 123 1234 12345 123456 1234567 12345678901234567890",
        "3.14159265358979 2.71828 -42 +7 1e10 6.02e23 0x1F 0b1010",
        "1,000,000 and 1.000.000 and 1 000 000",
        "Phone: +1 (555) 123-4567, date 2026-11-30T04:05:41Z",
        "Arabic-Indic digits: ٠١٢٣٤٥٦٧٨٩ and Devanagari: ०१२३४५६७८९",
        "Fullwidth: １２３４５ ＡＢＣ ｈｅｌｌｏ",
        "Superscripts x² y³ ½ ¾ ⅔ Ⅻ ①②③",
        "Café naïve résumé coöperate façade",
        "Cafe\u0301 nai\u0308ve re\u0301sume\u0301",
        "Ångström ﬁnance ﬂow Ǆ ǅ ǆ",
        "Straße groß ÄÖÜ äöü",
        "Ελληνικά: Γειά σου Κόσμε",
        "Русский текст: Привет, мир! Как дела?",
        "עברית: שלום עולם",
        "العربية: مرحبا بالعالم، كيف حالك؟",
        "हिन्दी: नमस्ते दुनिया",
        "ไทย: สวัสดีชาวโลก",
        "한국어: 안녕하세요 세계",
        "日本語：こんにちは世界。カタカナとひらがな、漢字。",
        "中文：你好，世界！这是一个测试句子。",
        "繁體中文：臺灣的資料庫與網路。",
        "混合 mixed 文本 text 123 数字",
        "Emoji: 😀😃😄😁 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🔥",
        "🏳️‍🌈 🧑🏿‍💻 👩🏻‍🔬",
        "Symbols: © ® ™ § ¶ † ‡ • … ‰ ′ ″ ‹ › « » € £ ¥ ₹ ₿",
        "Math: ∀x∈ℝ, ∃y: x² + y² ≤ 1 ⇒ ∫₀¹ f(x)dx ≈ π/4",
        "Box drawing: ┌─┬─┐ │ │ │ └─┴─┘",
        "Zero\u200bwidth\u200cjoiner\u200dtest\ufeffbom",
        "Control \u0001\u0002\u0007 chars \u001b[31mred\u001b[0m",
        "NBSP\u00a0here and\u2003em\u2009thin\u3000ideographic",
        "Line\u2028separator\u2029paragraph",
        "<|im_start|>user\nhello<|im_end|>",
        "<|im_start|",
        "<|im_end|><|im_end|><|endoftext|>",
        "< |im_start| >",
        "<|IM_START|>",
        "<|begin_of_text|>Hello<|eot_id|>",
        "<|start_header_id|>system<|end_header_id|>\n\n",
        "<|reserved_special_token_5|>",
        "<|begin_of_text",
        "<think>\nreasoning here\n</think>\n\nanswer",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "<tool_response>42</tool_response>",
        "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
        "text<|endoftext|>more",
        "<<|im_start|>>",
        "&lt;|im_start|&gt;",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        "func main() {\n\tfmt.Println(\"hello\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n",
        "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
        "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
        "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
        "    indented four\n        indented eight\n\t\ttabbed twice",
        "x = [i**2 for i in range(10) if i % 2 == 0]  # comment",
        "https://example.com/path?query=1&other=two#frag",
        "user@example.com, first.last+tag@sub.domain.org",
        "$HOME/.config/app/settings.yaml ~/bin/../lib",
        "!!!???...,,,;;;:::---___===+++***",
        "''''' \"\"\"\"\" ````` ~~~~~",
        "a'b'c's't're've'm'll'd",
        "'s",
        "'S'T'RE",
        "...'ll",
        "\n's",
        "end.\n\n\n  \n  next",
        "a\n \nb",
        "a \n b",
        "a\t\n\tb",
        "  \n  \n  ",
        "word\r\rword",
        "\u0085next line\u0085",
        "ᚠᛇᚻ᛫ᛒᛦᚦ runes",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒮𝒸𝓇𝒾𝓅𝓉",
        "Ⓐⓑⓒ ⒜⒝⒞ ㈠㈡",
        "Korean jamo: 각",
        "Tamil: வணக்கம் உலகம்",
        "Georgian: გამარჯობა",
        "Armenian: Բարեւ աշխարհ",
        "Amharic: ሰላም ልዑል",
        "Mongolian: ᠮᠣᠩᠭᠣᠯ",
        "Vietnamese: Tiếng Việt có dấu: ắ ằ ẳ ẵ ặ",
        "",
    ]
    # Long inputs.
    t.append("lorem ipsum dolor sit amet " * 200)
    t.append("数据" * 500)
    t.append("😀" * 300)
    t.append("0123456789" * 100)
    t.append(" ".join(str(i) for i in range(1000)))
    t.append("\n".join("line %d:\t%s" % (i, "x" * (i % 17)) for i in range(200)))
    return t


def exactness_texts():
    """Classes that once broke byte-exactness (issue 14): long runs of
    combining marks (Go's NFC inserted U+034F after 30), code points new in
    Unicode 16, line/paragraph separators, C0 controls next to white space."""
    marks = "\u0301\u0308\u0316\u0323\u0327\u0328\u035c\u0345"
    t = [
        "a" + "\u0301" * 31,
        "e" + "\u0301" * 30 + "x",
        "o" + "\u0316\u0301" * 20 + " next",
        "A" + "\u0300" * 29 + "\u0323" + "\u0300" * 5,
        "u" + marks * 6 + " word",
        "\u1100\u1161" + "\u0301" * 33 + "\u11a8",
        "x" + "\u0345" * 40 + "\u0301" * 3,
        "Zalgo: " + "".join(c + marks[i % 8] * (35 + i % 3) for i, c in enumerate("hello")),
        # Unicode 16: Kirat Rai digits (Nd) and letters, Garay, Gurung Khema,
        # Sunuwar, Tulu-Tigalari, Ol Onal, Todhri, Myanmar Extended-C digits,
        # Symbols for Legacy Computing Supplement, Egyptian Hieroglyphs Ext-A.
        "Kirat Rai 12\U00016d70\U00016d71\U00016d72\U00016d73\U00016d74 x\U00016d79",
        "\U00016d43\U00016d44\U00016d45\U00016d50 \U00016d6b\U00016d6c",
        "Garay \U00010d50\U00010d51\U00010d52 \U00010d40\U00010d41\U00010d42",
        "Gurung Khema \U00016100\U00016101\U00016102\U00016130\U00016131",
        "Sunuwar \U00011bc0\U00011bc1\U00011bf0\U00011bf1\U00011bf2",
        "Tulu-Tigalari \U00011380\U00011381\U00011382\U000113b8",
        "Ol Onal \U0001e5d0\U0001e5d1\U0001e5f1\U0001e5f2\U0001e5f3",
        "Todhri \U000105c0\U000105c1\U000105c2",
        "Myanmar \U000116d0\U000116d1\U000116d2\U000116d3abc",
        "Legacy \U0001cc00\U0001cc01\U0001cc15\U0001ccf0\U0001ccf1\U0001ccf2",
        "Hieroglyphs \U00013460\U00013461\U00013462",
        "mixed 9\U00016d70\U00016d71\U00016d72\U00016d73\U00016d74\U00016d75\U00016d76 7",
        "\u2028\u2029 start and end \u2029\u2028",
        "a\u2028b\u2029c \u2028 d",
        "\x1c\x1d\x1e\x1f",
        "\x1c padded \x1f",
        " \x1c\n\x1dtext\x1e \x1f\n",
        "\x0b\x0cvt ff\x0b\x0c",
        "\x85NEL\x85 and \xa0nbsp\xa0",
    ]
    return t


POOLS = [
    "abcdefghijklmnopqrstuvwxyz",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " " * 8 + "\t\n\r",
    ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
    "àéîõüçñßøåæœ",
    "αβγδεζηθλμπσω",
    "абвгдежзийклмн",
    "的一是不了人我在有他这中大来上个国",
    "あいうえおかきくけこアイウエオ",
    "가나다라마바사아자차카타파하",
    "😀😂🤔👍🎉🚀❤️🔥✅🙏",
    "\u0301\u0308\u200d\ufe0f",
    "٠١٢٣٤٥",

    "'s't're've'm'll'd",
]

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
            "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
            "<tool_call>", "<|im_start", "im_end|>"]


def random_texts(rng, n):
    out = []
    for i in range(n):
        k = rng.randint(1, 4)
        pools = rng.sample(POOLS, k)
        length = rng.choice([1, 2, 5, 10, 30, 80, 200, 600, 1500])
        chars = []
        for _ in range(length):
            if rng.random() < 0.01:
                chars.append(rng.choice(SPECIALS))
            else:
                chars.append(rng.choice(rng.choice(pools)))
        out.append("".join(chars))
    return out


WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more write "
         "go see number no way could people my than first water been call who oil its now find long down day did "
         "get come made may part").split()


def sentence(rng, lo=3, hi=25):
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    s = " ".join(words)
    return s[0].upper() + s[1:] + rng.choice([".", "?", "!", "...", ""])


def paragraph(rng):
    return " ".join(sentence(rng) for _ in range(rng.randint(1, 5)))


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City and state, e.g. San Francisco, CA"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search_docs",
        "description": "Search the documentation <index> & return the top hits.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
            "filters": {"type": "object", "properties": {"lang": {"type": "string"}, "after": {"type": "string", "format": "date"}}}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "run_python",
        "description": "Run Python code in a sandbox: 日本語 ok, emoji 🚀 ok.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}, "timeout": {"type": "number"}},
                       "required": ["code"]}}},
]


def tool_call(rng, i):
    t = rng.choice(TOOLS)["function"]["name"]
    if t == "get_weather":
        args = {"location": rng.choice(["Paris, France", "東京", "São Paulo", "New York, NY"]), "unit": rng.choice(["celsius", "fahrenheit"])}
    elif t == "search_docs":
        args = {"query": sentence(rng, 2, 6), "top_k": rng.randint(1, 20), "filters": {"lang": "en"}}
    else:
        args = {"code": "print(sum(range(%d)))\nimport os\n" % rng.randint(1, 999), "timeout": 2.5}
    return {"id": "call_%d" % i, "type": "function", "function": {"name": t, "arguments": args}}


SYSTEMS = [
    "You are a helpful assistant.",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "Réponds en français, avec précision.",
    "You are a coding agent. Use tools when needed.\n\nRules:\n- be concise\n- cite sources",
    "  Leading and trailing whitespace in the system prompt.  \n",
    "系统提示：请用中文回答。",
]


def conversations(rng, n):
    convs = []
    for i in range(n):
        msgs = []
        kind = i % 5
        if rng.random() < 0.6:
            msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
        turns = rng.randint(1, 6)
        tools = None
        if kind == 3:
            tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
        for t in range(turns):
            user = paragraph(rng)
            if rng.random() < 0.2:
                user = rng.choice(handcrafted()[20:60])
            if rng.random() < 0.1:
                user = "  " + user + "\n\n"
            msgs.append({"role": "user", "content": user})
            if kind == 3 and rng.random() < 0.7:
                calls = [tool_call(rng, t * 10 + j) for j in range(rng.randint(1, 2))]
                content = rng.choice(["", "Let me check.", "<think>\nI should call a tool.\n</think>\n\n"])
                msgs.append({"role": "assistant", "content": content, "tool_calls": calls})
                for c in calls:
                    msgs.append({"role": "tool", "content": json.dumps({"result": sentence(rng, 2, 8)}), "name": c["function"]["name"]})
            if t < turns - 1 or rng.random() < 0.3:
                content = paragraph(rng)
                if kind == 2 and rng.random() < 0.6:
                    content = "<think>\n" + sentence(rng) + "\n</think>\n\n" + content
                msgs.append({"role": "assistant", "content": content})
        if msgs[-1]["role"] == "assistant":
            agp = False
        else:
            agp = rng.random() < 0.85
        kwargs = {}
        if kind == 4 and rng.random() < 0.5:
            kwargs = {"enable_thinking": False}
        convs.append({"messages": msgs, "tools": tools, "add_generation_prompt": agp, "kwargs": kwargs})
    return convs


# Numbers json.dumps prints differently from Go: whole floats, exponents,
# negative zero, integers beyond 64 bits (kept as JSON text here, so the
# fixture file carries them exactly).
NUMBER_SCHEMA = (r'{"type": "function", "function": {"name": "set_limits", '
                 r'"description": "Limits \u2028 with separators \u2029 and <tags> & co.", '
                 r'"parameters": {"type": "object", "properties": {'
                 r'"ratio": {"type": "number", "minimum": 0.0, "maximum": 1.0, "default": 2.0, "multipleOf": 0.5}, '
                 r'"big": {"type": "integer", "maximum": 123456789012345678901234567890, "minimum": -9223372036854775809}, '
                 r'"exact": {"type": "integer", "const": 9007199254740993}, '
                 r'"sci": {"type": "number", "examples": [1e16, 1E+16, 1.5e16, 1e15, 1e-05, 0.0001, 1e-7, 12345678.9, 1e300, 123456789012345678.0, -0.0, 0.1, 5e-324, 1.7976931348623157e308]}, '
                 r'"z_first": {"type": "string", "enum": ["\u00e9t\u00e9", "\u65e5\u672c", "\ud83d\ude80", "tab\there", "nul\u0000", "del\u007f", "ctl\u001c"]}, '
                 r'"a_second": {"type": "boolean", "default": false}}, '
                 r'"required": ["ratio"]}}}')

NUMBER_ARGS = (r'{"ratio": 2.0, "big": 123456789012345678901234567890, "neg": -0.0, "sci": 1e16, '
               r'"small": 1e-05, "mid": 12345678.9, "huge": 1e300, "exact": 9007199254740993, '
               r'"text": "line\u2028sep\u2029para", "list": [1.0, 2.50, 3e2, -1e-10]}')


def exactness_conversations():
    """Chats whose rendering once differed from Python (issue 14): tool
    schemas and tool-call arguments with numbers Go prints differently,
    U+2028/U+2029 inside JSON, C0 controls around content the template trims,
    and long runs of combining marks."""
    schema = json.loads(NUMBER_SCHEMA)
    convs = []
    for i, (content, sysmsg) in enumerate([
        ("\x1c\x1d  What is the limit?  \x1e\x1f", "\x1f You set limits. \x1c"),
        ("\n\x1c\n hello \x0b\x0c\x1d", None),
        ("\u2028Separated\u2029 content\u2028", "\u2029system\u2028"),
        ("e" + "\u0301" * 33 + " and \U00016d70\U00016d71\U00016d72\U00016d73", None),
    ]):
        msgs = []
        if sysmsg is not None:
            msgs.append({"role": "system", "content": sysmsg})
        msgs.append({"role": "user", "content": content})
        convs.append({"messages": msgs, "tools": None, "add_generation_prompt": True, "kwargs": {}})
        # With the number-laden schema, a call whose arguments arrive as a
        # JSON string (as OpenAI clients send them), and the tool's answer.
        calls = [{"id": "call_n%d" % i, "type": "function",
                  "function": {"name": "set_limits", "arguments": NUMBER_ARGS}}]
        msgs2 = msgs + [
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "{\"ok\": 1.0, \"n\": 123456789012345678901234567890}", "name": "set_limits"},
        ]
        convs.append({"messages": msgs2, "tools": [schema, TOOLS[0]], "add_generation_prompt": i % 2 == 0, "kwargs": {}})
    return convs


def vllm_messages(msgs):
    """vLLM's preprocessing before the template: tool-call arguments given as
    a JSON string become the object json.loads makes of them."""
    out = []
    for m in msgs:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c, function=dict(c["function"]))
                if isinstance(c["function"].get("arguments"), str):
                    try:
                        c["function"]["arguments"] = json.loads(c["function"]["arguments"])
                    except ValueError:
                        c["function"]["arguments"] = {}
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


# What vLLM 0.33 does to a chat request's messages and tools before the
# template sees them, beyond vllm_messages above (mirrored here so the
# fixtures hold what the engine renders, not what the client sent).
TEXT_PART_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
                  "thinking": "thinking"}
BILLING_HEADER = "x-anthropic-billing-header"
# vLLM's content-format detection: a template that loops over a message's
# content gets every content as a list of {"type": "text"} parts ("openai");
# the others get one string, the texts joined with "\n".
OPENAI_CONTENT_FORMAT = {"gemma3"}


def engine_content(role, content, fmt):
    if isinstance(content, str) and not (role == "system" and content.startswith(BILLING_HEADER)):
        return [{"type": "text", "text": content}] if fmt == "openai" and role != "tool" else content
    parts = [] if content is None else [content] if isinstance(content, str) else list(content)
    pieces = []  # (kind, text)
    for p in parts:
        kind = "text" if isinstance(p, str) else p.get("type")
        text = p if isinstance(p, str) else p["name"] if kind == "tool_reference" else p[TEXT_PART_KEYS[kind]]
        if role == "system" and kind == "text" and text.startswith(BILLING_HEADER):
            text = text.partition("\n")[2]
            if not text:
                continue
        pieces.append((kind, text))
    if fmt == "openai":
        refs = any(k == "tool_reference" for k, _ in pieces)
        if role == "tool" and not refs:
            return "\n".join(t for _, t in pieces)
        return [{"type": "tool_reference", "name": t} if k == "tool_reference" else {"type": "text", "text": t}
                for k, t in pieces]
    # A string content leaves out the parts that parse to "".
    return "\n".join(t for _, t in pieces if t)


def engine_conversation(msgs, fmt, names_developer):
    out = []
    for m in vllm_messages(msgs):
        if isinstance(m.get("content"), list) or fmt == "openai" or (
                m["role"] == "system" and isinstance(m.get("content"), str) and BILLING_HEADER in m["content"]):
            m = dict(m, content=engine_content(m["role"], m.get("content"), fmt))
        out.append(m)
    if names_developer or not any(m["role"] == "developer" for m in out):
        return out
    out = [dict({k: v for k, v in m.items() if k != "tools"}, role="system") if m["role"] == "developer" else m
           for m in out]
    systems = [i for i, m in enumerate(out) if m["role"] == "system"]
    if not systems or (systems == [0]):
        return out
    merged = []
    for i in systems:
        c = out[i].get("content", "")
        if isinstance(c, list):
            c = "\n".join(p["text"] if isinstance(p, dict) else p for p in c)
        if c:
            merged.append(c)
    return [{"role": "system", "content": "\n\n".join(merged)}] + [m for m in out if m["role"] != "system"]


def engine_tools(tools):
    """The tools as vLLM renders them: each validated as a
    ChatCompletionToolsParam and model_dump()ed."""
    if tools is None:
        return None
    out = []
    for t in tools:
        f = t["function"]
        fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
        if f.get("strict") is not None:
            fn["strict"] = f["strict"]
        defer = f.get("defer_loading")
        if defer is None:
            defer = t.get("defer_loading")
        if defer is not None:
            fn["defer_loading"] = defer
        tool = {"type": "function", "function": fn}
        if t.get("defer_loading") is not None:
            tool["defer_loading"] = t["defer_loading"]
        out.append(tool)
    return out


def engine_shape_conversations():
    """Requests whose messages or tools vLLM reshapes before rendering:
    tools in a client's own key order, without descriptions, with strict,
    defer_loading and unknown keys; Responses-style content parts; developer
    messages; Claude Code's billing header line in a system prompt."""
    weather = TOOLS[0]["function"]
    convs = []
    tools = [
        {"function": {"parameters": weather["parameters"], "name": "get_weather"}},
        {"type": "function", "function": dict(TOOLS[1]["function"], strict=True), "cache_control": {"type": "ephemeral"}},
        {"type": "function", "function": {"strict": False, "x-note": "dropped", "description": None, "name": "noop",
                                          "parameters": None}, "defer_loading": True},
    ]
    convs.append({"messages": [{"role": "system", "content": SYSTEMS[3]},
                               {"role": "user", "content": "What is the weather in Paris?"}],
                  "tools": tools, "add_generation_prompt": True, "kwargs": {}})
    convs.append({"messages": [
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer in one line."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hi. How can I help?"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "List three primes."},
                                     {"type": "text", "text": "Then stop."}]}],
        "tools": None, "add_generation_prompt": True, "kwargs": {}})
    convs.append({"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "first"},
        {"role": "developer", "content": "Prefer bullet points."},
        {"role": "developer", "content": ""},
        {"role": "user", "content": "second"}],
        "tools": [TOOLS[2]], "add_generation_prompt": True, "kwargs": {}})
    # An assistant turn to continue (continue_final_message): plain, and
    # ending in white space a template may trim.
    for final in ["Sure, here is the plan:", "The answer is "]:
        convs.append({"messages": [{"role": "system", "content": SYSTEMS[0]},
                                   {"role": "user", "content": "Plan the migration."},
                                   {"role": "assistant", "content": final}],
                      "tools": None, "add_generation_prompt": False, "continue_final_message": True, "kwargs": {}})
    # An empty tools list is passed on as one (not as None).
    convs.append({"messages": [{"role": "user", "content": "No tools today."}],
                  "tools": [], "add_generation_prompt": True, "kwargs": {}})
    for sysmsg in [
        BILLING_HEADER + ": cc_version=2.1.3; cch=9f3e1;\nYou are Claude Code, a coding agent.",
        [{"type": "text", "text": BILLING_HEADER + ": cc_version=2.1.3; cch=07aa2;"},
         {"type": "text", "text": "You are Claude Code.\n\nUse the tools."}],
        [{"type": "text", "text": "Intro."}, {"type": "text", "text": BILLING_HEADER + ": cch=1;\nkept after"}],
    ]:
        convs.append({"messages": [{"role": "system", "content": sysmsg},
                                   {"role": "user", "content": "Fix the failing test."}],
                      "tools": [TOOLS[2]], "add_generation_prompt": True, "kwargs": {}})
    return convs


FAMILIES = ["qwen3", "llama3_1", "llama3", "llama3_2", "gptoss", "deepseek_v3", "gemma3"]

# Template arguments a family's chats always get: Llama 3.2's template prints
# today's date unless date_string is given, which would tie the fixture to
# the day it was made.
FAMILY_KWARGS = {"llama3_2": {"date_string": "26 Jul 2024"}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("names", nargs="*", default=FAMILIES)
    a = ap.parse_args()
    rng = random.Random(SEED)
    texts = handcrafted() + random_texts(rng, 160)
    exact_texts = exactness_texts()
    convs = conversations(random.Random(SEED + 1), 64) + exactness_conversations() + engine_shape_conversations()
    os.makedirs(a.out, exist_ok=True)
    for name in a.names:
        d = os.path.join(a.cache, name)
        tok = AutoTokenizer.from_pretrained(d)
        raw = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        def encode_all(texts):
            out = []
            for text in texts:
                ids = tok(text, add_special_tokens=False)["input_ids"]
                ids_special = tok(text, add_special_tokens=True)["input_ids"]
                if raw.encode(text, add_special_tokens=False).ids != ids:
                    sys.exit("%s: transformers and tokenizers disagree on %r" % (name, text[:60]))
                out.append({"text": text, "ids": ids, "ids_special": ids_special})
            return out
        plain, exact = encode_all(texts), encode_all(exact_texts)
        chat, raised = [], 0
        if not tok.chat_template:
            convs_here = []  # no chat template shipped (gpt-oss): completions and raw text only
        else:
            convs_here = convs
        for c in convs_here:
            c = dict(c, kwargs=dict(c["kwargs"], **FAMILY_KWARGS.get(name, {})))
            fmt = "openai" if name in OPENAI_CONTENT_FORMAT else "string"
            template = tok.chat_template if isinstance(tok.chat_template, str) else json.dumps(tok.chat_template)
            names_developer = '"developer"' in template or "'developer'" in template
            try:
                extra = {"continue_final_message": True} if c.get("continue_final_message") else {}
                rendered = tok.apply_chat_template(engine_conversation(c["messages"], fmt, names_developer),
                                                   tools=engine_tools(c["tools"]), tokenize=False,
                                                   add_generation_prompt=c["add_generation_prompt"], **extra, **c["kwargs"])
            except Exception:  # the template raises (e.g. DeepSeek-V3 on object arguments): the engine rejects it too
                raised += 1
                continue
            ids = tok(rendered, add_special_tokens=False)["input_ids"]
            # The fixture keeps the request's own JSON text (numbers exactly
            # as sent), which the Go side decodes as the engine would.
            chat.append({"messages_json": json.dumps(c["messages"], ensure_ascii=False),
                         "tools_json": json.dumps(c["tools"], ensure_ascii=False),
                         "add_generation_prompt": c["add_generation_prompt"],
                         "continue_final_message": bool(c.get("continue_final_message")),
                         "kwargs": c["kwargs"], "rendered": rendered, "ids": ids})
        meta = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__, "seed": SEED,
                "chats_raised": raised}
        path = os.path.join(a.out, name + ".json.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(json.dumps({"meta": meta, "plain": plain, "exact": exact, "chat": chat}, ensure_ascii=False).encode())
        print("%s: %d texts, %d exactness texts, %d conversations (%d raised) -> %s (%d bytes)" % (name, len(plain), len(exact), len(chat), raised, path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
