package extproc

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/route"
)

// fakeDecider records requests and answers with a fixed decision, an
// error, or a panic.
type fakeDecider struct {
	mu    sync.Mutex
	reqs  []route.Request
	dec   route.Decision
	err   error
	panic bool
	block bool // wait for ctx to end
}

func (f *fakeDecider) Decide(ctx context.Context, req route.Request) (route.Decision, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	dec, err, p, block := f.dec, f.err, f.panic, f.block
	f.mu.Unlock()
	if p {
		panic("decider exploded")
	}
	if block {
		<-ctx.Done()
		return route.Decision{}, ctx.Err()
	}
	return dec, err
}

func (f *fakeDecider) requests() []route.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]route.Request(nil), f.reqs...)
}

// decision is a pick of replica r1 at 10.0.0.1:8000 with fallbacks; r1
// matched 3 of 5 prompt blocks (block size 16) and computes the other 2,
// r2 matched 1.
func decision() route.Decision {
	return route.Decision{
		Replica: "r1", Address: "10.0.0.1:8000", Fallbacks: []string{"10.0.0.2:8000", "10.0.0.3:8000"},
		Policy: "blended", Reason: "cost", PromptTokens: 80, PromptBlocks: 5, PrefillBlocks: 2, TokenSource: "remote",
		TokenizeTime: time.Millisecond, DecideTime: 2 * time.Millisecond,
		Candidates: []route.Candidate{
			{Replica: "r1", Address: "10.0.0.1:8000", Matched: [index.NumTiers]int{2, 1, 0}, Trust: 1, Cost: 2, Eligible: true},
			{Replica: "r2", Address: "10.0.0.2:8000", Matched: [index.NumTiers]int{1, 0, 0}, Trust: 1, Cost: 4, Eligible: true},
		},
	}
}

type harness struct {
	t      testing.TB
	client extprocv3.ExternalProcessorClient
	conn   *grpc.ClientConn
	reg    *prometheus.Registry
	server *Server
	health *Health
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if cfg.Registerer == nil {
		cfg.Registerer = reg
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer(srv.ServerOptions()...) // as cmd/kvroute builds it
	srv.Register(g)
	h := NewHealth()
	h.Register(g)
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &harness{t: t, client: extprocv3.NewExternalProcessorClient(conn), conn: conn, reg: reg, server: srv, health: h}
}

// exchange opens a stream, sends msgs, half-closes, and returns every
// response until the server ends the stream.
func (h *harness) exchange(msgs ...*extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := h.client.Process(ctx)
	if err != nil {
		h.t.Fatalf("Process: %v", err)
	}
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			h.t.Fatalf("Send: %v", err)
		}
	}
	if err := s.CloseSend(); err != nil {
		h.t.Fatal(err)
	}
	var out []*extprocv3.ProcessingResponse
	for {
		r, err := s.Recv()
		if err != nil {
			return out
		}
		out = append(out, r)
	}
}

// open starts a stream for step-by-step tests.
func (h *harness) open(ctx context.Context) extprocv3.ExternalProcessor_ProcessClient {
	h.t.Helper()
	s, err := h.client.Process(ctx)
	if err != nil {
		h.t.Fatalf("Process: %v", err)
	}
	return s
}

func send(t testing.TB, s extprocv3.ExternalProcessor_ProcessClient, msgs ...*extprocv3.ProcessingRequest) {
	t.Helper()
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
}

func recv(t testing.TB, s extprocv3.ExternalProcessor_ProcessClient) *extprocv3.ProcessingResponse {
	t.Helper()
	r, err := s.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return r
}

// Request builders, shaped like Envoy's messages (values in raw_value).

func headerMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

func reqHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(kv...), EndOfStream: eos},
	}}
}

func withMode(r *extprocv3.ProcessingRequest, req, resp filterv3.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
	r.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}
	return r
}

func withSubset(r *extprocv3.ProcessingRequest, endpoints ...string) *extprocv3.ProcessingRequest {
	vals := make([]any, len(endpoints))
	for i, e := range endpoints {
		vals[i] = e
	}
	list, _ := structpb.NewList(vals)
	r.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: structpb.NewListValue(list)}},
	}}
	return r
}

func reqBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos},
	}}
}

func respHeaders(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(kv...), EndOfStream: eos},
	}}
}

func respBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos},
	}}
}

// metricValue returns the value of the series name with the given labels.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return sampleValue(m), true
		}
	}
	return 0, false
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// eventually polls cond until it holds or a generous deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
