package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kvbench runs the command line and returns stdout, failing on a non-zero
// exit.
func kvbench(t *testing.T, args ...string) []byte {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("kvbench %v: exit %d: %s", args, code, errb.String())
	}
	return out.Bytes()
}

// A small sim: two workloads, three policies, 4 replicas.
var smallSim = []string{"sim", "-workload", "herding,chat", "-size", "0.02", "-replicas", "4",
	"-gpu-blocks", "4096", "-cpu-blocks", "0", "-policies", "roundrobin,pureaffinity,kvroute", "-q", "-seed", "3"}

// The same seed gives the same numbers, byte for byte; another seed does
// not.
func TestSimDeterministic(t *testing.T) {
	args := append(append([]string(nil), smallSim...), "-json", "-no-plots")
	a := kvbench(t, args...)
	b := kvbench(t, args...)
	if !bytes.Equal(a, b) {
		t.Fatalf("two runs with the same seed differ:\n%s\n---\n%s", a, b)
	}
	var rep SimReport
	if err := json.Unmarshal(a, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Workloads) != 2 || len(rep.Workloads[0].Results) != 3 {
		t.Fatalf("report shape %+v", rep)
	}
	for _, wt := range rep.Workloads {
		for _, s := range wt.Results {
			if s.Requests != wt.Requests || s.TTFTP99 < s.TTFTP50 || s.HitRate > s.Ceiling+1e-9 {
				t.Fatalf("%s/%s: %+v", wt.Workload, s.Policy, s)
			}
		}
	}
	args[len(args)-3] = "4" // -seed 4
	if c := kvbench(t, args...); bytes.Equal(a, c) {
		t.Fatal("another seed gave the same numbers")
	}
}

func TestSimTableAndPlots(t *testing.T) {
	dir := t.TempDir()
	out := string(kvbench(t, append(append([]string(nil), smallSim...), "-out", dir)...))
	for _, want := range []string{"### herding", "### chat", "| kvroute |", "| pureaffinity |", "hit/ceiling"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"herding-ttft-cdf.png", "herding-ttft-cdf.svg", "herding-hit.png", "chat-hit.svg", "chat-load-kvroute.png", "herding-load-roundrobin.svg"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Size() < 1000 {
			t.Errorf("figure %s: %v", f, err)
		}
	}
}

func TestSimBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}`+"\n"+`{"timestamp": 1, "input_length": 10}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"sim", "-trace", bad, "-no-plots"}, 1, "line 2: missing output_length"},
		{[]string{"sim", "-workload", "nope", "-no-plots"}, 2, "unknown"},
		{[]string{"sim", "-policies", "nope", "-no-plots", "-workload", "herding"}, 2, "unknown"},
		{[]string{"sim", "-knobs", "kvroute.nope=1", "-no-plots", "-workload", "herding"}, 2, "no knob"},
		{[]string{"tune", "-policy", "roundrobin", "-workload", "herding"}, 2, "no tunable knobs"},
		{[]string{"tune", "-objective", "nope", "-workload", "herding"}, 2, "objective"},
		{[]string{"live", "-workload", "herding,chat"}, 2, "one workload"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tt.args, &out, &errb); code != tt.code || !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)", code, tt.code, errb.String(), tt.want)
			}
		})
	}
}

func TestTuneSmall(t *testing.T) {
	out := kvbench(t, "tune", "-workload", "herding", "-size", "0.02", "-replicas", "4", "-gpu-blocks", "4096",
		"-cpu-blocks", "0", "-policy", "hardswitch", "-objective", "ttft_mean", "-rounds", "1", "-q", "-json")
	var res []struct {
		Default, Best float64
		Sensitivity   []struct{ Scores []float64 }
		Evaluations   int
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Best > res[0].Default || len(res[0].Sensitivity) != 3 || res[0].Evaluations < 10 {
		t.Fatalf("tune result %s", out)
	}
	for _, k := range res[0].Sensitivity {
		for _, s := range k.Scores {
			if s < res[0].Best-1e-9 {
				t.Fatalf("sweep found %v below the reported best %v", s, res[0].Best)
			}
		}
	}
}

func TestLiveAgainstFakeStack(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			MaxTokens int `json:"max_tokens"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "text/event-stream")
		for range req.MaxTokens {
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	out := kvbench(t, "live", "-url", srv.URL, "-compare-url", srv.URL, "-workload", "herding", "-size", "0.002", "-speed", "1000", "-json")
	var rep LiveReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Primary.Requests != 3 || rep.Primary.Errors != 0 || rep.Compare == nil || rep.Compare.Requests != 3 || rep.Added == nil {
		t.Fatalf("live report %s", out)
	}
}
