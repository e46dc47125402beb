package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/engine/simtok"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// Options configure a live run.
type Options struct {
	// URL is the stack's base URL (for example http://127.0.0.1:10000);
	// requests go to URL + "/v1/completions" (URL + "/v1/messages" with
	// API APIMessages).
	URL   string
	Model string
	// API is APICompletions (the default when empty) or APIMessages:
	// every session sent as Claude Code sends it to vLLM's Anthropic
	// Messages endpoint (messagesSession has the body), its streamed
	// answer read from Anthropic's events. Not with TokenIDs.
	API string
	// Workload is what to send.
	Workload *bench.Workload
	// Rate, when positive, starts sessions as a Poisson process of Rate
	// per second (seeded) instead of at their workload start times.
	Rate float64
	// Speed divides workload start times and think times (2 = twice as
	// fast); 0 means 1.
	Speed float64
	// MaxSessions sends only the first MaxSessions sessions; 0 = all.
	MaxSessions int
	// MaxInFlight bounds concurrent requests (default 256).
	MaxInFlight int
	// Timeout bounds one request (default 5 minutes).
	Timeout time.Duration
	// SessionHeader carries the session key (default "x-session-id"; "-"
	// sends none).
	SessionHeader string
	// Header is added to every request.
	Header http.Header
	// Client sends the requests (default: a client with keep-alive).
	Client *http.Client
	// Seed seeds the Poisson start times.
	Seed uint64
	// Salt is mixed into every prompt's text, so that two runs over the
	// same stack (a side-by-side comparison) share no cached prefix.
	Salt uint64
	// TokenIDs sends every prompt as token ids, tokenized as the
	// simulator does (package simtok: BOS, then one token per byte), as
	// clients that tokenize themselves do (RL trainers, agents with their
	// own tokenizer): the router then never tokenizes, so a run measures
	// the routing without the tokenizer's cost.
	TokenIDs bool
	// Words renders every workload token as a space and a letter (" q")
	// instead of one letter: a word that BPE tokenizers such as Qwen3's
	// and Llama 3's encode as one token, so an engine and router using a
	// real tokenizer see the workload's lengths and block boundaries (one
	// letter per token suits the simulator's byte tokenizer; letters run
	// together encode to about two per token). Not with TokenIDs.
	Words bool
}

// Request is one measured request.
type Request struct {
	Session, Turn int
	// Start is the send time from the run's start.
	Start        time.Duration
	TTFT, E2E    time.Duration
	ITLs         []time.Duration
	PromptChars  int
	OutputChunks int
	// PromptTokens and CachedTokens come from the final usage chunk
	// (CachedTokens -1 when the server did not report it).
	PromptTokens, CachedTokens, CompletionTokens int
	Status                                       int
	Err                                          string
	// Upstream is the response's x-upstream header (the engine that
	// served it, when the stack's Envoy adds it).
	Upstream string
}

// Report is a run's outcome.
type Report struct {
	URL      string
	Requests []Request
	Duration time.Duration
	// Delayed counts session starts that waited for MaxInFlight.
	Delayed int
}

