//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestHybridFleet: two hybrid-attention engines (enginesim
// --hybrid-sliding-window 64: a full-attention and a sliding-window
// KV-cache group, 16-token blocks, so a hit needs 4 consecutive
// sliding-window blocks) publish their groups as vLLM 0.33 does, through
// real ZeroMQ, to kvroute behind a real Envoy.
//
// Engine A holds a 21-block prompt P; memory pressure then evicts the 16
// sliding-window blocks P's prefill released early, but none of its
// full-attention blocks. Engine B holds P's first 8 blocks in both groups.
// For Q (P's first 10 blocks, then new tokens) A's full-attention group
// holds 10 blocks and B's 8, but A cannot serve any (no 4 consecutive
// sliding-window blocks end at or before block 10): kvroute must credit A
// with 0 and B with 8, and route Q to B, which serves 128 cached tokens.
// For R (all of P, then new tokens) A's sliding-window group holds the last
// window: R goes to A, which serves all 336 of P's tokens from cache.
// Finally Q sent to A directly hits nothing, as kvroute predicted.
func TestHybridFleet(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2, seed: 400, engineArgs: func(int) []string {
		// One block per prefill step, so a prompt's early sliding-window
		// blocks are released during its prefill; a pool of 200 blocks.
		return []string{"--speed", "50", "--hybrid-sliding-window", "64",
			"--num-gpu-blocks", "200", "--max-model-len", "2048", "--max-num-seqs", "16", "--max-num-batched-tokens", "16"}
	}})
	ctx := t.Context()
	a, b := c.engines[0], c.engines[1]
	rng := rand.New(rand.NewPCG(4, 2))
	p := randomTokens(rng, 21*16)
	q := append(slices.Clone(p[:160]), randomTokens(rng, 64)...)
	r := append(slices.Clone(p), randomTokens(rng, 32)...)
	body := func(tokens []int) []byte {
		out, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": tokens, "max_tokens": 1})
		return out
	}
	waitMatched := func(what string, tokens []int, want map[string]int) {
		t.Helper()
		var last map[string]int
		waitFor(t, 20*time.Second, what, func() bool {
			m, err := c.matched(body(tokens))
			if err != nil {
				return false
			}
			last = m
			for addr, n := range want {
				if m[addr] != n {
					return false
				}
			}
			return true
		})
		t.Logf("%s: explain matched %v", what, last)
	}

	// A holds P, B holds P's first 8 blocks; no pressure yet.
	if n, err := engineCached(ctx, a.URL(), p); err != nil || n != 0 {
		t.Fatalf("P on A: cached %d, %v", n, err)
	}
	if n, err := engineCached(ctx, b.URL(), p[:128]); err != nil || n != 0 {
		t.Fatalf("P[:128] on B: cached %d, %v", n, err)
	}
	waitMatched("both groups of A's P and B's prefix learned", r, map[string]int{a.addr(): 21, b.addr(): 8})
	waitMatched("Q before the pressure", q, map[string]int{a.addr(): 10, b.addr(): 8})

	// Pressure on A: a disjoint prompt of 87 blocks allocates 174 blocks
	// (both groups), exactly A's 158 never-used blocks and the 16
	// sliding-window blocks P's prefill released (blocks 0-15).
	if _, err := engineCached(ctx, a.URL(), randomTokens(rng, 87*16)); err != nil {
		t.Fatal(err)
	}
	waitMatched("A's sliding-window evictions applied", q, map[string]int{a.addr(): 0, b.addr(): 8})
	waitMatched("R still a full hit on A", r, map[string]int{a.addr(): 21, b.addr(): 8})

	// Through Envoy: Q goes to B, R to A, and the engines confirm.
	c.waitPick(t, body(q), b.addr())
	res := c.post(ctx, "/v1/completions", body(q), nil)
	if res.err != nil || res.status != 200 || res.upstream != b.addr() || res.cached != 128 {
		t.Fatalf("Q through Envoy: status %d err %v on %s (want B %s) cached %d (want 128)", res.status, res.err, res.upstream, b.addr(), res.cached)
	}
	c.waitPick(t, body(r), a.addr())
	res = c.post(ctx, "/v1/completions", body(r), nil)
	if res.err != nil || res.status != 200 || res.upstream != a.addr() || res.cached != 21*16 {
		t.Fatalf("R through Envoy: status %d err %v on %s (want A %s) cached %d (want 336)", res.status, res.err, res.upstream, a.addr(), res.cached)
	}
	// A itself cannot serve Q's prefix, as kvroute predicted.
	if n, err := engineCached(ctx, a.URL(), q); err != nil || n != 0 {
		t.Fatalf("Q sent to A: cached %d (want 0: its window's blocks are gone), %v", n, err)
	}
	// kvroute saw A's sliding-window stores and evictions.
	if n, err := metricSum(ctx, c.kv.MetricsURL("/metrics"), "kvroute_events_skipped_total", `reason="other_group"`); err != nil || n == 0 {
		t.Errorf("kvroute counted %v sliding-window group events (%v), want some", n, err)
	}
}

// engineCached sends one completion of tokens (max_tokens 1) straight to
// an engine and returns its cached prompt tokens.
func engineCached(ctx context.Context, base string, tokens []int) (int, error) {
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": tokens, "max_tokens": 1})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("engine %s: status %d", base, resp.StatusCode)
	}
	var out struct {
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, err
	}
	if d := out.Usage.PromptTokensDetails; d != nil {
		return d.CachedTokens, nil
	}
	return 0, nil
}
