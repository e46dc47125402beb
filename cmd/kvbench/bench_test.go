package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/policy"
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

// The same seeds give the same numbers, byte for byte, whether the cases
// run one at a time or in parallel; other seeds do not.
func TestSimDeterministic(t *testing.T) {
	args := append(append([]string(nil), smallSim...), "-json", "-no-plots", "-seeds", "3-4")
	a := kvbench(t, append(args, "-parallel", "1")...)
	b := kvbench(t, append(args, "-parallel", "3")...)
	if !bytes.Equal(a, b) {
		t.Fatalf("sequential and parallel runs differ:\n%s\n---\n%s", a, b)
	}
	var rep SimReport
	if err := json.Unmarshal(a, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Workloads) != 2 || len(rep.Workloads[0].Results) != 3 || !slices.Equal(rep.Seeds, []uint64{3, 4}) {
		t.Fatalf("report shape %+v", rep)
	}
	for _, wt := range rep.Workloads {
		for _, a := range wt.Results {
			if len(a.PerSeed) != 2 || a.TTFTP99.Median < a.TTFTP50.Median || a.HitRate.Max > a.Ceiling.Max+1e-9 ||
				a.TTFTMean.Min > a.TTFTMean.Median || a.TTFTMean.Median > a.TTFTMean.Max {
				t.Fatalf("%s/%s: %+v", wt.Workload, a.Policy, a)
			}
			for _, s := range a.PerSeed {
				if s.Policy != a.Policy || s.Workload != wt.Workload {
					t.Fatalf("per-seed summary %+v under %s/%s", s, wt.Workload, a.Policy)
				}
			}
		}
	}
	c := kvbench(t, append(append([]string(nil), smallSim...), "-json", "-no-plots", "-seeds", "5-6")...)
	if bytes.Equal(a, c) {
		t.Fatal("other seeds gave the same numbers")
	}
}

