package route

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/policy"
)

func chat(msgs string) Request {
	return Request{Model: model, Input: TokenizeInput{Chat: true, Messages: json.RawMessage(msgs)}}
}

func TestSessionKey(t *testing.T) {
	const opening = `{"role":"system","content":"tools"},{"role":"user","content":"fix the bug"},{"role":"assistant","content":"looking"}`
	turn2 := chat(`[` + opening + `,{"role":"tool","content":"out"}]`)
	turn3 := chat(`[` + opening + `,{"role":"tool","content":"out"},{"role":"assistant","content":"done"},{"role":"user","content":"thanks"}]`)
	k2, k3 := SessionKey(turn2), SessionKey(turn3)
	if !strings.HasPrefix(k2, "conv:") || k2 != k3 {
		t.Fatalf("later turns of one conversation: keys %q and %q, want one conv: key", k2, k3)
	}
	sibling := chat(`[{"role":"system","content":"tools"},{"role":"user","content":"fix the bug"},{"role":"assistant","content":"reading the tests"},{"role":"tool","content":"out"}]`)
	if SessionKey(sibling) == k2 {
		t.Error("a sibling that answered differently shares the key")
	}
	other := turn2
	other.Model = "other"
	if SessionKey(other) == k2 {
		t.Error("the same conversation on another model shares the key")
	}
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"the header wins", func() Request { r := turn2; r.SessionKey = "s1"; r.User = "u"; return r }(), "s1"},
		{"a first turn has no conversation key", chat(`[{"role":"system","content":"tools"},{"role":"user","content":"fix the bug"}]`), ""},
		{"a first turn falls back to user", func() Request {
			r := chat(`[{"role":"user","content":"hi"}]`)
			r.User = "alice"
			return r
		}(), "user:alice"},
		{"malformed messages fall back to user", func() Request { r := chat(`{"role":`); r.User = "bob"; return r }(), "user:bob"},
		{"truncated array", chat(`[{"role":"user","content":"x"},`), ""},
		{"completion without user", Request{Model: model, Input: TokenizeInput{Prompt: "hello"}}, ""},
		{"completion with user", Request{Model: model, User: "carol"}, "user:carol"},
		{"the header wins over the body's session", Request{Model: model, SessionKey: "s1", BodySession: "c9", CacheKey: "k", User: "u"}, "s1"},
		{"the body's session wins over the opening", func() Request { r := turn2; r.BodySession = "c9"; r.CacheKey = "k"; r.User = "u"; return r }(), "sid:c9"},
		{"the opening wins over prompt_cache_key", func() Request { r := turn2; r.CacheKey = "tenant-7"; r.User = "u"; return r }(), k2},
		{"a first turn falls back to prompt_cache_key before user", func() Request {
			r := chat(`[{"role":"user","content":"hi"}]`)
			r.CacheKey, r.User = "thread-1", "alice"
			return r
		}(), "pck:thread-1"},
		{"completion with prompt_cache_key", Request{Model: model, CacheKey: "thread-2"}, "pck:thread-2"},
		{"a long body value is hashed", Request{Model: model, BodySession: strings.Repeat("x", MaxKeyValue+1)},
			"sid:#" + strconv.FormatUint(xxh3.HashString(strings.Repeat("x", MaxKeyValue+1)), 16)},
		{"a value of MaxKeyValue bytes is kept", Request{Model: model, User: strings.Repeat("y", MaxKeyValue)}, "user:" + strings.Repeat("y", MaxKeyValue)},
		{"a long header is hashed too", Request{Model: model, SessionKey: strings.Repeat("h", 60_000)},
			"#" + strconv.FormatUint(xxh3.HashString(strings.Repeat("h", 60_000)), 16)},
		{"a header of MaxKeyValue bytes is kept", Request{Model: model, SessionKey: strings.Repeat("h", MaxKeyValue)}, strings.Repeat("h", MaxKeyValue)},
		// A header cannot pose as a derived key, nor as another value's hash.
		{"a header shaped like a conversation key", func() Request { r := turn2; r.SessionKey = k2; return r }(), "hdr:" + k2},
		{"a header shaped like a user key", Request{Model: model, SessionKey: "user:alice", User: "alice"}, "hdr:user:alice"},
		{"a header shaped like a hash", Request{Model: model, SessionKey: "#1f"}, "hdr:#1f"},
		{"a header shaped like the escape", Request{Model: model, SessionKey: "hdr:x"}, "hdr:hdr:x"},
		{"a long header shaped like a key is hashed behind the escape", Request{Model: model, SessionKey: "pck:" + strings.Repeat("h", MaxKeyValue)},
			"hdr:#" + strconv.FormatUint(xxh3.HashString("pck:"+strings.Repeat("h", MaxKeyValue)), 16)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SessionKey(tt.req); got != tt.want {
				t.Errorf("key %.80q (%d bytes), want %.80q", got, len(got), tt.want)
			}
		})
	}
	// The session book treats an escaped header as a header.
	for _, h := range []string{k2, "user:alice", "pck:t"} {
		if k := SessionKey(Request{Model: model, SessionKey: h}); keyKind(k) != kindHeader {
			t.Errorf("header %q keyed %q of kind %d, want a header's", h, k, keyKind(k))
		}
	}
}

