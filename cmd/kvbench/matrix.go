package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/policy"
)

// MatrixReport is `kvbench matrix -json`: every case of the grid with
// every policy's medians over the seeds and the default's verdict.
type MatrixReport struct {
	Default   string         `json:"default"`
	Baseline  string         `json:"baseline"`
	Criteria  bench.Criteria `json:"criteria"`
	Seeds     []uint64       `json:"seeds"`
	Replicas  []int          `json:"replicas"`
	Workloads []string       `json:"workloads"`
	Utils     []float64      `json:"utils"`
	Policies  []string       `json:"policies"`
	// Bar is set when only the default and the baseline ran above the
	// judged utilization (-bar, `kvbench bar`).
	Bar bool `json:"bar,omitempty"`
	// TraceWindows is set when each seed replayed its own window of the
	// trace (-trace-windows), not the trace's first -limit requests.
	TraceWindows bool          `json:"trace_windows,omitempty"`
	Cases        []MatrixCase  `json:"cases"`
	Summary      MatrixSummary `json:"summary"`
}

// MatrixCase is one (replicas, workload, utilization) case.
type MatrixCase struct {
	Replicas    int               `json:"replicas"`
	Workload    string            `json:"workload"`
	Util        float64           `json:"util"`
	OfferedUtil float64           `json:"offered_util"`
	Requests    int               `json:"requests"`
	Verdict     bench.Verdict     `json:"verdict"`
	Results     []bench.Aggregate `json:"results"`
}

// MatrixSummary counts the verdicts.
type MatrixSummary struct {
	Cases  int `json:"cases"`
	Passed int `json:"passed"`
	// Failed counts failing cases per workload, per utilization and per
	// fleet size, and per check name.
	FailedByWorkload map[string]int `json:"failed_by_workload"`
	FailedByUtil     map[string]int `json:"failed_by_util"`
	FailedByReplicas map[string]int `json:"failed_by_replicas"`
	FailedByCheck    map[string]int `json:"failed_by_check"`
}

// defaultMatrixDuration is the matrix's default span of session starts.
const defaultMatrixDuration = 5 * time.Minute

// runBar is `kvbench bar`: the matrix with -bar (issue 17's bar exactly).
func runBar(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return matrix(ctx, "bar", true, args, stdout, stderr)
}

func runMatrix(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return matrix(ctx, "matrix", false, args, stdout, stderr)
}

