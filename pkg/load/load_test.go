package load

import (
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTrackerLifecycle(t *testing.T) {
	tr, err := NewTracker(nil)
	if err != nil {
		t.Fatal(err)
	}
	a := tr.Start("r1", 6, 10)
	b := tr.Start("r1", 2, 4)
	c := tr.Start("r2", -3, 5) // negative prefill taken as 0
	steps := []struct {
		name string
		do   func()
		want map[string]InFlight
	}{
		{"started", func() {}, map[string]InFlight{
			"r1": {PrefillBlocks: 8, DecodeBlocks: 14, Requests: 2},
			"r2": {PrefillBlocks: 0, DecodeBlocks: 5, Requests: 1},
		}},
		{"first token moves prefill out", func() { a.FirstToken(); a.FirstToken() }, map[string]InFlight{
			"r1": {PrefillBlocks: 2, DecodeBlocks: 14, Requests: 2},
			"r2": {DecodeBlocks: 5, Requests: 1},
		}},
		{"done after first token", func() { a.Done(); a.Done(); a.FirstToken() }, map[string]InFlight{
			"r1": {PrefillBlocks: 2, DecodeBlocks: 4, Requests: 1},
			"r2": {DecodeBlocks: 5, Requests: 1},
		}},
		{"done without first token releases prefill", func() { b.Done(); b.FirstToken(); b.Done() }, map[string]InFlight{
			"r1": {},
			"r2": {DecodeBlocks: 5, Requests: 1},
		}},
		{"nil handle is a no-op", func() { var h *Handle; h.FirstToken(); h.Done(); c.Done() }, map[string]InFlight{
			"r1": {}, "r2": {},
		}},
	}
	for _, s := range steps {
		s.do()
		if d := cmp.Diff(s.want, tr.Snapshot()); d != "" {
			t.Fatalf("%s: snapshot mismatch (-want +got):\n%s", s.name, d)
		}
	}
	if got := tr.Get("unknown"); got != (InFlight{}) {
		t.Errorf("Get(unknown) = %+v", got)
	}
}

// Racing finishers on one handle release it exactly once, with readers
// alongside writers, for a plain handle and for one in the decoding
// ledger (StartExpecting): neither the counters nor the ledger leak.
func TestTrackerConcurrentNeverLeaks(t *testing.T) {
	for _, out := range []Output{{}, {Tokens: 100, Blocks: 2}, {Streams: true}, {Tokens: 100, Blocks: 2, Streams: true}} {
		tr, _ := NewTracker(nil)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 500 {
					h := tr.StartExpecting("r", 3, 7, out)
					var inner sync.WaitGroup
					inner.Go(h.Done)
					if (g+i)%2 == 0 {
						h.FirstToken()
					}
					_ = tr.Releases("r", nil) // readers alongside writers
					h.Done()
					inner.Wait()
					_ = tr.Get("r")
				}
			})
		}
		wg.Wait()
		if got := tr.Releases("r", nil); len(got) != 0 {
			t.Fatalf("output %+v: ledger leaked %d entries", out, len(got))
		}
		if got := tr.Get("r"); got != (InFlight{}) {
			t.Fatalf("output %+v: counters leaked: %+v", out, got)
		}
	}
}

// The oldest streamed request still waiting for its first token, and the
// prefill blocks that were ahead of it plus its own: it moves to the next
// one as the oldest gets its token or ends, in any order; requests that
// do not stream never count.
func TestTrackerOldestWaiting(t *testing.T) {
	tr, _ := NewTracker(nil)
	now := time.Unix(100, 0)
	tr.SetClock(func() time.Time { return now })
	oldest := func() (time.Duration, int) {
		f := tr.Get("r")
		return f.OldestWait, f.OldestBlocks
	}
	plain := tr.Start("r", 50, 60) // not streamed: ahead of the others, never the oldest
	now = now.Add(time.Second)
	a := tr.StartExpecting("r", 4, 10, Output{Streams: true})
	now = now.Add(time.Second)
	b := tr.StartExpecting("r", 6, 10, Output{Tokens: 32, Blocks: 1, Streams: true})
	now = now.Add(time.Second)
	c := tr.StartExpecting("r", 3, 10, Output{Streams: true})
	now = now.Add(500 * time.Millisecond)
	if w, n := oldest(); w != 2500*time.Millisecond || n != 50+4 {
		t.Fatalf("oldest a: waited %v with %d blocks, want 2.5s and 54", w, n)
	}
	b.FirstToken() // out of the middle: a stays the oldest
	if w, n := oldest(); w != 2500*time.Millisecond || n != 54 {
		t.Fatalf("after b's first token: %v, %d", w, n)
	}
	a.Done() // ended before its first token (a client gone)
	if w, n := oldest(); w != 500*time.Millisecond || n != 50+4+6+3 {
		t.Fatalf("oldest c: waited %v with %d blocks, want 0.5s and 63", w, n)
	}
	c.FirstToken()
	c.FirstToken() // idempotent
	if w, n := oldest(); w != 0 || n != 0 {
		t.Fatalf("none waiting: %v, %d", w, n)
	}
	d := tr.StartExpecting("r", 2, 2, Output{Streams: true})
	now = now.Add(time.Second)
	if w, n := oldest(); w != time.Second || n != 50+2 {
		t.Fatalf("oldest d: %v, %d, want 1s and 52 (b's and c's prefill done)", w, n)
	}
	for _, h := range []*Handle{plain, b, c, d, a} {
		h.Done()
	}
	if got := tr.Get("r"); got != (InFlight{}) {
		t.Fatalf("counters leaked: %+v", got)
	}
}

