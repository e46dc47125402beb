package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// coldRig is a router with a simulated clock over a tracker-backed fleet
// of n whose replica r0 holds a 6,144-token shared prompt (an agent
// harness), nothing learned yet: a router's first minute.
type coldRig struct {
	*trackedRig
	sys []uint32
}

func newColdRig(t *testing.T, n int, cfg policy.KVRouteConfig) *coldRig {
	t.Helper()
	p, err := policy.NewKVRoute(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := &coldRig{trackedRig: newTrackedRig(t, n, p), sys: seq(6144, 7)}
	store(t, g.ix, "r0", model, g.sys, 16)
	return g
}

// start sends a new session's first request (the shared prompt and a
// 512-token task of its own) under key, lets it finish (its prompt stored
// where it went) and returns the decision.
func (g *coldRig) start(t *testing.T, key string, i int) Decision {
	t.Helper()
	toks := append(append([]uint32(nil), g.sys...), seq(512, uint32(1_000_000*(i+1)))...)
	d, err := g.rt.Decide(t.Context(), keyed(Request{Model: model, Tokens: toks}, key))
	if err != nil {
		t.Fatal(err)
	}
	d.Hold.Done()
	store(t, g.ix, d.Replica, model, toks, 16)
	return d
}

// keyed gives req the session key key: a "user:" key through the body's
// user field, as SessionKey derives it, any other as the header.
func keyed(req Request, key string) Request {
	if u, ok := strings.CutPrefix(key, "user:"); ok {
		req.User = u
	} else {
		req.SessionKey = key
	}
	return req
}

// comeBack starts a session under key on the prompt's holder r0 (one
// second on) and sends its ten later turns, 2 s apart, each adding grow
// tokens of history; every turn must stay at its home r0.
func (g *coldRig) comeBack(t *testing.T, key string, grow int) {
	t.Helper()
	g.now = g.now.Add(time.Second)
	if d := g.start(t, key, 0); d.Replica != "r0" {
		t.Fatalf("first session went to %s, want the holder r0", d.Replica)
	}
	toks := append(append([]uint32(nil), g.sys...), seq(512, 1_000_000)...)
	for turn := range 10 {
		g.now = g.now.Add(2 * time.Second)
		toks = append(toks, seq(grow, uint32(5_000_000+turn*10_000))...)
		d, err := g.rt.Decide(t.Context(), keyed(Request{Model: model, Tokens: toks}, key))
		if err != nil {
			t.Fatal(err)
		}
		d.Hold.Done()
		store(t, g.ix, d.Replica, model, toks, 16)
		if d.Replica != "r0" {
			t.Fatalf("%s's turn %d went to %s, want its home r0", key, turn+2, d.Replica)
		}
	}
}

// A router's first sessions: 8 new sessions with session keys start on a
// fleet of 8 within 2 s, sharing a 6,144-token prompt r0 holds; each
// finishes before the next starts, so the fleet looks idle at every
// decision. Nothing predicts their later turns (none has come back), so
// the cost sees only the prompt's prefill saved on r0 and sends all 8
// there. The round of sessions of unknown future places them one per
// replica instead: each of the 7 others prefills the prompt once, from
// capacity it was not using.
func TestColdStartSessionsSpreadOnePerReplica(t *testing.T) {
	g := newColdRig(t, 8, policy.KVRouteConfig{})
	got := map[index.ReplicaID]int{}
	rounds := 0
	for i := range 8 {
		g.now = g.now.Add(250 * time.Millisecond)
		d := g.start(t, fmt.Sprint("agent-", i), i)
		got[d.Replica]++
		if d.Reason == ReasonSessionRound {
			rounds++
		}
	}
	t.Logf("sessions per replica: %v (%d placed by the round)", got, rounds)
	for r, n := range got {
		if n != 1 {
			t.Errorf("%s took %d of the 8 first sessions, want 1 each: %v", r, n, got)
		}
	}
	if rounds != 7 {
		t.Errorf("the round changed %d picks, want 7 (every session but the first, which the cost sends to the prompt's holder anyway)", rounds)
	}

	// The same start without a policy that prices a session's future
	// (future_weight 0): no round, and every session goes to the holder.
	off := 0.0
	g = newColdRig(t, 8, policy.KVRouteConfig{FutureWeight: &off})
	for i := range 8 {
		g.now = g.now.Add(250 * time.Millisecond)
		if d := g.start(t, fmt.Sprint("agent-", i), i); d.Replica != "r0" || d.Reason == ReasonSessionRound {
			t.Errorf("without the future charge session %d went to %s (%s), want the holder r0: the test no longer reproduces the packing", i, d.Replica, d.Reason)
		}
	}
}

// The round is one session per replica of each key kind, and only while
// none of the kind's sessions came back: one-shot requests with session
// keys (a herding burst, n samples under one key) are spread for one round,
// predict nothing (their class never comes back), and after the round go
// where the cost sends them.
func TestColdStartRoundEndsAfterOnePerReplica(t *testing.T) {
	g := newColdRig(t, 4, policy.KVRouteConfig{})
	for i := range 4 {
		g.now = g.now.Add(100 * time.Millisecond)
		g.start(t, fmt.Sprint("one-", i), i)
	}
	for i := 4; i < 12; i++ {
		g.now = g.now.Add(100 * time.Millisecond)
		d := g.start(t, fmt.Sprint("one-", i), i)
		if d.Reason == ReasonSessionRound {
			t.Errorf("request %d placed by the round after one per replica", i)
		}
	}
	cs := []policy.Candidate{{Replica: "r0"}, {Replica: "r1"}}
	if f := g.rt.book.view(g.now.Add(time.Minute), "one-new", false, 0, false, cs); f.Turns != 0 {
		t.Errorf("one-shot requests predict %v later turns, want 0", f.Turns)
	}
	if cs[0].Sessions.Rate != 0 || cs[1].Sessions.Rate != 0 {
		t.Errorf("one-shot requests commit load: %+v %+v", cs[0].Sessions, cs[1].Sessions)
	}

	// A kind whose sessions came back is no longer of unknown future: a
	// user-keyed session sends a second turn, and the next new user-keyed
	// session is placed by the cost alone (its prediction).
	g = newColdRig(t, 4, policy.KVRouteConfig{})
	g.now = g.now.Add(time.Second)
	g.start(t, "user:a", 0)
	if !g.rt.book.round(g.now, "user:b", candidatesOf(4), make([]float64, 4)) {
		t.Fatal("a user-keyed kind with one start and none back is not in its round")
	}
	g.now = g.now.Add(2 * time.Second)
	toks := append(append(append([]uint32(nil), g.sys...), seq(512, 1_000_000)...), seq(1024, 5_000_000)...)
	d, err := g.rt.Decide(t.Context(), keyed(Request{Model: model, Tokens: toks}, "user:a"))
	if err != nil {
		t.Fatal(err)
	}
	d.Hold.Done()
	if g.rt.book.round(g.now, "user:b", candidatesOf(4), make([]float64, 4)) {
		t.Error("the kind is still in its round after one of its sessions came back")
	}
	// Conversation keys are derived from a history: never a round.
	if g.rt.book.round(g.now, "conv:1", candidatesOf(4), make([]float64, 4)) {
		t.Error("a conversation key is in a round")
	}
}

// Explain shows the round's pick without counting it: the next Decide
// sees the same starts.
func TestColdStartRoundExplainDoesNotCount(t *testing.T) {
	g := newColdRig(t, 4, policy.KVRouteConfig{})
	g.now = g.now.Add(time.Second)
	g.start(t, "agent-0", 0)
	toks := append(append([]uint32(nil), g.sys...), seq(512, 2_000_000)...)
	e, err := g.rt.Explain(t.Context(), Request{Model: model, Tokens: toks, SessionKey: "agent-1"})
	if err != nil {
		t.Fatal(err)
	}
	if e.Replica == "r0" || e.Reason != ReasonSessionRound {
		t.Errorf("explained the second session to %s (%s), want another replica than r0 by the round", e.Replica, e.Reason)
	}
	d := g.start(t, "agent-1", 1)
	if d.Replica == "r0" || d.Reason != ReasonSessionRound {
		t.Errorf("placed the second session on %s (%s), want another replica than r0 by the round", d.Replica, d.Reason)
	}
}

// The round invests only capacity nobody is using: with every replica
// but the prompt's holder running a request, a second session still joins
// the holder (the policy's pick), and it is spread once one is idle again.
func TestColdStartRoundOnlyToIdleReplicas(t *testing.T) {
	g := newColdRig(t, 4, policy.KVRouteConfig{})
	g.now = g.now.Add(time.Second)
	if d := g.start(t, "agent-0", 0); d.Replica != "r0" {
		t.Fatalf("first session went to %s, want the holder r0", d.Replica)
	}
	var busy []*load.Handle
	for _, r := range []string{"r1", "r2", "r3"} {
		busy = append(busy, g.tr.Start(r, 0, 64))
	}
	g.now = g.now.Add(time.Second)
	if d := g.start(t, "agent-1", 1); d.Replica != "r0" || d.Reason == ReasonSessionRound {
		t.Errorf("with no idle replica the second session went to %s (%s), want the holder r0 by the cost", d.Replica, d.Reason)
	}
	busy[1].Done()
	g.now = g.now.Add(time.Second)
	if d := g.start(t, "agent-2", 2); d.Replica != "r2" || d.Reason != ReasonSessionRound {
		t.Errorf("with r2 idle the third session went to %s (%s), want r2 by the round", d.Replica, d.Reason)
	}
	for _, h := range busy {
		h.Done()
	}
}

func candidatesOf(n int) []policy.Candidate {
	out := make([]policy.Candidate, n)
	for i := range out {
		out[i] = policy.Candidate{Replica: index.ReplicaID(fmt.Sprint("r", i)), Load: load.Load{Healthy: true}}
	}
	return out
}

// A growing session is balanced by living sessions, a short one is not.
// On a fleet of 4 whose r0 holds a 6,144-token shared prompt (384 blocks)
// and one living session there, whose ten later turns each added grow
// tokens of history 2 s apart, a new session of the same kind goes where
// the cost sends it (r0, the prompt's holder: such light turns queue
// behind nothing, so the future charge does not move it) unless its later
// turns are predicted to add more history than the 384 blocks it would
// find there: then to an idle replica with no living session (reason
// session_balance), whose prefill of the prompt is within what the
// holder saves. Agent sessions that start small and grow past a replica's
// cache packed on their prompt's holder otherwise; a chat's few short
// turns do not outgrow the prompt.
func TestGrowingSessionsBalanceByLivingSessions(t *testing.T) {
	for _, tc := range []struct {
		name string
		grow int // tokens each of agent-0's later turns adds
		away bool
	}{
		{"history outgrows the prompt", 768, true},
		{"history smaller than the prompt", 16, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newColdRig(t, 4, policy.KVRouteConfig{})
			g.comeBack(t, "agent-0", tc.grow)

			g.now = g.now.Add(time.Second)
			req := Request{Model: model, Tokens: append(append([]uint32(nil), g.sys...), seq(512, 2_000_000)...), SessionKey: "agent-1"}
			e, err := g.rt.Explain(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("agent-1: %s (%s)", e.Replica, e.Reason)
			if tc.away && (e.Replica == "r0" || e.Reason != ReasonSessionBalance) {
				t.Errorf("a session predicted to add %d tokens a turn went to %s (%s), want an idle replica without sessions by %s", tc.grow, e.Replica, e.Reason, ReasonSessionBalance)
			}
			if !tc.away && (e.Replica != "r0" || e.Reason == ReasonSessionBalance) {
				t.Errorf("a session predicted to add %d tokens a turn went to %s (%s), want the prompt's holder r0 by the cost", tc.grow, e.Replica, e.Reason)
			}
		})
	}
}

// A crowded prefix holder's new sessions copy the prefix elsewhere. On a
// fleet of 4 whose r0 holds a 6,144-token shared prompt, chat-like
// sessions (ten later turns adding 16 tokens each: far less history than
// the prompt, so the balance of growing sessions leaves them with it)
// start one after another and live on. Each alone is cheaper on r0, so
// without the crowd rule they would all start there. Once r0 has
// SessionCrowdExcess more living sessions than the fewest (and
// SessionCrowdRatio times its fair share), the next goes where the fewest
// live, paying one prefill of the prompt (reason session_replicate); no
// session joins a replica that crowded.
func TestCrowdedHolderReplicatesItsPrefix(t *testing.T) {
	g := newColdRig(t, 4, policy.KVRouteConfig{})
	// One session that came back, so that the kind's sessions have a
	// prediction (small growth) and no round applies.
	g.comeBack(t, "user:chat-0", 16)

	living := func() map[index.ReplicaID]int {
		cs := []policy.Candidate{{Replica: "r0"}, {Replica: "r1"}, {Replica: "r2"}, {Replica: "r3"}}
		g.rt.book.view(g.now, "", false, 0, false, cs)
		out := map[index.ReplicaID]int{}
		for _, c := range cs {
			out[c.Replica] = c.Sessions.Sessions
		}
		return out
	}
	replicated := 0
	for i := 1; i <= 8; i++ {
		g.now = g.now.Add(200 * time.Millisecond)
		before := living()
		d := g.start(t, fmt.Sprint("user:chat-", i), i)
		t.Logf("session %d: %s (%s), living before %v", i, d.Replica, d.Reason, before)
		if d.Reason == ReasonSessionBalance || d.Reason == ReasonSessionRound {
			t.Errorf("session %d placed by %s: the rig no longer isolates the crowd rule", i, d.Reason)
		}
		if d.Reason == ReasonSessionReplicate {
			replicated++
			if d.Replica == "r0" {
				t.Errorf("session %d: replicated onto the crowded holder r0", i)
			}
		}
		least, total := before["r0"], 0
		for _, n := range before {
			least, total = min(least, n), total+n
		}
		if n := before[d.Replica]; n >= least+SessionCrowdExcess && float64(n) >= SessionCrowdRatio*float64(total)/float64(len(before)) {
			t.Errorf("session %d joined the crowded %s (%d living sessions, the fewest %d): %v", i, d.Replica, n, least, before)
		}
		if i == 1 && d.Replica != "r0" {
			t.Errorf("session 1 went to %s (%s) with one session on r0, want the prompt's holder r0 by the cost", d.Replica, d.Reason)
		}
	}
	if replicated == 0 {
		t.Errorf("no session left the crowded holder by %s", ReasonSessionReplicate)
	}
}
