package extproc

import (
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Health service names of the Endpoint Picker protocol.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	HealthExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// Health is the gRPC health service with the protocol's three service
// names: liveness (serving while the process runs), readiness and the
// ext_proc service name (both follow SetReady; not serving until then).
// The empty service name follows readiness too.
type Health struct {
	srv   *health.Server
	ready atomic.Bool
}

// NewHealth returns a Health that is live and not ready.
func NewHealth() *Health {
	h := &Health{srv: health.NewServer()}
	h.srv.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	h.SetReady(false)
	return h
}

// Register adds the health service to g.
func (h *Health) Register(g *grpc.Server) { healthpb.RegisterHealthServer(g, h.srv) }

// SetReady sets readiness (and the ext_proc service status).
func (h *Health) SetReady(ready bool) {
	h.ready.Store(ready)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range []string{"", HealthReadiness, HealthExtProc} {
		h.srv.SetServingStatus(svc, st)
	}
}

// Ready reports the last SetReady (false after Shutdown).
func (h *Health) Ready() bool { return h.ready.Load() }

// Shutdown marks every service not serving, for good (watchers are told),
// so the proxy drains the router before it stops.
func (h *Health) Shutdown() {
	h.ready.Store(false)
	h.srv.Shutdown()
}
