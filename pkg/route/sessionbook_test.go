package route

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// agentSessions replays coding-agent sessions starting on a shared tool
// prompt one replica (r0) holds, on a router over a fleet of 4 with a
// simulated clock: 12 sessions start 2 s apart, each sends 10 turns 4 s
// apart, every turn appending 4,096 tokens of tool output (a quarter of a
// second of prefill at the policy's default 16,000 tokens/s) to its
// history. A turn finishes (its hold is done, its prompt stored on the
// replica that served it) before the next decision, so the instantaneous
// load is idle at every new session's start: only the sessions' committed
// future turns tell the replicas apart. It returns how many sessions each
// replica served last.
func agentSessions(t *testing.T, cfg policy.KVRouteConfig) map[index.ReplicaID]int {
	t.Helper()
	tr, err := load.NewTracker(nil)
	if err != nil {
		t.Fatal(err)
	}
	st := &trackerState{fakeState: fleet(4), t: tr}
	ix := index.New(index.Config{})
	sys := seq(6144, 7)
	store(t, ix, "r0", model, sys, 16)
	p, err := policy.NewKVRoute(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	rt := New(Options{Matcher: ix, State: st, Policy: p, Seed: 1, Tracker: tr, Now: func() time.Time { return now }})
	type turn struct {
		at         time.Duration
		sess, turn int
	}
	var turns []turn
	for s := range 12 {
		for k := range 10 {
			turns = append(turns, turn{time.Duration(s)*2*time.Second + time.Duration(k)*4*time.Second, s, k})
		}
	}
	slices.SortStableFunc(turns, func(a, b turn) int { return int(a.at - b.at) })
	history := make([][]uint32, 12)
	last := map[int]index.ReplicaID{}
	start := now
	for _, tu := range turns {
		now = start.Add(tu.at)
		if tu.turn == 0 {
			history[tu.sess] = append(append([]uint32(nil), sys...), seq(512, uint32(1_000_000*(tu.sess+1)))...)
		} else {
			history[tu.sess] = append(history[tu.sess], seq(4096, uint32(1_000_000*(tu.sess+1)+10_000*tu.turn))...)
		}
		d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: history[tu.sess], SessionKey: fmt.Sprint("agent-", tu.sess)})
		if err != nil {
			t.Fatal(err)
		}
		d.Hold.Done()
		store(t, ix, d.Replica, model, history[tu.sess], 16)
		last[tu.sess] = d.Replica
	}
	out := map[index.ReplicaID]int{}
	for _, r := range last {
		out[r]++
	}
	return out
}

// New agent sessions on a shared prompt spread by their predicted future
// turns: without the future charge every session lands on the prompt's
// holder (its short prefill wins every time the fleet looks idle between
// turns), with it no replica serves more than 4 of the 12 sessions.
func TestAgentSessionsSpreadByTheirFuture(t *testing.T) {
	got := agentSessions(t, policy.KVRouteConfig{})
	t.Logf("sessions per replica with the future charge: %v", got)
	for r, n := range got {
		if n > 4 {
			t.Errorf("%s serves %d of 12 sessions (> 4): %v", r, n, got)
		}
	}
	off := 0.0
	without := agentSessions(t, policy.KVRouteConfig{FutureWeight: &off})
	t.Logf("sessions per replica without it: %v", without)
	if without["r0"] < 8 {
		t.Errorf("without the future charge the holder serves only %d of 12 sessions: the test no longer reproduces the crowding it guards against (%v)", without["r0"], without)
	}
}

