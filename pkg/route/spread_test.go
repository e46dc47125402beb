package route

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// The work meter reads blocks per second over its window: a steady 100
// blocks a second reads about 100 once the window has passed, and the
// first burst reads its blocks over the lead-in, not over an instant.
func TestWorkMeterRate(t *testing.T) {
	var m workMeter
	t0 := time.Unix(100, 0)
	if r := m.rate(t0); r != 0 {
		t.Fatalf("empty meter reads %v", r)
	}
	m.add(t0, 800)
	if r := m.rate(t0); r > 800/workMeterLeadIn.Seconds()*1.1 {
		t.Errorf("first burst reads %v blocks/s, want about %v", r, 800/workMeterLeadIn.Seconds())
	}
	for i := 1; i <= 600; i++ {
		m.add(t0.Add(time.Duration(i)*100*time.Millisecond), 10)
	}
	if r := m.rate(t0.Add(60 * time.Second)); math.Abs(r-100) > 5 {
		t.Errorf("steady 100 blocks/s reads %v", r)
	}
}

// A replica's fluid queue drains at its speed; the blocks sent there count
// as its charge until the estimate has computed them.
func TestFluidQueues(t *testing.T) {
	var f fluidQueues
	t0 := time.Unix(100, 0)
	f.add("r0", t0, 100, 50, 1000)                           // done at t0+0.5s
	f.add("r0", t0.Add(100*time.Millisecond), 100, 30, 1000) // 40 left + 30: done at t0+0.8s
	q, c := f.get("r0", t0.Add(300*time.Millisecond), 100)
	if math.Abs(q-50) > 1e-9 || c != 80 {
		t.Errorf("at 0.3 s: queued %v charge %v, want 50, 80", q, c)
	}
	q, c = f.get("r0", t0.Add(600*time.Millisecond), 100)
	if math.Abs(q-20) > 1e-9 || c != 30 {
		t.Errorf("at 0.6 s: queued %v charge %v, want 20, 30", q, c)
	}
	if q, c = f.get("r0", t0.Add(time.Second), 100); q != 0 || c != 0 {
		t.Errorf("at 1 s: queued %v charge %v, want 0, 0", q, c)
	}
	if q, c = f.get("r1", t0, 100); q != 0 || c != 0 {
		t.Errorf("unknown replica: queued %v charge %v", q, c)
	}
	// With a limit of 40 blocks a replica never holds more in the
	// estimate, however long the router sends 10 blocks a millisecond
	// against a learned 100 a second; its dispatches' list keeps only
	// those within the limit's horizon (0.4 s, about 400 of them; without
	// the limit all 10,000).
	for i := range 10000 {
		f.add("r2", t0.Add(time.Duration(i)*time.Millisecond), 100, 10, 40)
	}
	now := t0.Add(10 * time.Second)
	if q, _ := f.get("r2", now, 100); q > 40 {
		t.Errorf("queue past its limit: %v blocks, limit 40", q)
	}
	f.mu.Lock()
	n := len(f.m["r2"].sent)
	f.mu.Unlock()
	if n > 500 {
		t.Errorf("%d dispatches kept, want at most the ~400 of the last 0.4 s", n)
	}
}

// Bursts without a session key: a request whose prompt is not in flight
// starts one, the requests that find it in flight are its siblings.
func TestBurstSizes(t *testing.T) {
	var b burstSizes
	t0 := time.Unix(100, 0)
	if s := b.size(t0); s != 1 {
		t.Fatalf("no bursts: size %v, want 1", s)
	}
	for i := range 3 {
		at := t0.Add(time.Duration(i) * time.Second)
		b.note(at, false)
		for range 7 {
			b.note(at, true)
		}
	}
	if s := b.size(t0.Add(3 * time.Second)); math.Abs(s-8) > 0.05 {
		t.Errorf("three bursts of 8: size %v", s)
	}
}

// Decision.QueuedTokens, the rate learner's RateSample.Queued, is what the
// picked replica's fluid queue holds ahead of the request (the router's
// earlier dispatches there drained at its prefill speed), never more than
// the backlog still charged there; Explain leaves it 0.
func TestDecideQueuedTokens(t *testing.T) {
	st := fleet(1)
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 1000, PrefillRate: 1600} // 100 blocks/s
	p, err := policy.New(policy.NameRoundRobin, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	rt := New(Options{Matcher: index.New(index.Config{}), State: st, Policy: p, Seed: 1, Now: func() time.Time { return now }})
	decide := func(base uint32) Decision {
		t.Helper()
		d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: seq(50*16, base)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := decide(100); d.QueuedTokens != 0 {
		t.Fatalf("first request: %d tokens queued ahead, want 0", d.QueuedTokens)
	}
	now = now.Add(200 * time.Millisecond) // 20 of its 50 blocks computed
	if d := decide(5000); d.QueuedTokens != 30*16 {
		t.Fatalf("0.2 s later: %d tokens queued ahead, want 30 blocks' %d", d.QueuedTokens, 30*16)
	}
	// The replica answered sooner than its speed says: 10 blocks charged.
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 10, PrefillRate: 1600}
	if d := decide(9000); d.QueuedTokens != 10*16 {
		t.Fatalf("capped: %d tokens queued ahead, want the 10 charged blocks' %d", d.QueuedTokens, 10*16)
	}
	if e, err := rt.Explain(t.Context(), Request{Model: model, Tokens: seq(50*16, 13000)}); err != nil || e.QueuedTokens != 0 {
		t.Fatalf("Explain: %d tokens queued (%v), want 0", e.QueuedTokens, err)
	}

	// A request finding 40 of its 50 blocks cached queues only its 10.
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 1000, PrefillRate: 1600}
	ix := index.New(index.Config{})
	cached := seq(50*16, 20000)
	store(t, ix, "r0", model, cached[:40*16], 16)
	rt = New(Options{Matcher: ix, State: st, Policy: p, Seed: 1, Now: func() time.Time { return now }})
	if d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: cached}); err != nil || d.MatchedBlocks() != 40 {
		t.Fatalf("cached request: matched %d (%v), want 40", d.MatchedBlocks(), err)
	}
	if d := decide(30000); d.QueuedTokens != 10*16 {
		t.Fatalf("behind a cached request: %d tokens queued ahead, want its 10 uncached blocks' %d", d.QueuedTokens, 10*16)
	}
}

