//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestAbuseChangesNoRoutingDecision: a client of kvroute's ext_proc port
// that is not Envoy (the attacks of issue 15, against the real process)
// holds 300 streams open, half of them stopped after the request headers,
// and sends 40 fabricated responses reporting cached_tokens 0. None of it
// counts as load or lowers a replica's cache credit, and the next request
// through Envoy is routed to the cache holder as before, with its cached
// tokens served.
func TestAbuseChangesNoRoutingDecision(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2})
	ctx := t.Context()
	msgs := []message{{Role: "user", Content: prompt("abuse", 150)}}
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 2})
	first := c.chat(ctx, msgs, 2, nil)
	if first.err != nil || first.status != 200 {
		t.Fatalf("warm-up: %d %v %s", first.status, first.err, first.body)
	}
	holder := first.upstream
	c.waitPick(t, body, holder)

	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", c.extprocPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	hdrs := func(kv ...string) *corev3.HeaderMap {
		m := &corev3.HeaderMap{}
		for i := 0; i+1 < len(kv); i += 2 {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return m
	}
	// 300 streams held open: half silent, half stopped after the request
	// headers (no body, so no decision).
	for i := range 300 {
		s, err := client.Process(actx)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if i%2 == 1 {
			if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
				RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json")},
			}}); err != nil {
				t.Fatalf("stream %d headers: %v", i, err)
			}
		}
	}
	waitFor(t, 30*time.Second, "kvroute to hold the 300 streams", func() bool {
		return kvMetric(t, c, "kvroute_extproc_streams_active", nil) >= 300
	})
	// 40 fabricated responses on streams kvroute routed nothing for.
	usage := `{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1200,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`
	for i := range 40 {
		s, err := client.Process(actx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "200", "content-type", "application/json")}}},
			{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(usage), EndOfStream: true}}},
		} {
			if err := s.Send(m); err != nil {
				t.Fatalf("fabricated response %d: %v", i, err)
			}
		}
		_ = s.CloseSend()
		for {
			if _, err := s.Recv(); err != nil {
				break
			}
		}
	}

	// Nothing moved: no request in flight on any replica, every credit 1.
	if n := kvMetric(t, c, "kvroute_replica_inflight_requests", nil); n != 0 {
		t.Errorf("the abuse counts as %v requests in flight", n)
	}
	for addr, r := range c.replicas() {
		if r.Credit != 1 {
			t.Errorf("replica %s cache credit %v after fabricated feedback, want 1", addr, r.Credit)
		}
	}
	// The routing decision is the one before the attack, with the streams
	// still open.
	c.waitPick(t, body, holder)
	r := c.chat(ctx, msgs, 2, nil)
	if r.err != nil || r.status != 200 || r.upstream != holder || r.cached == 0 {
		t.Fatalf("request after the abuse: %d %v upstream %s (want the holder %s) cached %d", r.status, r.err, r.upstream, holder, r.cached)
	}
	if kvMetric(t, c, "kvroute_extproc_streams_active", nil) < 300 {
		t.Errorf("the abusive streams were not held open through the check")
	}
}

// kvMetric sums the samples of a kvroute metric whose labels include the
// given ones.
func kvMetric(t *testing.T, c *cluster, name string, labels map[string]string) float64 {
	t.Helper()
	code, b, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", c.metricsPort))
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
next:
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
