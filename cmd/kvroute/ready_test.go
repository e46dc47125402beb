package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/pkg/extproc"
)

// TestReadinessWaitsForWarmIndex: with a healthy replica whose event stream
// never connects (so the index cannot warm up), kvroute stays not ready,
// on /readyz and on the gRPC readiness service, until
// readiness.warm_timeout passes; then it turns ready and says the events
// were not warm. (Turning ready warm, before the timeout, is covered end to
// end in e2e TestActiveActiveRouters.)
func TestReadinessWaitsForWarmIndex(t *testing.T) {
	tests := []struct {
		name        string
		warmTimeout time.Duration
		wantReady   bool
	}{
		{"cold stream holds readiness back", time.Minute, false},
		{"warm timeout releases it", 300 * time.Millisecond, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := fakeEngine(t, 0)
			nowhere := "ipc://" + filepath.Join(t.TempDir(), "nobody-binds-this")
			cfg, err := ParseConfig(fmt.Appendf(nil, `
listeners: {drain_timeout: 2s}
replicas:
  static:
  - {id: a, address: %q, model: m, events_endpoint: %q}
tokenizer: {default: {kind: remote, timeout: 2s}}
load: {scrape_interval: 20ms}
events: {replay_timeout: 1m}
readiness: {warm_timeout: %s}
`, strings.TrimPrefix(e.URL, "http://"), nowhere, tc.warmTimeout))
			if err != nil {
				t.Fatal(err)
			}
			r, lis, logs := startServe(t, cfg)
			conn, err := grpc.NewClient("passthrough:///"+lis.extproc.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			grpcReady := func() bool {
				rctx, rcancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer rcancel()
				resp, err := hc.Check(rctx, &healthpb.HealthCheckRequest{Service: extproc.HealthReadiness})
				return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
			}
			httpReady := func() bool {
				resp, err := http.Get("http://" + lis.metrics.Addr().String() + "/readyz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			}

			// The replica is probed healthy and its stream subscribed, so
			// only the cold stream can hold readiness back.
			waitUntil(t, "replica probed healthy", func() bool { return r.set.Load("a").Healthy })
			waitUntil(t, "event stream subscribed", func() bool { return r.events.Status("a").Known })
			if tc.wantReady {
				waitUntil(t, "ready after the warm timeout", func() bool { return httpReady() && grpcReady() })
				if !strings.Contains(logs.String(), "events_warm=false") {
					t.Errorf("ready log does not say the events were cold:\n%s", logs.String())
				}
				return
			}
			deadline := time.Now().Add(1500 * time.Millisecond)
			for time.Now().Before(deadline) {
				if httpReady() || grpcReady() {
					t.Fatal("ready while the only event stream is cold and the warm timeout is a minute away")
				}
				time.Sleep(50 * time.Millisecond)
			}
			if r.events.Warm() {
				t.Fatal("the events manager reports warm for a stream that never connected: the test proves nothing")
			}
			// /readyz says why: the replica is probed, its stream is not warm.
			resp, err := http.Get("http://" + lis.metrics.Addr().String() + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{"not ready\n", "replicas: 1 (1 probed)\n", "event streams: 1 (0 caught up, warm: false)\n", "degraded: a "} {
				if !strings.Contains(string(body), want) {
					t.Errorf("/readyz lacks %q:\n%s", want, body)
				}
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's and the test's
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
