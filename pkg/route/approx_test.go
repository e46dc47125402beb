package route

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

var t0 = time.Unix(1_700_000_000, 0)

func approxKeys(n int, base uint32) []kvblock.Key {
	return kvblock.Keys(nil, approxRoot(model, "", false), seq(n*16, base), 16, kvblock.Options{})
}

// matchMap runs Match and returns replica -> blocks, checking ByTier.
func matchMap(t *testing.T, x *ApproxIndex, keys []kvblock.Key, now time.Time) map[index.ReplicaID]int {
	t.Helper()
	out := map[index.ReplicaID]int{}
	for _, m := range x.Match(keys, now, nil) {
		if _, dup := out[m.Replica]; dup {
			t.Fatalf("replica %s reported twice", m.Replica)
		}
		if m.Blocks <= 0 || m.ByTier[index.TierGPU] != m.Blocks || m.ByTier[index.TierCPU]+m.ByTier[index.TierDisk] != 0 {
			t.Fatalf("match %+v", m)
		}
		out[m.Replica] = m.Blocks
	}
	return out
}

func TestApproxIndexLongestPrefix(t *testing.T) {
	keys := approxKeys(6, 1)
	tests := []struct {
		name   string
		record map[index.ReplicaID][]kvblock.Key
		want   map[index.ReplicaID]int
	}{
		{"empty", nil, map[index.ReplicaID]int{}},
		{"whole and partial prefixes", map[index.ReplicaID][]kvblock.Key{
			"a": keys, "b": keys[:2], "c": keys[:1],
		}, map[index.ReplicaID]int{"a": 6, "b": 2, "c": 1}},
		{"interior hole truncates", map[index.ReplicaID][]kvblock.Key{
			"a": {keys[0], keys[1], keys[3], keys[4]},
		}, map[index.ReplicaID]int{"a": 2}},
		{"no block 0 matches nothing", map[index.ReplicaID][]kvblock.Key{
			"a": keys[1:], "b": keys[:3],
		}, map[index.ReplicaID]int{"b": 3}},
		{"other prompts do not match", map[index.ReplicaID][]kvblock.Key{
			"a": approxKeys(6, 500),
		}, map[index.ReplicaID]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewApproxIndex(ApproxConfig{})
			for r, ks := range tt.record {
				x.Record(ks, r, t0)
			}
			if got := matchMap(t, x, keys, t0.Add(time.Second)); !mapsEqual(got, tt.want) {
				t.Fatalf("match %v, want %v", got, tt.want)
			}
		})
	}
}

func mapsEqual(a, b map[index.ReplicaID]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestApproxIndexMatchesBruteForce checks the one-descent match against a
// per-replica scan over random records.
func TestApproxIndexMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	keys := approxKeys(12, 1)
	x := NewApproxIndex(ApproxConfig{})
	held := map[index.ReplicaID]map[kvblock.Key]bool{}
	for i := range 200 {
		r := index.ReplicaID(fmt.Sprint("r", rng.IntN(6)))
		var ks []kvblock.Key
		for _, k := range keys {
			if rng.IntN(5) > 0 {
				ks = append(ks, k)
			}
		}
		x.Record(ks, r, t0)
		if held[r] == nil {
			held[r] = map[kvblock.Key]bool{}
		}
		for _, k := range ks {
			held[r][k] = true
		}
		want := map[index.ReplicaID]int{}
		for r, h := range held {
			n := 0
			for n < len(keys) && h[keys[n]] {
				n++
			}
			if n > 0 {
				want[r] = n
			}
		}
		if got := matchMap(t, x, keys, t0); !mapsEqual(got, want) {
			t.Fatalf("record %d: match %v, want %v", i, got, want)
		}
	}
}