func TestTrackerReleasesLedger(t *testing.T) {
	tr, _ := NewTracker(nil)
	now := time.Unix(100, 0)
	tr.SetClock(func() time.Time { return now })
	a := tr.StartExpecting("r1", 6, 10, Output{Tokens: 512, Blocks: 8})
	b := tr.StartExpecting("r1", 2, 4, Output{Tokens: 64, Blocks: 1})
	c := tr.Start("r1", 1, 3) // no expected output: never in the ledger
	d := tr.StartExpecting("r2", 1, 1, Output{Tokens: 16, Blocks: 1})
	if got := tr.Releases("r1", nil); len(got) != 0 {
		t.Fatalf("before any first token: %+v", got)
	}
	a.FirstToken()
	now = now.Add(300 * time.Millisecond)
	b.FirstToken()
	c.FirstToken()
	d.FirstToken()
	now = now.Add(200 * time.Millisecond)
	got := tr.Releases("r1", nil)
	sort.Slice(got, func(i, j int) bool { return got[i].Blocks > got[j].Blocks })
	want := []Release{
		{Blocks: 18, Output: 512, Decoding: 500 * time.Millisecond},
		{Blocks: 5, Output: 64, Decoding: 200 * time.Millisecond},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Releases(r1) (-want +got):\n%s", diff)
	}
	a.Done()
	a.FirstToken() // after Done: no effect
	got = tr.Releases("r1", got[:0])
	if len(got) != 1 || got[0].Output != 64 {
		t.Fatalf("after a is done: %+v", got)
	}
	b.Done()
	c.Done()
	d.Done()
	if got := tr.Releases("r1", nil); len(got) != 0 {
		t.Fatalf("all done: %+v", got)
	}
	if got := tr.Releases("r2", nil); len(got) != 0 {
		t.Fatalf("r2 all done: %+v", got)
	}
	if got := tr.Releases("unknown", nil); len(got) != 0 {
		t.Fatalf("unknown replica: %+v", got)
	}
	e := tr.StartExpecting("r1", 1, 1, Output{Tokens: 8, Blocks: 1})
	e.Done() // done before its first token: never in the ledger
	e.FirstToken()
	if got := tr.Releases("r1", nil); len(got) != 0 {
		t.Fatalf("done before first token: %+v", got)
	}
	if got := tr.Get("r1"); got != (InFlight{}) {
		t.Fatalf("counters leaked: %+v", got)
	}
}

func TestTrackerMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tr, err := NewTracker(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := tr.Start("r1", 4, 9)
	defer h.Done()
	for name, want := range map[string]float64{
		"kvroute_replica_active_prefill_blocks": 4,
		"kvroute_replica_active_decode_blocks":  9,
		"kvroute_replica_inflight_requests":     1,
	} {
		if got, ok := gathered(t, reg, name, "r1"); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	if _, err := NewTracker(reg); err == nil {
		t.Fatal("second registration on one registry succeeded")
	}
}

func TestFidelity(t *testing.T) {
	type obs struct{ predicted, served int }
	tests := []struct {
		name string
		cfg  FidelityConfig
		obs  []obs
		want float64
	}{
		{"no observations", FidelityConfig{}, nil, 1},
		{"served as predicted", FidelityConfig{MinSamples: 1}, []obs{{64, 64}, {32, 32}}, 1},
		{"over-serving is capped at 1", FidelityConfig{MinSamples: 1}, []obs{{16, 64}}, 1},
		{"zero prediction ignored", FidelityConfig{MinSamples: 1}, []obs{{0, 0}, {0, 64}}, 1},
		{"half served, one sample", FidelityConfig{Alpha: 0.5, MinSamples: 1}, []obs{{64, 32}}, 0.75},
		{"below min samples stays 1", FidelityConfig{Alpha: 0.5, MinSamples: 3}, []obs{{64, 0}, {64, 0}}, 1},
		{"persistent misses hit the floor", FidelityConfig{Alpha: 0.5, Floor: 0.3, MinSamples: 2}, []obs{{64, 0}, {64, 0}, {64, 0}, {64, 0}}, 0.3},
		{"ewma arithmetic", FidelityConfig{Alpha: 0.5, Floor: 0.01, MinSamples: 2}, []obs{{64, 0}, {64, 64}}, 0.75},
		{"negative values clamp", FidelityConfig{MinSamples: 1, Alpha: 1, Floor: 0.01}, []obs{{10, -5}}, 0.01},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := NewFidelity(tc.cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range tc.obs {
				f.Observe("r", o.predicted, o.served)
			}
			if got := f.Credit("r"); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("Credit = %v, want %v", got, tc.want)
			}
			if got := f.Credit("other"); got != 1 {
				t.Errorf("unobserved replica credit = %v, want 1", got)
			}
		})
	}
}

