//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestResponseObservedOffThePath: with the shipped Envoy config the
// response goes to kvroute through the second, observability-mode ext_proc
// filter only. Every routed request, streamed or not, is claimed by its
// observer stream through the decision id (a client-sent id is replaced),
// none ends unobserved, the in-flight charges all fall back to zero when
// the answers end, and the usage of the JSON answers reaches the cache
// fidelity (the repeated prompt is served from the cache kvroute
// predicted). The router's own stream ends right after the pick.
func TestResponseObservedOffThePath(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2})
	ctx := t.Context()
	l := &openLoad{c: c}
	const streamed = 4
	for i := range streamed {
		if o := l.one(int64(i), true, 40); !o.ok() {
			t.Fatalf("streamed request %d: %v", i, o)
		}
	}
	msgs := []message{{Role: "user", Content: prompt("observer", 150)}}
	forged := map[string]string{"x-kvroute-decision": "forged-by-the-client"}
	var cached int
	for i := range 3 {
		r := c.chat(ctx, msgs, 4, forged)
		if r.err != nil || r.status != 200 {
			t.Fatalf("JSON request %d: %d %v %s", i, r.status, r.err, r.body)
		}
		cached = r.cached
	}
	if cached == 0 {
		t.Fatalf("the repeated prompt was not served from the cache")
	}
	total := float64(streamed + 3)
	waitFor(t, 30*time.Second, "every response observed and its charge released", func() bool {
		return kvMetric(t, c, "kvroute_extproc_observer_streams_total", map[string]string{"outcome": "claimed"}) == total &&
			kvMetric(t, c, "kvroute_replica_inflight_requests", nil) == 0 &&
			kvMetric(t, c, "kvroute_extproc_requests_in_flight", nil) == 0
	})
	for _, outcome := range []string{"unknown", "no_id"} {
		if n := kvMetric(t, c, "kvroute_extproc_observer_streams_total", map[string]string{"outcome": outcome}); n != 0 {
			t.Errorf("%v observer streams %s, want none", n, outcome)
		}
	}
	if n := kvMetric(t, c, "kvroute_extproc_unobserved_total", nil); n != 0 {
		t.Errorf("%v requests unobserved, want none", n)
	}
	if n := kvMetric(t, c, "kvroute_decisions_total", nil); n != total {
		t.Errorf("%v decisions for %v requests", n, total)
	}
	// The served cached tokens reached the fidelity (admin's replica list).
	code, b, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/debug/replicas", c.adminPort))
	if err != nil || code != 200 {
		t.Fatalf("GET /debug/replicas: %d %v", code, err)
	}
	var out struct {
		Replicas []map[string]any `json:"replicas"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	served := 0.0
	for _, r := range out.Replicas {
		for k, v := range r {
			if strings.EqualFold(strings.ReplaceAll(k, "_", ""), "servedcachedtokens") {
				switch x := v.(type) {
				case float64:
					served += x
				case string: // protojson writes int64 as a string
					var f float64
					_, _ = fmt.Sscan(x, &f)
					served += f
				}
			}
		}
	}
	if served < float64(cached) {
		t.Errorf("served cached tokens in the fidelity totals %v, want at least the last answer's %d: %s", served, cached, b)
	}
	// Envoy's view: two ext_proc filters, neither waited on for the
	// response, none failed.
	if n := counter(t, c, "http.inference.ext_proc.streams_failed"); n != 0 {
		t.Errorf("Envoy counted %d failed ext_proc streams", n)
	}
}

// TestObserverStopsAtTheFirstToken: with routing.usage_sample_every large
// (and no per-replica floor within the test), the observer of each streamed
// answer closes its stream at the first token, through the real Envoy:
// every answer still completes, nothing fails on Envoy's side, and every
// in-flight charge is released when Envoy closes the router stream at the
// request's end.
func TestObserverStopsAtTheFirstToken(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2, kvExtra: "routing: {usage_sample_every: 1000, usage_sample_interval: 1h}\n"})
	l := &openLoad{c: c}
	const streamed = 6
	for i := range streamed {
		if o := l.one(int64(i), true, 200); !o.ok() {
			t.Fatalf("streamed request %d: %v", i, o)
		}
	}
	waitFor(t, 30*time.Second, "every charge released", func() bool {
		return kvMetric(t, c, "kvroute_replica_inflight_requests", nil) == 0 &&
			kvMetric(t, c, "kvroute_extproc_requests_in_flight", nil) == 0
	})
	if n := kvMetric(t, c, "kvroute_extproc_observed_to_first_token_total", nil); n != streamed {
		t.Errorf("%v answers observed to the first token only, want %d", n, streamed)
	}
	if n := kvMetric(t, c, "kvroute_extproc_unobserved_total", nil); n != 0 {
		t.Errorf("%v requests unobserved, want none", n)
	}
	if n := counter(t, c, "http.inference.ext_proc.streams_failed"); n != 0 {
		t.Errorf("Envoy counted %d failed ext_proc streams", n)
	}
}
