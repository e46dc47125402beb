package route

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// trackerState is a fleet whose loads are a load.Tracker's in-flight view,
// as kvroute's load.View builds them; each Load read sleeps a little, so
// that concurrent decisions overlap.
type trackerState struct {
	*fakeState
	t     *load.Tracker
	sleep time.Duration
}

func (s *trackerState) Load(id index.ReplicaID) load.Load {
	time.Sleep(s.sleep)
	in := s.t.Get(string(id))
	return load.Load{Healthy: true, ActiveRequests: in.Requests, ActivePrefillBlocks: float64(in.PrefillBlocks), ActiveDecodeBlocks: float64(in.DecodeBlocks)}
}

// trackedRig is a router over n replicas whose load is what its own
// Tracker was charged, with an empty index and a clock the test moves.
type trackedRig struct {
	rt  *Router
	tr  *load.Tracker
	ix  *index.Index
	now time.Time
}

func newTrackedRig(t *testing.T, n int, p policy.Policy) *trackedRig {
	t.Helper()
	return newTrackedRigWith(t, n, Options{Policy: p})
}

// newTrackedRigWith is newTrackedRig with opts' other fields (Pending).
func newTrackedRigWith(t *testing.T, n int, opts Options) *trackedRig {
	t.Helper()
	tr, err := load.NewTracker(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := &trackedRig{tr: tr, ix: index.New(index.Config{}), now: time.Unix(1000, 0)}
	opts.Matcher, opts.State, opts.Seed, opts.Tracker = g.ix, &trackerState{fakeState: fleet(n), t: tr}, 1, tr
	opts.Now = func() time.Time { return g.now }
	g.rt = New(opts)
	return g
}

// A sibling placed where its whole prompt is in flight is charged only
// the prefill it computes itself: the engine computes the shared prompt
// once, for the request that carried it there, which stays charged for it
// until its first token. Charged again per sibling, a fan-out's holder
// read as many prompts as it has siblings. A request sharing only part of
// its prompt with one in flight is charged that part too (see Decide).
func TestDecideChargesSiblingItsOwnPrefill(t *testing.T) {
	g := newTrackedRigWith(t, 1, Options{Pending: NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL})})
	prompt := append(seq(20*16, 500), seq(4*16, 9000)...)
	for i, tc := range []struct {
		name    string
		tokens  []uint32
		charged int // the replica's charged prefill after the decision
	}{
		{"first", slices.Clone(prompt), 24},
		{"sibling", slices.Clone(prompt), 24 + 1}, // its last block is computed again
		{"part in flight", append(slices.Clone(prompt[:20*16]), seq(4*16, 7000)...), 25 + 24},
		{"a prefix of it", slices.Clone(prompt[:20*16-8]), 49}, // 19 full blocks, all in flight
	} {
		d, err := g.rt.Decide(t.Context(), Request{Model: model, Tokens: tc.tokens})
		if err != nil {
			t.Fatal(err)
		}
		if got := g.tr.Get("r0").PrefillBlocks; got != tc.charged {
			t.Errorf("request %d (%s): %d blocks charged, want %d (decision's %d)", i, tc.name, got, tc.charged, d.PrefillBlocks)
		}
	}
}

// With Options.Tracker, a decision charges its pick before any other
// decision reads the loads: a burst of concurrent requests is seen one by
// one (the k-th decision sees k-1 requests in flight), so a burst on a
// prefix one replica holds is not sent there whole by decisions that all
// read the same idle fleet. Each decision returns its hold; finishing it
// empties the tracker.
func TestDecideChargesItsPickBeforeOthersRead(t *testing.T) {
	const n = 24
	tr, err := load.NewTracker(nil)
	if err != nil {
		t.Fatal(err)
	}
	st := &trackerState{fakeState: fleet(4), t: tr, sleep: 200 * time.Microsecond}
	ix := index.New(index.Config{})
	sys := seq(40*16, 7)
	store(t, ix, "r2", model, sys, 16)
	p, err := policy.New(policy.NameKVRoute, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rt := New(Options{Matcher: ix, State: st, Policy: p, Seed: 1, Tracker: tr})

	var (
		mu    sync.Mutex
		seen  []int
		holds []*load.Handle
		picks = map[index.ReplicaID]int{}
		wg    sync.WaitGroup
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			tokens := append(append([]uint32(nil), sys...), seq(2*16, uint32(100000+100*i))...)
			d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: tokens})
			if err != nil {
				t.Error(err)
				return
			}
			inflight := 0
			for _, c := range d.Candidates {
				inflight += c.Load.Requests()
			}
			mu.Lock()
			seen, holds = append(seen, inflight), append(holds, d.Hold)
			picks[d.Replica]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	slices.Sort(seen)
	for k, v := range seen {
		if v != k {
			t.Fatalf("in-flight requests seen by the decisions: %v, want 0..%d (each decision sees every earlier pick charged)", seen, n-1)
		}
	}
	if picks["r2"] == n {
		t.Errorf("every request went to the prefix holder: %v", picks)
	}
	for _, h := range holds {
		if h == nil {
			t.Fatal("a decision returned no hold")
		}
		h.Done()
	}
	for _, r := range []string{"r0", "r1", "r2", "r3"} {
		if in := tr.Get(r); in != (load.InFlight{}) {
			t.Errorf("%s still charged after every hold is done: %+v", r, in)
		}
	}
	// Explain never charges.
	if d, err := rt.Explain(t.Context(), Request{Model: model, Tokens: sys}); err != nil || d.Hold != nil || tr.Get(string(d.Replica)).Requests != 0 {
		t.Errorf("explain: hold %v, %s charged %d, err %v", d.Hold, d.Replica, tr.Get(string(d.Replica)).Requests, err)
	}
}
