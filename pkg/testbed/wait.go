package testbed

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// pollEvery is how often WaitFor checks its condition.
const pollEvery = 50 * time.Millisecond

// WaitFor checks cond every 50ms until it holds, ctx is done or timeout
// passes; the error names what was awaited.
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// client is used for readiness probes: short timeout, no shared pool with
// the callers' traffic.
var client = &http.Client{Timeout: 5 * time.Second}

// Get fetches url and returns its status code and body.
func Get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// OK reports whether GET url answers 200.
func OK(ctx context.Context, url string) bool {
	code, _, err := Get(ctx, url)
	return err == nil && code == http.StatusOK
}

// waitReady waits until GET url answers 200, or p exits, or the timeout
// passes; the error carries the tail of p's log.
func waitReady(ctx context.Context, p *Proc, timeout time.Duration, what, url string) error {
	err := WaitFor(ctx, timeout, what, func() bool {
		return !p.Running() || OK(ctx, url)
	})
	if err == nil && !p.Running() {
		err = fmt.Errorf("%s exited (%v) while waiting for %s", p.Name(), p.Err(), what)
	}
	if err != nil {
		return fmt.Errorf("%w\n---- %s log ----\n%s", err, p.Name(), p.Tail(4000))
	}
	return nil
}
