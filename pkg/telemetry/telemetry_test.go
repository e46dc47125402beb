package telemetry

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clearEnv unsets every variable NewTracing reads.
func clearEnv(t *testing.T) {
	for _, k := range []string{
		"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
	} {
		t.Setenv(k, "")
	}
}

func TestTracingNonExporting(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"nothing set":             {},
		"exporter none":           {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
		"sdk disabled":            {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"},
		"protocol without sink":   {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		"exporter none, any case": {"OTEL_TRACES_EXPORTER": " NONE "},
	} {
		t.Run(name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range env {
				t.Setenv(k, v)
			}
			tr, err := NewTracing(context.Background(), TracingConfig{})
			if err != nil {
				t.Fatal(err)
			}
			if tr.Exporter != "none" {
				t.Errorf("Exporter = %q, want none", tr.Exporter)
			}
			_, span := tr.Provider.Tracer("t").Start(context.Background(), "s")
			if span.IsRecording() {
				t.Error("non-exporting provider records spans")
			}
			span.End()
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			if got := tr.Propagator.Fields(); !strings.Contains(strings.Join(got, ","), "traceparent") {
				t.Errorf("propagator fields %v lack traceparent", got)
			}
		})
	}
}

func TestTracingConfigErrors(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"unsupported exporter": {"OTEL_TRACES_EXPORTER": "zipkin"},
		"unsupported protocol": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
	} {
		t.Run(name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range env {
				t.Setenv(k, v)
			}
			if _, err := NewTracing(context.Background(), TracingConfig{}); !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig", err)
			}
		})
	}
}

// collected gathers the span and service names an OTLP sink received.
type collected struct {
	mu       sync.Mutex
	spans    []string
	services []string
}

func (c *collected) add(req *coltracepb.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				c.services = append(c.services, a.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, s.GetName())
			}
		}
	}
}

func (c *collected) snapshot() ([]string, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.spans...), append([]string(nil), c.services...)
}

type grpcSink struct {
	coltracepb.UnimplementedTraceServiceServer
	c *collected
}

func (s *grpcSink) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.c.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func TestTracingExportsOTLP(t *testing.T) {
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			clearEnv(t)
			c := &collected{}
			var endpoint string
			switch protocol {
			case "grpc":
				lis, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				g := grpc.NewServer()
				coltracepb.RegisterTraceServiceServer(g, &grpcSink{c: c})
				done := make(chan struct{})
				go func() { defer close(done); _ = g.Serve(lis) }()
				t.Cleanup(func() { g.Stop(); <-done })
				endpoint = "http://" + lis.Addr().String()
			default:
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					var req coltracepb.ExportTraceServiceRequest
					if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
						http.Error(w, "bad export", http.StatusBadRequest)
						return
					}
					c.add(&req)
					w.Header().Set("Content-Type", "application/x-protobuf")
					out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
					_, _ = w.Write(out)
				}))
				t.Cleanup(srv.Close)
				endpoint = srv.URL
			}
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
			t.Setenv("OTEL_SERVICE_NAME", "kvroute-test")

			tr, err := NewTracing(context.Background(), TracingConfig{ServiceVersion: "v0"})
			if err != nil {
				t.Fatal(err)
			}
			wantExp := map[string]string{"grpc": "otlp/grpc", "http/protobuf": "otlp/http"}[protocol]
			if tr.Exporter != wantExp {
				t.Errorf("Exporter = %q, want %q", tr.Exporter, wantExp)
			}
			_, span := tr.Provider.Tracer("t").Start(context.Background(), "unit-span")
			if !span.IsRecording() {
				t.Fatal("exporting provider does not record")
			}
			span.End()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := tr.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			if err := tr.Shutdown(ctx); err != nil {
				t.Fatalf("second Shutdown: %v", err)
			}
			spans, services := c.snapshot()
			if len(spans) != 1 || spans[0] != "unit-span" {
				t.Errorf("exported spans %v, want [unit-span]", spans)
			}
			if len(services) != 1 || services[0] != "kvroute-test" {
				t.Errorf("service names %v, want OTEL_SERVICE_NAME", services)
			}
		})
	}
}

func TestMetricsHandler(t *testing.T) {
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	srv := httptest.NewServer(MetricsHandler(reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"kvroute_test_total 3", "go_goroutines", "process_"} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if NewRegistry() == reg {
		t.Error("registries are shared")
	}
}

func TestNewLogger(t *testing.T) {
	tests := []struct {
		level, format string
		wantErr       bool
		check         func(out string) bool
	}{
		{"", "", false, func(o string) bool { return strings.Contains(o, "level=INFO") && !strings.Contains(o, "DEBUG") }},
		{"debug", "json", false, func(o string) bool { return strings.Contains(o, `"level":"DEBUG"`) }},
		{"warn", "text", false, func(o string) bool { return !strings.Contains(o, "INFO") && strings.Contains(o, "WARN") }},
		{"loud", "", true, nil},
		{"info", "xml", true, nil},
	}
	for _, tc := range tests {
		t.Run(tc.level+"/"+tc.format, func(t *testing.T) {
			var buf bytes.Buffer
			l, err := NewLogger(&buf, tc.level, tc.format)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil {
				if !errors.Is(err, ErrConfig) {
					t.Errorf("error %v does not wrap ErrConfig", err)
				}
				return
			}
			l.Debug("d")
			l.Info("i")
			l.Warn("w")
			if !tc.check(buf.String()) {
				t.Errorf("unexpected output %q", buf.String())
			}
		})
	}
}