// -trace-windows gives each seed its own window of the trace; without it
// every seed replays the same first -limit requests.
func TestSimTraceWindows(t *testing.T) {
	var lines []string
	for i := range 10 {
		n := 512 * (i + 1)
		ids := make([]string, i+1)
		for k := range ids {
			ids[k] = fmt.Sprint(100*i + k)
		}
		lines = append(lines, fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": 4, "hash_ids": [%s]}`, 1000*i, n, strings.Join(ids, ", ")))
	}
	tr := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(tr, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	means := func(extra ...string) []float64 {
		args := append([]string{"sim", "-trace", tr, "-limit", "3", "-seeds", "1-2", "-replicas", "2", "-policies", "roundrobin",
			"-q", "-json", "-no-plots"}, extra...)
		var rep SimReport
		if err := json.Unmarshal(kvbench(t, args...), &rep); err != nil {
			t.Fatal(err)
		}
		var out []float64
		for _, s := range rep.Workloads[0].Results[0].PerSeed {
			if s.Requests != 3 {
				t.Fatalf("%d requests a seed, want 3", s.Requests)
			}
			out = append(out, s.TTFTMean)
		}
		return out
	}
	if m := means(); m[0] != m[1] {
		t.Errorf("without windows the seeds replayed different requests: mean TTFT %v", m)
	}
	// Seed 2's window starts at request 4 (frac(0.618...) of 8 starts):
	// longer prompts than seed 1's first three.
	var rep SimReport
	if err := json.Unmarshal(kvbench(t, "sim", "-trace", tr, "-limit", "3", "-trace-windows", "-policies", "roundrobin", "-q", "-json", "-no-plots"), &rep); err != nil || !rep.TraceWindows {
		t.Errorf("the report does not say the trace was windowed (err %v)", err)
	}
	if m := means("-trace-windows"); !(m[1] > m[0]) {
		t.Errorf("seed 2's window (longer prompts) is not slower than seed 1's: mean TTFT %v", m)
	}
}

// -util sets each workload's offered prefill utilization.
func TestSimUtil(t *testing.T) {
	out := kvbench(t, "sim", "-workload", "herding,chat", "-duration", "20s", "-replicas", "4", "-gpu-blocks", "4096",
		"-cpu-blocks", "0", "-policies", "roundrobin", "-q", "-json", "-no-plots", "-util", "0.5,1.1")
	var rep SimReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Workloads) != 4 {
		t.Fatalf("%d tables, want 2 workloads x 2 utils", len(rep.Workloads))
	}
	for _, wt := range rep.Workloads {
		if math.Abs(wt.OfferedUtil-wt.Util) > 0.005*wt.Util || (wt.Util != 0.5 && wt.Util != 1.1) {
			t.Errorf("%s: util %v, offered %v", wt.Workload, wt.Util, wt.OfferedUtil)
		}
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
		// A live fleet is real: the simulated fleet's flags are refused,
		// not accepted and ignored.
		{[]string{"live", "-workload", "herding", "-speed-change", "1@30s:0.33"}, 2, "-speed-change"},
		{[]string{"live", "-workload", "herding", "-gpu-blocks", "3072"}, 2, "-gpu-blocks"},
		// A live stack slows its own engines, by enginesim's flags.
		{[]string{"live", "-stack", "-workload", "herding", "-slow-engine", "1@30s"}, 2, "replica@time:speed"},
		// The Messages API carries text.
		{[]string{"live", "-workload", "herding", "-api", "chat"}, 2, "-api"},
		{[]string{"live", "-workload", "herding", "-api", "messages", "-token-ids"}, 2, "sends text"},
		{[]string{"live", "-stack", "-workload", "herding", "-api", "messages", "-tokenizer", "ids"}, 2, "sends text"},
		{[]string{"sim", "-seeds", "3-1", "-workload", "herding"}, 2, "reversed"},
		{[]string{"sim", "-util", "0.5,x", "-workload", "herding"}, 2, "not a utilization"},
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

// -api messages sends /v1/messages and reads Anthropic's event stream.
func TestLiveMessagesAgainstFakeStack(t *testing.T) {
	var paths sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths.Store(r.URL.Path, true)
		var req struct {
			MaxTokens int `json:"max_tokens"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":0}}}\n\n")
		for range req.MaxTokens {
			fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n")
		}
		fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":2,\"output_tokens\":1,\"cache_read_input_tokens\":8,\"cache_creation_input_tokens\":0}}\n\n")
		fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	out := kvbench(t, "live", "-url", srv.URL, "-api", "messages", "-workload", "herding", "-size", "0.002", "-speed", "1000", "-json")
	var rep LiveReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if _, ok := paths.Load("/v1/messages"); !ok || rep.Primary.Requests != 3 || rep.Primary.Errors != 0 || rep.Primary.HitRate != 0.8 {
		t.Fatalf("live report %s", out)
	}
}

// A small matrix: every case judged, the summary counts them, the JSON file
// matches stdout, and the numbers do not depend on parallelism.
func TestMatrixSmall(t *testing.T) {
	dir := t.TempDir()
	args := []string{"matrix", "-replicas", "2,4", "-workloads", "herding,chat", "-util", "0.5,1.1", "-seeds", "1-2",
		"-size", "0.02", "-duration", "0", "-gpu-blocks", "4096", "-cpu-blocks", "0", "-policies", "roundrobin,leastload,kvroute", "-q"}
	a := kvbench(t, append(args, "-json", "-parallel", "1", "-json-out", filepath.Join(dir, "m.json"))...)
	b := kvbench(t, append(args, "-json", "-parallel", "3")...)
	if !bytes.Equal(a, b) {
		t.Fatal("matrix output depends on parallelism")
	}
	if f, err := os.ReadFile(filepath.Join(dir, "m.json")); err != nil || !bytes.Equal(f, a) {
		t.Fatalf("json-out file differs from stdout (%v)", err)
	}
	var rep MatrixReport
	if err := json.Unmarshal(a, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 8 || rep.Summary.Cases != 8 {
		t.Fatalf("%d cases, summary %+v", len(rep.Cases), rep.Summary)
	}
	passed := 0
	for _, c := range rep.Cases {
		if len(c.Results) != 3 || len(c.Results[0].PerSeed) != 2 {
			t.Fatalf("case %+v", c)
		}
		want := 3 // mean, p99, hit at 0.5
		if c.Util > 0.95 {
			want = 2 // mean and p99 against round robin
		}
		if len(c.Verdict.Checks) != want {
			t.Fatalf("%s r%d util %v: checks %+v", c.Workload, c.Replicas, c.Util, c.Verdict.Checks)
		}
		if c.Verdict.Pass {
			passed++
		}
	}
	if passed != rep.Summary.Passed {
		t.Fatalf("summary passed %d, cases passing %d", rep.Summary.Passed, passed)
	}
	md := string(kvbench(t, args...))
	// 65-request chats cannot load even 2 replicas: flagged light.
	for _, want := range []string{"| 2 | herding | 0.50 |", "| 4 | chat | 1.10 |", "cases pass.", "(light)", "cases are light"} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
	// Each row carries the default's end-to-end p99 beside that of the
	// policy with the best other mean time to first token.
	for _, c := range rep.Cases {
		e2e := map[string]float64{}
		for _, a := range c.Results {
			e2e[a.Policy] = a.E2EP99.Median
		}
		ref := c.Verdict.Checks[0]
		if !strings.HasPrefix(ref.Name, "mean") || ref.RefPolicy == "" {
			t.Fatalf("first check %+v, want the mean against a named policy", ref)
		}
		want := fmt.Sprintf("| %.2f / %.2f %s |", e2e[rep.Default], e2e[ref.RefPolicy], ref.RefPolicy)
		if !strings.Contains(md, want) {
			t.Errorf("%s r%d util %v: table lacks %q", c.Workload, c.Replicas, c.Util, want)
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"matrix", "-policies", "leastload,kvroute"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "baseline") {
		t.Errorf("matrix without the baseline: exit %d, %s", code, errb.String())
	}
}

// With -duration every generator is sized so that its session starts span
// the duration at the case's utilization: more sessions for a higher
// utilization and a bigger fleet.
func TestGridDuration(t *testing.T) {
	sf := simFlags{size: 1, rate: 1, replicas: 4, cpuBlocks: -1}
	small := sf.fleet()
	sf.replicas = 8
	big := sf.fleet()
	const d = 10 * time.Minute
	for _, name := range bench.Generators() {
		utils := []float64{0.5, 1}
		if name == bench.GenReason {
			utils = []float64{0.15, 0.3} // its own sweep: decodes fill the KV cache past about 0.3
		}
		g, err := buildGrid(&sf, []string{name}, []uint64{1}, utils, d,
			[]bench.FleetConfig{small, big}, []string{"roundrobin"}, policy.Config{}, false, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var reqs []int
		for _, c := range g.cases {
			o := c.Workload.Offered()
			if name != bench.GenGRPO && (o.Span < d*6/10 || o.Span > d*14/10) {
				t.Errorf("%s on %d replicas: start span %v, want about %v", name, c.Fleet.Replicas, o.Span, d)
			}
			reqs = append(reqs, c.Workload.Requests())
		}
		// Cases: (4 replicas, the lower utilization), (4, the higher), (8, lower), (8, higher).
		if !(reqs[0] <= reqs[1] && reqs[1] <= reqs[3] && reqs[0] <= reqs[2] && reqs[0] < reqs[3]) {
			t.Errorf("%s: requests %v do not grow with utilization and fleet size", name, reqs)
		}
	}
}

// `kvbench bar` runs every policy up to the judged utilization and only the
// default and the baseline above it, with the same figures and verdicts
// as the full matrix.
func TestBarRunsOnlyWhatTheBarJudges(t *testing.T) {
	args := []string{"-replicas", "2", "-workloads", "herding", "-util", "0.5,1.1", "-seeds", "1-2",
		"-size", "0.02", "-duration", "0", "-gpu-blocks", "4096", "-cpu-blocks", "0", "-policies", "roundrobin,leastload,kvroute", "-q", "-json"}
	var bar, full MatrixReport
	if err := json.Unmarshal(kvbench(t, append([]string{"bar"}, args...)...), &bar); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(kvbench(t, append([]string{"matrix"}, args...)...), &full); err != nil {
		t.Fatal(err)
	}
	if !bar.Bar || full.Bar || len(bar.Cases) != 2 || len(full.Cases) != 2 {
		t.Fatalf("bar %v with %d cases, matrix %v with %d", bar.Bar, len(bar.Cases), full.Bar, len(full.Cases))
	}
	for i, c := range bar.Cases {
		var got []string
		for _, a := range c.Results {
			got = append(got, a.Policy)
		}
		want := []string{"roundrobin", "leastload", "kvroute"}
		if c.Util > 0.95 {
			want = []string{"roundrobin", "kvroute"}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("util %v: policies %v, want %v", c.Util, got, want)
		}
		if !reflect.DeepEqual(c.Verdict, full.Cases[i].Verdict) {
			t.Fatalf("util %v: bar verdict %+v, matrix %+v", c.Util, c.Verdict, full.Cases[i].Verdict)
		}
	}
}

func TestParseSpeedChange(t *testing.T) {
	ch, err := parseSpeedChange("2@20s:0.33")
	if err != nil || ch != (bench.SpeedChange{Replica: 2, At: 20 * time.Second, Speed: 0.33}) {
		t.Fatalf("2@20s:0.33 = %+v, %v", ch, err)
	}
	for _, bad := range []string{"", "2", "2@20s", "x@20s:1", "-1@20s:1", "2@soon:1", "2@-5s:1", "2@20s:fast", "2@20s:0", "2@20s:200"} {
		if _, err := parseSpeedChange(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
