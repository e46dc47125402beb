//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// TestLoRAAdapters: two of three engines serve the adapter sql-lora
// (--lora-modules, as vLLM). kvroute learns it from their /v1/models; an
// adapter request gets 200 through Envoy and lands only on those two; its
// second turn lands where the first was cached and the engine confirms the
// hit; the base model's keys never match the adapter's blocks; an adapter
// nobody serves is 404.
func TestLoRAAdapters(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 3, seed: 200, engineArgs: func(i int) []string {
		if i > 0 {
			return []string{"--lora-modules", "sql-lora=/loras/sql"}
		}
		return nil
	}})
	ctx := t.Context()
	serving := map[string]bool{c.engines[1].addr(): true, c.engines[2].addr(): true}

	body := func(model string, msgs []message) []byte {
		b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 8})
		return b
	}
	// kvroute learns the adapters from the engines' /v1/models.
	hist := []message{{Role: "system", Content: prompt("sql-agent", 60)}, {Role: "user", Content: prompt("q0", 20)}}
	waitFor(t, 20*time.Second, "explain to list the adapter's two replicas", func() bool {
		m, err := c.matched(body("sql-lora", hist))
		addrs := slices.Sorted(maps.Keys(m))
		return err == nil && len(addrs) == 2 && serving[addrs[0]] && serving[addrs[1]]
	})

	// The base model is still served by all three.
	base := c.post(ctx, "/v1/chat/completions", body("sim-model", []message{{Role: "user", Content: prompt("base", 30)}}), nil)
	if base.status != 200 || base.err != nil {
		t.Fatalf("base request: %d %v %s", base.status, base.err, base.body)
	}

	// Adapter sessions land only on the replicas serving the adapter.
	for i := range 6 {
		r := c.post(ctx, "/v1/chat/completions", body("sql-lora", []message{{Role: "user", Content: prompt(fmt.Sprintf("lora-%d", i), 30)}}), nil)
		if r.status != 200 || r.err != nil {
			t.Fatalf("adapter request %d: %d %v %s", i, r.status, r.err, r.body)
		}
		if !serving[r.upstream] {
			t.Fatalf("adapter request %d landed on %s, which does not serve sql-lora", i, r.upstream)
		}
	}

	// Turn 1, then turn 2 once the index has learned turn 1's blocks.
	first := c.post(ctx, "/v1/chat/completions", body("sql-lora", hist), nil)
	if first.status != 200 || first.err != nil || !serving[first.upstream] {
		t.Fatalf("turn 1: %d %v on %s %s", first.status, first.err, first.upstream, first.body)
	}
	hist = append(hist, message{Role: "assistant", Content: first.text}, message{Role: "user", Content: prompt("q1", 20)})
	next := body("sql-lora", hist)
	waitFor(t, 20*time.Second, "the index to learn turn 1 under the adapter", func() bool {
		m, err := c.matched(next)
		return err == nil && m[first.upstream] > 0
	})
	// The same conversation for the base model matches nothing anywhere:
	// the adapter's blocks have their own root.
	m, err := c.matched(body("sim-model", hist))
	if err != nil {
		t.Fatal(err)
	}
	for addr, n := range m {
		if n != 0 {
			t.Errorf("base model matched %d blocks of the adapter's conversation on %s", n, addr)
		}
	}
	c.waitPick(t, next, first.upstream)
	second := c.post(ctx, "/v1/chat/completions", next, nil)
	if second.status != 200 || second.err != nil {
		t.Fatalf("turn 2: %d %v %s", second.status, second.err, second.body)
	}
	if second.upstream != first.upstream {
		t.Fatalf("turn 2 landed on %s, turn 1 on %s", second.upstream, first.upstream)
	}
	if second.cached < first.prompt-16 || second.cached == 0 {
		t.Fatalf("turn 2: cached %d of %d tokens, want at least turn 1's %d less one block", second.cached, second.prompt, first.prompt)
	}
	t.Logf("adapter turn 2 on %s: %d of %d prompt tokens cached", second.upstream, second.cached, second.prompt)

	// An adapter nobody serves is an unknown model.
	r := c.post(ctx, "/v1/chat/completions", body("nope-lora", hist), nil)
	if r.status != 404 {
		t.Fatalf("unknown adapter: %d %s", r.status, r.body)
	}
}
