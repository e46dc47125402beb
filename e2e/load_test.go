//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// openLoad is an open-loop client: it starts one request every interval,
// whether or not the earlier ones have finished, and records every
// request's outcome. Every third request streams (SSE) a long answer, so
// some are always mid-response; the others are short non-streamed chats.
// Stop ends the schedule and waits for every started request.
type openLoad struct {
	c        *cluster
	interval time.Duration

	started, finished atomic.Int64
	streaming         atomic.Int64 // streamed requests in flight
	inflight          atomic.Int64

	mu       sync.Mutex
	outcomes []outcome

	cancel context.CancelFunc
	ticker sync.WaitGroup // the scheduling goroutine
	reqs   sync.WaitGroup // one per started request
}

// outcome is one request of an openLoad.
type outcome struct {
	n          int64
	stream     bool
	start, end time.Time
	status     int
	err        error
	complete   bool // a 200 with a whole answer (JSON, or SSE up to [DONE])
	upstream   string
	body       string // the start of a failed answer
}

func (o outcome) ok() bool { return o.err == nil && o.status == 200 && o.complete }

func (o outcome) String() string {
	return fmt.Sprintf("#%d stream=%v %s..%s status=%d complete=%v err=%v upstream=%s body=%q",
		o.n, o.stream, o.start.Format("15:04:05.000"), o.end.Format("15:04:05.000"), o.status, o.complete, o.err, o.upstream, o.body)
}

// startOpenLoad starts the schedule; requests go through c's Envoy.
func startOpenLoad(c *cluster, interval time.Duration, streamTokens int) *openLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &openLoad{c: c, interval: interval, cancel: cancel}
	l.ticker.Add(1)
	go func() {
		defer l.ticker.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n := l.started.Add(1)
			l.reqs.Add(1)
			go func() {
				defer l.reqs.Done()
				o := l.one(n, n%3 == 0, streamTokens)
				l.mu.Lock()
				l.outcomes = append(l.outcomes, o)
				l.mu.Unlock()
				l.finished.Add(1)
			}()
		}
	}()
	return l
}

// one sends request n: the prompt repeats per session (n mod 8), so
// kvroute has caches to route by.
func (l *openLoad) one(n int64, stream bool, streamTokens int) (o outcome) {
	l.inflight.Add(1)
	defer l.inflight.Add(-1)
	if stream {
		l.streaming.Add(1)
		defer l.streaming.Add(-1)
	}
	o = outcome{n: n, stream: stream, start: time.Now()}
	defer func() { o.end = time.Now() }()
	maxTokens := 8
	if stream {
		maxTokens = streamTokens
	}
	body, _ := json.Marshal(map[string]any{
		"model": "sim-model", "stream": stream, "max_tokens": maxTokens,
		"messages": []message{{Role: "user", Content: prompt(fmt.Sprintf("load-session-%d", n%8), 60) + fmt.Sprintf(" turn %d", n)}},
	})
	// Bounded: a request that hangs fails the test instead of the run.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", l.c.listenPort), bytes.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := loadClient.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.status, o.upstream = resp.StatusCode, resp.Header.Get("x-e2e-upstream")
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.body = string(b)
		return o
	}
	if !stream {
		b, err := io.ReadAll(resp.Body)
		var out struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if err == nil {
			err = json.Unmarshal(b, &out)
		}
		o.err, o.complete = err, err == nil && len(out.Choices) > 0
		if !o.complete {
			o.body = string(b[:min(len(b), 512)])
		}
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	chunks := 0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if line == "data: [DONE]" {
			o.complete = true
			continue
		}
		if o.complete {
			o.err = fmt.Errorf("data after [DONE]: %q", line)
			return o
		}
		if !json.Valid([]byte(strings.TrimPrefix(line, "data: "))) {
			o.err = fmt.Errorf("SSE event %d is not JSON: %q", chunks, line)
			return o
		}
		chunks++
	}
	if err := sc.Err(); err != nil {
		o.err = fmt.Errorf("stream cut after %d events: %w", chunks, err)
	} else if !o.complete {
		o.err = fmt.Errorf("stream ended after %d events without [DONE]", chunks)
	}
	return o
}

// loadClient has no overall timeout (each request has its own) and
// enough idle connections for the load's concurrency.
var loadClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}

// waitFinished waits until n more requests than from have finished.
func (l *openLoad) waitFinished(t testing.TB, from int64, n int64, timeout time.Duration, what string) {
	t.Helper()
	waitFor(t, timeout, what, func() bool { return l.finished.Load() >= from+n })
}

// Stop ends the schedule, waits (bounded) for the started requests and
// returns every outcome.
func (l *openLoad) Stop(t testing.TB) []outcome {
	t.Helper()
	l.cancel()
	l.ticker.Wait()
	done := make(chan struct{})
	go func() { l.reqs.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("requests still in flight 2 minutes after the load stopped: %d", l.inflight.Load())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]outcome(nil), l.outcomes...)
}

// failures returns the outcomes that are not a complete 200.
func failures(os []outcome) []outcome {
	var bad []outcome
	for _, o := range os {
		if !o.ok() {
			bad = append(bad, o)
		}
	}
	return bad
}
