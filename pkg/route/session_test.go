package route

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SessionKey(tt.req); got != tt.want {
				t.Errorf("key %q, want %q", got, tt.want)
			}
		})
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
