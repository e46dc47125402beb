//go:build e2e

package e2e

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/bench/live"
)

// TestLiveBenchMessages runs what `kvbench live -stack -api messages`
// runs, small: agent sessions sent to enginesim's /v1/messages as Claude
// Code sends them, through kvroute and through round robin at once. Every
// request succeeds; kvroute counts each prompt exactly as the engine that
// served it does (its decisions' prompt tokens are the requests' usage,
// input plus cache read and written), on its local tokenizer; the
// sessions are keyed by their header, or by their metadata.user_id
// session on a first turn and their opening after it, a keyless decision
// only for a first turn without identity; and kvroute's runs find the histories cached more often than
// round robin's.
func TestLiveBenchMessages(t *testing.T) {
	root, dir := qwen3Tokenizer(t)
	w := agentSessions()
	rep, err := live.Bench(t.Context(), live.BenchOptions{
		Root: root, Bin: filepath.Dir(bins.KVRoute), Engines: 4, EngineSpeed: 10,
		EngineArgs: []string{"--max-model-len", "16384"}, TokenizerDir: dir, Reps: 1, Parallel: true, Requests: true,
		Workload: func(int) (*bench.Workload, uint64, error) { return w, 1, nil },
		Run:      live.Options{Model: "sim-model", Timeout: 30 * time.Second, API: live.APIMessages},
		Log:      testLog{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.API != live.APIMessages || rep.Tokenizer != live.TokenizerLocal || rep.Demoted || len(rep.Reps) != 1 {
		t.Fatalf("api %s, tokenizer %s, demoted %v, %d reps", rep.API, rep.Tokenizer, rep.Demoted, len(rep.Reps))
	}
	r := rep.Reps[0]
	k, o := r.KVRoute.Summary, r.RoundRobin.Summary
	if k.Requests != w.Requests() || k.Errors != 0 || o.Requests != w.Requests() || o.Errors != 0 {
		t.Fatalf("kvroute %+v, round robin %+v", k, o)
	}
	if rs := r.KVRoute.Router; rs == nil || rs.Decisions != float64(w.Requests()) || rs.Fallbacks != 0 {
		t.Fatalf("kvroute's own figures %+v, want %d decisions on the local tokenizer", rs, w.Requests())
	}
	var served, decided []int
	for _, q := range r.KVRoute.Requests {
		served = append(served, q.PromptTokens)
	}
	kinds := map[string]int{}
	for _, raw := range r.KVRoute.Decisions {
		var d struct {
			Decision struct {
				PromptTokens string `json:"prompt_tokens"`
				TokenSource  string `json:"token_source"`
				Session      string `json:"session"`
			} `json:"decision"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(d.Decision.PromptTokens)
		decided = append(decided, n)
		kind, _, ok := strings.Cut(d.Decision.Session, ":")
		switch {
		case d.Decision.Session == "":
			kind = "keyless"
		case !ok:
			kind = "header"
		}
		kinds[kind]++
		if d.Decision.TokenSource != "local" {
			t.Errorf("a decision on tokens from %q", d.Decision.TokenSource)
		}
	}
	slices.Sort(served)
	slices.Sort(decided)
	if !slices.Equal(served, decided) {
		t.Errorf("kvroute's prompt tokens %v, the engines' %v", decided, served)
	}
	// Two sessions of each habit, four turns each: the header's all its
	// turns; Claude Code's session in metadata.user_id a first turn's
	// (as prompt_cache_key), later turns their opening's, as a keyless
	// session's later turns.
	if kinds["header"] != 8 || kinds["pck"] != 2 || kinds["keyless"] != 2 || kinds["conv"] != 12 {
		t.Errorf("decisions by session kind %v, want 8 header, 2 pck and 2 keyless first turns, and 12 conv", kinds)
	}
	if k.HitRate <= o.HitRate || k.HitRate < 0.5 {
		t.Errorf("hit rate kvroute %.3f, round robin %.3f", k.HitRate, o.HitRate)
	}
}

// agentSessions are 6 agent sessions of 4 turns over one shared 400-token
// harness prompt, two with a session header, two with a user and two with
// neither, starting 20 ms apart: a 100-token task, 300-token tool outputs,
// 8 output tokens, 50 ms between turns.
func agentSessions() *bench.Workload {
	w := &bench.Workload{Name: "e2e-agents"}
	for s := range 6 {
		id := "agents-" + strconv.Itoa(s)
		sess := bench.Session{ID: id, Start: time.Duration(s) * 20 * time.Millisecond}
		switch s % 3 {
		case 0:
			sess.Key = id
		case 1:
			sess.User = "user-" + id
		}
		for turn := range 4 {
			tu := bench.Turn{Append: []bench.Segment{{ID: uint64(1000*s + turn + 1), Len: 300}}, Output: 8}
			if turn == 0 {
				tu.Append = []bench.Segment{{ID: 7, Len: 400}, {ID: uint64(1000*s + 999), Len: 100}}
			} else {
				tu.Gap = 50 * time.Millisecond
			}
			sess.Turns = append(sess.Turns, tu)
		}
		w.Sessions = append(w.Sessions, sess)
	}
	return w
}
