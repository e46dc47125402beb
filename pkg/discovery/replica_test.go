package discovery

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog (client-go's logger) starts its flush daemon in init.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}

func replica(id, addr, model string) Replica {
	return Replica{ID: id, Address: addr, Model: model}
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      []Replica
		want    []Replica
		wantErr []string // substrings, all must appear
	}{
		{
			name: "defaults and sort",
			in: []Replica{
				{Address: "10.0.0.2:8000", Model: "m", Ready: true},
				{ID: "a", Address: "[fd00::1]:8000", Model: "m", Engine: EngineSGLang, BlockSize: 16,
					EventsEndpoint: "tcp://fd00::1:5557", DPRanks: 2},
			},
			wantErr: []string{"replicas[1].events_endpoint"},
		},
		{
			name: "defaults and sort ipv6 bracketed",
			in: []Replica{
				{Address: "10.0.0.2:8000", Model: "m", Ready: true},
				{ID: "a", Address: "[fd00::1]:8000", Model: "m", Engine: EngineSGLang, BlockSize: 16,
					EventsEndpoint: "tcp://[fd00::1]:5557", ReplayEndpoint: "tcp://[fd00::1]:5600", DPRanks: 2},
			},
			want: []Replica{
				{ID: "10.0.0.2:8000", Address: "10.0.0.2:8000", Model: "m", Engine: EngineVLLM, DPRanks: 1,
					MetricsURL: "http://10.0.0.2:8000/metrics", HealthURL: "http://10.0.0.2:8000/health", Ready: true},
				{ID: "a", Address: "[fd00::1]:8000", Model: "m", Engine: EngineSGLang, BlockSize: 16,
					EventsEndpoint: "tcp://[fd00::1]:5557", ReplayEndpoint: "tcp://[fd00::1]:5600", DPRanks: 2,
					MetricsURL: "http://[fd00::1]:8000/metrics", HealthURL: "http://[fd00::1]:8000/health"},
			},
		},
		{name: "empty", in: nil, want: []Replica{}},
		{name: "hostname address", in: []Replica{replica("", "vllm-0:8000", "m")},
			wantErr: []string{"replicas[0].address", "must be an IP address"}},
		{name: "no port", in: []Replica{replica("", "10.0.0.1", "m")}, wantErr: []string{"replicas[0].address", "not ip:port"}},
		{name: "port zero", in: []Replica{replica("", "10.0.0.1:0", "m")}, wantErr: []string{"replicas[0].address", "invalid port"}},
		{name: "missing address and model", in: []Replica{{}},
			wantErr: []string{"replicas[0].address: is required", "replicas[0].model: is required", "replicas[0].id: must not be empty"}},
		{name: "bad engine", in: []Replica{{Address: "10.0.0.1:1", Model: "m", Engine: "trt"}}, wantErr: []string{"replicas[0].engine"}},
		{name: "negative block size", in: []Replica{{Address: "10.0.0.1:1", Model: "m", BlockSize: -1}}, wantErr: []string{"replicas[0].block_size"}},
		{name: "too many ranks", in: []Replica{{Address: "10.0.0.1:1", Model: "m", DPRanks: MaxDPRanks + 1}}, wantErr: []string{"replicas[0].dp_ranks"}},
		{name: "events wildcard host", in: []Replica{{Address: "10.0.0.1:1", Model: "m", EventsEndpoint: "tcp://*:5557"}},
			wantErr: []string{"replicas[0].events_endpoint", "connectable host"}},
		{name: "events bad scheme", in: []Replica{{Address: "10.0.0.1:1", Model: "m", EventsEndpoint: "udp://1.2.3.4:5"}},
			wantErr: []string{"replicas[0].events_endpoint", "tcp:// or ipc://"}},
		{name: "ipc with ranks", in: []Replica{{Address: "10.0.0.1:1", Model: "m", EventsEndpoint: "ipc:///tmp/ev", DPRanks: 2}},
			wantErr: []string{"replicas[0].events_endpoint", "data-parallel"}},
		{name: "rank ports overflow", in: []Replica{{Address: "10.0.0.1:1", Model: "m", EventsEndpoint: "tcp://1.2.3.4:65535", DPRanks: 2}},
			wantErr: []string{"replicas[0].events_endpoint", "exceeds 65535"}},
		{name: "replay without events", in: []Replica{{Address: "10.0.0.1:1", Model: "m", ReplayEndpoint: "tcp://1.2.3.4:5558"}},
			wantErr: []string{"replicas[0].replay_endpoint: is set but events_endpoint is not"}},
		{name: "replay overlaps rank ports", in: []Replica{{Address: "10.0.0.1:1", Model: "m",
			EventsEndpoint: "tcp://1.2.3.4:5557", ReplayEndpoint: "tcp://1.2.3.4:5558", DPRanks: 2}},
			wantErr: []string{"replicas[0].replay_endpoint", "overlaps"}},
		{name: "bad metrics url", in: []Replica{{Address: "10.0.0.1:1", Model: "m", MetricsURL: "ftp://x/metrics"}},
			wantErr: []string{"replicas[0].metrics_url"}},
		{name: "bad health url", in: []Replica{{Address: "10.0.0.1:1", Model: "m", HealthURL: "http:///health"}},
			wantErr: []string{"replicas[0].health_url", "no host"}},
		{name: "duplicate id", in: []Replica{replica("x", "10.0.0.1:1", "m"), replica("x", "10.0.0.2:1", "m")},
			wantErr: []string{`replicas[1].id: duplicate "x" (also replicas[0])`}},
		{name: "duplicate address", in: []Replica{replica("x", "10.0.0.1:1", "m"), replica("y", "10.0.0.1:1", "m")},
			wantErr: []string{`replicas[1].address: duplicate "10.0.0.1:1" (also replicas[0])`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := append([]Replica(nil), tt.in...)
			got, err := Normalize("replicas", tt.in)
			if diff := cmp.Diff(in, tt.in); diff != "" {
				t.Errorf("input modified (-before +after):\n%s", diff)
			}
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Normalize = %v, want error containing %q", got, tt.wantErr)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("error %v does not match ErrInvalid", err)
				}
				var fe *FieldError
				if !errors.As(err, &fe) {
					t.Errorf("error %v has no *FieldError", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Normalize (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOffsetEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		endpoint string
		rank     int
		want     string
		wantErr  bool
	}{
		{"rank 0 unchanged", "tcp://10.0.0.1:5557", 0, "tcp://10.0.0.1:5557", false},
		{"rank 0 ipc unchanged", "ipc:///tmp/ev", 0, "ipc:///tmp/ev", false},
		{"tcp offset", "tcp://10.0.0.1:5557", 3, "tcp://10.0.0.1:5560", false},
		{"ipv6 offset", "tcp://[fd00::1]:5557", 1, "tcp://[fd00::1]:5558", false},
		{"empty stays empty", "", 4, "", false},
		{"ipc rank 1", "ipc:///tmp/ev", 1, "", true},
		{"negative rank", "tcp://10.0.0.1:5557", -1, "", true},
		{"overflow", "tcp://10.0.0.1:65535", 1, "", true},
		{"no port", "tcp://10.0.0.1", 1, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := OffsetEndpoint(tt.endpoint, tt.rank)
			if (err != nil) != tt.wantErr {
				t.Fatalf("OffsetEndpoint(%q, %d) error = %v, wantErr %v", tt.endpoint, tt.rank, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("OffsetEndpoint(%q, %d) = %q, want %q", tt.endpoint, tt.rank, got, tt.want)
			}
		})
	}
}

func TestDiff(t *testing.T) {
	t.Parallel()
	a := replica("a", "10.0.0.1:1", "m")
	b := replica("b", "10.0.0.2:1", "m")
	c := replica("c", "10.0.0.3:1", "m")
	bReady := b
	bReady.Ready = true
	tests := []struct {
		name       string
		prev, next []Replica
		want       Changes
	}{
		{"both empty", nil, nil, Changes{}},
		{"all added", nil, []Replica{a, b}, Changes{Added: []Replica{a, b}}},
		{"all removed", []Replica{a, b}, nil, Changes{Removed: []Replica{a, b}}},
		{"same", []Replica{a, b, c}, []Replica{a, b, c}, Changes{}},
		{"mixed", []Replica{a, b}, []Replica{bReady, c}, Changes{Added: []Replica{c}, Removed: []Replica{a}, Changed: []Replica{bReady}}},
		{"interleaved", []Replica{a, c}, []Replica{b}, Changes{Added: []Replica{b}, Removed: []Replica{a, c}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Diff(tt.prev, tt.next)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Diff (-want +got):\n%s", diff)
			}
			if got.Empty() != (len(tt.want.Added)+len(tt.want.Removed)+len(tt.want.Changed) == 0) {
				t.Errorf("Empty() = %v for %+v", got.Empty(), got)
			}
		})
	}
}

func TestStatic(t *testing.T) {
	t.Parallel()
	t.Run("publishes once and returns on cancel", func(t *testing.T) {
		t.Parallel()
		in := []Replica{replica("b", "10.0.0.2:8000", "m"), replica("a", "10.0.0.1:8000", "m")}
		src := Static(in)
		in[0].Model = "mutated" // Static keeps its own copy
		ctx, cancel := context.WithCancel(t.Context())
		updates := make(chan Snapshot)
		done := runSource(ctx, src, updates)
		snap := recvSnapshot(t, updates)
		if snap.Source != "static" {
			t.Errorf("Source = %q, want static", snap.Source)
		}
		if got := ids(snap.Replicas); !cmp.Equal(got, []string{"a", "b"}) {
			t.Errorf("IDs = %v, want [a b]", got)
		}
		if snap.Replicas[1].Model != "m" {
			t.Errorf("model = %q: Static must copy its input", snap.Replicas[1].Model)
		}
		cancel()
		if err := waitDone(t, done); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
	t.Run("invalid set is an error", func(t *testing.T) {
		t.Parallel()
		src := Static([]Replica{replica("a", "host:1", "m")})
		err := src.Run(t.Context(), make(chan Snapshot, 1))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Run = %v, want ErrInvalid", err)
		}
	})
	t.Run("cancel before receive", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := Static([]Replica{replica("a", "10.0.0.1:1", "m")}).Run(ctx, make(chan Snapshot)); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
}

// Test helpers shared by the source tests.

const waitLimit = 30 * time.Second // generous: CI machines are loaded

func runSource(ctx context.Context, s Source, updates chan<- Snapshot) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, updates) }()
	return done
}

func waitDone(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(waitLimit):
		t.Fatal("Run did not return after cancel")
		return nil
	}
}

func recvSnapshot(t *testing.T, ch <-chan Snapshot) Snapshot {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(waitLimit):
		t.Fatal("no snapshot")
		return Snapshot{}
	}
}

