//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/bench/live"
	"github.com/kvroute/kvroute/pkg/testbed"
)

// TestLiveBench runs what `kvbench live -stack` runs, small: it starts 4
// enginesims on the Qwen3 tokenizer, kvroute with its default tokenizer
// (kind auto, finding the files in a search directory) behind Envoy and a
// round-robin Envoy, and runs two repetitions in alternating order. Every
// request of every run succeeds and is routed by kvroute on its local
// tokenizer (no fallbacks, not demoted), kvroute's runs find the sessions'
// histories cached more often than round robin's, and the report keeps
// each run's slowest requests with the engine that served them. Then the
// same with both arms at once, round robin on 4 engines of its own.
func TestLiveBench(t *testing.T) {
	root, dir := qwen3Tokenizer(t)
	w := sharedPromptSessions(4, 200)
	for _, parallel := range []bool{false, true} {
		reps := 2
		if parallel {
			reps = 1
		}
		rep, err := live.Bench(t.Context(), live.BenchOptions{
			Root: root, Bin: filepath.Dir(bins.KVRoute), Engines: 4, EngineSpeed: 10,
			EngineArgs: []string{"--max-model-len", "16384"}, TokenizerDir: dir, Reps: reps, Parallel: parallel,
			Workload: func(int) (*bench.Workload, uint64, error) { return w, 1, nil },
			Run:      live.Options{Model: "sim-model", Timeout: 30 * time.Second},
			Log:      testLog{t},
		})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Tokenizer != live.TokenizerLocal || rep.Demoted || len(rep.Reps) != reps || rep.Parallel != parallel {
			t.Fatalf("tokenizer %s, demoted %v, %d reps, parallel %v", rep.Tokenizer, rep.Demoted, len(rep.Reps), rep.Parallel)
		}
		for i, r := range rep.Reps {
			want := []string{"kvroute first", "round robin first"}[i]
			if parallel {
				want = "parallel"
			}
			if r.Order != want {
				t.Errorf("rep %d order %q, want %q", r.Rep, r.Order, want)
			}
			k, o := r.KVRoute.Summary, r.RoundRobin.Summary
			if k.Requests != w.Requests() || k.Errors != 0 || o.Requests != w.Requests() || o.Errors != 0 {
				t.Fatalf("rep %d: kvroute %+v, round robin %+v", r.Rep, k, o)
			}
			rs := r.KVRoute.Router
			if rs == nil || rs.Decisions != float64(w.Requests()) || rs.Fallbacks != 0 || rs.TokenizeMean <= 0 {
				t.Errorf("rep %d: kvroute's own figures %+v, want %d decisions on the local tokenizer", r.Rep, rs, w.Requests())
			}
			if k.HitRate <= o.HitRate || k.HitRate < 0.5 {
				t.Errorf("rep %d: hit rate kvroute %.3f, round robin %.3f", r.Rep, k.HitRate, o.HitRate)
			}
			if r.P99Ratio <= 0 || len(r.KVRoute.Worst) != 5 || r.KVRoute.Worst[0].Upstream == "" || r.KVRoute.Worst[0].TTFT < r.KVRoute.Worst[4].TTFT {
				t.Errorf("rep %d: p99 ratio %v, worst %+v", r.Rep, r.P99Ratio, r.KVRoute.Worst)
			}
		}
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Logf("%s", p)
	return len(p), nil
}

// qwen3Tokenizer is the repository's root and the Qwen3 tokenizer files'
// directory the live runs give their engines and kvroute.
func qwen3Tokenizer(t *testing.T) (root, dir string) {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir = os.Getenv("KVROUTE_TOKENIZER_CACHE")
	if dir == "" {
		dir = filepath.Join(root, ".cache", "tokenizers")
	}
	dir = filepath.Join(dir, "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatalf("Qwen3 tokenizer files missing (%v): run `make fixtures`", err)
	}
	return root, dir
}
