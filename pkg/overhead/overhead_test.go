package overhead

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseWorkloads(t *testing.T) {
	got, err := ParseWorkloads("small@500, 229KB@c32,1.5MB@c1,533KB@20")
	if err != nil {
		t.Fatal(err)
	}
	want := []Workload{
		{Name: "small", BodyBytes: 1024, Rate: 500},
		{Name: "229KB", BodyBytes: 229_000, Concurrency: 32},
		{Name: "1.5MB", BodyBytes: 1_500_000, Concurrency: 1},
		{Name: "533KB", BodyBytes: 533_000, Rate: 20},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	for _, bad := range []string{"", "small", "big@1", "10KB@c0", "10KB@-1", "xKB@c1", "small@cx"} {
		if _, err := ParseWorkloads(bad); err == nil {
			t.Errorf("ParseWorkloads(%q) accepted", bad)
		}
	}
}

func TestBodiesAreUniqueChatsOfTheirSize(t *testing.T) {
	for _, size := range []int{1 << 10, 229_000} {
		f := newBodyFactory(model, size)
		a, b := f.next(), f.next()
		if string(a) == string(b) {
			t.Fatal("two bodies are equal: the tokenizer cache would serve the second")
		}
		var v struct {
			Model    string `json:"model"`
			Stream   bool   `json:"stream"`
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(a, &v); err != nil {
			t.Fatal(err)
		}
		if v.Model != model || !v.Stream || len(v.Messages) < 2 || v.Messages[len(v.Messages)-1].Role != "user" {
			t.Errorf("body %.200s", a)
		}
		if len(a) < size*9/10 || len(a) > size*13/10 {
			t.Errorf("size %d body is %d bytes", size, len(a))
		}
	}
}

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	rs := []result{
		{ok: true, ttft: 1 * ms, e2e: 11 * ms, chunks: 11},
		{ok: true, ttft: 2 * ms, e2e: 22 * ms, chunks: 11},
		{ok: true, ttft: 3 * ms, e2e: 33 * ms, chunks: 11},
		{ok: false},
	}
	s := summarize(rs, 2*time.Second, 1)
	if s.Requests != 4 || s.Errors != 1 || s.Late != 1 || s.Throughput != 1.5 {
		t.Errorf("counts %+v", s)
	}
	if s.TTFTp50 != 2*ms || s.E2Ep50 != 22*ms || s.E2Ep99 != 33*ms || s.ITLp50 != 2*ms {
		t.Errorf("quantiles %+v", s)
	}
	r := row(Workload{Name: "w", Rate: 1}, []Phase{
		{Workload: Workload{Name: "w", Rate: 1}, Target: "kvroute", Stats: Stats{E2Ep50: 30 * ms, Throughput: 9}},
		{Workload: Workload{Name: "w", Rate: 1}, Target: "round-robin", Stats: Stats{E2Ep50: 20 * ms, Throughput: 10}},
	})
	if r.AddedE2Ep50 != 10*ms || r.ThroughputRatio != 0.9 {
		t.Errorf("row %+v", r)
	}
}

func TestProcCPU(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel has charged at least one more clock tick (on a
	// loaded host a fixed wall time may get less than one).
	after := before
	for end := time.Now().Add(10 * time.Second); after <= before && time.Now().Before(end); {
		for spin := time.Now().Add(20 * time.Millisecond); time.Now().Before(spin); {
		}
		if after, err = procCPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if after <= before {
		t.Errorf("CPU time did not advance: %v then %v", before, after)
	}
	if _, err := procCPU(-1); err == nil {
		t.Error("no error for a missing process")
	}
}

// The medians carry every measured figure, kvroute's cores included.
func TestMedianStatsCarriesCPUCores(t *testing.T) {
	m := medianStats([]Stats{{CPUCores: 0.3, Throughput: 1}, {CPUCores: 0.1, Throughput: 3}, {CPUCores: 0.2, Throughput: 2}})
	if m.CPUCores != 0.2 || m.Throughput != 2 {
		t.Fatalf("medians %+v", m)
	}
}

// kvroute's extra environment must be NAME=VALUE pairs.
func TestKVRouteEnvValidated(t *testing.T) {
	for env, ok := range map[string]bool{"GOMAXPROCS=1": true, "GOGC=": true, "GOMAXPROCS": false, "=1": false} {
		o := Options{Root: t.TempDir(), Tokenizer: TokenizerRemote, KVRouteEnv: []string{env}}
		if err := o.defaults(); (err == nil) != ok {
			t.Errorf("%q: error %v, want ok %v", env, err, ok)
		}
	}
}