// recvUntil receives snapshots until ok accepts one and returns it with the
// number of snapshots received.
func recvUntil(t *testing.T, ch <-chan Snapshot, what string, ok func(Snapshot) bool) (Snapshot, int) {
	t.Helper()
	deadline := time.After(waitLimit)
	var last Snapshot
	for n := 1; ; n++ {
		select {
		case s := <-ch:
			if ok(s) {
				return s, n
			}
			last = s
		case <-deadline:
			t.Fatalf("no snapshot with %s; last: %+v", what, last)
			return Snapshot{}, n
		}
	}
}

func expectNoSnapshot(t *testing.T, ch <-chan Snapshot) {
	t.Helper()
	select {
	case s := <-ch:
		t.Fatalf("unexpected snapshot %+v", s)
	default:
	}
}

func ids(rs []Replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func byID(rs []Replica, id string) (Replica, bool) {
	for _, r := range rs {
		if r.ID == id {
			return r, true
		}
	}
	return Replica{}, false
}

// TestReplicaEqual changes each field of a replica in turn: Equal must see
// every one (a field added to Replica but not to Equal fails here).
func TestReplicaEqual(t *testing.T) {
	base := Replica{ID: "a", Address: "10.0.0.1:1", Model: "m", LoRAAdapters: []string{"x"}}
	if !base.Equal(base) {
		t.Fatal("a replica is not Equal to itself")
	}
	v := reflect.ValueOf(&base).Elem()
	for i := range v.NumField() {
		other := base
		other.LoRAAdapters = slices.Clone(base.LoRAAdapters)
		f := reflect.ValueOf(&other).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "!")
		case reflect.Int:
			f.SetInt(f.Int() + 1)
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{"y"}))
		default:
			t.Fatalf("field %s: kind %s not covered by this test", v.Type().Field(i).Name, f.Kind())
		}
		if base.Equal(other) {
			t.Errorf("Equal ignores field %s", v.Type().Field(i).Name)
		}
	}
}
