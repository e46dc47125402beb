//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// TestMultiTurnSessionsStick: under light load, later turns of a session
// land on the replica holding their history, and the engine confirms the hit.
func TestMultiTurnSessionsStick(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	// 11 sessions: not a multiple of the replica count, so round robin
	// cannot pass by accident.
	later, stuck, confirmed := stickSessions(t, c, "agent", 11, 5, false)
	t.Logf("later turns: %d, on the history's replica: %d, cache hit confirmed: %d", later, stuck, confirmed)
	if stuck*10 < later*9 {
		t.Errorf("only %d of %d later turns landed on the replica holding their history (want >= 90%%)", stuck, later)
	}
	if confirmed*10 < later*9 {
		t.Errorf("cached_tokens confirmed the history hit for only %d of %d later turns", confirmed, later)
	}
}

// stickSessions drives sessions chat sessions of turns turns through c, one
// turn of each session in turn, each turn appending a user message and the
// answer (keyed: with an x-session-id header per session). It counts the
// later turns, those that landed on their previous turn's replica, and of
// those the ones whose cached tokens confirm the history hit (all of the
// previous prompt but its last partial block).
func stickSessions(t *testing.T, c *cluster, name string, sessions, turns int, keyed bool) (later, stuck, confirmed int) {
	t.Helper()
	ctx := t.Context()
	hist := make([][]message, sessions)
	last := make([]result, sessions)
	for s := range sessions {
		hist[s] = []message{{Role: "system", Content: prompt(fmt.Sprintf("%s%d", name, s), 40)}}
	}
	for turn := range turns {
		for s := range sessions {
			hist[s] = append(hist[s], message{Role: "user", Content: prompt(fmt.Sprintf("%s%d-t%d", name, s, turn), 25)})
			var hdr map[string]string
			if keyed {
				hdr = map[string]string{"x-session-id": fmt.Sprint(name, "-", s)}
			}
			r := c.chat(ctx, hist[s], 8, hdr)
			if r.err != nil || r.status != 200 {
				t.Fatalf("session %d turn %d: %d %v %s", s, turn, r.status, r.err, r.body)
			}
			if turn > 0 {
				later++
				if r.upstream == last[s].upstream {
					stuck++
					if r.cached >= last[s].prompt-16 && r.cached > 0 {
						confirmed++
					}
				}
			}
			last[s] = r
			hist[s] = append(hist[s], message{Role: "assistant", Content: r.text})
		}
	}
	return later, stuck, confirmed
}

// TestSharedSystemPromptDoesNotHerd: one long system prompt shared by every
// request, cached on one replica first, then a concurrent burst of 64 from
// 16 clients: the router must spread the burst instead of sending it all
// to the cache holder. It runs the router's default policy (kvroute).
// Here the prompt's prefill (~3.4k tokens) is long against a decode step,
// and the holder's hits leave no prefill queue, so the prediction rightly
// finds the holder faster for every request, while the other replicas are
// still prefilling the prompt for their first requests. What spreads the
// burst is kvroute's prefix share bound: once the prompt drew 2N or more
// placements within about a second, a replica that took 1.25/N of them is
// passed over (N = 4; route's prefix memory). Decisions see each other's
// in-flight charge (route.Options.Tracker), so concurrent requests do not
// all read the same idle fleet.
func TestSharedSystemPromptDoesNotHerd(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	ctx := t.Context()
	sys := message{Role: "system", Content: prompt("shared-system", 200)}
	first := c.chat(ctx, []message{sys, {Role: "user", Content: "warm up"}}, 4, nil)
	if first.err != nil || first.status != 200 {
		t.Fatalf("warm-up: %d %v %s", first.status, first.err, first.body)
	}
	probe, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": []message{sys, {Role: "user", Content: "x"}}})
	waitFor(t, 20*time.Second, "the index to learn the system prompt", func() bool {
		m, err := c.matched(probe)
		return err == nil && m[first.upstream] > 0
	})

	const total, workers = 64, 16
	counts := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan string, total)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r := c.chat(ctx, []message{sys, {Role: "user", Content: prompt(fmt.Sprintf("question%d", i), 20)}}, 48, nil)
				if r.err != nil || r.status != 200 {
					errs <- fmt.Sprintf("request %d: %d %v %s", i, r.status, r.err, r.body)
					continue
				}
				mu.Lock()
				counts[r.upstream]++
				mu.Unlock()
			}
		}()
	}
	for i := range total {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	t.Logf("placement: %v (first cached on %s)", counts, first.upstream)
	for up, n := range counts {
		if n*10 > total*4 {
			t.Errorf("replica %s took %d of %d requests (> 40%%): herding", up, n, total)
		}
	}
}

