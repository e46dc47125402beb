package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/policy"
)

func runTune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf simFlags
	sf.register(fs)
	name := fs.String("policy", policy.NameKVRoute, "policy whose knobs to search")
	objective := fs.String("objective", "ttft_p99", "objective to minimise: "+strings.Join(bench.Objectives(), ", "))
	rounds := fs.Int("rounds", 2, "coordinate-search passes at most")
	asJSON := fs.Bool("json", false, "print JSON")
	quiet := fs.Bool("q", false, "no progress on stderr")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if len(bench.Knobs(*name)) == 0 {
		return fmt.Errorf("%w: policy %q has no tunable knobs", errUsage, *name)
	}
	if _, err := bench.Objective(*objective, bench.Summary{}); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	ws, err := sf.load()
	if err != nil {
		return err
	}
	var results []*bench.TuneResult
	for _, w := range ws {
		res, err := bench.Tune(ctx, w, *name, *objective, sf.fleet(), *rounds, func(set map[string]float64, v float64) {
			if !*quiet {
				fmt.Fprintf(stderr, "%s %s %s = %.4f\n", w.Name, *name, formatSetting(set), v)
			}
		})
		if err != nil {
			return err
		}
		results = append(results, res)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	for _, r := range results {
		fmt.Fprintf(stdout, "### %s: %s on %s (%d evaluations)\n\n", r.Objective, r.Policy, r.Workload, r.Evaluations)
		fmt.Fprintf(stdout, "defaults: %.4f; best: %.4f with %s\n\n", r.Default, r.Best, formatSetting(r.Setting))
		fmt.Fprintln(stdout, "| knob | grid | objective over the grid (others at best) | spread |")
		fmt.Fprintln(stdout, "|---|---|---|---:|")
		for _, k := range r.Sensitivity {
			vals := make([]string, len(k.Values))
			scores := make([]string, len(k.Scores))
			for i := range k.Values {
				vals[i] = fmt.Sprint(k.Values[i])
				scores[i] = fmt.Sprintf("%.3f", k.Scores[i])
			}
			fmt.Fprintf(stdout, "| %s | %s | %s | %.1f%% |\n", k.Knob, strings.Join(vals, ", "), strings.Join(scores, ", "), 100*k.Spread)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}

func formatSetting(set map[string]float64) string {
	if len(set) == 0 {
		return "defaults"
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, set[k])
	}
	return strings.Join(parts, " ")
}