// Whatever a client sends, in the header or the body, a session key stays
// short, the same value keys the same session, and two values that differ
// only past the bound key two sessions.
func TestSessionKeyBoundedForEverySource(t *testing.T) {
	sources := map[string]func(v string) Request{
		"header":           func(v string) Request { return Request{Model: model, SessionKey: v} },
		"body session":     func(v string) Request { return Request{Model: model, BodySession: v} },
		"prompt_cache_key": func(v string) Request { return Request{Model: model, CacheKey: v} },
		"user":             func(v string) Request { return Request{Model: model, User: v} },
	}
	long := strings.Repeat("z", 1<<20)
	for name, req := range sources {
		a, b := SessionKey(req(long+"a")), SessionKey(req(long+"b"))
		if len(a) > MaxKeyValue+8 || len(b) > MaxKeyValue+8 {
			t.Errorf("%s: a 1 MiB value gave keys of %d and %d bytes", name, len(a), len(b))
		}
		if a == b || a == "" {
			t.Errorf("%s: two values differing past the bound keyed %q and %q", name, a, b)
		}
		if again := SessionKey(req(long + "a")); again != a {
			t.Errorf("%s: the same value keyed %q, then %q", name, a, again)
		}
	}
}

func TestHomesBounded(t *testing.T) {
	h := newHomes(4)
	h.set("a", "r1")
	if id, ok := h.get("a"); !ok || id != "r1" {
		t.Fatalf("get a = %q %v", id, ok)
	}
	h.set("b", "r2") // fills the current generation (max/2): it becomes the old one
	h.set("c", "r3")
	if id, ok := h.get("a"); !ok || id != "r1" {
		t.Fatalf("a should survive one generation: %q %v", id, ok)
	}
	h.set("d", "r4") // second rotation: a and b are dropped
	if _, ok := h.get("a"); ok {
		t.Error("a outlived two generations")
	}
	if id, _ := h.get("d"); id != "r4" {
		t.Errorf("d = %q", id)
	}
	var off *homes = newHomes(-1)
	off.set("a", "r1")
	if _, ok := off.get("a"); ok {
		t.Error("a disabled memory remembered")
	}
}

// recordingPolicy picks the first eligible candidate and records what it saw.
type recordingPolicy struct {
	req   policy.Request
	cands []policy.Candidate
	pick  int
}

func (p *recordingPolicy) Name() string { return "recording" }
func (p *recordingPolicy) Pick(req policy.Request, cands []policy.Candidate, _ policy.Env) policy.Result {
	p.req, p.cands = req, append([]policy.Candidate(nil), cands...)
	return policy.Result{Pick: p.pick, Reason: "test"}
}