// Summary is a report's headline figures (seconds).
type Summary struct {
	URL        string  `json:"url"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	TTFTMean   float64 `json:"ttft_mean_s"`
	TTFTP50    float64 `json:"ttft_p50_s"`
	TTFTP90    float64 `json:"ttft_p90_s"`
	TTFTP99    float64 `json:"ttft_p99_s"`
	ITLP50     float64 `json:"itl_p50_s"`
	ITLP99     float64 `json:"itl_p99_s"`
	E2EP50     float64 `json:"e2e_p50_s"`
	E2EP99     float64 `json:"e2e_p99_s"`
	Throughput float64 `json:"throughput_tok_s"`
	// HitRate is cached over prompt tokens, over requests that reported
	// cached tokens.
	HitRate  float64 `json:"hit_rate"`
	Duration float64 `json:"duration_s"`
	Delayed  int     `json:"delayed"`
}

// UpstreamHeader is the response header Request.Upstream is read from.
const UpstreamHeader = "x-upstream"

// ErrOptions classifies bad options.
var ErrOptions = errors.New("live: invalid options")

// Run sends o.Workload to o.URL and measures every request. It returns
// when every session has finished or ctx is done (then with the requests
// measured so far and ctx's error).
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.URL == "" || o.Workload == nil {
		return nil, fmt.Errorf("%w: URL and Workload are required", ErrOptions)
	}
	if o.Words && o.TokenIDs {
		return nil, fmt.Errorf("%w: Words and TokenIDs exclude each other", ErrOptions)
	}
	switch o.API {
	case "":
		o.API = APICompletions
	case APICompletions:
	case APIMessages:
		if o.TokenIDs {
			return nil, fmt.Errorf("%w: the Messages API sends text, not token ids", ErrOptions)
		}
	default:
		return nil, fmt.Errorf("%w: API %q: want %s or %s", ErrOptions, o.API, APICompletions, APIMessages)
	}
	if o.Speed == 0 {
		o.Speed = 1
	}
	if !(o.Speed > 0) || math.IsInf(o.Speed, 0) || o.Rate < 0 || math.IsNaN(o.Rate) {
		return nil, fmt.Errorf("%w: speed %v and rate %v", ErrOptions, o.Speed, o.Rate)
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.SessionHeader == "" {
		o.SessionHeader = "x-session-id"
	}
	if o.Client == nil {
		tr := &http.Transport{MaxIdleConnsPerHost: o.MaxInFlight, DisableCompression: true}
		defer tr.CloseIdleConnections()
		o.Client = &http.Client{Transport: tr}
	}
	sessions := o.Workload.Sessions
	if o.MaxSessions > 0 && len(sessions) > o.MaxSessions {
		sessions = sessions[:o.MaxSessions]
	}
	starts := make([]time.Duration, len(sessions))
	rng := rand.New(rand.NewPCG(o.Seed, 0x6c697665))
	t := time.Duration(0)
	for i, s := range sessions {
		if o.Rate > 0 {
			t += time.Duration(rng.ExpFloat64() / o.Rate * float64(time.Second))
			starts[i] = t
		} else {
			starts[i] = time.Duration(float64(s.Start) / o.Speed)
		}
	}
	r := &runner{o: o, sem: make(chan struct{}, o.MaxInFlight), begin: time.Now()}
	var wg sync.WaitGroup
	order := make([]int, len(sessions))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return int(starts[a] - starts[b]) })
	timer := time.NewTimer(0)
	defer timer.Stop()
loop:
	for _, i := range order {
		if d := starts[i] - time.Since(r.begin); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				break loop
			case <-timer.C:
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.session(ctx, i, sessions[i])
		}()
	}
	wg.Wait()
	rep := &Report{URL: o.URL, Duration: time.Since(r.begin), Delayed: r.delayed}
	rep.Requests = r.done
	slices.SortFunc(rep.Requests, func(a, b Request) int {
		if a.Session != b.Session {
			return a.Session - b.Session
		}
		return a.Turn - b.Turn
	})
	return rep, ctx.Err()
}

type runner struct {
	o     Options
	sem   chan struct{}
	begin time.Time

	mu      sync.Mutex
	done    []Request
	delayed int
}

func (r *runner) record(q Request) {
	r.mu.Lock()
	r.done = append(r.done, q)
	r.mu.Unlock()
}

// session sends one session's turns in order.
func (r *runner) session(ctx context.Context, idx int, s bench.Session) {
	var (
		history []byte           // the completions prompt so far
		msgs    *messagesSession // or the Messages conversation
	)
	if r.o.API == APIMessages {
		msgs = newMessagesSession(r, idx, &s)
	}
	for k, tu := range s.Turns {
		if k > 0 && tu.Gap > 0 {
			t := time.NewTimer(time.Duration(float64(tu.Gap) / r.o.Speed))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		var (
			path         = pathCompletions
			body, prompt []byte
			chars        int
		)
		if msgs != nil {
			path, body = pathMessages, msgs.turn(k, tu, tu.Output)
			chars = msgs.chars
		} else {
			prompt = append(history, r.render(r.tokens(tu))...)
			body, chars = r.completionBody(prompt, tu.Output, s.User), len(prompt)
		}
		select {
		case r.sem <- struct{}{}:
		default:
			r.mu.Lock()
			r.delayed++
			r.mu.Unlock()
			select {
			case r.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
		q, out := r.send(ctx, idx, k, s.Key, path, body, chars)
		<-r.sem
		r.record(q)
		if q.Err != "" || ctx.Err() != nil {
			return
		}
		out = resentText(tu, out)
		if msgs != nil {
			msgs.answered(k, out, k+1 < len(s.Turns))
		} else {
			history = append(prompt, out...)
		}
	}
}

// resentText is what of a turn's generated text the next turn resends:
// without its first Hidden of Output tokens' share of the text (a
// reasoning model's thinking, dropped from earlier assistant turns).
func resentText(tu bench.Turn, out []byte) []byte {
	if tu.Hidden <= 0 || tu.Output <= 0 {
		return out
	}
	return out[len(out)*min(tu.Hidden, tu.Output)/tu.Output:]
}

// tokens are a turn's new tokens.
func (r *runner) tokens(tu bench.Turn) []uint32 {
	if tu.TraceIDs != nil {
		return kvblock.ExpandTrace(tu.TraceIDs, tu.TraceLen, tu.TraceBlock)
	}
	return bench.Expand(nil, tu.Append)
}

// render renders workload tokens as letters (as words with Options.Words).
func (r *runner) render(toks []uint32) []byte {
	letter := func(t uint32) byte { return 'a' + byte((uint64(t)^r.o.Salt*0x9e3779b97f4a7c15)%26) }
	if r.o.Words {
		out := make([]byte, 2*len(toks))
		for i, t := range toks {
			out[2*i], out[2*i+1] = ' ', letter(t)
		}
		return out
	}
	out := make([]byte, len(toks))
	for i, t := range toks {
		out[i] = letter(t)
	}
	return out
}

type completionRequest struct {
	Model         string         `json:"model"`
	Prompt        any            `json:"prompt"` // text, or token ids (Options.TokenIDs)
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options"`
	IgnoreEOS     bool           `json:"ignore_eos"`
	User          string         `json:"user,omitempty"` // the session's OpenAI user field, if its client sends one
}

