//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// rawStatus writes req on a fresh connection to Envoy's listener and
// returns the status code of the answer (0 and an error when the
// connection closes without one).
func rawStatus(t *testing.T, port int, req string) (int, error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(req)); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, nil
}

// TestEnvoyBadRequestsAnswered: requests Envoy refuses get an HTTP answer,
// not a closed connection: HTTP/1.0 gets 426, a 100 KiB header gets 431.
func TestEnvoyBadRequestsAnswered(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2})
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`

	// The same request over HTTP/1.1 is served: the refusals below are
	// about the protocol version and the header size alone.
	if code, err := rawStatus(t, c.listenPort, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: e2e\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)); err != nil || code != 200 {
		t.Fatalf("HTTP/1.1 request: %d %v", code, err)
	}
	if code, err := rawStatus(t, c.listenPort, fmt.Sprintf("POST /v1/chat/completions HTTP/1.0\r\nHost: e2e\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)); err != nil || code != http.StatusUpgradeRequired {
		t.Errorf("HTTP/1.0 request: status %d, err %v; want 426", code, err)
	}
	big := strings.Repeat("a", 100<<10)
	if code, err := rawStatus(t, c.listenPort, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: e2e\r\nX-Big: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", big, len(body), body)); err != nil || code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("100 KiB header: status %d, err %v; want 431", code, err)
	}
	// Envoy is still serving after both refusals.
	if r := c.chat(t.Context(), []message{{Role: "user", Content: "after"}}, 2, nil); r.err != nil || r.status != 200 {
		t.Errorf("request after the refusals: %d %v %s", r.status, r.err, r.body)
	}
}

// TestClientDestinationHeaderWhileKVRouteDown: with kvroute stopped, a
// request carrying its own x-gateway-destination-endpoint (a dead address
// or a real engine) is served by the round-robin fallback: the header is
// stripped before the route is chosen.
func TestClientDestinationHeaderWhileKVRouteDown(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2})
	ctx := t.Context()
	if err := c.kv.Proc.Stop(testbed.StopGrace); err != nil {
		t.Fatal(err)
	}
	engines := map[string]bool{}
	for _, e := range c.engines {
		engines[e.addr()] = true
	}
	seen := map[string]int{}
	for i, dest := range []string{"127.0.0.1:1", c.engines[0].addr(), "10.255.255.1:80", c.engines[1].addr(), "not-an-address", "127.0.0.1:1,127.0.0.1:2"} {
		hdr := map[string]string{"x-gateway-destination-endpoint": dest, "x-gateway-destination-endpoint-fallback": "127.0.0.1:3"}
		r := c.chat(ctx, []message{{Role: "user", Content: prompt(fmt.Sprintf("down%d", i), 20)}}, 2, hdr)
		if r.err != nil || r.status != 200 {
			t.Fatalf("request %d with client destination %q while kvroute is down: %d %v %s", i, dest, r.status, r.err, r.body)
		}
		if !engines[r.upstream] {
			t.Fatalf("request %d served by %q, not one of the engines %v", i, r.upstream, engines)
		}
		seen[r.upstream]++
	}
	if len(seen) < 2 {
		t.Errorf("fail-open traffic went to %v: want the round-robin fallback over both engines", seen)
	}
}

// TestRetryMovesToKVRouteFallback: when kvroute's pick refuses connections
// (the engine died and neither kvroute nor Envoy's health checks noticed
// yet), Envoy's retry goes to the next address of kvroute's list, not back
// to the dead one: no request is lost.
func TestRetryMovesToKVRouteFallback(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 3})
	ctx := t.Context()
	msgs := []message{{Role: "user", Content: prompt("retry", 150)}}
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 2})
	first := c.chat(ctx, msgs, 2, nil)
	if first.err != nil || first.status != 200 {
		t.Fatalf("warm-up: %d %v %s", first.status, first.err, first.body)
	}
	holder := first.upstream
	c.waitPick(t, body, holder)
	var dead *engine
	for _, e := range c.engines {
		if e.addr() == holder {
			dead = e
		}
	}
	if dead == nil {
		t.Fatalf("warm-up served by %q, not an engine", holder)
	}
	// SIGKILL: the port refuses connections at once.
	dead.Proc.Kill()
	<-dead.Proc.Done()
	served := map[string]int{}
	for i := range 20 {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		r := c.chat(rctx, msgs, 2, nil)
		cancel()
		if r.err != nil || r.status != 200 {
			t.Fatalf("request %d after the holder died: %d %v %s", i, r.status, r.err, r.body)
		}
		served[r.upstream]++
	}
	if served[holder] != 0 {
		t.Fatalf("served by the dead holder %s: %v", holder, served)
	}
	// Whether a retry was needed depends on how fast kvroute's probes drop
	// the dead engine; the count says which path served the first ones.
	t.Logf("after the holder %s died: %v; Envoy retries %d", holder, served, counter(t, c, "cluster.fallback_round_robin.upstream_rq_retry"))
}