func TestFidelityRecoversAndResets(t *testing.T) {
	f, _ := NewFidelity(FidelityConfig{Alpha: 0.5, Floor: 0.1, MinSamples: 1}, nil)
	for range 6 {
		f.Observe("r", 100, 0)
	}
	low := f.Credit("r")
	if low > 0.1+1e-9 {
		t.Fatalf("credit after misses = %v, want the floor", low)
	}
	for range 6 {
		f.Observe("r", 100, 100)
	}
	if got := f.Credit("r"); got < 0.95 {
		t.Errorf("credit after recovery = %v, want near 1", got)
	}
	f.Observe("r", 100, 0)
	f.Reset("r")
	if got := f.Credit("r"); got != 1 {
		t.Errorf("credit after Reset = %v, want 1", got)
	}
	var nilF *Fidelity
	if nilF.Credit("r") != 1 {
		t.Error("nil Fidelity credit != 1")
	}
}

func TestFidelityConfigErrors(t *testing.T) {
	for name, cfg := range map[string]FidelityConfig{
		"alpha above 1":    {Alpha: 1.5},
		"negative alpha":   {Alpha: -0.1},
		"floor above 1":    {Floor: 2},
		"negative samples": {MinSamples: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewFidelity(cfg, nil); err == nil {
				t.Fatal("NewFidelity accepted a bad config")
			}
		})
	}
}

func TestFidelityMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	f, err := NewFidelity(FidelityConfig{Alpha: 1, MinSamples: 1, Floor: 0.1}, reg)
	if err != nil {
		t.Fatal(err)
	}
	f.Observe("r1", 64, 16)
	f.Observe("r1", 0, 32)
	for name, want := range map[string]float64{
		"kvroute_cached_tokens_predicted_total": 64,
		"kvroute_cached_tokens_served_total":    48,
		"kvroute_fidelity_observations_total":   2,
		"kvroute_replica_cache_credit":          0.25,
	} {
		if got, ok := gathered(t, reg, name, "r1"); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
}

// TestFidelityTotals: the typed totals the admin API shows are the figures
// the counters export, per replica, and survive Reset (they are counters).
func TestFidelityTotals(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	f, err := NewFidelity(FidelityConfig{}, reg)
	if err != nil {
		t.Fatal(err)
	}
	f.Observe("a", 64, 16)
	f.Observe("a", 0, 32)
	f.Observe("a", -5, -1) // counted as an observation of zeros
	f.Observe("b#dp1", 10, 10)
	f.Reset("a")
	tests := []struct {
		replica string
		want    CacheTotals
	}{
		{"a", CacheTotals{Predicted: 64, Served: 48, Observations: 3}},
		{"b#dp1", CacheTotals{Predicted: 10, Served: 10, Observations: 1}},
		{"never", CacheTotals{}},
	}
	for _, tt := range tests {
		t.Run(tt.replica, func(t *testing.T) {
			got := f.Totals(tt.replica)
			if got != tt.want {
				t.Fatalf("Totals = %+v, want %+v", got, tt.want)
			}
			for name, want := range map[string]int64{
				"kvroute_cached_tokens_predicted_total": got.Predicted,
				"kvroute_cached_tokens_served_total":    got.Served,
				"kvroute_fidelity_observations_total":   got.Observations,
			} {
				v, ok := gathered(t, reg, name, tt.replica)
				if ok != (tt.want != CacheTotals{}) || int64(v) != want {
					t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
				}
			}
		})
	}
	var nilF *Fidelity
	if nilF.Totals("a") != (CacheTotals{}) {
		t.Error("nil Fidelity has totals")
	}
}