// firstPick is kvroute's pace with a fixed pick: the first candidate.
type firstPick struct{ *policy.KVRoute }

func (firstPick) Pick(_ policy.Request, cands []policy.Candidate, _ policy.Env) policy.Result {
	return policy.Result{Pick: 0, Reason: policy.ReasonCost, Costs: make([]float64, len(cands))}
}

// TestFluidQueueDrainsAtThePolicysPace: a replica with no learned speed
// drains its fluid queue at the speed the policy prices it at (a Pacer:
// the mean of the replicas' learned speeds, else its prefill_rate), not
// at a constant of route's own.
func TestFluidQueueDrainsAtThePolicysPace(t *testing.T) {
	rate := 1600.0 // 100 blocks of 16 tokens per second
	k, err := policy.NewKVRoute(policy.KVRouteConfig{PrefillRate: &rate})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		learned float64 // r1's learned speed (0: none)
		want    int     // blocks left of the first 50 after 0.2 s
	}{
		{"prefill_rate", 0, 30},    // 100 blocks/s: 20 computed
		{"fleet's mean", 3200, 10}, // 200 blocks/s: 40 computed
	} {
		st := fleet(2)
		st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 1000}
		st.loads["r1"] = load.Load{Healthy: true, ActivePrefillBlocks: 1000, PrefillRate: tc.learned}
		now := time.Unix(1000, 0)
		rt := New(Options{Matcher: index.New(index.Config{}), State: st, Policy: firstPick{k}, Seed: 1, Now: func() time.Time { return now }})
		if _, err := rt.Decide(t.Context(), Request{Model: model, Tokens: seq(50*16, 100)}); err != nil {
			t.Fatal(err)
		}
		now = now.Add(200 * time.Millisecond)
		d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: seq(50*16, 5000)})
		if err != nil || d.Replica != "r0" {
			t.Fatalf("%s: picked %s (%v), want r0", tc.name, d.Replica, err)
		}
		if d.QueuedTokens != tc.want*16 {
			t.Errorf("%s: %d tokens queued ahead after 0.2 s, want %d blocks' %d", tc.name, d.QueuedTokens, tc.want, tc.want*16)
		}
	}
}

// TestDecideForgetsDepartedReplicas: once a replica is gone from the
// State's set, the router drops its fluid queue, its learned speeds and
// the session load committed to it; a replica merely unhealthy keeps its
// own.
func TestDecideForgetsDepartedReplicas(t *testing.T) {
	st := fleet(3)
	p, err := policy.New(policy.NameRoundRobin, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	rt := New(Options{Matcher: index.New(index.Config{}), State: st, Policy: p, Seed: 1, Now: func() time.Time { return now }})
	for i := range 3 {
		d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: seq(50*16, uint32(1000*i))})
		if err != nil {
			t.Fatal(err)
		}
		rt.Rates().Observe(d.Replica, RateSample{Uncached: 2000, TTFT: 200 * time.Millisecond, E2E: time.Second, Output: 10})
	}
	rt.book.mu.Lock()
	s := &bookSession{key: "s", home: "r2", live: true}
	rt.book.put(s)
	rt.book.reps["r2"] = &policy.SessionLoad{Sessions: 1, Rate: 0.1}
	rt.book.mu.Unlock()
	kept := func(id index.ReplicaID) (fluid, rate, book bool) {
		rt.fluid.mu.Lock()
		_, fluid = rt.fluid.m[id]
		rt.fluid.mu.Unlock()
		_, rate = rt.Rates().Get(id)
		rt.book.mu.Lock()
		_, book = rt.book.reps[id]
		rt.book.mu.Unlock()
		return
	}
	if f, r, b := kept("r2"); !f || !r || !b {
		t.Fatalf("before: r2 fluid %v rates %v sessions %v, want all held", f, r, b)
	}

	// r1 turns unhealthy, r2 leaves.
	st.loads["r1"] = load.Load{Healthy: false}
	st.reps = st.reps[:2]
	now = now.Add(time.Second)
	if _, err := rt.Decide(t.Context(), Request{Model: model, Tokens: seq(50*16, 9000)}); err != nil {
		t.Fatal(err)
	}
	if f, r, b := kept("r2"); f || r || b {
		t.Errorf("r2 gone: fluid %v rates %v sessions %v still held", f, r, b)
	}
	if s.live {
		t.Error("a session living on r2 still counts its load")
	}
	for _, id := range []index.ReplicaID{"r0", "r1"} {
		if f, r, _ := kept(id); !f || !r {
			t.Errorf("%s still in the fleet: fluid %v rates %v, want both held", id, f, r)
		}
	}
}
