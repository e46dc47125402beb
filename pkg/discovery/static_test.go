package discovery

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const goodYAML = `
replicas:
  - address: 10.0.0.2:8000
    model: llama
    events_endpoint: tcp://10.0.0.2:5557
    replay_endpoint: tcp://10.0.0.2:5560
    dp_ranks: 2
    topic: kv
  - id: sg-0
    address: "[fd00::1]:30000"
    model: qwen
    engine: sglang
    block_size: 1
    metrics_url: http://[fd00::1]:9100/metrics
    health_url: https://[fd00::1]:30000/healthz
    ready: false
`

func TestParseReplicas(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		doc     string
		want    []Replica
		wantErr []string
	}{
		{
			name: "full",
			doc:  goodYAML,
			want: []Replica{
				{ID: "10.0.0.2:8000", Address: "10.0.0.2:8000", Model: "llama", Engine: EngineVLLM,
					EventsEndpoint: "tcp://10.0.0.2:5557", ReplayEndpoint: "tcp://10.0.0.2:5560", Topic: "kv", DPRanks: 2,
					MetricsURL: "http://10.0.0.2:8000/metrics", HealthURL: "http://10.0.0.2:8000/health", Ready: true},
				{ID: "sg-0", Address: "[fd00::1]:30000", Model: "qwen", Engine: EngineSGLang, BlockSize: 1, DPRanks: 1,
					MetricsURL: "http://[fd00::1]:9100/metrics", HealthURL: "https://[fd00::1]:30000/healthz", Ready: false},
			},
		},
		{name: "empty document", doc: "", want: []Replica{}},
		{name: "empty list", doc: "replicas: []\n", want: []Replica{}},
		{name: "unknown key", doc: "replicas:\n  - address: 10.0.0.1:1\n    model: m\n    modle: x\n",
			wantErr: []string{"field modle not found"}},
		{name: "unknown top-level key", doc: "replica:\n  - address: 10.0.0.1:1\n", wantErr: []string{"field replica not found"}},
		{name: "wrong type", doc: "replicas:\n  - address: 10.0.0.1:1\n    model: m\n    dp_ranks: two\n", wantErr: []string{"line 4", "two"}},
		{name: "lora adapters", doc: "replicas:\n  - {address: 10.0.0.1:1, model: m, lora_adapters: [sql-lora, chat-lora, sql-lora]}\n",
			want: []Replica{{ID: "10.0.0.1:1", Address: "10.0.0.1:1", Model: "m", Engine: EngineVLLM, DPRanks: 1,
				MetricsURL: "http://10.0.0.1:1/metrics", HealthURL: "http://10.0.0.1:1/health", Ready: true,
				LoRAAdapters: []string{"chat-lora", "sql-lora"}}}},
		{name: "group kinds", doc: "replicas:\n  - {address: 10.0.0.1:1, model: m, group_kinds: [full_attention, sliding_window]}\n",
			want: []Replica{{ID: "10.0.0.1:1", Address: "10.0.0.1:1", Model: "m", Engine: EngineVLLM, DPRanks: 1,
				MetricsURL: "http://10.0.0.1:1/metrics", HealthURL: "http://10.0.0.1:1/health", Ready: true,
				GroupKinds: []string{"full_attention", "sliding_window"}}}},
		{name: "bad group kinds", doc: "replicas:\n  - {address: 10.0.0.1:1, model: m, group_kinds: [full_attention, '', 'a,b']}\n",
			wantErr: []string{"replicas[0].group_kinds[1]: \"\" is not", "replicas[0].group_kinds[2]"}},
		{name: "bad lora adapters", doc: "replicas:\n  - {address: 10.0.0.1:1, model: m, lora_adapters: ['', m, 'a,b']}\n",
			wantErr: []string{"replicas[0].lora_adapters[0]: \"\" is not", "replicas[0].lora_adapters[1]: \"m\" is the base model", "lora_adapters[2]"}},
		{name: "two documents", doc: "replicas: []\n---\nreplicas: []\n", wantErr: []string{"single YAML document"}},
		{name: "not yaml", doc: "replicas: [\n", wantErr: []string{"yaml"}},
		{name: "field path", doc: "replicas:\n  - {address: 10.0.0.1:1, model: m}\n  - {address: 10.0.0.2:1, model: m}\n  - {address: 'vllm-2:8000', model: m}\n",
			wantErr: []string{"replicas[2].address"}},
		{name: "several errors reported", doc: "replicas:\n  - {address: 10.0.0.1:1}\n  - {address: 10.0.0.1:1, model: m, engine: x}\n",
			wantErr: []string{"replicas[0].model: is required", "replicas[1].engine", "replicas[1].address: duplicate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseReplicas([]byte(tt.doc))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("ParseReplicas = %v, want error", got)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("error %v does not match ErrInvalid", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseReplicas: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseReplicas (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildReplicasPath(t *testing.T) {
	t.Parallel()
	f := false
	rs, err := BuildReplicas("router.replicas", []ReplicaSpec{{Address: "10.0.0.1:1", Model: "m", Ready: &f}})
	if err != nil || len(rs) != 1 || rs[0].Ready {
		t.Fatalf("BuildReplicas = %+v, %v; want one not-ready replica", rs, err)
	}
	_, err = BuildReplicas("router.replicas", []ReplicaSpec{{Address: "10.0.0.1:1"}})
	if err == nil || !strings.Contains(err.Error(), "router.replicas[0].model") {
		t.Errorf("BuildReplicas error = %v, want the router.replicas[0].model path", err)
	}
}

// writeAtomic replaces path's content in one rename, as a config management
// tool would, so the poller never reads a half-written file.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func oneReplicaYAML(addr, model string) string {
	return "replicas:\n  - address: " + addr + "\n    model: " + model + "\n"
}

// waitCounter polls a counter until it reaches want.
func waitCounter(t *testing.T, c prometheus.Collector, want float64) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for testutil.ToFloat64(c) < want {
		if time.Now().After(deadline) {
			t.Fatalf("counter = %v, want >= %v", testutil.ToFloat64(c), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFileSource(t *testing.T) {
	t.Parallel()
	t.Run("reload, bad reload keeps last, recovery", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "replicas.yaml")
		writeAtomic(t, path, oneReplicaYAML("10.0.0.1:8000", "a"))
		reg := prometheus.NewPedanticRegistry()
		src, err := NewFile(FileConfig{Name: "f", Path: path, Interval: 5 * time.Millisecond, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		updates := make(chan Snapshot)
		done := runSource(ctx, src, updates)

		snap := recvSnapshot(t, updates)
		if snap.Source != "f" || len(snap.Replicas) != 1 || snap.Replicas[0].Model != "a" {
			t.Fatalf("first snapshot = %+v", snap)
		}

		writeAtomic(t, path, oneReplicaYAML("10.0.0.1:8000", "b"))
		snap = recvSnapshot(t, updates)
		if len(snap.Replicas) != 1 || snap.Replicas[0].Model != "b" {
			t.Fatalf("after reload = %+v, want model b", snap)
		}

		writeAtomic(t, path, oneReplicaYAML("not-an-ip:8000", "c"))
		waitCounter(t, src.m.errors, 1)
		expectNoSnapshot(t, updates)

		// Same bad content again: not counted twice.
		time.Sleep(50 * time.Millisecond)
		if got := testutil.ToFloat64(src.m.errors); got != 1 {
			t.Errorf("errors = %v after polling the same bad content, want 1", got)
		}

		writeAtomic(t, path, oneReplicaYAML("10.0.0.9:8000", "c"))
		snap = recvSnapshot(t, updates)
		if len(snap.Replicas) != 1 || snap.Replicas[0].Address != "10.0.0.9:8000" {
			t.Fatalf("after recovery = %+v", snap)
		}
		cancel()
		if err := waitDone(t, done); err != nil {
			t.Errorf("Run = %v", err)
		}
		if got := testutil.ToFloat64(src.m.snapshots); got != 3 {
			t.Errorf("snapshots_total = %v, want 3", got)
		}
		if n, err := testutil.GatherAndCount(reg, "kvroute_discovery_refresh_errors_total"); err != nil || n != 1 {
			t.Errorf("registry has %d refresh error series (%v), want 1", n, err)
		}
	})
	t.Run("identical rewrite publishes nothing", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "replicas.yaml")
		writeAtomic(t, path, oneReplicaYAML("10.0.0.1:8000", "a"))
		src, err := NewFile(FileConfig{Path: path, Interval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		updates := make(chan Snapshot)
		done := runSource(ctx, src, updates)
		recvSnapshot(t, updates)
		// Different bytes, same replicas: parsed, but not re-sent.
		writeAtomic(t, path, "# comment\n"+oneReplicaYAML("10.0.0.1:8000", "a"))
		writeAtomic(t, path, oneReplicaYAML("10.0.0.2:8000", "a"))
		snap := recvSnapshot(t, updates)
		if snap.Replicas[0].Address != "10.0.0.2:8000" {
			t.Fatalf("got %+v, want the 10.0.0.2 replica (the comment-only change must not publish)", snap)
		}
		cancel()
		if err := waitDone(t, done); err != nil {
			t.Error(err)
		}
	})
	t.Run("configmap symlink swap", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		// Kubernetes layout: file -> ..data/file, ..data -> ..<ts> (swapped atomically).
		mkVersion := func(name, content string) {
			if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name, "replicas.yaml"), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		swap := func(name string) {
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(name, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
		}
		mkVersion("..v1", oneReplicaYAML("10.0.0.1:8000", "a"))
		swap("..v1")
		path := filepath.Join(dir, "replicas.yaml")
		if err := os.Symlink(filepath.Join("..data", "replicas.yaml"), path); err != nil {
			t.Fatal(err)
		}
		src, err := NewFile(FileConfig{Path: path, Interval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		updates := make(chan Snapshot)
		done := runSource(ctx, src, updates)
		if snap := recvSnapshot(t, updates); snap.Replicas[0].Model != "a" {
			t.Fatalf("first = %+v", snap)
		}
		mkVersion("..v2", oneReplicaYAML("10.0.0.1:8000", "b"))
		swap("..v2")
		if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
			t.Fatal(err)
		}
		if snap := recvSnapshot(t, updates); snap.Replicas[0].Model != "b" {
			t.Fatalf("after swap = %+v", snap)
		}
		cancel()
		if err := waitDone(t, done); err != nil {
			t.Error(err)
		}
	})
	t.Run("file deleted keeps last set", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "replicas.yaml")
		writeAtomic(t, path, oneReplicaYAML("10.0.0.1:8000", "a"))
		src, err := NewFile(FileConfig{Path: path, Interval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		updates := make(chan Snapshot)
		done := runSource(ctx, src, updates)
		recvSnapshot(t, updates)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		waitCounter(t, src.m.errors, 2) // every failed read counts
		expectNoSnapshot(t, updates)
		writeAtomic(t, path, oneReplicaYAML("10.0.0.1:8000", "a2"))
		if snap := recvSnapshot(t, updates); snap.Replicas[0].Model != "a2" {
			t.Fatalf("after recreate = %+v", snap)
		}
		cancel()
		if err := waitDone(t, done); err != nil {
			t.Error(err)
		}
	})
	t.Run("invalid at start is an error", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "replicas.yaml")
		writeAtomic(t, path, "replicas:\n  - {address: 10.0.0.1:1, model: m, bogus: 1}\n")
		src, err := NewFile(FileConfig{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		updates := make(chan Snapshot, 1)
		err = src.Run(t.Context(), updates)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), path) {
			t.Errorf("Run = %v, want ErrInvalid naming the file", err)
		}
		expectNoSnapshot(t, updates)
	})
	t.Run("missing at start is an error", func(t *testing.T) {
		t.Parallel()
		src, err := NewFile(FileConfig{Path: filepath.Join(t.TempDir(), "none.yaml")})
		if err != nil {
			t.Fatal(err)
		}
		if err := src.Run(t.Context(), make(chan Snapshot, 1)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Run = %v, want os.ErrNotExist", err)
		}
	})
	t.Run("cancel while the receiver is away", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "replicas.yaml")
		writeAtomic(t, path, oneReplicaYAML("10.0.0.1:8000", "a"))
		src, err := NewFile(FileConfig{Path: path, Interval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := runSource(ctx, src, make(chan Snapshot)) // nobody receives
		cancel()
		if err := waitDone(t, done); err != nil {
			t.Error(err)
		}
	})
}

func TestNewFileConfig(t *testing.T) {
	t.Parallel()
	if _, err := NewFile(FileConfig{}); err == nil {
		t.Error("NewFile without a path succeeded")
	}
	if _, err := NewFile(FileConfig{Path: "x", Interval: -time.Second}); err == nil {
		t.Error("NewFile with a negative interval succeeded")
	}
	reg := prometheus.NewRegistry()
	if _, err := NewFile(FileConfig{Path: "x", Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFile(FileConfig{Path: "y", Registerer: reg}); err == nil {
		t.Error("two sources with the same name registered on one registry")
	}
	if _, err := NewFile(FileConfig{Name: "other", Path: "y", Registerer: reg}); err != nil {
		t.Errorf("second source with another name: %v", err)
	}
}