// call is one request's timing and outcome.
type call struct {
	start, end time.Time
	status     int
	err        error
	upstream   string
}

// TestReplicaKilledMidRun: after a replica dies, requests stop failing
// within a second, and its blocks leave the index.
func TestReplicaKilledMidRun(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	ctx := t.Context()
	victim := c.engines[0]
	// Give the victim some cache, directly, so that it is in the index.
	warm, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": []message{{Role: "user", Content: prompt("victim", 100)}}, "max_tokens": 2})
	resp, err := httpc.Post("http://"+victim.addr()+"/v1/chat/completions", "application/json", strings.NewReader(string(warm)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, 20*time.Second, "the victim's blocks in the index", func() bool {
		m, err := c.matched(warm)
		return err == nil && m[victim.addr()] > 0
	})

	var mu sync.Mutex
	var calls []call
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; runCtx.Err() == nil; i++ {
				// Sessions with history on every replica, the victim's included.
				body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 8, "messages": []message{
					{Role: "user", Content: prompt(fmt.Sprintf("w%d-s%d", w, i%6), 60)},
				}})
				cl := call{start: time.Now()}
				r := c.post(ctx, "/v1/chat/completions", body, nil)
				cl.end, cl.status, cl.err, cl.upstream = time.Now(), r.status, r.err, r.upstream
				mu.Lock()
				calls = append(calls, cl)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(2 * time.Second)
	victim.Proc.Kill()
	killedAt := time.Now()
	time.Sleep(4 * time.Second)
	stop()
	wg.Wait()

	var before, after, failedLate int
	var victimBefore int
	for _, cl := range calls {
		if cl.start.Before(killedAt) {
			before++
			if cl.upstream == victim.addr() {
				victimBefore++
			}
			continue
		}
		after++
		failed := cl.err != nil || cl.status != 200
		if failed && cl.start.After(killedAt.Add(time.Second)) {
			failedLate++
			t.Errorf("request started %v after the kill failed: status %d, err %v", cl.start.Sub(killedAt).Round(time.Millisecond), cl.status, cl.err)
		}
		if !failed && cl.upstream == victim.addr() {
			t.Errorf("request started %v after the kill was served by the dead replica?", cl.start.Sub(killedAt))
		}
	}
	t.Logf("requests before the kill: %d (%d on the victim), after: %d", before, victimBefore, after)
	if after < 10 {
		t.Fatalf("only %d requests after the kill: the workload stalled", after)
	}
	if victimBefore == 0 {
		t.Fatalf("the victim served nothing before the kill: the test proves nothing")
	}
	waitFor(t, 20*time.Second, "the dead replica's blocks to leave the index", func() bool {
		m, err := c.matched(warm)
		return err == nil && m[victim.addr()] == 0 && c.indexReplicas() == 3
	})
	if st := c.replicas()[victim.addr()]; st.Healthy {
		t.Errorf("the dead replica is still reported healthy: %+v", st)
	}
}

