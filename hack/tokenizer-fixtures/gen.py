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

Usage: gen.py --cache .cache/tokenizers --out pkg/tokenize/testdata qwen3 llama3_1
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    rng = random.Random(SEED)
    texts = handcrafted() + random_texts(rng, 160)
    convs = conversations(random.Random(SEED + 1), 64)
    os.makedirs(a.out, exist_ok=True)
    for name in a.names:
        d = os.path.join(a.cache, name)
        tok = AutoTokenizer.from_pretrained(d)
        raw = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        plain = []
        for text in texts:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            ids_special = tok(text, add_special_tokens=True)["input_ids"]
            if raw.encode(text, add_special_tokens=False).ids != ids:
                sys.exit("%s: transformers and tokenizers disagree on %r" % (name, text[:60]))
            plain.append({"text": text, "ids": ids, "ids_special": ids_special})
        chat = []
        for c in convs:
            rendered = tok.apply_chat_template(c["messages"], tools=c["tools"], tokenize=False,
                                               add_generation_prompt=c["add_generation_prompt"], **c["kwargs"])
            ids = tok(rendered, add_special_tokens=False)["input_ids"]
            chat.append(dict(c, rendered=rendered, ids=ids))
        meta = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__, "seed": SEED}
        path = os.path.join(a.out, name + ".json.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(json.dumps({"meta": meta, "plain": plain, "chat": chat}, ensure_ascii=False).encode())
        print("%s: %d texts, %d conversations -> %s (%d bytes)" % (name, len(plain), len(chat), path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