type chunk struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// completionBody is a streamed completion of prompt.
func (r *runner) completionBody(prompt []byte, maxTokens int, user string) []byte {
	var p any = string(prompt)
	if r.o.TokenIDs {
		p = simtok.Encode(string(prompt), true)
	}
	body, _ := json.Marshal(completionRequest{
		Model: r.o.Model, Prompt: p, MaxTokens: maxTokens, Stream: true,
		StreamOptions: map[string]any{"include_usage": true}, IgnoreEOS: true, User: user,
	})
	return body
}

// send posts one streamed request of the run's API and measures it; it
// returns the generated text.
func (r *runner) send(ctx context.Context, sess, turn int, key, path string, body []byte, promptChars int) (Request, []byte) {
	q := Request{Session: sess, Turn: turn, PromptChars: promptChars, CachedTokens: -1}
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(r.o.URL, "/")+path, bytes.NewReader(body))
	if err != nil {
		q.Err = err.Error()
		return q, nil
	}
	req.Header.Set("Content-Type", "application/json")
	if r.o.API == APIMessages {
		req.Header.Set("Anthropic-Version", "2023-06-01")
	}
	for k, vs := range r.o.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if r.o.SessionHeader != "-" && key != "" {
		req.Header.Set(r.o.SessionHeader, key)
	}
	start := time.Now()
	q.Start = start.Sub(r.begin)
	resp, err := r.o.Client.Do(req)
	if err != nil {
		q.Err = err.Error()
		return q, nil
	}
	defer resp.Body.Close()
	q.Status = resp.StatusCode
	q.Upstream = resp.Header.Get(UpstreamHeader)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		q.Err = fmt.Sprintf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return q, nil
	}
	var out []byte
	if r.o.API == APIMessages {
		out = readMessagesStream(resp.Body, &q, start)
		q.E2E = time.Since(start)
		return q, out
	}
	last := start
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if bytes.Equal(data, []byte("[DONE]")) {
			break
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			q.Err = fmt.Sprintf("bad chunk: %v", err)
			return q, out
		}
		if len(c.Choices) > 0 && c.Choices[0].Text != "" {
			last = q.chunk(start, last, time.Now())
			out = append(out, c.Choices[0].Text...)
		}
		if c.Usage != nil {
			q.PromptTokens, q.CompletionTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
			if c.Usage.PromptTokensDetails != nil {
				q.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
			} else {
				q.CachedTokens = 0
			}
		}
	}
	q.E2E = time.Since(start)
	if err := sc.Err(); err != nil {
		q.Err = err.Error()
	} else if q.OutputChunks == 0 {
		q.Err = "no output"
	}
	return q, out
}

// Summarize computes a report's summary over the successful requests.
func Summarize(rep *Report) Summary {
	s := Summary{URL: rep.URL, Duration: rep.Duration.Seconds(), Delayed: rep.Delayed}
	var ttft, e2e, itl []float64
	var prompt, cached, tokens int
	for _, q := range rep.Requests {
		s.Requests++
		if q.Err != "" {
			s.Errors++
			continue
		}
		ttft = append(ttft, q.TTFT.Seconds())
		e2e = append(e2e, q.E2E.Seconds())
		for _, d := range q.ITLs {
			itl = append(itl, d.Seconds())
		}
		tokens += max(q.CompletionTokens, q.OutputChunks)
		if q.CachedTokens >= 0 {
			prompt += q.PromptTokens
			cached += q.CachedTokens
		}
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	slices.Sort(itl)
	if len(ttft) > 0 {
		t := 0.0
		for _, x := range ttft {
			t += x
		}
		s.TTFTMean = t / float64(len(ttft))
	}
	s.TTFTP50, s.TTFTP90, s.TTFTP99 = bench.Quantile(ttft, 0.5), bench.Quantile(ttft, 0.9), bench.Quantile(ttft, 0.99)
	s.ITLP50, s.ITLP99 = bench.Quantile(itl, 0.5), bench.Quantile(itl, 0.99)
	s.E2EP50, s.E2EP99 = bench.Quantile(e2e, 0.5), bench.Quantile(e2e, 0.99)
	if rep.Duration > 0 {
		s.Throughput = float64(tokens) / rep.Duration.Seconds()
	}
	if prompt > 0 {
		s.HitRate = float64(cached) / float64(prompt)
	}
	return s
}

// chunk records an output chunk that arrived at now, on a request sent at
// start whose previous chunk came at last: the first chunk's time to first
// token, a later one's gap. It returns now.
func (q *Request) chunk(start, last, now time.Time) time.Time {
	if q.OutputChunks == 0 {
		q.TTFT = now.Sub(start)
	} else {
		q.ITLs = append(q.ITLs, now.Sub(last))
	}
	q.OutputChunks++
	return now
}
