package overhead

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Workload is one load shape.
type Workload struct {
	Name string
	// BodyBytes is the approximate size of each request body.
	BodyBytes int
	// Rate > 0 sends open loop at this many requests per second;
	// otherwise Concurrency workers send closed loop.
	Rate        float64
	Concurrency int
}

func (w Workload) String() string {
	if w.Rate > 0 {
		return fmt.Sprintf("%s @ %g req/s", w.Name, w.Rate)
	}
	return fmt.Sprintf("%s @ concurrency %d", w.Name, w.Concurrency)
}

// slug names the workload in file names: "small@500", "229KB@c32".
func (w Workload) slug() string {
	if w.Rate > 0 {
		return fmt.Sprintf("%s@%g", w.Name, w.Rate)
	}
	return fmt.Sprintf("%s@c%d", w.Name, w.Concurrency)
}

// result is one request's outcome as the client saw it.
type result struct {
	ok        bool
	ttft, e2e time.Duration
	chunks    int
}

// Stats summarize one phase (one target, one run of a workload).
type Stats struct {
	Requests, Errors int
	// Throughput is successful requests per second of the phase.
	Throughput float64
	TTFTp50    time.Duration
	TTFTp99    time.Duration
	E2Ep50     time.Duration
	E2Ep99     time.Duration
	// ITLp50 is the median over requests of the mean gap between
	// streamed chunks.
	ITLp50 time.Duration
	// CPUPerRequest is kvroute's CPU time per completed request (zero for
	// the round-robin target).
	CPUPerRequest time.Duration
	// CPUCores is kvroute's CPU time over the phase divided by the phase's
	// wall time (cores in use; zero for the round-robin target): at a rate
	// near zero, its idle cost.
	CPUCores float64
	// EnvoyCPUPerRequest is the target Envoy's own CPU time per completed
	// request (both targets): what the ext_proc exchange costs the proxy.
	EnvoyCPUPerRequest time.Duration
	// Routed is the fraction of requests kvroute made a decision for.
	Routed float64
	// Fallbacks counts the phase's requests kvroute routed without their
	// exact tokens: tokenizer fallbacks (approximate tokens) and decisions
	// degraded by a failed or timed-out tokenization.
	Fallbacks int
	// Late counts open-loop sends that started more than 10 ms behind
	// schedule (the client could not keep up).
	Late int
}

// bodyFactory makes unique chat bodies of about size bytes.
type bodyFactory struct {
	model string
	size  int
	seq   atomic.Uint64
	text  string
}

func newBodyFactory(model string, size int) *bodyFactory {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches; " +
		"numbers like 42 and 3.14 appear with code such as func main() { return nil } and café 日本語 text")
	var sb strings.Builder
	for i := 0; sb.Len() < size; i++ {
		sb.WriteString(words[(i*7+i/len(words))%len(words)])
		sb.WriteByte(' ')
	}
	return &bodyFactory{model: model, size: size, text: sb.String()}
}

// next returns a new body: a system prompt and a user turn (small), or a
// multi-turn history split from the text (large), prefixed with a unique
// request number.
func (f *bodyFactory) next() []byte {
	n := f.seq.Add(1)
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var msgs []msg
	turns := 2
	if f.size > 16<<10 {
		turns = 16
	}
	per := len(f.text) / turns
	for t := range turns {
		role := "user"
		if t%2 == 1 {
			role = "assistant"
		}
		if t == 0 && turns == 2 {
			role = "system"
		}
		content := f.text[t*per : (t+1)*per]
		if t == 0 {
			content = fmt.Sprintf("request %d. %s", n, content)
		}
		msgs = append(msgs, msg{Role: role, Content: strings.ToValidUTF8(content, "")})
	}
	if msgs[len(msgs)-1].Role != "user" {
		msgs = append(msgs, msg{Role: "user", Content: "continue"})
	}
	b, _ := json.Marshal(map[string]any{
		"model": f.model, "messages": msgs, "max_tokens": 64, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "ignore_eos": true,
	})
	return b
}