func TestApproxIndexTTL(t *testing.T) {
	keys := approxKeys(4, 1)
	const ttl = 2 * time.Minute
	t.Run("expires after the TTL", func(t *testing.T) {
		x := NewApproxIndex(ApproxConfig{TTL: ttl})
		x.Record(keys, "a", t0)
		if got := matchMap(t, x, keys, t0.Add(ttl-time.Nanosecond)); got["a"] != 4 {
			t.Fatalf("before expiry: %v", got)
		}
		if got := matchMap(t, x, keys, t0.Add(ttl)); len(got) != 0 {
			t.Fatalf("at expiry: %v", got)
		}
	})
	t.Run("a new dispatch renews only its blocks", func(t *testing.T) {
		x := NewApproxIndex(ApproxConfig{TTL: ttl})
		x.Record(keys, "a", t0)
		x.Record(keys[:2], "a", t0.Add(time.Minute))
		if got := matchMap(t, x, keys, t0.Add(ttl+time.Second)); got["a"] != 2 {
			t.Fatalf("after the first expiry: %v, want a:2", got)
		}
		if got := matchMap(t, x, keys, t0.Add(time.Minute+ttl)); len(got) != 0 {
			t.Fatalf("after the second expiry: %v", got)
		}
	})
	t.Run("record drops expired entries", func(t *testing.T) {
		x := NewApproxIndex(ApproxConfig{TTL: ttl})
		x.Record(keys, "a", t0)
		x.Record(keys[:1], "b", t0.Add(time.Minute))
		if st := x.Stats(); st.Entries != 5 || st.Keys != 4 || st.Expired != 0 {
			t.Fatalf("stats %+v", st)
		}
		x.Record(keys[:1], "c", t0.Add(ttl+time.Second)) // a's entries are past their TTL
		if st := x.Stats(); st.Entries != 2 || st.Keys != 1 || st.Expired != 4 || st.Evicted != 0 {
			t.Fatalf("stats %+v", st)
		}
		if got := matchMap(t, x, keys, t0.Add(ttl+time.Second)); !mapsEqual(got, map[index.ReplicaID]int{"b": 1, "c": 1}) {
			t.Fatalf("match %v", got)
		}
	})
	t.Run("defaults", func(t *testing.T) {
		x := NewApproxIndex(ApproxConfig{TTL: -1, MaxEntries: -1})
		if x.ttl != int64(DefaultApproxTTL) || x.max != DefaultApproxMaxEntries {
			t.Fatalf("ttl %v max %d", time.Duration(x.ttl), x.max)
		}
	})
}

func TestApproxIndexBounded(t *testing.T) {
	x := NewApproxIndex(ApproxConfig{MaxEntries: 10})
	a, b := approxKeys(8, 1), approxKeys(8, 900)
	x.Record(a, "a", t0)
	x.Record(b, "b", t0.Add(time.Second))
	st := x.Stats()
	if st.Entries != 10 || st.Keys != 10 || st.Evicted != 6 || st.Expired != 0 {
		t.Fatalf("stats %+v", st)
	}
	// a's deepest blocks went first: its prefix survives, shortened.
	now := t0.Add(2 * time.Second)
	if got := matchMap(t, x, a, now); !mapsEqual(got, map[index.ReplicaID]int{"a": 2}) {
		t.Fatalf("a: %v", got)
	}
	if got := matchMap(t, x, b, now); !mapsEqual(got, map[index.ReplicaID]int{"b": 8}) {
		t.Fatalf("b: %v", got)
	}
	// Renewing a's head makes b's tail the least recent.
	x.Record(a[:1], "a", now)
	x.Record(a[:3], "a", now)
	if st := x.Stats(); st.Entries != 10 || st.Evicted != 7 {
		t.Fatalf("stats %+v", st)
	}
	if got := matchMap(t, x, a, now); got["a"] != 3 {
		t.Fatalf("a: %v", got)
	}
	if got := matchMap(t, x, b, now); got["b"] != 7 {
		t.Fatalf("b: %v", got)
	}
}

