//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// Restart figures: the engines' replay buffers (vLLM's default
// buffer_steps) and how full the test fills them before kvroute restarts.
const (
	replayBufferSteps = 10000
	fillUntil         = 9000 // stop the filler load once an engine has sent this many batches
	prefixTokens      = 64   // 4 blocks: each probe's prefix, held by one engine
	probesPerEngine   = 50
	stableProbes      = 6 // affinity counts once this many probes in a row are affine
)

// TestRestartWarmAffinity: kvroute is killed (SIGKILL) and started again
// while four engines hold nearly full replay buffers (9,000–9,700 batches
// of 10,000). The test measures, through Envoy, the time from the new
// kvroute's start to cache affinity: the first of stableProbes probes in a
// row that kvroute routed with cache affinity (a decision not degraded,
// counted in kvroute_decisions_total) to the engine holding the probe's
// prefix, which confirms the hit (cached_tokens). Every probe has its own
// prefix, stored on one engine (chosen at random) after the filler load, so
// that only a replay that reaches the end of the buffer can teach it to
// kvroute, and so that a fail-open probe landing elsewhere pollutes no
// later probe. Affinity must return; the figure is logged (docs/benchmarks.md,
// "Warm restart").
func TestRestartWarmAffinity(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 4, seed: 300, engineArgs: func(int) []string {
		// One block per prefill step, so that one long prompt publishes
		// one batch per block, at 50x real time.
		return []string{"--speed", "50", "--max-num-seqs", "16",
			"--max-num-batched-tokens", "16", "--kv-events-buffer-steps", strconv.Itoa(replayBufferSteps)}
	}})
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(13, 17))

	// Fill every engine's replay buffer with long prompts sent to the
	// engine directly (kvroute, running, applies them live).
	fillStart := time.Now()
	eg, ectx := errgroup.WithContext(ctx)
	for i, e := range c.engines {
		seed := uint64(1000 + i)
		eg.Go(func() error {
			r := rand.New(rand.NewPCG(seed, 1))
			for {
				sent, err := engineBatches(ectx, e.URL())
				if err != nil {
					return err
				}
				if sent >= fillUntil {
					return nil
				}
				if err := engineComplete(ectx, e.URL(), randomTokens(r, 4000)); err != nil {
					return err
				}
			}
		})
	}
	if err := eg.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("filled %d replay buffers past %d batches in %v", len(c.engines), fillUntil, time.Since(fillStart).Round(time.Millisecond))

	// One prefix per probe, each stored on one engine only.
	type probe struct {
		prefix []int
		holder int
	}
	probes := make([]probe, 0, probesPerEngine*len(c.engines))
	for i := range c.engines {
		for range probesPerEngine {
			probes = append(probes, probe{randomTokens(rng, prefixTokens), i})
		}
	}
	rng.Shuffle(len(probes), func(a, b int) { probes[a], probes[b] = probes[b], probes[a] })
	for _, p := range probes {
		if err := engineComplete(ctx, c.engines[p.holder].URL(), p.prefix); err != nil {
			t.Fatal(err)
		}
	}
	held := make([]int64, len(c.engines))
	for i, e := range c.engines {
		n, err := engineBatches(ctx, e.URL())
		if err != nil {
			t.Fatal(err)
		}
		held[i] = n
		if held[i] < fillUntil || held[i] >= replayBufferSteps-200 {
			t.Fatalf("engine %d published %d batches: want a buffer between %d and %d of %d full", i, held[i], fillUntil, replayBufferSteps-200, replayBufferSteps)
		}
	}
	t.Logf("replay buffers hold %v batches of %d", held, replayBufferSteps)

	// Kill kvroute and start it again.
	c.kv.Proc.Kill()
	<-c.kv.Proc.Done()
	t0 := time.Now()
	if err := c.kv.Launch(c.g, bins.KVRoute); err != nil {
		t.Fatal(err)
	}
	readyAt := make(chan time.Duration, 1)
	go func() {
		for ctx.Err() == nil && time.Since(t0) < time.Minute {
			if testbed.OK(ctx, c.kv.MetricsURL("/readyz")) {
				readyAt <- time.Since(t0)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	var (
		affineAt time.Duration
		run      int
		sent     int
		failOpen int
	)
	for _, p := range probes {
		if run >= stableProbes {
			break
		}
		at := time.Since(t0)
		if at > 45*time.Second {
			break
		}
		before, errBefore := affineDecisions(ctx, c.kv.MetricsURL("/metrics"))
		tokens := append(append([]int(nil), p.prefix...), randomTokens(rng, 16)...)
		body, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": tokens, "max_tokens": 1})
		r := c.post(ctx, "/v1/completions", body, nil)
		if r.err != nil || r.status != 200 {
			t.Fatalf("probe %d at %v: %d %v %s", sent, at, r.status, r.err, r.body)
		}
		sent++
		after, errAfter := affineDecisions(ctx, c.kv.MetricsURL("/metrics"))
		routed := errBefore == nil && errAfter == nil && after > before
		if !routed {
			failOpen++
		}
		if routed && r.upstream == c.engines[p.holder].addr() && r.cached >= prefixTokens {
			if run == 0 {
				affineAt = at
			}
			run++
		} else {
			run = 0
		}
		time.Sleep(50 * time.Millisecond)
	}
	if run < stableProbes {
		t.Fatalf("cache affinity did not return: %d probes over %v, last run of %d affine probes", sent, time.Since(t0).Round(time.Millisecond), run)
	}
	ready := time.Duration(-1)
	select {
	case ready = <-readyAt:
	default:
	}
	partial, _ := metricSum(ctx, c.kv.MetricsURL("/metrics"), "kvroute_events_replays_total", `result="partial"`)
	replayed, _ := metricSum(ctx, c.kv.MetricsURL("/metrics"), "kvroute_events_replayed_batches_total", "")
	t.Logf("time to cache affinity through Envoy: %v (kvroute /readyz 200 at %v; %d probes, %d not routed by kvroute with affinity; %.0f batches replayed, %.0f partial replay rounds)",
		affineAt.Round(time.Millisecond), ready.Round(time.Millisecond), sent, failOpen, replayed, partial)
	if replayed < float64(len(c.engines)*fillUntil) {
		t.Errorf("kvroute replayed %.0f batches: want every engine's buffer (at least %d)", replayed, len(c.engines)*fillUntil)
	}
}

// randomTokens returns n token ids in the simulator's pre-tokenized range.
func randomTokens(r *rand.Rand, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1000 + r.IntN(100000)
	}
	return out
}

// engineComplete sends one completion of tokens with max_tokens 1 straight
// to an engine.
func engineComplete(ctx context.Context, base string, tokens []int) error {
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": tokens, "max_tokens": 1})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("engine %s: status %d", base, resp.StatusCode)
	}
	return nil
}

// engineBatches is how many KV-event batches an engine has published.
func engineBatches(ctx context.Context, base string) (int64, error) {
	v, err := metricSum(ctx, base+"/metrics", "enginesim_kv_event_batches_total", `outcome="sent"`)
	return int64(v), err
}

// affineDecisions is kvroute's count of decisions that used cache affinity
// (not degraded).
func affineDecisions(ctx context.Context, url string) (float64, error) {
	return metricSum(ctx, url, "kvroute_decisions_total", `degraded=""`)
}

// metricSum sums the samples of a Prometheus metric whose label set
// contains filter.
func metricSum(ctx context.Context, url, name, filter string) (float64, error) {
	code, b, err := testbed.Get(ctx, url)
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("GET %s: %d", url, code)
	}
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		if filter != "" && !strings.Contains(rest, filter) {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}
