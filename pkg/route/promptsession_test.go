package route

import (
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// keysOf returns the prompt's block keys at 16 tokens a block.
func keysOf(tokens []uint32) []kvblock.Key {
	return kvblock.Keys(nil, kvblock.Root(model, ""), tokens, 16, kvblock.Options{})
}

// extend returns prompt followed by n blocks of tokens from base.
func extend(prompt []uint32, n int, base uint32) []uint32 {
	return append(append([]uint32(nil), prompt...), seq(n*16, base)...)
}

func TestPromptBookContinues(t *testing.T) {
	turn1 := seq(10*16, 1)
	turn2 := extend(turn1, 3, 5000)
	turn3 := extend(turn2, 2, 6000)
	k1, k2, k3 := keysOf(turn1), keysOf(turn2), keysOf(turn3)
	b := newPromptBook(64)

	if _, _, ok := b.continues(k2, len(k2), true); ok {
		t.Fatal("an empty book names a conversation")
	}
	b.set(k1[len(k1)-1], "r1", len(k1), "")
	if _, _, ok := b.continues(k2, len(k1)-1, true); ok {
		t.Fatal("a record longer than within found")
	}
	if _, _, ok := b.continues(k2, len(k1)+continueWindow, true); ok {
		t.Fatal("a record continueWindow or more below within found")
	}
	// The same prompt again is a resend, not a continuation.
	if _, _, ok := b.continues(k1, len(k1), true); ok {
		t.Fatal("a prompt continues itself")
	}
	want := "conv:p" + strconv.FormatUint(uint64(k1[len(k1)-1]), 16)
	key, home, ok := b.continues(k2, len(k2), true)
	if !ok || key != want || home != "r1" {
		t.Fatalf("turn 2: %q at %s (%v), want %q at r1", key, home, ok, want)
	}
	// A retry of turn 2 continues turn 1 as its first sending did.
	if key, home, ok := b.continues(k2, len(k2), true); !ok || key != want || home != "r1" {
		t.Fatalf("turn 2 again: %q at %s (%v)", key, home, ok)
	}
	// Turn 3 continues turn 2 (the longest recorded prompt), and inherits
	// the key turn 2 carried.
	b.set(k2[len(k2)-1], "r2", len(k2), key)
	if key3, home3, ok := b.continues(k3, len(k3), true); !ok || key3 != want || home3 != "r2" {
		t.Fatalf("turn 3: %q at %s (%v), want %q at r2", key3, home3, ok, want)
	}

	// An explanation of a different continuation claims nothing; a
	// decision of one forks turn 1, and from then on nothing continues it.
	other := keysOf(extend(turn1, 2, 9000))
	if _, _, ok := b.continues(other, len(other), false); ok {
		t.Fatal("a second continuation of turn 1 found a conversation")
	}
	if _, _, ok := b.continues(k2, len(k2), true); !ok {
		t.Fatal("an explanation forked turn 1")
	}
	if _, _, ok := b.continues(other, len(other), true); ok {
		t.Fatal("a second continuation of turn 1 found a conversation")
	}
	if _, _, ok := b.continues(keysOf(extend(turn1, 4, 11000)), len(k1), true); ok {
		t.Fatal("turn 1 not forked by a second continuation")
	}
	// A resend of turn 2, recorded with its key, is not probed for: it
	// keeps the key it was given. A resend of turn 1, recorded with none,
	// gets none.
	if key2, _, ok := b.continues(k2, len(k2), true); !ok || key2 != want {
		t.Fatalf("turn 2 resent: %q (%v), want %q", key2, ok, want)
	}
	if _, _, ok := b.continues(k1, len(k1), true); ok {
		t.Fatal("turn 1 resent found a conversation")
	}
	// Turn 2's own record is untouched: turn 3 still continues it.
	if _, _, ok := b.continues(k3, len(k3), true); !ok {
		t.Fatal("turn 3 lost turn 2")
	}
}

// A prompt sent to two replicas (a GRPO group's task, a fan-out's prompt)
// is shared: nothing continues it. A conversation key its request carried
// is inherited; another kind of key is not.
func TestPromptBookContinuesOnlyOneSendersPrompt(t *testing.T) {
	task := seq(8*16, 1)
	k, next := keysOf(task), keysOf(extend(task, 2, 700))
	b := newPromptBook(64)
	b.set(k[len(k)-1], "r0", len(k), "")
	b.set(k[len(k)-1], "r1", len(k), "")
	if _, _, ok := b.continues(next, len(next), true); ok {
		t.Fatal("a prompt sent to two replicas continued")
	}

	b = newPromptBook(64)
	b.set(k[len(k)-1], "r0", len(k), "conv:abc")
	if key, _, ok := b.continues(next, len(next), true); !ok || key != "conv:abc" {
		t.Fatalf("conversation key %q (%v), want conv:abc", key, ok)
	}
	b = newPromptBook(64)
	b.set(k[len(k)-1], "r0", len(k), "user:u")
	if key, _, ok := b.continues(next, len(next), true); !ok || key == "user:u" || keyKind(key) != kindConv {
		t.Fatalf("after a user key: %q (%v), want a conversation key of its own", key, ok)
	}
}

// A request without a session key that continues a prompt the router sent
// finds its home there: the previous turn's replica, marked Home for the
// policy, the decision naming the conversation; its next turn carries the
// same key. An explanation records nothing.
func TestDecideKeylessContinuationFindsItsHome(t *testing.T) {
	st := fleet(3)
	ix := index.New(index.Config{})
	rp := &recordingPolicy{pick: 2}
	rt := New(Options{Matcher: ix, State: st, Policy: rp, Seed: 1})
	turn1 := seq(10*16, 1)
	d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: turn1})
	if err != nil {
		t.Fatal(err)
	}
	if d.Session != "" || d.SessionFromPrompt {
		t.Fatalf("first turn keyed %q", d.Session)
	}
	// Until a replica's index holds turn 1, nothing is probed for.
	turn2 := extend(turn1, 3, 5000)
	if e, err := rt.Explain(t.Context(), Request{Model: model, Tokens: turn2}); err != nil || e.Session != "" {
		t.Fatalf("turn 2 with turn 1 in no index: session %q (%v)", e.Session, err)
	}
	store(t, ix, "r2", model, turn1, 16)
	homes := func() []index.ReplicaID {
		var h []index.ReplicaID
		for _, c := range rp.cands {
			if c.Home {
				h = append(h, c.Replica)
			}
		}
		return h
	}
	rp.pick = 0
	e, err := rt.Explain(t.Context(), Request{Model: model, Tokens: turn2})
	if err != nil {
		t.Fatal(err)
	}
	if !e.SessionFromPrompt || keyKind(e.Session) != kindConv || rp.req.SessionKey != e.Session {
		t.Fatalf("turn 2 explained: session %q from prompt %v, policy saw %q", e.Session, e.SessionFromPrompt, rp.req.SessionKey)
	}
	if h := homes(); len(h) != 1 || h[0] != "r2" {
		t.Fatalf("turn 2's homes %v, want r2 (turn 1's replica)", h)
	}
	d2, err := rt.Decide(t.Context(), Request{Model: model, Tokens: turn2})
	if err != nil {
		t.Fatal(err)
	}
	if d2.Session != e.Session || d2.Replica != "r0" {
		t.Fatalf("turn 2 decided: session %q at %s, want %q at r0", d2.Session, d2.Replica, e.Session)
	}
	store(t, ix, "r0", model, turn2, 16)
	turn3 := extend(turn2, 2, 6000)
	d3, err := rt.Decide(t.Context(), Request{Model: model, Tokens: turn3})
	if err != nil {
		t.Fatal(err)
	}
	if d3.Session != e.Session {
		t.Fatalf("turn 3 session %q, want %q", d3.Session, e.Session)
	}
	if h := homes(); len(h) != 1 || h[0] != "r0" {
		t.Fatalf("turn 3's homes %v, want r0 (turn 2's replica)", h)
	}
	// A request with a key of its own keeps it.
	d4, err := rt.Decide(t.Context(), Request{Model: model, Tokens: extend(turn3, 1, 7000), SessionKey: "s"})
	if err != nil || d4.Session != "s" || d4.SessionFromPrompt {
		t.Fatalf("keyed request: session %q from prompt %v (%v)", d4.Session, d4.SessionFromPrompt, err)
	}
}