// TestApproxIndexMatchesModel drives the index and a plain model of it
// (one map of (key, replica) entries with their expiry and recency) with
// the same random records under a short TTL and a small MaxEntries, while
// replicas come and go (each gone replica's number is reused for a new
// one), and compares every match, the stats and the slots in use.
func TestApproxIndexMatchesModel(t *testing.T) {
	type ent struct {
		key     kvblock.Key
		replica index.ReplicaID
	}
	type val struct {
		expires int64
		seq     int
	}
	const ttl, maxEntries = 3 * time.Second, 300
	rng := rand.New(rand.NewPCG(11, 3))
	prompts := make([][]kvblock.Key, 8)
	for i := range prompts {
		prompts[i] = approxKeys(recordChunk+40, uint32(i%3)*7) // three shared heads
		for j := 20 + i; j < len(prompts[i]); j++ {
			prompts[i][j] ^= kvblock.Key(i+1) << 40
		}
	}
	x := NewApproxIndex(ApproxConfig{TTL: ttl, MaxEntries: maxEntries})
	model := map[ent]val{}
	var seq int
	var expired, evicted int64
	record := func(keys []kvblock.Key, r index.ReplicaID, now time.Time) {
		tn := now.UnixNano()
		for end := len(keys); end > 0; end -= recordChunk {
			for e, v := range model {
				if v.expires <= tn {
					delete(model, e)
					expired++
				}
			}
			chunk := keys[max(0, end-recordChunk):end]
			for i := len(chunk) - 1; i >= 0; i-- {
				seq++
				model[ent{chunk[i], r}] = val{tn + int64(ttl), seq}
			}
			for len(model) > maxEntries {
				var oldest ent
				least := seq + 1
				for e, v := range model {
					if v.seq < least {
						oldest, least = e, v.seq
					}
				}
				delete(model, oldest)
				evicted++
			}
		}
		x.Record(keys, r, now)
	}
	now := t0
	for i := range 3000 {
		now = now.Add(time.Duration(rng.IntN(40)) * time.Millisecond)
		// Replicas r<i/200>..: older ones stop being sent requests and
		// expire out of the index.
		r := index.ReplicaID(fmt.Sprint("r", i/200+rng.IntN(4)))
		p := prompts[rng.IntN(len(prompts))]
		record(p[:1+rng.IntN(len(p))], r, now)

		q := prompts[rng.IntN(len(prompts))]
		tn := now.UnixNano()
		want := map[index.ReplicaID]int{}
		holders := map[index.ReplicaID]bool{}
		for e := range model {
			holders[e.replica] = true
		}
		for r := range holders {
			n := 0
			for n < len(q) {
				if v, ok := model[ent{q[n], r}]; !ok || v.expires <= tn {
					break
				}
				n++
			}
			if n > 0 {
				want[r] = n
			}
		}
		if got := matchMap(t, x, q, now); !mapsEqual(got, want) {
			t.Fatalf("step %d: match %v, want %v", i, got, want)
		}
		keys := map[kvblock.Key]bool{}
		for e := range model {
			keys[e.key] = true
		}
		st := x.Stats()
		if st.Entries != len(model) || st.Keys != len(keys) || st.Expired != expired || st.Evicted != evicted {
			t.Fatalf("step %d: stats %+v, want %d entries, %d keys, %d expired, %d evicted", i, st, len(model), len(keys), expired, evicted)
		}
		if n := len(x.numbers); n != len(holders) {
			t.Fatalf("step %d: %d replica numbers for %d replicas holding entries", i, n, len(holders))
		}
	}
	if got, bound := len(x.ents), maxEntries+recordChunk+1; got > bound {
		t.Fatalf("%d slots for at most %d entries", got, bound)
	}
	if len(x.spare) == 0 {
		t.Fatal("no replica number was ever freed: the churn did not happen")
	}
}

func TestApproxRootDistinct(t *testing.T) {
	roots := []kvblock.Key{
		kvblock.Root(model, ""), kvblock.Root(model, "ad"), kvblock.Root("other", ""),
		approxRoot(model, "", false), approxRoot(model, "", true),
		approxRoot(model, "ad", false), approxRoot(model, "ad", true),
		approxRoot("other", "", false),
	}
	for i := range roots {
		if j := slices.Index(roots, roots[i]); j != i {
			t.Fatalf("root %d equals root %d", i, j)
		}
	}
}