// A one-shot request, even with a session key, predicts no later turns
// once its class has been seen never to come back; sessions that do come
// back predict theirs, commit their home while they live and stop once
// their horizon passes.
func TestSessionBookLearnsAndExpires(t *testing.T) {
	b := newSessionBook(1024, 3)
	t0 := time.Unix(0, 0)
	cands := func() []policy.Candidate {
		return []policy.Candidate{{Replica: "r0"}, {Replica: "r1"}}
	}
	// One-shot requests drawn by prefix 1 (herding): never a later turn.
	for i := range 20 {
		b.record(t0.Add(time.Duration(i)*time.Second), fmt.Sprint("one-", i), false, 1, true, "r0", 10)
	}
	cs := cands()
	if f := b.view(t0.Add(30*time.Second), "one-new", false, 1, true, cs); f.Turns != 0 {
		t.Errorf("one-shot class predicts %v later turns, want 0", f.Turns)
	}
	if cs[0].Sessions.Rate != 0 {
		t.Errorf("one-shot requests commit r0: %+v", cs[0].Sessions)
	}
	// Sessions drawn by prefix 2: 5 turns 2 s apart, 40 blocks each.
	t1 := t0.Add(time.Minute)
	for s := range 4 {
		for k := range 5 {
			at := t1.Add(time.Duration(s)*20*time.Second + time.Duration(k)*2*time.Second)
			b.record(at, fmt.Sprint("agent-", s), k > 0, 2, true, "r1", 40)
		}
	}
	now := t1.Add(3*20*time.Second + 4*2*time.Second) // the last session's last turn
	cs = cands()
	f := b.view(now, "agent-new", false, 2, true, cs)
	// The class: 4 of 4 sessions came back, shrunk toward the kind's 4 of
	// 24 (the one-shots count there too): (4+1/6)/5 = 0.83; 16 later turns
	// and the kind's 4 per returning session over 3 ended sessions that
	// came back and one pseudo-end: 0.83*(16+4)/4 = 4.17.
	if !(f.Turns >= 4 && f.Turns <= 4.3) {
		t.Errorf("predicted later turns %v, want about 4.17", f.Turns)
	}
	if math.Abs(f.Blocks-40) > 1e-9 || math.Abs(f.BlocksSq-1600) > 1e-6 {
		t.Errorf("predicted blocks per turn %v (square %v), want 40 (1600)", f.Blocks, f.BlocksSq)
	}
	if got := cs[1].Sessions; got.Sessions != 1 || got.Rate < 0.49 || got.Rate > 0.51 || got.Blocks < 19.9 || got.Blocks > 20.1 {
		t.Errorf("r1 commits %+v, want the last session: 0.5 turns/s, 20 blocks/s", got)
	}
	if cs[0].Sessions.Sessions != 0 {
		t.Errorf("r0 commits %+v, want nothing", cs[0].Sessions)
	}
	if f := b.view(now, "agent-3", true, 2, true, cs); f.Turns != 0 {
		t.Errorf("a request with a home predicts %v later turns, want 0 (homes are not placed anew)", f.Turns)
	}
	cs = cands()
	b.view(now.Add(7*time.Second), "", false, 0, false, cs)
	if cs[1].Sessions.Sessions != 0 {
		t.Errorf("r1 still commits %+v past the horizon (3 gaps of 2 s)", cs[1].Sessions)
	}
	// A parallel request (same key, within MinSessionGap) is no turn.
	b.record(now.Add(10*time.Second), "fan", false, 3, true, "r0", 10)
	b.record(now.Add(10*time.Second), "fan", true, 3, true, "r1", 10)
	if s := b.lookup("fan"); s.turns != 1 || s.home != "r0" {
		t.Errorf("fan-out siblings counted as turns: %d turns, home %s", s.turns, s.home)
	}
	if c := b.classes[3]; c.turns != 0 {
		t.Errorf("fan-out siblings counted as later turns of their class: %v", c.turns)
	}
}

// A burst's size is learned per start class: after one burst of 8
// parallel requests, the second request of a new burst of that class
// expects 6 more; a request past MinSessionGap is no sibling. A burst
// whose second request was spread is reported spread until the session's
// next turn.
func TestSessionBookLearnsBurstSize(t *testing.T) {
	b := newSessionBook(1024, 3)
	t0 := time.Unix(0, 0)
	for i := range 8 {
		b.record(t0, "fan-0", i > 0, 5, true, "r0", 10)
	}
	if par, n, placed, _ := b.siblings(t0, "fan-0"); !par || n != 0 || placed != 8 {
		t.Errorf("a ninth request of the burst: parallel %v, %v more expected, %d placed; want true, 0, 8", par, n, placed)
	}
	t1 := t0.Add(time.Second)
	if par, _, _, _ := b.siblings(t1, "fan-0"); par {
		t.Error("a request a second later counted as a sibling")
	}
	if n := b.firstBurst(t1, "fan-1", 5, true); math.Abs(n-7) > 1e-3 {
		t.Errorf("a new session of the class expects %v more with its first, want 7", n)
	}
	if n := b.firstBurst(t1, "user:u-1", 9, true); n != 0 {
		t.Errorf("a new session of another kind and class expects %v more with its first, want 0", n)
	}
	b.record(t1, "fan-1", false, 5, true, "r1", 10)
	t2 := t1.Add(time.Millisecond)
	par, n, placed, spread := b.siblings(t2, "fan-1")
	if !par || math.Abs(n-6) > 1e-3 || placed != 1 || spread {
		t.Errorf("second request of a new burst: parallel %v, %v more expected, %d placed, spread %v; want true, 6, 1, false", par, n, placed, spread)
	}
	b.record(t2, "fan-1", true, 5, true, "r2", 10)
	b.spreadBurst("fan-1")
	if _, n, placed, spread := b.siblings(t2, "fan-1"); math.Abs(n-5) > 1e-3 || placed != 2 || !spread {
		t.Errorf("third request of a spread burst: %v more expected, %d placed, spread %v; want 5, 2, true", n, placed, spread)
	}
	t3 := t2.Add(10 * time.Second)
	b.record(t3, "fan-1", true, 5, true, "r2", 10)
	if _, _, _, spread := b.siblings(t3, "fan-1"); spread {
		t.Error("the session's next turn still counted its previous burst as spread")
	}
	if par, _, _, _ := b.siblings(t1, "unknown"); par {
		t.Error("an unknown key counted as a sibling")
	}
}