// send posts one streamed chat completion and reads it to the end.
func send(ctx context.Context, c *http.Client, url string, body []byte) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return result{}
	}
	req.Header.Set("content-type", "application/json")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return result{}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return result{}
	}
	var r result
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		if r.chunks == 0 {
			r.ttft = time.Since(start)
		}
		r.chunks++
		if bytes.Contains(line, []byte("[DONE]")) {
			r.ok = true
		}
	}
	r.e2e = time.Since(start)
	r.ok = r.ok && sc.Err() == nil
	return r
}

// drive runs w against url for d and returns every request's result and
// the count of late open-loop sends.
func drive(ctx context.Context, c *http.Client, url string, w Workload, f *bodyFactory, d time.Duration) ([]result, int) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	var (
		mu  sync.Mutex
		out []result
		wg  sync.WaitGroup
	)
	record := func(r result) {
		mu.Lock()
		out = append(out, r)
		mu.Unlock()
	}
	late := 0
	start := time.Now()
	if w.Rate > 0 {
		n := int(w.Rate * d.Seconds())
		interval := time.Duration(float64(time.Second) / w.Rate)
		for i := range n {
			at := start.Add(time.Duration(i) * interval)
			if wait := time.Until(at); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
				}
			} else if -wait > 10*time.Millisecond {
				late++
			}
			if ctx.Err() != nil {
				break
			}
			body := f.next()
			wg.Add(1)
			go func() {
				defer wg.Done()
				record(send(ctx, c, url, body))
			}()
		}
	} else {
		stop := start.Add(d)
		for range w.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) && ctx.Err() == nil {
					record(send(ctx, c, url, f.next()))
				}
			}()
		}
	}
	wg.Wait()
	return out, late
}

// summarize turns results into Stats (CPU and Routed are filled by the
// caller).
func summarize(rs []result, elapsed time.Duration, late int) Stats {
	st := Stats{Requests: len(rs), Late: late}
	var ttft, e2e, itl []time.Duration
	for _, r := range rs {
		if !r.ok {
			st.Errors++
			continue
		}
		ttft = append(ttft, r.ttft)
		e2e = append(e2e, r.e2e)
		if r.chunks > 1 {
			itl = append(itl, (r.e2e-r.ttft)/time.Duration(r.chunks-1))
		}
	}
	st.Throughput = float64(len(e2e)) / elapsed.Seconds()
	st.TTFTp50, st.TTFTp99 = quantile(ttft, 0.5), quantile(ttft, 0.99)
	st.E2Ep50, st.E2Ep99 = quantile(e2e, 0.5), quantile(e2e, 0.99)
	st.ITLp50 = quantile(itl, 0.5)
	return st
}

func quantile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// ParseWorkloads reads a comma-separated list of SIZE@RATE (open loop,
// requests per second) or SIZE@cN (N concurrent closed-loop clients);
// SIZE is "small" (1 KiB) or a decimal size with a KB or MB suffix
// ("229KB"). Example: "small@500,229KB@c32".
func ParseWorkloads(s string) ([]Workload, error) {
	var out []Workload
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		size, load, ok := strings.Cut(item, "@")
		if !ok {
			return nil, fmt.Errorf("workload %q: want SIZE@RATE or SIZE@cN", item)
		}
		w := Workload{Name: size}
		switch up := strings.ToUpper(size); {
		case up == "SMALL":
			w.BodyBytes = 1 << 10
		case strings.HasSuffix(up, "KB"), strings.HasSuffix(up, "MB"):
			n, err := strconv.ParseFloat(up[:len(up)-2], 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("workload %q: bad size %q", item, size)
			}
			mult := 1e3
			if strings.HasSuffix(up, "MB") {
				mult = 1e6
			}
			w.BodyBytes = int(n * mult)
		default:
			return nil, fmt.Errorf("workload %q: size %q: want small or a KB/MB size", item, size)
		}
		if c, ok := strings.CutPrefix(load, "c"); ok {
			n, err := strconv.Atoi(c)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("workload %q: bad concurrency %q", item, c)
			}
			w.Concurrency = n
		} else {
			r, err := strconv.ParseFloat(load, 64)
			if err != nil || r <= 0 {
				return nil, fmt.Errorf("workload %q: bad rate %q", item, load)
			}
			w.Rate = r
		}
		out = append(out, w)
	}
	return out, nil
}
