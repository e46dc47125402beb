package discovery

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeResolver answers from maps the test changes while the source runs.
type fakeResolver struct {
	mu    sync.Mutex
	hosts map[string][]string
	srvs  map[string][]*net.SRV
	err   error // returned by every lookup when set
}

func (f *fakeResolver) set(fn func(f *fakeResolver)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func notFound(name string) error {
	return &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

func (f *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if ips, ok := f.hosts[host]; ok {
		return append([]string(nil), ips...), nil
	}
	if net.ParseIP(host) != nil {
		return []string{host}, nil
	}
	return nil, notFound(host)
}

func (f *fakeResolver) LookupSRV(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return "", nil, f.err
	}
	key := name
	if service != "" {
		key = "_" + service + "._" + proto + "." + name
	}
	srvs, ok := f.srvs[key]
	if !ok {
		return "", nil, notFound(key)
	}
	return key, srvs, nil
}

func addrs(rs []Replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Address
	}
	return out
}

func TestDNSSourceA(t *testing.T) {
	t.Parallel()
	const host = "vllm.ns.svc.cluster.local"
	res := &fakeResolver{hosts: map[string][]string{host: {"10.0.0.2", "10.0.0.1"}}}
	src, err := NewDNS(DNSConfig{
		Host: host, Port: 8000, Interval: 5 * time.Millisecond, Resolver: res,
		Defaults: Defaults{Model: "llama", EventsPort: 5557, ReplayPort: 5600, DPRanks: 2, Topic: "kv", MetricsPort: 9000},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	updates := make(chan Snapshot)
	done := runSource(ctx, src, updates)

	snap := recvSnapshot(t, updates)
	want := []Replica{
		{ID: "10.0.0.1:8000", Address: "10.0.0.1:8000", Model: "llama", Engine: EngineVLLM,
			EventsEndpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5600", Topic: "kv", DPRanks: 2,
			MetricsURL: "http://10.0.0.1:9000/metrics", HealthURL: "http://10.0.0.1:8000/health", Ready: true},
		{ID: "10.0.0.2:8000", Address: "10.0.0.2:8000", Model: "llama", Engine: EngineVLLM,
			EventsEndpoint: "tcp://10.0.0.2:5557", ReplayEndpoint: "tcp://10.0.0.2:5600", Topic: "kv", DPRanks: 2,
			MetricsURL: "http://10.0.0.2:9000/metrics", HealthURL: "http://10.0.0.2:8000/health", Ready: true},
	}
	if snap.Source != "dns" {
		t.Errorf("Source = %q, want dns", snap.Source)
	}
	if diff := cmp.Diff(want, snap.Replicas); diff != "" {
		t.Fatalf("first snapshot (-want +got):\n%s", diff)
	}

	// A pod goes away, another arrives.
	res.set(func(f *fakeResolver) { f.hosts[host] = []string{"10.0.0.1", "10.0.0.3"} })
	snap = recvSnapshot(t, updates)
	if got := addrs(snap.Replicas); !cmp.Equal(got, []string{"10.0.0.1:8000", "10.0.0.3:8000"}) {
		t.Fatalf("after change = %v", got)
	}

	// A transient failure keeps the set and counts.
	res.set(func(f *fakeResolver) { f.err = &net.DNSError{Err: "i/o timeout", Name: host, IsTimeout: true} })
	waitCounter(t, src.m.errors, 2)
	expectNoSnapshot(t, updates)
	res.set(func(f *fakeResolver) { f.err = nil })

	// No such host: every pod is gone.
	res.set(func(f *fakeResolver) { delete(f.hosts, host) })
	snap, _ = recvUntil(t, updates, "no replicas", func(s Snapshot) bool { return len(s.Replicas) == 0 })
	if snap.Replicas == nil {
		t.Error("empty snapshot has nil Replicas, want an empty slice")
	}
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Errorf("Run = %v", err)
	}
}

func TestDNSSourceSRV(t *testing.T) {
	t.Parallel()
	const svc = "vllm.ns.svc.cluster.local"
	res := &fakeResolver{
		hosts: map[string][]string{
			"vllm-0.vllm.ns.svc.cluster.local": {"10.0.0.1", "fd00::1"},
			"vllm-1.vllm.ns.svc.cluster.local": {"10.0.0.2"},
		},
		srvs: map[string][]*net.SRV{
			"_http._tcp." + svc: {
				{Target: "vllm-0.vllm.ns.svc.cluster.local.", Port: 8000},
				{Target: "vllm-1.vllm.ns.svc.cluster.local.", Port: 8001},
				{Target: "gone.vllm.ns.svc.cluster.local.", Port: 8000}, // NXDOMAIN target: skipped
			},
		},
	}
	tests := []struct {
		name   string
		family string
		want   []string
	}{
		{"both families", "", []string{"10.0.0.1:8000", "10.0.0.2:8001", "[fd00::1]:8000"}},
		{"ipv4", IPv4, []string{"10.0.0.1:8000", "10.0.0.2:8001"}},
		{"ipv6", IPv6, []string{"[fd00::1]:8000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src, err := NewDNS(DNSConfig{
				Host: svc, SRV: true, SRVService: "http", SRVProto: "tcp", IPFamily: tt.family,
				Interval: time.Hour, Resolver: res, Defaults: Defaults{Model: "m"},
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			updates := make(chan Snapshot)
			done := runSource(ctx, src, updates)
			snap := recvSnapshot(t, updates)
			if got := addrs(snap.Replicas); !cmp.Equal(got, tt.want) {
				t.Errorf("addresses = %v, want %v", got, tt.want)
			}
			cancel()
			if err := waitDone(t, done); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestDNSSourceFailsUntilFirstSuccess(t *testing.T) {
	t.Parallel()
	res := &fakeResolver{hosts: map[string][]string{}, err: errors.New("server misbehaving")}
	src, err := NewDNS(DNSConfig{Host: "h", Port: 1, Interval: 5 * time.Millisecond, Resolver: res, Defaults: Defaults{Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	updates := make(chan Snapshot)
	done := runSource(ctx, src, updates)
	waitCounter(t, src.m.errors, 3)
	expectNoSnapshot(t, updates)
	res.set(func(f *fakeResolver) { f.err = nil; f.hosts["h"] = []string{"10.1.1.1"} })
	snap := recvSnapshot(t, updates)
	if got := addrs(snap.Replicas); !cmp.Equal(got, []string{"10.1.1.1:1"}) {
		t.Errorf("addresses = %v", got)
	}
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Error(err)
	}
	if v := testutil.ToFloat64(src.m.snapshots); v != 1 {
		t.Errorf("snapshots_total = %v, want 1", v)
	}
}

func TestNewDNSConfig(t *testing.T) {
	t.Parallel()
	ok := DNSConfig{Host: "h", Port: 1, Defaults: Defaults{Model: "m"}}
	tests := []struct {
		name    string
		mutate  func(c *DNSConfig)
		wantErr string
	}{
		{"valid", func(*DNSConfig) {}, ""},
		{"valid srv", func(c *DNSConfig) { c.Port = 0; c.SRV = true }, ""},
		{"no host", func(c *DNSConfig) { c.Host = "" }, "dns.host"},
		{"no port", func(c *DNSConfig) { c.Port = 0 }, "dns.port"},
		{"half srv name", func(c *DNSConfig) { c.SRV = true; c.SRVService = "http" }, "dns.srv_service"},
		{"bad family", func(c *DNSConfig) { c.IPFamily = "v4" }, "dns.ip_family"},
		{"no model", func(c *DNSConfig) { c.Defaults.Model = "" }, "dns.defaults.model"},
		{"bad engine", func(c *DNSConfig) { c.Defaults.Engine = "x" }, "dns.defaults.engine"},
		{"replay without events", func(c *DNSConfig) { c.Defaults.ReplayPort = 5600 }, "dns.defaults.replay_port"},
		{"bad port", func(c *DNSConfig) { c.Defaults.EventsPort = 70000 }, "dns.defaults.events_port"},
		{"negative interval", func(c *DNSConfig) { c.Interval = -1 }, "dns.interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := ok
			tt.mutate(&c)
			_, err := NewDNS(c)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("NewDNS: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalid) {
				t.Errorf("NewDNS error = %v, want ErrInvalid containing %q", err, tt.wantErr)
			}
		})
	}
}
