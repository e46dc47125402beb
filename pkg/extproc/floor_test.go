package extproc

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The floor processor answers Envoy's router stream as kvroute answers a
// pick (the endpoints in turn), ends the observer stream at the first
// response chunk, and reports healthy to Envoy's gRPC health check.
func TestFloorProcessor(t *testing.T) {
	if _, err := NewFloorProcessor(nil); err == nil {
		t.Fatal("a floor processor without endpoints was made")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	served := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() { served <- ServeFloor(sctx, lis, []string{"127.0.0.1:9001", "127.0.0.1:9002"}) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("ServeFloor: %v", err)
		}
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: extprocv3.ExternalProcessor_ServiceDesc.ServiceName})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hr, err)
	}
	client := extprocv3.NewExternalProcessorClient(conn)

	var dests []string
	for range 3 {
		s, err := client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pc := &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED}
		if err := s.Send(&extprocv3.ProcessingRequest{ProtocolConfig: pc, Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(":path", "/v1/chat/completions")}}}); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Recv(); err != nil || r.GetRequestHeaders() == nil {
			t.Fatalf("headers answer %v, %v", r, err)
		}
		if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m"}`), EndOfStream: true}}}); err != nil {
			t.Fatal(err)
		}
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		hm := map[string]string{}
		for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
			hm[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
		}
		md := r.GetDynamicMetadata().GetFields()[MetadataNamespace].GetStructValue().GetFields()[MetadataDestinationKey].GetStringValue()
		if hm[DefaultDestinationHeader] == "" || md != hm[DefaultDestinationHeader] || hm[DecisionHeader] == "" {
			t.Fatalf("body answer does not name a destination the way kvroute does: %v", r)
		}
		dests = append(dests, md)
		_ = s.CloseSend()
	}
	if dests[0] == dests[1] || dests[0] != dests[2] {
		t.Fatalf("destinations %v: want the two endpoints in turn", dests)
	}

	obs, err := client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}},
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}},
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {}\n\n")}}},
	} {
		if err := obs.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	// No answer on the observer stream: the server ends it after the
	// first chunk (io.EOF), without waiting for the client's end.
	if r, err := obs.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("observer stream: answer %v, error %v; want its end", r, err)
	}
}