// A chat request without a key is a first turn (it has no assistant
// message): even when its prompt begins with one the router sent, it
// continues nothing.
func TestDecideChatFirstTurnContinuesNothing(t *testing.T) {
	st := fleet(3)
	ix := index.New(index.Config{})
	rt := New(Options{Matcher: ix, State: st, Policy: &recordingPolicy{pick: 1}, Seed: 1})
	system := seq(10*16, 1)
	if _, err := rt.Decide(t.Context(), Request{Model: model, Tokens: system}); err != nil {
		t.Fatal(err)
	}
	store(t, ix, "r1", model, system, 16)
	next := extend(system, 2, 4000)
	chat := TokenizeInput{Chat: true, Messages: []byte(`[{"role":"system","content":"s"},{"role":"user","content":"u"}]`)}
	d, err := rt.Explain(t.Context(), Request{Model: model, Tokens: next, Input: chat})
	if err != nil || d.Session != "" {
		t.Fatalf("chat first turn: session %q (%v), want none", d.Session, err)
	}
	if d, err := rt.Explain(t.Context(), Request{Model: model, Tokens: next}); err != nil || !d.SessionFromPrompt {
		t.Fatalf("the same prompt without chat messages: session %q (%v), want the conversation it continues", d.Session, err)
	}
}