func TestApproxIndexConcurrent(t *testing.T) {
	x := NewApproxIndex(ApproxConfig{MaxEntries: 64})
	keys := approxKeys(16, 1)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := index.ReplicaID(fmt.Sprint("r", w))
			for i := range 300 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				x.Record(keys[:1+i%16], r, now)
				for _, m := range x.Match(keys, now, nil) {
					if m.Blocks < 1 || m.Blocks > 16 {
						t.Errorf("match %+v", m)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if st := x.Stats(); st.Entries > 64 || st.Entries <= 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A Record landing between two chunks of a Match can take every entry of
// a replica the Match is following and hand its number to another
// replica: the Match then credits the first replica no further, never with
// the blocks the other holds.
func TestApproxIndexMatchAcrossRenumbering(t *testing.T) {
	keys := approxKeys(2*recordChunk, 5)
	x := NewApproxIndex(ApproxConfig{TTL: time.Minute, MaxEntries: 2 * recordChunk})
	x.Record(keys, "a", t0)
	once := false
	x.betweenChunks = func() {
		if once {
			return
		}
		once = true
		// b's whole record evicts all of a's entries and frees a's
		// number; c's then evicts b's and is given a's number.
		x.Record(keys, "b", t0.Add(time.Second))
		if _, ok := x.numbers["a"]; ok {
			t.Error("a kept its number")
		}
		x.Record(keys, "c", t0.Add(time.Second))
		if n, ok := x.numbers["c"]; !ok || n != 0 {
			t.Errorf("c got number %d (%v), want a's 0", n, ok)
		}
	}
	got := matchMap(t, x, keys, t0.Add(2*time.Second))
	if !once {
		t.Fatal("the match never crossed a chunk")
	}
	// a held the first chunk when the Match read it; c's blocks past it
	// are not a's.
	if !mapsEqual(got, map[index.ReplicaID]int{"a": recordChunk}) {
		t.Fatalf("match %v, want a: %d", got, recordChunk)
	}
}

// fedState marks which replicas have an event stream.
type fedState struct {
	*fakeState
	fed map[index.ReplicaID]bool
}

func (s fedState) EventFed(id index.ReplicaID) bool { return s.fed[id] }

func approxTokenizer(ids []uint32) Tokenizer {
	return tokenizerFunc(func(context.Context, string, TokenizeInput) (Tokens, error) {
		return Tokens{IDs: ids, Source: "approximate", Exact: false}, nil
	})
}

type approxRig struct {
	st  fedState
	ix  *index.Index
	ax  *ApproxIndex
	now time.Time
	rt  *Router
}

// newApproxRig: three replicas r0..r2 (r0 least loaded), none event-fed
// unless named, a 2-minute approximate index and a settable clock.
func newApproxRig(t *testing.T, tok Tokenizer, fed ...index.ReplicaID) *approxRig {
	t.Helper()
	g := &approxRig{st: fedState{fleet(3), map[index.ReplicaID]bool{}}, ix: index.New(index.Config{}), now: t0}
	for _, id := range fed {
		g.st.fed[id] = true
	}
	g.ax = NewApproxIndex(ApproxConfig{TTL: 2 * time.Minute})
	p, err := policy.New(policy.NameBlended, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	g.rt = New(Options{Matcher: g.ix, State: g.st, Policy: p, Tokenizer: tok, Seed: 1,
		Approx: g.ax, Now: func() time.Time { return g.now }})
	return g
}

// makeBusiest makes id the most loaded replica.
func (g *approxRig) makeBusiest(id index.ReplicaID) {
	g.st.loads[id] = load.Load{Healthy: true, ActivePrefillBlocks: 35}
}

func candidate(t *testing.T, d Decision, id index.ReplicaID) Candidate {
	t.Helper()
	for _, c := range d.Candidates {
		if c.Replica == id {
			return c
		}
	}
	t.Fatalf("no candidate %s in %+v", id, d)
	return Candidate{}
}

func TestDecideApproximateLearnsFromDispatch(t *testing.T) {
	prompt := seq(40*16, 3)
	g := newApproxRig(t, approxTokenizer(prompt))
	req := Request{Model: model, Input: TokenizeInput{Prompt: "x"}}
	d, err := g.rt.Decide(t.Context(), req)
	if err != nil || d.Replica != "r0" || d.Degraded != DegradedApproximateIndex || d.MatchedBlocks() != 0 {
		t.Fatalf("first: %+v %v", d, err)
	}
	if st := g.ax.Stats(); st.Entries != 40 {
		t.Fatalf("learned %+v, want 40 entries", st)
	}
	// r0 is now the busiest: without what it learned the request would go
	// to r1 (see the control below); with it, the prefix pulls it back.
	g.makeBusiest("r0")
	g.now = g.now.Add(time.Minute)
	d, err = g.rt.Decide(t.Context(), req)
	if err != nil || d.Replica != "r0" || d.Degraded != DegradedApproximateIndex || d.MatchedBlocks() != 40 {
		t.Fatalf("second: %+v %v", d, err)
	}
	if c := candidate(t, d, "r0"); !c.Approximate || c.Trust != DefaultApproxTrust || c.Matched[index.TierGPU] != 40 {
		t.Fatalf("r0 %+v", c)
	}
	if c := candidate(t, d, "r1"); !c.Approximate || c.Matched != [index.NumTiers]int{} {
		t.Fatalf("r1 %+v", c)
	}

	t.Run("control: a fresh index routes by load", func(t *testing.T) {
		h := newApproxRig(t, approxTokenizer(prompt))
		h.makeBusiest("r0")
		d, err := h.rt.Decide(t.Context(), req)
		if err != nil || d.Replica != "r1" || d.Degraded != DegradedApproximateIndex {
			t.Fatalf("%+v %v", d, err)
		}
	})
	t.Run("expiry forgets", func(t *testing.T) {
		g.now = g.now.Add(2*time.Minute + time.Second) // past the second dispatch's TTL
		d, err := g.rt.Decide(t.Context(), req)
		if err != nil || d.Replica != "r1" || d.MatchedBlocks() != 0 {
			t.Fatalf("%+v %v", d, err)
		}
		if c := candidate(t, d, "r0"); c.Matched != [index.NumTiers]int{} {
			t.Fatalf("r0 still matched: %+v", c)
		}
	})
}

func TestDecideApproximateNeverCreditsEventFed(t *testing.T) {
	prompt := seq(40*16, 3)
	g := newApproxRig(t, approxTokenizer(prompt), "r0")
	// r0 holds the prompt in the event-fed index and, under the approximate
	// root, in the dispatch-learned one: neither may count.
	store(t, g.ix, "r0", model, prompt, 16)
	g.ax.Record(kvblock.Keys(nil, approxRoot(model, "", false), prompt, 16, kvblock.Options{}), "r0", g.now)
	g.makeBusiest("r2")
	g.st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 30}
	before := g.ax.Stats()
	d, err := g.rt.Decide(t.Context(), Request{Model: model, Input: TokenizeInput{Prompt: "x"}})
	if err != nil || d.Replica != "r1" || d.Degraded != DegradedApproximateIndex {
		t.Fatalf("%+v %v", d, err)
	}
	if c := candidate(t, d, "r0"); c.Approximate || c.Trust != 0 || c.Matched != [index.NumTiers]int{} {
		t.Fatalf("event-fed r0 %+v", c)
	}
	if st := g.ax.Stats(); st.Entries != before.Entries+40 {
		t.Fatalf("the no-events pick r1 was not learned: %+v -> %+v", before, st)
	}

	t.Run("an event-fed pick is not learned", func(t *testing.T) {
		h := newApproxRig(t, approxTokenizer(prompt), "r0")
		d, err := h.rt.Decide(t.Context(), Request{Model: model, Input: TokenizeInput{Prompt: "x"}})
		if err != nil || d.Replica != "r0" {
			t.Fatalf("%+v %v", d, err)
		}
		if st := h.ax.Stats(); st.Entries != 0 {
			t.Fatalf("learned %+v", st)
		}
	})
	t.Run("all event-fed: approximate tokens are not matched", func(t *testing.T) {
		h := newApproxRig(t, approxTokenizer(prompt), "r0", "r1", "r2")
		store(t, h.ix, "r2", model, prompt, 16)
		d, err := h.rt.Decide(t.Context(), Request{Model: model, Input: TokenizeInput{Prompt: "x"}})
		if err != nil || d.Replica != "r0" || d.Degraded != DegradedApproximate || d.MatchedBlocks() != 0 {
			t.Fatalf("%+v %v", d, err)
		}
		if c := candidate(t, d, "r2"); c.Trust != 0 || c.Matched != [index.NumTiers]int{} {
			t.Fatalf("r2 %+v", c)
		}
	})
}

func TestExplainDoesNotLearn(t *testing.T) {
	prompt := seq(40*16, 3)
	g := newApproxRig(t, approxTokenizer(prompt))
	req := Request{Model: model, Input: TokenizeInput{Prompt: "x"}}
	for range 3 {
		d, err := g.rt.Explain(t.Context(), req)
		if err != nil || d.Replica != "r0" || d.Degraded != DegradedApproximateIndex {
			t.Fatalf("%+v %v", d, err)
		}
	}
	if st := g.ax.Stats(); st.Entries != 0 {
		t.Fatalf("explain learned %+v", st)
	}
	if _, err := g.rt.Decide(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	g.makeBusiest("r0")
	d, err := g.rt.Explain(t.Context(), req)
	if err != nil || d.Replica != "r0" || d.MatchedBlocks() != 40 {
		t.Fatalf("explain after a dispatch: %+v %v", d, err)
	}
	if st := g.ax.Stats(); st.Entries != 40 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDecideExactTokensLearnForNoEventReplicas(t *testing.T) {
	prompt := seq(40*16, 9)
	g := newApproxRig(t, nil, "r2")
	store(t, g.ix, "r2", model, prompt, 16) // event-fed, but busiest
	g.makeBusiest("r2")
	req := Request{Model: model, Tokens: prompt}
	d, err := g.rt.Decide(t.Context(), req)
	if err != nil || d.Replica != "r2" || d.Degraded != "" || d.MatchedBlocks() != 40 {
		t.Fatalf("events win: %+v %v", d, err)
	}
	if st := g.ax.Stats(); st.Entries != 0 {
		t.Fatalf("learned an event-fed pick: %+v", st)
	}
	// A new prompt goes to r0 by load and is learned for it.
	other := seq(40*16, 5000)
	if d, err = g.rt.Decide(t.Context(), Request{Model: model, Tokens: other}); err != nil || d.Replica != "r0" {
		t.Fatalf("%+v %v", d, err)
	}
	g.st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 30}
	d, err = g.rt.Decide(t.Context(), Request{Model: model, Tokens: other})
	if err != nil || d.Replica != "r0" || d.Degraded != "" || d.MatchedBlocks() != 40 {
		t.Fatalf("learned exact prefix: %+v %v", d, err)
	}
	if c := candidate(t, d, "r0"); !c.Approximate || c.Trust != DefaultApproxTrust {
		t.Fatalf("r0 %+v", c)
	}
	if c := candidate(t, d, "r2"); c.Approximate || c.Trust != 1 {
		t.Fatalf("event-fed r2 %+v", c)
	}
	// The same text tokenized approximately never meets the exact keys.
	h := g.rt
	h.opts.Tokenizer = approxTokenizer(other)
	d, err = h.Decide(t.Context(), Request{Model: model, Input: TokenizeInput{Prompt: "x"}})
	if err != nil || d.Degraded != DegradedApproximateIndex || d.MatchedBlocks() != 0 {
		t.Fatalf("approximate ids matched exact keys: %+v %v", d, err)
	}
}

func TestDecideWithoutEventFeedsNeverApproximates(t *testing.T) {
	prompt := seq(40*16, 3)
	ax := NewApproxIndex(ApproxConfig{})
	rt := New(Options{State: fleet(2), Tokenizer: approxTokenizer(prompt), Approx: ax})
	d, err := rt.Decide(t.Context(), Request{Model: model, Input: TokenizeInput{Prompt: "x"}})
	if err != nil || d.Degraded != DegradedApproximate {
		t.Fatalf("%+v %v", d, err)
	}
	if st := ax.Stats(); st.Entries != 0 {
		t.Fatalf("learned %+v", st)
	}
}

// A record longer than one chunk is matched whole, and MaxEntries still
// holds across chunks.
func TestApproxIndexRecordInChunks(t *testing.T) {
	keys := approxKeys(3*recordChunk+7, 9)
	x := NewApproxIndex(ApproxConfig{TTL: time.Minute})
	x.Record(keys, "a", t0)
	if got := matchMap(t, x, keys, t0); got["a"] != len(keys) {
		t.Fatalf("match %v, want a: %d", got, len(keys))
	}
	small := NewApproxIndex(ApproxConfig{TTL: time.Minute, MaxEntries: recordChunk})
	small.Record(keys, "a", t0)
	if st := small.Stats(); st.Entries != recordChunk || st.Evicted != int64(len(keys)-recordChunk) {
		t.Fatalf("stats %+v, want %d entries", st, recordChunk)
	}
	// Deepest first: what survives is the head, block 0 the most recent.
	if got := matchMap(t, small, keys, t0); got["a"] != recordChunk {
		t.Fatalf("match %v, want a: %d", got, recordChunk)
	}
}

// A staged record is matched from Stage on, before Commit writes it, and
// exactly as the committed record afterwards; expired, it matches nothing.
func TestApproxIndexStaged(t *testing.T) {
	keys := approxKeys(600, 3)
	sibling := append(slices.Clone(keys[:400]), approxKeys(10, 77)...)
	x := NewApproxIndex(ApproxConfig{TTL: 5 * time.Second})
	x.Record(keys[:100], "a", t0)
	st := x.Stage(keys, "b", t0)
	st2 := x.Stage(keys[:300], "a", t0)
	want := map[index.ReplicaID]int{"a": 300, "b": 400}
	if got := matchMap(t, x, sibling, t0.Add(time.Second)); !maps.Equal(got, want) {
		t.Fatalf("staged: match %v, want %v", got, want)
	}
	if got := matchMap(t, x, sibling, t0.Add(6*time.Second)); len(got) != 0 {
		t.Fatalf("expired staged records match %v", got)
	}
	x.Commit(st)
	x.Commit(st2)
	if got := matchMap(t, x, sibling, t0.Add(time.Second)); !maps.Equal(got, want) {
		t.Fatalf("committed: match %v, want %v", got, want)
	}
	if n := len(x.staged); n != 0 {
		t.Fatalf("%d staged records left after commit", n)
	}
	// A record whose Commit never comes is dropped by a Stage past its TTL.
	x.Stage(keys, "c", t0)
	x.Stage(keys[:1], "d", t0.Add(5*time.Second))
	if n := len(x.staged); n != 1 || x.staged[0].replica != "d" {
		t.Fatalf("staged after the TTL: %d records, want d's alone", n)
	}
}

// Stages, commits and matches from many goroutines (run with -race): every
// decision's own staged record is visible to its next match.
func TestApproxIndexStagedConcurrent(t *testing.T) {
	x := NewApproxIndex(ApproxConfig{TTL: time.Minute})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				keys := approxKeys(recordChunk+50, uint32(g*1000+i))
				rep := index.ReplicaID(fmt.Sprint("r", g))
				st := x.Stage(keys, rep, t0)
				if got := x.Match(keys, t0, nil); !slices.ContainsFunc(got, func(m index.ReplicaMatch) bool { return m.Replica == rep && m.Blocks == len(keys) }) {
					t.Errorf("own staged record not matched: %v", got)
					return
				}
				x.Commit(st)
			}
		})
	}
	wg.Wait()
	if n := len(x.staged); n != 0 {
		t.Fatalf("%d staged records left", n)
	}
}

