//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// BenchmarkResponsePath compares what kvroute's place on the response path
// costs a streamed answer: three Envoys in front of the same kvroute and
// engines, requests alternating between them: "observer" (envoy/envoy.yaml
// as shipped: the response goes to kvroute through the observability-mode
// filter, which Envoy never waits for), "streamed" (the response through
// the router filter in STREAMED mode, as shipped before issue 11: Envoy
// holds each chunk until kvroute answers) and "plain" (no ext_proc: round
// robin). Reported per arm: the median and p99 gap between SSE events at
// the client, and the median time to the first event. Engines at real speed
// (10 ms per decode step).
//
//	go test -tags e2e -run '^$' -bench BenchmarkResponsePath -benchtime 40x ./e2e/
func BenchmarkResponsePath(b *testing.B) {
	g := newGroup(b)
	ctx := context.Background()
	s, err := testbed.StartStack(ctx, g, testbed.StackOptions{
		Bin: bins, Envoy: envoyTmpl, Engines: 2,
		EngineArgs: func(i int) []string {
			return []string{"--enable-prompt-tokens-details", "--seed", fmt.Sprint(700 + i), "--log-level", "warn"}
		},
		KVRouteExtra: kvrouteConfig(""),
	})
	if err != nil {
		b.Fatal(err)
	}
	// The router filter processes the response; the observer filter stays
	// disabled (its per-route enabling removed).
	streamedTmpl := bytes.Replace(envoyTmpl, []byte(`response_header_mode: SKIP
                response_body_mode: NONE
                response_trailer_mode: SKIP`), []byte(`response_header_mode: SEND
                response_body_mode: STREAMED
                response_trailer_mode: SEND`), 1)
	streamedTmpl = regexp.MustCompile(`(?m)^ *kvroute\.ext_proc\.observe:\n(?: {18}.*\n)+`).ReplaceAll(streamedTmpl, nil)
	if bytes.Equal(streamedTmpl, envoyTmpl) || bytes.Count(streamedTmpl, []byte("kvroute.ext_proc.observe")) != 1 {
		b.Fatal("envoy/envoy.yaml changed: cannot derive the STREAMED single-filter config")
	}
	streamed := &testbed.Envoy{Name: "envoy-streamed", Config: testbed.EnvoyConfig{ExtProc: []int{s.KV.ExtProc}, Engines: s.EnginePorts()}}
	if err := streamed.Start(ctx, g, bins.Envoy, streamedTmpl); err != nil {
		b.Fatal(err)
	}
	plain := &testbed.Envoy{Name: "envoy-plain", Config: testbed.EnvoyConfig{Engines: s.EnginePorts()}}
	if err := plain.Start(ctx, g, bins.Envoy, envoyTmpl); err != nil {
		b.Fatal(err)
	}
	modes := []struct {
		name string
		url  string
		gaps []time.Duration
		ttft []time.Duration
	}{{name: "observer", url: s.Envoy.URL()}, {name: "streamed", url: streamed.URL()}, {name: "plain", url: plain.URL()}}
	b.ResetTimer()
	for i := range b.N {
		for m := range modes {
			gaps, ttft, err := sseTimes(ctx, modes[m].url, fmt.Sprintf("bench %d %s", i, prompt("path", 40)))
			if err != nil {
				b.Fatalf("%s request %d: %v", modes[m].name, i, err)
			}
			modes[m].gaps = append(modes[m].gaps, gaps...)
			modes[m].ttft = append(modes[m].ttft, ttft)
		}
	}
	b.StopTimer()
	q := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000
	}
	for _, m := range modes {
		b.ReportMetric(q(m.gaps, 0.5), m.name+"-itl-p50-ms")
		b.ReportMetric(q(m.gaps, 0.99), m.name+"-itl-p99-ms")
		b.ReportMetric(q(m.ttft, 0.5), m.name+"-ttft-p50-ms")
	}
}

// sseTimes streams one chat answer (64 tokens) and returns the gaps between
// its SSE events and the time to the first one.
func sseTimes(ctx context.Context, url, content string) ([]time.Duration, time.Duration, error) {
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "stream": true, "max_tokens": 64,
		"messages": []message{{Role: "user", Content: content}}})
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, "POST", url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := loadClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	var gaps []time.Duration
	var ttft time.Duration
	last := time.Time{}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "data: ") {
			continue
		}
		now := time.Now()
		if last.IsZero() {
			ttft = now.Sub(start)
		} else {
			gaps = append(gaps, now.Sub(last))
		}
		last = now
		done = sc.Text() == "data: [DONE]"
	}
	if err := sc.Err(); err != nil || !done {
		return nil, 0, fmt.Errorf("stream incomplete: %v", err)
	}
	return gaps, ttft, nil
}
