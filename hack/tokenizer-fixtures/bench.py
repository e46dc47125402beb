#!/usr/bin/env python3
"""Throughput of pkg/tokenize's local encoder next to HuggingFace tokenizers,
on the same fixture corpus, same machine, same run.

For each tokenizer it times HF tokenizers' Tokenizer.encode over every fixture
text (add_special_tokens=False, one call per text, as a router tokenizes one
request at a time; --runs repetitions, median), then runs
`go test -bench BenchmarkEncodeCorpus` (-count --runs, median) and prints
both throughputs and the ratio Go/HF.

Usage: bench.py --cache .cache/tokenizers [--runs 5]
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

NAMES = ["qwen3", "llama3_1"]


def hf_throughput(cache, name, runs):
    tok = Tokenizer.from_file(os.path.join(cache, name, "tokenizer.json"))
    with gzip.open(os.path.join("pkg/tokenize/testdata", name + ".json.gz")) as f:
        texts = [p["text"] for p in json.load(f)["plain"]]
    nbytes = sum(len(t.encode()) for t in texts)
    for t in texts:  # warm up, as the Go benchmark's b.Loop does
        tok.encode(t, add_special_tokens=False)
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for t in texts:
            tok.encode(t, add_special_tokens=False)
        rates.append(nbytes / (time.perf_counter() - t0) / 1e6)
    return statistics.median(rates), nbytes


def go_throughput(runs):
    out = subprocess.run(
        ["go", "test", "-run", "^$", "-bench", "BenchmarkEncodeCorpus", "-benchtime", "20x",
         "-count", str(runs), "./pkg/tokenize/"],
        check=True, capture_output=True, text=True).stdout
    rates = {}
    for line in out.splitlines():
        m = re.match(r"BenchmarkEncodeCorpus/(\S+?)-\d+\s+\d+\s+\d+ ns/op\s+([\d.]+) MB/s", line)
        if m:
            rates.setdefault(m.group(1), []).append(float(m.group(2)))
    return {k: statistics.median(v) for k, v in rates.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=".cache/tokenizers")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    os.environ.setdefault("KVROUTE_TOKENIZER_CACHE", os.path.abspath(a.cache))
    hf = {n: hf_throughput(a.cache, n, a.runs) for n in NAMES}
    go = go_throughput(a.runs)
    hf2 = {n: hf_throughput(a.cache, n, a.runs) for n in NAMES}  # again after Go: load drift
    print("%-10s %10s %12s %12s %8s" % ("tokenizer", "bytes", "HF MB/s", "Go MB/s", "Go/HF"))
    for n in NAMES:
        h = statistics.median([hf[n][0], hf2[n][0]])
        print("%-10s %10d %12.2f %12.2f %8.2f" % (n, hf[n][1], h, go[n], go[n] / h))


if __name__ == "__main__":
    main()