// TestReplicaRestartRelearned: an engine restarted (sequence numbers from
// 0, an empty cache) has its index entries cleared, never yields phantom
// hits, and is relearned from its new events.
func TestReplicaRestartRelearned(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	e := c.engines[1]
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": []message{{Role: "user", Content: prompt("restart", 100)}}, "max_tokens": 2})
	direct := func() result {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://"+e.addr()+"/v1/chat/completions", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := httpc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct{ Usage usage }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		r := result{status: resp.StatusCode, prompt: out.Usage.PromptTokens}
		if d := out.Usage.PromptTokensDetails; d != nil {
			r.cached = d.CachedTokens
		}
		return r
	}
	direct()
	waitFor(t, 20*time.Second, "the prompt's blocks indexed on the replica", func() bool {
		m, err := c.matched(body)
		return err == nil && m[e.addr()] > 0
	})

	// Restart at once, with another seed: new block hashes, sequence from 0.
	e.Proc.Kill()
	e.seed += 1000
	e.start(t)
	waitFor(t, 30*time.Second, "the restarted replica healthy, caught up and cleared", func() bool {
		st, ok := c.replicas()[e.addr()]
		m, err := c.matched(body)
		return ok && st.Healthy && st.Warm && err == nil && m[e.addr()] == 0
	})
	// No phantom hit comes back: the index stays empty for the prompt while
	// nothing is sent, and the engine agrees its cache is empty.
	for range 10 {
		if m, err := c.matched(body); err != nil || m[e.addr()] != 0 {
			t.Fatalf("phantom hit after the restart: %v %v", m, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := direct(); r.cached != 0 {
		t.Fatalf("the restarted engine served %d cached tokens: it was not reset", r.cached)
	}
	// Relearned from the new engine's events, and the hit is real.
	waitFor(t, 20*time.Second, "the prompt relearned on the restarted replica", func() bool {
		m, err := c.matched(body)
		return err == nil && m[e.addr()] > 0
	})
	c.waitPick(t, body, e.addr())
	r := c.post(t.Context(), "/v1/chat/completions", body, nil)
	if r.err != nil || r.status != 200 || r.upstream != e.addr() || r.cached == 0 {
		t.Fatalf("through Envoy: status %d err %v upstream %s (want %s) cached %d", r.status, r.err, r.upstream, e.addr(), r.cached)
	}
}

// TestFailOpenAndResume: with kvroute stopped, Envoy keeps serving on its
// round-robin route; when kvroute returns it relearns the engines' caches
// from their replay buffers and cache-aware routing resumes.
func TestFailOpenAndResume(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	ctx := t.Context()
	msgs := []message{{Role: "user", Content: prompt("resume", 150)}}
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 4})
	first := c.chat(ctx, msgs, 4, nil)
	if first.err != nil || first.status != 200 {
		t.Fatalf("warm-up: %d %v %s", first.status, first.err, first.body)
	}
	holder := first.upstream

	if err := c.kv.Proc.Stop(testbed.StopGrace); err != nil {
		t.Error(err)
	}
	if err := c.kv.Proc.Err(); err != nil {
		t.Errorf("kvroute did not exit cleanly on SIGTERM: %v", err)
	}
	seen := map[string]int{}
	for i := range 12 {
		r := c.chat(ctx, []message{{Role: "user", Content: prompt(fmt.Sprintf("open%d", i), 30)}}, 4, nil)
		if r.err != nil || r.status != 200 {
			t.Fatalf("request %d with kvroute down: %d %v %s", i, r.status, r.err, r.body)
		}
		seen[r.upstream]++
	}
	if len(seen) < 2 {
		t.Errorf("fail-open traffic went to %v: want the round-robin fallback over several replicas", seen)
	}

	c.startKVRoute()
	c.waitExtProcHealthy(true)
	if m, err := c.matched(body); err != nil || m[holder] == 0 {
		t.Fatalf("after the restart the index does not know the holder's blocks (replay): %v %v", m, err)
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i := range 4 {
		c.waitPick(t, body, holder)
		r := c.chat(ctx, msgs, 4, nil)
		if r.err != nil || r.status != 200 {
			t.Fatalf("request %d after the restart: %d %v %s", i, r.status, r.err, r.body)
		}
		if r.upstream != holder || r.cached == 0 {
			t.Fatalf("request %d after the restart went to %s with %d cached tokens, want the holder %s (fail-open saw %v)", i, r.upstream, r.cached, holder, keys)
		}
	}
}
