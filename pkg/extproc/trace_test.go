package extproc

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/route"
)

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	dec := decision()
	dec.Degraded = "tokenize_timeout"
	for i := range 20 { // more candidates than the event keeps
		dec.Candidates = append(dec.Candidates, route.Candidate{
			Replica: index.ReplicaID(fmt.Sprintf("x%02d", i)), Cost: math.NaN(), Matched: [index.NumTiers]int{0, 0, 0},
		})
	}
	h := newHarness(t, Config{Decider: &fakeDecider{dec: dec}, TracerProvider: tp})

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const parentSpan = "00f067aa0ba902b7"
	got := h.exchange(reqHeaders(true, ":path", "/v1/models", "traceparent", "00-"+traceID+"-"+parentSpan+"-01"))
	if len(got) != 1 {
		t.Fatalf("got %d responses", len(got))
	}
	var upstream string
	for _, hv := range got[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if hv.GetHeader().GetKey() == "traceparent" {
			upstream = string(hv.GetHeader().GetRawValue())
		}
	}

	eventually(t, "spans ended", func() bool { return len(rec.Ended()) == 2 })
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	req, decide := spans["kvroute.request"], spans["kvroute.decide"]
	if req == nil || decide == nil {
		t.Fatalf("spans %v, want kvroute.request and kvroute.decide", spans)
	}
	if req.SpanKind() != trace.SpanKindServer || req.Parent().TraceID().String() != traceID || req.Parent().SpanID().String() != parentSpan {
		t.Errorf("request span kind %v parent %v: want a server span child of the caller", req.SpanKind(), req.Parent())
	}
	if decide.Parent().SpanID() != req.SpanContext().SpanID() {
		t.Error("decision span is not a child of the request span")
	}
	want := fmt.Sprintf("00-%s-%s-01", traceID, req.SpanContext().SpanID())
	if upstream != want {
		t.Errorf("upstream traceparent %q, want %q", upstream, want)
	}

	a := attrs(decide.Attributes())
	for k, v := range map[attribute.Key]attribute.Value{
		"kvroute.policy":                attribute.StringValue("blended"),
		"kvroute.replica":               attribute.StringValue("r1"),
		"kvroute.prompt_blocks":         attribute.IntValue(5),
		"kvroute.matched_blocks.best":   attribute.IntValue(3),
		"kvroute.matched_blocks.chosen": attribute.IntValue(3),
		"kvroute.tokenize.source":       attribute.StringValue("remote"),
		"kvroute.tokenize.ms":           attribute.Float64Value(1),
		"kvroute.decide.ms":             attribute.Float64Value(2),
		"kvroute.fallback_reason":       attribute.StringValue("tokenize_timeout"),
		"kvroute.candidates":            attribute.IntValue(22),
	} {
		if a[k] != v {
			t.Errorf("decision attribute %s = %v, want %v", k, a[k].Emit(), v.Emit())
		}
	}
	if len(decide.Events()) != 1 || decide.Events()[0].Name != "candidate_costs" {
		t.Fatalf("events %v, want one candidate_costs", decide.Events())
	}
	ev := attrs(decide.Events()[0].Attributes)
	ids := ev["replica"].AsStringSlice()
	if len(ids) != maxCostEvents || ids[0] != "r1" || ids[1] != "r2" {
		t.Errorf("cost event replicas %v: want %d, eligible cheapest first", ids, maxCostEvents)
	}
	if ev["total"].AsInt64() != 22 {
		t.Errorf("cost event total %v", ev["total"].Emit())
	}
}

func TestNoTraceparentWithoutRecordingSpan(t *testing.T) {
	// The default no-op provider and no incoming context: nothing to inject.
	h := newHarness(t, Config{Decider: &fakeDecider{dec: decision()}})
	got := h.exchange(reqHeaders(true, ":path", "/v1/models"))
	for _, hv := range got[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if hv.GetHeader().GetKey() == "traceparent" {
			t.Errorf("traceparent injected without a trace: %s", hv.GetHeader().GetRawValue())
		}
	}
}

func TestHealth(t *testing.T) {
	h := newHarness(t, Config{Decider: &fakeDecider{}})
	hc := healthpb.NewHealthClient(h.conn)
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("Check(%q): %v", svc, err)
		}
		return r.GetStatus()
	}
	serving, not := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	steps := []struct {
		name string
		do   func()
		want map[string]healthpb.HealthCheckResponse_ServingStatus
	}{
		{"initially live, not ready", func() {}, map[string]healthpb.HealthCheckResponse_ServingStatus{
			HealthLiveness: serving, HealthReadiness: not, HealthExtProc: not}},
		{"ready", func() { h.health.SetReady(true) }, map[string]healthpb.HealthCheckResponse_ServingStatus{
			HealthLiveness: serving, HealthReadiness: serving, HealthExtProc: serving, "": serving}},
		{"not ready again", func() { h.health.SetReady(false) }, map[string]healthpb.HealthCheckResponse_ServingStatus{
			HealthLiveness: serving, HealthReadiness: not, HealthExtProc: not}},
		{"shutdown", func() { h.health.SetReady(true); h.health.Shutdown() }, map[string]healthpb.HealthCheckResponse_ServingStatus{
			HealthLiveness: not, HealthReadiness: not, HealthExtProc: not}},
	}
	for _, s := range steps {
		s.do()
		for svc, want := range s.want {
			if got := check(svc); got != want {
				t.Errorf("%s: %q = %v, want %v", s.name, svc, got, want)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "other"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}
}

func TestSubsetList(t *testing.T) {
	list, _ := structpb.NewList([]any{"a:1", " b:2 ", "", 3})
	for name, tc := range map[string]struct {
		v    *structpb.Value
		want []string
	}{
		"list":         {structpb.NewListValue(list), []string{"a:1", "b:2"}},
		"comma string": {structpb.NewStringValue("a:1, b:2,"), []string{"a:1", "b:2"}},
		"empty string": {structpb.NewStringValue(""), []string{}},
		"number":       {structpb.NewNumberValue(1), []string{}},
		"nil":          {nil, []string{}},
	} {
		t.Run(name, func(t *testing.T) {
			got := subsetList(tc.v)
			if got == nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("subsetList = %#v, want %#v", got, tc.want)
			}
		})
	}
}
