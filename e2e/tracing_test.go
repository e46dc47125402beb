//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// otlpReceiver is an in-test OTLP/gRPC trace collector.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	service string
	name    string
	attrs   map[string]*commonpb.AnyValue
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{service: service, name: sp.GetName(), attrs: attrMap(sp)})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func attrMap(sp *tracepb.Span) map[string]*commonpb.AnyValue {
	m := map[string]*commonpb.AnyValue{}
	for _, kv := range sp.GetAttributes() {
		m[kv.GetKey()] = kv.GetValue()
	}
	return m
}

func startOTLP(t *testing.T) (*otlpReceiver, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rcv := &otlpReceiver{}
	g := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(g, rcv)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return rcv, ln.Addr().String()
}

// TestDecisionSpansExported: kvroute, configured only through the standard
// OTEL_* variables, exports its decision spans with the decision's
// attributes to an OTLP collector.
func TestDecisionSpansExported(t *testing.T) {
	rcv, addr := startOTLP(t)
	c := newCluster(t, clusterOpts{kvEnv: []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addr,
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_SERVICE_NAME=kvroute-e2e",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}})
	ctx := t.Context()
	msgs := []message{{Role: "user", Content: prompt("traced", 120)}}
	var last result
	body := fmt.Appendf(nil, `{"model":"sim-model","messages":[{"role":"user","content":%q}]}`, msgs[0].Content)
	for i := range 2 { // the second one hits the first one's blocks
		if i == 1 {
			c.waitPick(t, body, last.upstream)
		}
		last = c.chat(ctx, msgs, 4, nil)
		if last.err != nil || last.status != 200 {
			t.Fatalf("request %d: %d %v %s", i, last.status, last.err, last.body)
		}
		if i == 0 {
			waitFor(t, 20*time.Second, "the first request's blocks indexed", func() bool {
				m, err := c.matched(body)
				return err == nil && m[last.upstream] > 0
			})
		}
	}
	var sp receivedSpan
	waitFor(t, 30*time.Second, "a kvroute.decide span for the request", func() bool {
		var ok bool
		sp, ok = findMatched(rcv, last.upstream)
		return ok
	})
	if sp.service != "kvroute-e2e" {
		t.Errorf("service.name = %q, want kvroute-e2e (OTEL_SERVICE_NAME)", sp.service)
	}
	checks := map[string]func(*commonpb.AnyValue) bool{
		"kvroute.policy":                func(v *commonpb.AnyValue) bool { return v.GetStringValue() == "kvroute" },
		"kvroute.endpoint":              func(v *commonpb.AnyValue) bool { return v.GetStringValue() == last.upstream },
		"kvroute.prompt_tokens":         func(v *commonpb.AnyValue) bool { return v.GetIntValue() == int64(last.prompt) },
		"kvroute.prompt_blocks":         func(v *commonpb.AnyValue) bool { return v.GetIntValue() > 0 },
		"kvroute.matched_blocks.chosen": func(v *commonpb.AnyValue) bool { return v.GetIntValue() > 0 },
		"kvroute.tokenize.source":       func(v *commonpb.AnyValue) bool { return v.GetStringValue() == "remote" },
		"kvroute.candidates":            func(v *commonpb.AnyValue) bool { return v.GetIntValue() == 4 },
	}
	for k, ok := range checks {
		if v, present := sp.attrs[k]; !present || !ok(v) {
			t.Errorf("span attribute %s = %v", k, v)
		}
	}

	// The request span is ended by the observer stream (Envoy's
	// observability-mode filter) with what it saw of the response: the
	// status Envoy forwarded to it, the usage, the served cached tokens.
	var req receivedSpan
	waitFor(t, 30*time.Second, "the kvroute.request span with the response's usage", func() bool {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		for _, s := range rcv.spans {
			if s.name == "kvroute.request" && s.attrs["kvroute.endpoint"].GetStringValue() == last.upstream &&
				s.attrs["kvroute.usage.prompt_tokens"].GetIntValue() == int64(last.prompt) &&
				s.attrs["kvroute.cached_tokens.served"].GetIntValue() == int64(last.cached) && last.cached > 0 {
				req = s
				return true
			}
		}
		return false
	})
	if v := req.attrs["http.response.status_code"].GetIntValue(); v != 200 {
		t.Errorf("request span http.response.status_code = %d, want 200 (the observer is sent :status)", v)
	}
}

// findMatched returns a decide span for replica whose match is non-zero.
func findMatched(r *otlpReceiver, replica string) (receivedSpan, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if s.name == "kvroute.decide" && s.attrs["kvroute.endpoint"].GetStringValue() == replica &&
			s.attrs["kvroute.matched_blocks.chosen"].GetIntValue() > 0 {
			return s, true
		}
	}
	return receivedSpan{}, false
}
