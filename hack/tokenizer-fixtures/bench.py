#!/usr/bin/env python3
"""Throughput of pkg/tokenize's local encoder next to HuggingFace tokenizers,
per family, on the same inputs, same machine, same run.

Two measurements per tokenizer family:

  corpus   every general fixture text encoded once per pass (add_special_tokens
           False, one call per text, as a router tokenizes one request at a
           time), caches warm: MB/s, median of --runs passes.
  100k     one prompt of about 100k tokens (the general fixture texts joined
           by newlines until 100k reference tokens, each repetition of the
           corpus with its ASCII letters shifted so no word repeats, exactly as
           the Go benchmark builds it). "cold": a tokenizer whose caches are empty
           (HF: Tokenizer.from_file afresh before each timed encode, loading
           not timed; Go: the word cache emptied before each op). "warm": the
           same text encoded again by the same tokenizer. Median of --runs.

The Go side runs `go test -bench 'BenchmarkEncodeCorpus|Benchmark100kTokenPrompt'`
(-count --runs) between two HF passes (their median is used, to even out load
drift). Prints a markdown table.

Usage: bench.py --cache .cache/tokenizers [--runs 5] [name...]
"""

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import time

from tokenizers import Tokenizer

NAMES = ["qwen3", "llama3_1", "llama3", "llama3_2", "gptoss", "deepseek_v3", "gemma3"]


def fixture(name):
    with gzip.open(os.path.join("pkg/tokenize/testdata", name + ".json.gz")) as f:
        return json.load(f)["plain"]


def caesar(s, k):
    """Shifts ASCII letters by k places (as corpusText in bench_test.go)."""
    if k % 26 == 0:
        return s
    def sh(c):
        if "a" <= c <= "z":
            return chr(ord("a") + (ord(c) - ord("a") + k) % 26)
        if "A" <= c <= "Z":
            return chr(ord("A") + (ord(c) - ord("A") + k) % 26)
        return c
    return "".join(sh(c) for c in s)


def prompt_100k(plain, n=100_000):
    """The corpus repeated to about n reference tokens, repetition k with its
    letters shifted by k so that no word repeats (a cold run stays cold)."""
    parts, tokens, k = [], 0, 0
    while tokens < n:
        for p in plain:
            parts.append(caesar(p["text"], k) + "\n")
            tokens += len(p["ids"]) + 1
            if tokens >= n:
                break
        k += 1
    return "".join(parts)


def hf(cache, name, runs):
    path = os.path.join(cache, name, "tokenizer.json")
    plain = fixture(name)
    texts = [p["text"] for p in plain]
    nbytes = sum(len(t.encode()) for t in texts)
    tok = Tokenizer.from_file(path)
    for t in texts:  # warm up, as the Go benchmark's b.Loop does
        tok.encode(t, add_special_tokens=False)
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for t in texts:
            tok.encode(t, add_special_tokens=False)
        rates.append(nbytes / (time.perf_counter() - t0) / 1e6)
    big = prompt_100k(plain)
    cold, warm = [], []
    for _ in range(runs):
        fresh = Tokenizer.from_file(path)
        t0 = time.perf_counter()
        fresh.encode(big, add_special_tokens=False)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fresh.encode(big, add_special_tokens=False)
        warm.append(time.perf_counter() - t0)
    return {"corpus": statistics.median(rates), "bytes": nbytes,
            "cold": statistics.median(cold) * 1e3, "warm": statistics.median(warm) * 1e3}


def go(runs, names):
    pat = "BenchmarkEncodeCorpus/(%s)$|Benchmark100kTokenPrompt/(%s)/" % ("|".join(names), "|".join(names))
    out = subprocess.run(
        ["go", "test", "-run", "^$", "-bench", pat, "-benchtime", "5x", "-count", str(runs), "./pkg/tokenize/"],
        check=True, capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        m = re.match(r"BenchmarkEncodeCorpus/(\S+?)-\d+\s+\d+\s+\d+ ns/op\s+([\d.]+) MB/s", line)
        if m:
            res.setdefault((m.group(1), "corpus"), []).append(float(m.group(2)))
        m = re.match(r"Benchmark100kTokenPrompt/(\S+?)/(cold|warm)-\d+\s+\d+\s+(\d+) ns/op", line)
        if m:
            res.setdefault((m.group(1), m.group(2)), []).append(int(m.group(3)) / 1e6)
    return {k: statistics.median(v) for k, v in res.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=".cache/tokenizers")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("names", nargs="*", default=NAMES)
    a = ap.parse_args()
    os.environ.setdefault("KVROUTE_TOKENIZER_CACHE", os.path.abspath(a.cache))
    h1 = {n: hf(a.cache, n, a.runs) for n in a.names}
    g = go(a.runs, a.names)
    h2 = {n: hf(a.cache, n, a.runs) for n in a.names}  # again after Go: load drift
    print("| family | corpus HF MB/s | corpus Go MB/s | Go/HF | 100k cold HF ms | 100k cold Go ms | HF/Go | 100k warm HF ms | 100k warm Go ms | HF/Go |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in a.names:
        h = {k: statistics.median([h1[n][k], h2[n][k]]) for k in ("corpus", "cold", "warm")}
        print("| %s | %.2f | %.2f | %.1f× | %.0f | %.0f | %.1f× | %.0f | %.0f | %.1f× |" % (
            n, h["corpus"], g[(n, "corpus")], g[(n, "corpus")] / h["corpus"],
            h["cold"], g[(n, "cold")], h["cold"] / g[(n, "cold")],
            h["warm"], g[(n, "warm")], h["warm"] / g[(n, "warm")]))


if __name__ == "__main__":
    main()
