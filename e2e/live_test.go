//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/bench/live"
	"github.com/kvroute/kvroute/pkg/testbed"
)

// TestLiveSideBySide runs what `kvbench live -url A -compare-url B` runs,
// against the stack it is measured on (hack/demo -serve starts the same):
// Envoy with kvroute, and a second Envoy rendered from the same
// envoy/envoy.yaml without the ext_proc filter, in front of the same
// engines. Every request of both runs succeeds; kvroute decides exactly
// the first run's requests (the plain Envoy never calls it), and the
// multi-turn sessions find their history cached behind kvroute.
func TestLiveSideBySide(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	plain := &testbed.Envoy{Name: "envoy-plain", Config: testbed.EnvoyConfig{Engines: c.enginePorts()}}
	if err := plain.Start(t.Context(), c.g, bins.Envoy, envoyTmpl); err != nil {
		t.Fatal(err)
	}
	w := sharedPromptSessions(3, 60)
	before, err := decisions(c)
	if err != nil {
		t.Fatal(err)
	}
	opts := live.Options{URL: c.envoy.URL(), Model: "sim-model", Workload: w, Timeout: 30 * time.Second, Seed: 1}
	rep, err := live.Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	routed := live.Summarize(rep)
	mid, err := decisions(c)
	if err != nil {
		t.Fatal(err)
	}
	opts.URL, opts.Salt = plain.URL(), 1
	rep, err = live.Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	rr := live.Summarize(rep)
	after, err := decisions(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kvroute: %+v", routed)
	t.Logf("plain:   %+v", rr)
	for _, s := range []live.Summary{routed, rr} {
		if s.Requests != w.Requests() || s.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors; want %d, 0", s.URL, s.Requests, s.Errors, w.Requests())
		}
	}
	if got := int(mid - before); got != w.Requests() {
		t.Errorf("kvroute made %d decisions for the %d requests through its Envoy", got, w.Requests())
	}
	if after != mid {
		t.Errorf("kvroute made %v decisions while the plain Envoy was driven", after-mid)
	}
	if routed.HitRate <= 0 {
		t.Errorf("no cached prompt tokens behind kvroute: hit rate %v", routed.HitRate)
	}
}

// sharedPromptSessions is 6 sessions of turns turns, starting 20 ms
// apart: a shared 400-token system prompt, newTokens new tokens a turn, 8
// output tokens, 50 ms think time.
func sharedPromptSessions(turns, newTokens int) *bench.Workload {
	w := &bench.Workload{Name: "e2e"}
	for s := range 6 {
		sess := bench.Session{Key: "s" + string(rune('a'+s)), Start: time.Duration(s) * 20 * time.Millisecond}
		for turn := range turns {
			tu := bench.Turn{Append: []bench.Segment{{ID: uint64(1000*s + turn + 1), Len: newTokens}}, Output: 8}
			if turn == 0 {
				tu.Append = append([]bench.Segment{{ID: 7, Len: 400}}, tu.Append...)
			} else {
				tu.Gap = 50 * time.Millisecond
			}
			sess.Turns = append(sess.Turns, tu)
		}
		w.Sessions = append(w.Sessions, sess)
	}
	return w
}
