//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// TestStreamOutlivesDrain: kvroute gets SIGTERM while a long SSE answer it
// routed is streaming, and the answer outlives the drain deadline (1s
// here). The observer stream (the observability-mode filter, which Envoy
// never waits for) is ended with UNAVAILABLE at its next chunk; the
// router's stream, idle since the pick (Envoy closes it when the request
// is done), is cut with kvroute's connections, which Envoy, failing open,
// treats as the end of processing. kvroute exits 0 and the client's answer
// completes, every event up to [DONE].
func TestStreamOutlivesDrain(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2, kvArgs: []string{"--drain-timeout", "1s"}})
	l := &openLoad{c: c}
	res := make(chan outcome, 1)
	// About 3s of tokens at the engines' speed (the prompt is ~1100 tokens of the 4096 context): well past the 1s drain.
	go func() { res <- l.one(1, true, 2900) }()
	waitFor(t, 60*time.Second, "kvroute to route the stream", func() bool {
		n, err := decisions(c)
		return err == nil && n >= 1 || l.streaming.Load() == 0
	})
	if l.streaming.Load() == 0 {
		t.Fatalf("the stream ended before the test could stop kvroute: %v", <-res)
	}
	termAt := time.Now()
	if err := c.kv.Proc.Stop(testbed.StopGrace); err != nil {
		t.Fatal(err)
	}
	exited := time.Since(termAt)
	if err := c.kv.Proc.Err(); err != nil {
		t.Errorf("kvroute did not exit 0 after SIGTERM: %v", err)
	}
	select {
	case o := <-res:
		t.Fatalf("the stream ended before kvroute's drain deadline (%v), nothing tested: %v", exited, o)
	default:
	}
	if len(c.kv.Proc.Lines("ending the remaining ext_proc streams")) == 0 {
		t.Errorf("kvroute did not reach its drain deadline with the stream open")
	}
	var o outcome
	select {
	case o = <-res:
	case <-time.After(2 * time.Minute):
		t.Fatal("the stream did not end within 2 minutes of kvroute's exit")
	}
	if !o.ok() {
		t.Fatalf("the stream that outlived the drain: %v", o)
	}
	t.Logf("kvroute exited %v after SIGTERM with the stream open; the stream completed at %v (%s)",
		exited.Round(time.Millisecond), o.end.Sub(termAt).Round(time.Millisecond), strings.TrimSpace(o.upstream))
}