// The approximate mode records a long prompt at grid positions only and
// matches it whole; a prompt sharing part of it is credited up to the last
// grid position inside the shared part.
func TestApproxGrid(t *testing.T) {
	for _, n := range []int{1, 63, 64, 65, 80, 1023, 1024, 1025, 3500} {
		keys := approxKeys(n, 5)
		grid := approxGrid(nil, keys)
		if approxGridBlocks(len(grid), n) != n {
			t.Fatalf("n=%d: the whole grid covers %d blocks", n, approxGridBlocks(len(grid), n))
		}
		if n >= 3500 && len(grid) > n/15 {
			t.Fatalf("n=%d: %d grid keys", n, len(grid))
		}
	}
	x := NewApproxIndex(ApproxConfig{})
	long := approxKeys(3500, 5)
	x.Record(approxGrid(nil, long), "a", t0)
	m := approxMatcher{x, t0, new([]kvblock.Key)}
	whole := m.Match(long, nil)
	if len(whole) != 1 || whole[0].Blocks != 3500 || whole[0].ByTier[index.TierGPU] != 3500 {
		t.Fatalf("the recorded prompt matched %+v, want a: 3500", whole)
	}
	for _, tc := range []struct{ shared, want int }{
		{40, 40},     // dense head: exact
		{100, 96},    // grid step 16 below 1024 blocks: 95 is the last grid block inside
		{2000, 1984}, // grid step 64 beyond: 1983
		{3500, 3456}, // a longer prompt sharing all of it: the recorded last block is not on its grid, 3455 is
	} {
		other := append(slices.Clone(long[:tc.shared]), approxKeys(50, 9000)...)
		if got := m.Match(other, nil); len(got) != 1 || got[0].Blocks != tc.want {
			t.Errorf("sharing %d blocks: matched %+v, want a: %d", tc.shared, got, tc.want)
		}
	}
}