func TestDecideMarksHome(t *testing.T) {
	st := fleet(3)
	rp := &recordingPolicy{pick: 2}
	rt := New(Options{State: st, Policy: rp, Seed: 1})
	req := Request{Model: model, Tokens: seq(64, 1), SessionKey: "s"}
	d, err := rt.Decide(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Session != "s" || rp.req.SessionKey != "s" {
		t.Fatalf("session %q, policy saw %q", d.Session, rp.req.SessionKey)
	}
	for _, c := range rp.cands {
		if c.Home {
			t.Fatalf("first request of a session has a home: %+v", c)
		}
	}
	rp.pick = 0
	if _, err := rt.Explain(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	d, err = rt.Decide(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	var homes []index.ReplicaID
	for _, c := range rp.cands {
		if c.Home {
			homes = append(homes, c.Replica)
		}
	}
	if len(homes) != 1 || homes[0] != "r2" {
		t.Fatalf("homes %v, want r2 (the first pick; Explain records nothing)", homes)
	}
	if !d.Candidates[2].Home || d.Candidates[0].Home {
		t.Errorf("decision candidates do not show the home: %+v", d.Candidates)
	}
	// The next request finds its home where this one went.
	if _, err := rt.Decide(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if !rp.cands[0].Home || rp.cands[2].Home {
		t.Errorf("home did not follow the session to r0: %+v", rp.cands)
	}
	// Without a key (and nothing to derive one from) no candidate is home.
	if _, err := rt.Decide(t.Context(), Request{Model: model, Tokens: seq(64, 1)}); err != nil {
		t.Fatal(err)
	}
	for _, c := range rp.cands {
		if c.Home {
			t.Errorf("keyless request has a home: %+v", c)
		}
	}
}

// rawContent agrees with encoding/json on every object it accepts.
func FuzzRawContent(f *testing.F) {
	for _, s := range []string{
		`{"role":"user","content":"x"}`,
		`{ "content" : [ {"type":"text","text":"a}\"]"} ] , "role":"tool" }`,
		`{"content":null}`, `{"content":1.5e3,"Content":true}`, `{"role":"a"}`, `{}`,
		`{"name":"{[","content":{"a":[1,{"b":"}"}]}}`,
		`{"con\u0074ent":"escaped key"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		var want rawMessage
		if json.Unmarshal(obj, &want) != nil {
			return
		}
		got, ok := rawContent(obj)
		if !ok {
			return // escaped keys: the caller asks encoding/json
		}
		if !bytes.Equal(got, want.Content) {
			t.Fatalf("%s: rawContent %q, encoding/json %q", obj, got, want.Content)
		}
	})
}

// A conversation sent with the OpenAI user field (or prompt_cache_key) is
// keyed by it on its first turn (no assistant message yet) and by its
// opening from its second. The session book follows it to the new key:
// its second turn is a later turn of the session its first started (one
// start, one session that came back, one session committed), not a new
// session beside a one-shot ghost of the first. Another user's
// conversation is a new session.
func TestDecideConversationContinuesItsUsersSession(t *testing.T) {
	for _, field := range []string{"user", "prompt_cache_key"} {
		t.Run(field, func(t *testing.T) {
			st := fleet(3)
			rp := &recordingPolicy{pick: 2}
			now := time.Unix(1000, 0)
			rt := New(Options{State: st, Policy: rp, Seed: 1, Now: func() time.Time { return now }})
			turn := func(who string, msgs string) Request {
				r := chat(msgs)
				r.Tokens = seq(64, 1)
				if field == "user" {
					r.User = who
				} else {
					r.CacheKey = who
				}
				return r
			}
			first := map[string]string{"user": "user:alice", "prompt_cache_key": "pck:alice"}[field]
			d, err := rt.Decide(t.Context(), turn("alice", `[{"role":"user","content":"hi"}]`))
			if err != nil {
				t.Fatal(err)
			}
			if d.Session != first {
				t.Fatalf("first turn keyed %q, want %s", d.Session, first)
			}
			rp.pick = 0
			now = now.Add(5 * time.Second)
			d, err = rt.Decide(t.Context(), turn("alice", `[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]`))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(d.Session, "conv:") {
				t.Fatalf("second turn keyed %q, want a conv: key", d.Session)
			}
			b := rt.book
			if b.lookup(first) != nil {
				t.Errorf("the session is still booked under %s", first)
			}
			s := b.lookup(d.Session)
			if s == nil || s.turns != 2 || s.home != "r0" || s.first != time.Unix(1000, 0) {
				t.Fatalf("booked session %+v, want the first turn's session: 2 turns, home r0", s)
			}
			starts, back := 0.0, 0.0
			for _, k := range b.kinds {
				starts += k.starts
				back += k.back
			}
			if math.Abs(starts-1) > 0.05 || math.Abs(back-1) > 0.05 {
				t.Errorf("%v sessions started, %v came back; want 1 and 1 (decayed over seconds)", starts, back)
			}
			if k := b.kinds[kindUser].starts; math.Abs(k-1) > 0.05 {
				t.Errorf("%v sessions of the user kind started, want the one (a %s key may span conversations)", k, field)
			}
			now = now.Add(5 * time.Second)
			d, err = rt.Decide(t.Context(), turn("bob", `[{"role":"user","content":"yo"},{"role":"assistant","content":"hey"},{"role":"user","content":"more"}]`))
			if err != nil {
				t.Fatal(err)
			}
			if s := b.lookup(d.Session); s == nil || s.turns != 1 {
				t.Errorf("another user's conversation booked as %+v, want a new session", s)
			}
		})
	}
}

// A session's own committed turns are not counted as load its request
// would wait behind: the request sees its home's other sessions only.
func TestSessionBookViewLeavesOutTheSessionItself(t *testing.T) {
	b := newSessionBook(1024, 3)
	t0 := time.Unix(0, 0)
	for k := range 3 {
		b.record(t0.Add(time.Duration(k)*2*time.Second), "conv:a", k > 0, 1, true, "r1", 40)
	}
	now := t0.Add(5 * time.Second)
	cs := []policy.Candidate{{Replica: "r0"}, {Replica: "r1"}}
	b.view(now, "other", false, 1, true, cs)
	if cs[1].Sessions.Sessions != 1 || !(cs[1].Sessions.Rate > 0) {
		t.Fatalf("r1 commits %+v to another session, want conv:a", cs[1].Sessions)
	}
	cs = []policy.Candidate{{Replica: "r0"}, {Replica: "r1"}}
	b.view(now, "conv:a", false, 1, true, cs)
	if got := cs[1].Sessions; got.Sessions != 0 || got.Rate != 0 || got.Blocks != 0 || got.BlocksSq != 0 {
		t.Errorf("conv:a sees its own turns on r1: %+v", got)
	}
}

// Claude Code's system prompt starts with a billing line whose value changes
// on every request; vLLM drops that line before rendering, and a
// conversation's key must not change with it either.
func TestConversationKeyIgnoresTheBillingLine(t *testing.T) {
	turn := func(sys, answer string) Request {
		return chat(`[{"role":"system","content":` + sys + `},{"role":"user","content":"fix it"},{"role":"assistant","content":"` + answer + `"},{"role":"user","content":"go on"}]`)
	}
	for _, c := range []struct{ a, b, other string }{
		{`"x-anthropic-billing-header: cch=1;\nYou are Claude Code."`, `"x-anthropic-billing-header: cch=2;\nYou are Claude Code."`, `"x-anthropic-billing-header: cch=2;\nYou are someone else."`},
		{`[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"You are Claude Code."}]`,
			`[{"type":"text","text":"x-anthropic-billing-header: cch=9;"},{"type":"text","text":"You are Claude Code."}]`,
			`[{"type":"text","text":"x-anthropic-billing-header: cch=9;"},{"type":"text","text":"You are Claude."}]`},
	} {
		ka, kb := SessionKey(turn(c.a, "ok")), SessionKey(turn(c.b, "ok"))
		if !strings.HasPrefix(ka, "conv:") || ka != kb {
			t.Errorf("%s / %s: keys %q and %q, want one conv: key", c.a, c.b, ka, kb)
		}
		if SessionKey(turn(c.other, "ok")) == ka {
			t.Errorf("%s: another system prompt shares the key", c.other)
		}
		if SessionKey(turn(c.a, "other answer")) == ka {
			t.Errorf("%s: another opening answer shares the key", c.a)
		}
		// The parser's messages give the same key as the raw JSON.
		r := turn(c.b, "ok")
		var msgs []json.RawMessage
		if err := json.Unmarshal(r.Input.Messages, &msgs); err != nil {
			t.Fatal(err)
		}
		parsed := make([]ChatMessage, len(msgs))
		for i, m := range msgs {
			var rm rawMessage
			_ = json.Unmarshal(m, &rm)
			parsed[i] = ChatMessage{Role: rm.Role, Raw: m}
		}
		hRaw, ok1 := openingHash(model, r.Input.Messages)
		hParsed, ok2 := parsedOpeningHash(model, parsed)
		if !ok1 || !ok2 || hRaw != hParsed {
			t.Errorf("%s: raw and parsed opening hashes differ", c.b)
		}
	}
}