// matrix runs the matrix; name is the subcommand and barDefault the
// default of -bar.
func matrix(ctx context.Context, name string, barDefault bool, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf simFlags
	sf.registerSource(fs)
	sf.registerFleet(fs)
	var gf gridFlags
	gf.register(fs, "0.5,0.8,0.95,1.1", defaultMatrixDuration)
	replicas := fs.String("replicas", "4,8,16", "fleet sizes, comma-separated")
	workloads := fs.String("workloads", "all", "workloads, comma-separated: trace, "+strings.Join(bench.Generators(), ", ")+", or all (the bar's: every one but reasoning)")
	policies := fs.String("policies", strings.Join(bench.ComparedPolicies(), ","), "policies, comma-separated (must include -default and -baseline)")
	def := fs.String("default", policy.NameKVRoute, "the policy judged")
	baseline := fs.String("baseline", policy.NameRoundRobin, "the overload reference")
	knobs := fs.String("knobs", "", "policy knobs, comma-separated policy.knob=value")
	jsonOut := fs.String("json-out", "", "also write the JSON report to this file")
	asJSON := fs.Bool("json", false, "print the JSON report instead of Markdown")
	details := fs.Bool("details", false, "print every policy's medians per case after the summary")
	dry := fs.Bool("dry-run", false, "print the grid's size (cases, simulations, requests) and exit")
	quiet := fs.Bool("q", false, "no progress on stderr")
	bar := fs.Bool("bar", barDefault, "issue 17's bar exactly: above the judged utilization (0.95) only the default and the baseline run, the only policies its overload check compares; at and below it every policy of -policies")
	if gf.seeds == "" {
		gf.seeds = "1-5"
	}
	fs.Lookup("seeds").DefValue = "1-5"
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if gf.seeds == "" {
		gf.seeds = "1-5"
	}
	sf.rate = 1
	seeds, utils, err := gf.parse(1)
	if err != nil {
		return err
	}
	if len(utils) == 0 {
		return fmt.Errorf("%w: -util: at least one utilization", errUsage)
	}
	var fleets []bench.FleetConfig
	var reps []int
	for _, r := range splitList(*replicas) {
		n, err := strconv.Atoi(r)
		if err != nil || n < 1 || n > 1024 {
			return fmt.Errorf("%w: -replicas %q: %q is not a fleet size in [1, 1024]", errUsage, *replicas, r)
		}
		sf.replicas = n
		fleets = append(fleets, sf.fleet())
		reps = append(reps, n)
	}
	if len(fleets) == 0 {
		return fmt.Errorf("%w: -replicas: at least one fleet size", errUsage)
	}
	sf.workloads = *workloads
	wnames := sf.workloadNames()
	known := append([]string{"trace"}, bench.Generators()...)
	for _, w := range wnames {
		if !contains(known, w) {
			return fmt.Errorf("%w: workload %q: unknown (want one of %s, or all)", errUsage, w, strings.Join(known, ", "))
		}
	}
	names := splitList(*policies)
	pcfg, err := parseKnobs(*knobs)
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := policy.New(n, pcfg); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	if !contains(names, *def) || !contains(names, *baseline) {
		return fmt.Errorf("%w: -policies must include the default %q and the baseline %q", errUsage, *def, *baseline)
	}
	cr := bench.DefaultCriteria()
	var namesAt func(float64) []string
	if *bar {
		namesAt = func(u float64) []string {
			if u > cr.JudgedUtil {
				return []string{*baseline, *def}
			}
			return nil
		}
	}
	g, err := buildGrid(&sf, wnames, seeds, utils, gf.duration, fleets, names, pcfg, false, namesAt)
	if err != nil {
		return err
	}
	if *dry {
		reqs := 0
		for _, c := range g.cases {
			reqs += c.Workload.Requests()
		}
		fmt.Fprintf(stdout, "%d cases, %d simulations, %d simulated requests\n", len(g.cells), len(g.cases), reqs)
		return nil
	}
	results, err := g.run(ctx, &gf, *quiet, stderr)
	if err != nil {
		return err
	}
	rep := MatrixReport{
		Default: *def, Baseline: *baseline, Criteria: cr, Seeds: seeds, Replicas: reps,
		Workloads: wnames, Utils: utils, Policies: names, Bar: *bar,
		TraceWindows: sf.traceWindowed(),
		Summary: MatrixSummary{
			FailedByWorkload: map[string]int{}, FailedByUtil: map[string]int{},
			FailedByReplicas: map[string]int{}, FailedByCheck: map[string]int{},
		},
	}
	for _, cell := range g.cells {
		mc := MatrixCase{Replicas: cell.replicas, Workload: cell.workload, Util: cell.util, Requests: cell.requests}
		for _, pol := range cell.policies {
			var ss []bench.Summary
			for _, ci := range pol {
				ss = append(ss, results[ci].Summary)
			}
			mc.Results = append(mc.Results, bench.AggregateSeeds(seeds, ss))
		}
		mc.OfferedUtil = mc.Results[0].OfferedUtil.Median
		mc.Verdict, err = bench.Judge(cell.util, mc.Results, *def, *baseline, cr)
		if err != nil {
			return err
		}
		rep.Summary.Cases++
		if mc.Verdict.Pass {
			rep.Summary.Passed++
		} else {
			rep.Summary.FailedByWorkload[cell.workload]++
			rep.Summary.FailedByUtil[strconv.FormatFloat(cell.util, 'f', -1, 64)]++
			rep.Summary.FailedByReplicas[strconv.Itoa(cell.replicas)]++
			for _, c := range mc.Verdict.Checks {
				if !c.Pass {
					rep.Summary.FailedByCheck[c.Name]++
				}
			}
		}
		rep.Cases = append(rep.Cases, mc)
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	writeMatrix(stdout, rep, *details)
	return nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// lightRun marks a case whose realized utilization (the default's run
// util) is under this fraction of its target.
const lightRun = 0.7

// writeMatrix prints one row per case and the summary; with details, every
// policy's medians per case.
func writeMatrix(w io.Writer, rep MatrixReport, details bool) {
	d := rep.Default
	fmt.Fprintf(w, "### kvbench matrix: %s judged, medians of %d seeds (%v)\n\n", d, len(rep.Seeds), rep.Seeds)
	if rep.TraceWindows {
		fmt.Fprintln(w, "The trace: each seed its own window of it (-trace-windows).")
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "| replicas | workload | util | run util | requests | %s mean s | best other mean | %s p99 s | best other p99 | E2E p99 s (%s / best other mean's) | hit/ceiling | load CV | preemptions (%s / %s) | verdict |\n", d, d, d, d, rep.Baseline)
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---|---:|---|---|---:|---:|---:|---|")
	light := 0
	for _, c := range rep.Cases {
		byPolicy := make(map[string]bench.Aggregate, len(c.Results))
		for _, a := range c.Results {
			byPolicy[a.Policy] = a
		}
		da, ba := byPolicy[d], byPolicy[rep.Baseline]
		check := func(name string) (bench.Check, bool) {
			for _, ch := range c.Verdict.Checks {
				if strings.HasPrefix(ch.Name, name) {
					return ch, true
				}
			}
			return bench.Check{}, false
		}
		other := func(name string) string {
			if ch, ok := check(name); ok {
				return fmt.Sprintf("%.3f %s", ch.Ref, ch.RefPolicy)
			}
			return ""
		}
		// The time to first token is what the verdict judges; the end to
		// end tail beside it shows what a policy's lead there cost after
		// the first token (a replica packed with decodes serves them
		// slower).
		e2e := fmt.Sprintf("%.2f", da.E2EP99.Median)
		if ch, ok := check("mean"); ok {
			if a, ok := byPolicy[ch.RefPolicy]; ok {
				e2e += fmt.Sprintf(" / %.2f %s", a.E2EP99.Median, a.Policy)
			}
		}
		verdict := "pass"
		if !c.Verdict.Pass {
			var bad []string
			for _, ch := range c.Verdict.Checks {
				if !ch.Pass {
					bad = append(bad, ch.String())
				}
			}
			verdict = "FAIL: " + strings.Join(bad, "; ")
		}
		runUtil := fmt.Sprintf("%.2f", da.RunUtil.Median)
		if da.RunUtil.Median < lightRun*c.Util {
			runUtil += " (light)"
			light++
		}
		fmt.Fprintf(w, "| %d | %s | %.2f | %s | %d | %.3f (%.3f–%.3f) | %s | %.3f (%.3f–%.3f) | %s | %s | %.3f | %.3f | %.0f / %.0f | %s |\n",
			c.Replicas, c.Workload, c.Util, runUtil, c.Requests,
			da.TTFTMean.Median, da.TTFTMean.Min, da.TTFTMean.Max, other("mean"),
			da.TTFTP99.Median, da.TTFTP99.Min, da.TTFTP99.Max, other("p99"), e2e,
			da.HitOverCeiling.Median, da.LoadCV.Median, da.Preemptions.Median, ba.Preemptions.Median, verdict)
	}
	s := rep.Summary
	fmt.Fprintf(w, "\n%d of %d cases pass.", s.Passed, s.Cases)
	for _, part := range []struct {
		name string
		m    map[string]int
	}{{"workload", s.FailedByWorkload}, {"utilization", s.FailedByUtil}, {"replicas", s.FailedByReplicas}, {"check", s.FailedByCheck}} {
		if len(part.m) == 0 {
			continue
		}
		keys := make([]string, 0, len(part.m))
		for k := range part.m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var items []string
		for _, k := range keys {
			items = append(items, fmt.Sprintf("%s %d", k, part.m[k]))
		}
		fmt.Fprintf(w, " Failing by %s: %s.", part.name, strings.Join(items, ", "))
	}
	fmt.Fprintln(w)
	if light > 0 {
		fmt.Fprintf(w, "\n%d cases are light: the default's realized load on the run's bulk is under %.0f %% of the target (sessions outlast their start span); lengthen -duration.\n", light, 100*lightRun)
	}
	if !details {
		return
	}
	fmt.Fprintln(w)
	for _, c := range rep.Cases {
		writeTable(w, WorkloadTable{
			Workload: fmt.Sprintf("%s, %d replicas", c.Workload, c.Replicas), Requests: c.Requests,
			Util: c.Util, OfferedUtil: c.OfferedUtil, Results: c.Results,
		})
	}
}
