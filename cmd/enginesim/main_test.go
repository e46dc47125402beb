package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type sim struct {
	info   runInfo
	base   string
	client *http.Client
	// stop stops the simulator and waits until it has stopped (at most
	// 30 s); the test's cleanup calls it too.
	stop func()
}

// startTimeout bounds a simulator's start. Loading a real tokenizer file
// under the race detector on a loaded 2-core host takes tens of seconds; the
// bound only catches a start that hangs.
const startTimeout = 3 * time.Minute

// startSim runs the simulator in-process on loopback with free ports; args
// override the defaults. It stops the simulator when the test ends.
func startSim(t *testing.T, args ...string) *sim {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan runInfo, 1)
	errc := make(chan error, 1)
	all := append([]string{
		"--host", "127.0.0.1", "--port", "0",
		"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
		"--seed", "1", "--speed", "50", "--log-level", "warn",
	}, args...)
	go func() { errc <- run(ctx, all, io.Discard, func(i runInfo) { ready <- i }) }()
	s := &sim{client: &http.Client{Timeout: 60 * time.Second}}
	select {
	case s.info = <-ready:
	case err := <-errc:
		cancel()
		t.Fatalf("simulator did not start: %v", err)
	case <-time.After(startTimeout):
		cancel()
		t.Fatalf("simulator did not start in %v", startTimeout)
	}
	s.base = "http://" + s.info.HTTPAddr
	s.stop = sync.OnceFunc(func() {
		s.client.CloseIdleConnections()
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("simulator did not stop in 30s")
		}
	})
	t.Cleanup(s.stop)
	return s
}

func (s *sim) post(t *testing.T, path string, body string) (int, []byte) {
	t.Helper()
	resp, err := s.client.Post(s.base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return resp.StatusCode, b
}

func (s *sim) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := s.client.Get(s.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completionJSON struct {
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
}

func (s *sim) complete(t *testing.T, body string) completionJSON {
	t.Helper()
	code, b := s.post(t, "/v1/completions", body)
	if code != http.StatusOK {
		t.Fatalf("completion: %d %s", code, b)
	}
	var c completionJSON
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return c
}

func tokenCount(t *testing.T, s *sim, body string) int {
	t.Helper()
	code, b := s.post(t, "/tokenize", body)
	if code != http.StatusOK {
		t.Fatalf("tokenize: %d %s", code, b)
	}
	var r struct {
		Count       int   `json:"count"`
		MaxModelLen int   `json:"max_model_len"`
		Tokens      []int `json:"tokens"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.Count != len(r.Tokens) || r.MaxModelLen == 0 {
		t.Fatalf("tokenize response %s (%v)", b, err)
	}
	return r.Count
}

// Sampled (vLLM's default temperature of 1), one prompt gets an answer of
// its own each time, unless the request repeats a seed; at temperature 0
// the answer repeats.
func TestSampling(t *testing.T) {
	s := startSim(t)
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 5)
	text := func(extra string) string {
		t.Helper()
		return s.complete(t, fmt.Sprintf(`{"model": "sim-model", "prompt": %q, "max_tokens": 32%s}`, prompt, extra)).Choices[0].Text
	}
	if a, b := text(""), text(""); a == b {
		t.Errorf("two sampled answers are one: %q", a)
	}
	if a, b := text(`, "temperature": 0.8, "seed": 42`), text(`, "temperature": 0.8, "seed": 42`); a != b {
		t.Errorf("one seed, two answers: %q vs %q", a, b)
	}
	if a, b := text(`, "seed": 42`), text(`, "seed": 43`); a == b {
		t.Errorf("seeds 42 and 43, one answer: %q", a)
	}
	if a, b := text(`, "temperature": 0`), text(`, "temperature": 0`); a != b {
		t.Errorf("greedy, two answers: %q vs %q", a, b)
	}
}

// A second identical request is served from the cache: full blocks × 16.
func TestCachedTokensOnRepeat(t *testing.T) {
	s := startSim(t, "--enable-prompt-tokens-details")
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 5) // 225 chars
	n := tokenCount(t, s, fmt.Sprintf(`{"prompt": %q}`, prompt))
	if n != len(prompt)+1 {
		t.Fatalf("tokenize count %d, want %d (bytes + BOS)", n, len(prompt)+1)
	}
	body := fmt.Sprintf(`{"model": "sim-model", "prompt": %q, "max_tokens": 7, "temperature": 0}`, prompt)
	first := s.complete(t, body)
	second := s.complete(t, body)
	// vLLM 0.33 reports the details whenever they are enabled: a miss is 0.
	if d := first.Usage.PromptTokensDetails; d == nil || d.CachedTokens != 0 {
		t.Errorf("cold request had details %+v, want cached_tokens 0", d)
	}
	if got, want := second.Usage.PromptTokensDetails.CachedTokens, (n/16)*16; got != want {
		t.Errorf("cached tokens %d, want %d", got, want)
	}
	if second.Usage.PromptTokens != n || second.Usage.CompletionTokens != 7 || second.Usage.TotalTokens != n+7 {
		t.Errorf("usage %+v", second.Usage)
	}
	if first.Choices[0].Text != second.Choices[0].Text || len(first.Choices[0].Text) != 7 {
		t.Errorf("greedy text not deterministic or wrong length: %q vs %q", first.Choices[0].Text, second.Choices[0].Text)
	}
	// Pre-tokenized: the same tokens hit the same blocks.
	ids := make([]string, 0, n)
	ids = append(ids, "256")
	for i := 0; i < len(prompt); i++ {
		ids = append(ids, fmt.Sprint(prompt[i]))
	}
	third := s.complete(t, `{"prompt": [`+strings.Join(ids, ",")+`], "max_tokens": 2}`)
	if third.Usage.PromptTokensDetails.CachedTokens != (n/16)*16 {
		t.Errorf("token-id prompt cached %d", third.Usage.PromptTokensDetails.CachedTokens)
	}
	// Without --enable-prompt-tokens-details the field is null.
	s2 := startSim(t)
	if u := s2.complete(t, body).Usage; u.PromptTokensDetails != nil {
		t.Errorf("prompt_tokens_details without the flag: %+v", u.PromptTokensDetails)
	}
	// Metrics count the queries and hits.
	m := s.get(t, "/metrics")
	for _, want := range []string{
		`vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"} ` + fmt.Sprint(2*(n/16)*16),
		`vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"} ` + fmt.Sprint(3*n),
		`vllm:num_requests_running{engine="0",model_name="sim-model"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="sim-model"} 0`,
		`vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_cpu_blocks="0",num_gpu_blocks="2048"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestChatAndTokenizeAgree(t *testing.T) {
	s := startSim(t, "--enable-prompt-tokens-details", "--lora-modules", "adapter-a=/a,adapter-b=/b")
	msgs := `[{"role":"system","content":"You are brief."},{"role":"user","content":[{"type":"text","text":"Tell me about caches."}]}]`
	n := tokenCount(t, s, `{"messages": `+msgs+`}`)
	want := 1 + len("<|system|>\nYou are brief.<|end|>\n<|user|>\nTell me about caches.<|end|>\n<|assistant|>\n")
	if n != want {
		t.Fatalf("chat tokenize count %d, want %d", n, want)
	}
	if m := tokenCount(t, s, `{"messages": `+msgs+`, "add_generation_prompt": false}`); m != n-len("<|assistant|>\n") {
		t.Errorf("without generation prompt: %d", m)
	}
	for _, model := range []string{"sim-model", "adapter-b"} {
		code, b := s.post(t, "/v1/chat/completions", `{"model":"`+model+`","messages":`+msgs+`,"max_tokens":5}`)
		if code != http.StatusOK {
			t.Fatalf("chat: %d %s", code, b)
		}
		var c completionJSON
		_ = json.Unmarshal(b, &c)
		if c.Object != "chat.completion" || c.Model != model || c.Usage.PromptTokens != n ||
			c.Choices[0].Message.Role != "assistant" || len(c.Choices[0].Message.Content) != 5 {
			t.Errorf("%s: chat response %s", model, b)
		}
	}
	models := s.get(t, "/v1/models")
	for _, id := range []string{`"id":"sim-model"`, `"id":"adapter-a"`, `"id":"adapter-b"`, `"root":"/b"`} {
		if !strings.Contains(models, id) {
			t.Errorf("/v1/models lacks %s: %s", id, models)
		}
	}
	if resp, err := s.client.Get(s.base + "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("health: %v", err)
	} else {
		resp.Body.Close()
	}
}

func TestErrors(t *testing.T) {
	s := startSim(t, "--max-model-len", "64")
	cases := []struct {
		name, path, body string
		code             int
		typ, contains    string
	}{
		{"malformed json", "/v1/completions", `{"prompt": "x",`, 400, "BadRequestError", "invalid JSON"},
		{"malformed chat", "/v1/chat/completions", `not json`, 400, "BadRequestError", "invalid JSON"},
		{"unknown model", "/v1/completions", `{"model": "gpt-9", "prompt": "x"}`, 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"unknown model chat", "/v1/chat/completions", `{"model": "gpt-9", "messages": [{"role":"user","content":"x"}]}`, 404, "NotFoundError", "does not exist"},
		{"unknown model tokenize", "/tokenize", `{"model": "gpt-9", "prompt": "x"}`, 404, "NotFoundError", "does not exist"},
		{"prompt over max len", "/v1/completions", `{"prompt": "` + strings.Repeat("a", 80) + `", "max_tokens": 1}`, 400, "BadRequestError", "maximum context length is 64 tokens"},
		{"prompt plus output over max len", "/v1/completions", `{"prompt": "` + strings.Repeat("a", 50) + `", "max_tokens": 20}`, 400, "BadRequestError", "too large: 20"},
		{"bad prompt type", "/v1/completions", `{"prompt": {"a": 1}}`, 400, "BadRequestError", "prompt must be"},
		{"token out of vocabulary", "/v1/completions", `{"prompt": [1, 999999999]}`, 400, "BadRequestError", "out of vocabulary"},
		{"empty token list", "/v1/completions", `{"prompt": []}`, 400, "BadRequestError", "empty"},
		{"zero max tokens", "/v1/completions", `{"prompt": "x", "max_tokens": 0}`, 400, "BadRequestError", "at least 1"},
		{"stream options without stream", "/v1/completions", `{"prompt": "x", "stream_options": {"include_usage": true}}`, 400, "BadRequestError", "stream=True"},
		{"empty cache salt", "/v1/completions", `{"prompt": "x", "cache_salt": ""}`, 400, "BadRequestError", "cache_salt"},
		{"empty messages", "/v1/chat/completions", `{"messages": []}`, 400, "BadRequestError", "messages"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b := s.post(t, c.path, c.body)
			checkVLLMError(t, code, b, c.code, c.typ, c.contains)
		})
	}
	// Nothing was queued by the rejected requests.
	if m := s.get(t, "/metrics"); !strings.Contains(m, `vllm:prefix_cache_queries_total{engine="0",model_name="sim-model"} 0`) {
		t.Errorf("rejected requests reached the engine")
	}
}

type sseResult struct {
	chunks []completionJSON
	done   bool
}

func readSSE(t *testing.T, r io.Reader) (sseResult, error) {
	var res sseResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return res, fmt.Errorf("not an SSE data line: %q", line)
		}
		if res.done {
			return res, fmt.Errorf("data after [DONE]")
		}
		if data == "[DONE]" {
			res.done = true
			continue
		}
		var c completionJSON
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return res, fmt.Errorf("chunk %q: %w", data, err)
		}
		res.chunks = append(res.chunks, c)
	}
	return res, sc.Err()
}

// 200 concurrent streams complete, each with its own consistent usage.
func TestConcurrentStreaming(t *testing.T) {
	s := startSim(t, "--enable-prompt-tokens-details", "--num-gpu-blocks", "600", "--max-num-seqs", "64")
	const n = 200
	shared := strings.Repeat("shared system prompt for every request; ", 4)
	type outcome struct {
		text   string
		usage  usageJSON
		chunks int
		err    error
	}
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			maxTok := 5 + i%20
			chat := i%2 == 1
			var path, body string
			if chat {
				path = "/v1/chat/completions"
				body = fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, shared+fmt.Sprint(i), maxTok)
			} else {
				path = "/v1/completions"
				body = fmt.Sprintf(`{"prompt":%q,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, shared+fmt.Sprint(i), maxTok)
			}
			resp, err := s.client.Post(s.base+path, "application/json", strings.NewReader(body))
			if err != nil {
				out[i].err = err
				return
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				out[i].err = fmt.Errorf("content type %q", ct)
				return
			}
			res, err := readSSE(t, resp.Body)
			if err != nil {
				out[i].err = err
				return
			}
			if !res.done {
				out[i].err = fmt.Errorf("no [DONE]")
				return
			}
			last := res.chunks[len(res.chunks)-1]
			if last.Usage == nil || len(last.Choices) != 0 {
				out[i].err = fmt.Errorf("last chunk is not the usage chunk: %+v", last)
				return
			}
			out[i].usage = *last.Usage
			var finish int
			for _, c := range res.chunks[:len(res.chunks)-1] {
				ch := c.Choices[0]
				if chat {
					if ch.Delta.Role == "assistant" {
						continue
					}
					out[i].text += ch.Delta.Content
				} else {
					out[i].text += ch.Text
				}
				out[i].chunks++
				if ch.FinishReason != nil {
					finish++
					if *ch.FinishReason != "length" {
						out[i].err = fmt.Errorf("finish reason %q", *ch.FinishReason)
					}
				}
			}
			if finish != 1 {
				out[i].err = fmt.Errorf("%d chunks with a finish reason", finish)
			}
		}()
	}
	wg.Wait()
	cached := 0
	for i, o := range out {
		if o.err != nil {
			t.Errorf("stream %d: %v", i, o.err)
			continue
		}
		maxTok := 5 + i%20
		if o.chunks != maxTok || len(o.text) != maxTok || o.usage.CompletionTokens != maxTok {
			t.Errorf("stream %d: %d chunks, text %q, usage %+v, want %d tokens", i, o.chunks, o.text, o.usage, maxTok)
		}
		if o.usage.TotalTokens != o.usage.PromptTokens+o.usage.CompletionTokens {
			t.Errorf("stream %d: inconsistent usage %+v", i, o.usage)
		}
		d := o.usage.PromptTokensDetails
		if d == nil {
			t.Errorf("stream %d: no prompt token details", i)
			continue
		}
		c := d.CachedTokens
		if c%16 != 0 || c >= o.usage.PromptTokens {
			t.Errorf("stream %d: cached %d of %d", i, c, o.usage.PromptTokens)
		}
		cached += c
	}
	if cached == 0 {
		t.Error("no stream hit the shared prefix")
	}
	m := s.get(t, "/metrics")
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="sim-model"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="sim-model"} 0`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="sim-model"} ` + fmt.Sprint(cached),
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="sim-model"} 200`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="sim-model"} 200`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// A client that goes away mid-stream frees its request.
func TestClientDisconnectAborts(t *testing.T) {
	s := startSim(t, "--speed", "1")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/completions",
		strings.NewReader(`{"prompt":"abandon me","max_tokens":3000,"stream":true}`))
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if strings.Contains(s.get(t, "/metrics"), `vllm:num_requests_running{engine="0",model_name="sim-model"} 0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("aborted request still running after 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ---- KV events ----

type frameMsg [][]byte

func newSocket(t *testing.T, typ zmq.Type) (*zmq.Context, *zmq.Socket) {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := zctx.NewSocket(typ)
	if err != nil {
		t.Fatal(err)
	}
	_ = sock.SetLinger(0)
	t.Cleanup(func() {
		_ = sock.Close()
		_ = zctx.Term()
	})
	return zctx, sock
}

func recvTimeout(t *testing.T, sock *zmq.Socket, d time.Duration) (frameMsg, bool) {
	t.Helper()
	p := zmq.NewPoller()
	p.Add(sock, zmq.POLLIN)
	polled, err := p.Poll(d)
	if err != nil {
		t.Fatal(err)
	}
	if len(polled) == 0 {
		return nil, false
	}
	msg, err := sock.RecvMessageBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	return msg, true
}

type batchRec struct {
	seq     uint64
	topic   string
	payload []byte
}

// replayFrom asks the replay socket for every batch from start.
func replayFrom(t *testing.T, endpoint string, start uint64, legacy bool) []batchRec {
	t.Helper()
	_, dealer := newSocket(t, zmq.DEALER)
	if err := dealer.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	var s8 [8]byte
	binary.BigEndian.PutUint64(s8[:], start)
	if _, err := dealer.SendMessage("", s8[:]); err != nil {
		t.Fatal(err)
	}
	var out []batchRec
	for {
		msg, ok := recvTimeout(t, dealer, 30*time.Second)
		if !ok {
			t.Fatal("replay: no answer in 30s")
		}
		if len(msg[0]) != 0 {
			t.Fatalf("replay: first frame not empty: %q", msg)
		}
		msg = msg[1:]
		if legacy {
			if len(msg) != 2 {
				t.Fatalf("legacy replay: %d frames", len(msg))
			}
			if bytes.Equal(msg[0], replayEnd) {
				if len(msg[1]) != 0 {
					t.Fatal("legacy end marker has a payload")
				}
				return out
			}
			out = append(out, batchRec{seq: binary.BigEndian.Uint64(msg[0]), payload: msg[1]})
			continue
		}
		if len(msg) != 3 {
			t.Fatalf("replay: %d frames", len(msg))
		}
		if bytes.Equal(msg[1], replayEnd) {
			if len(msg[0]) != 0 || len(msg[2]) != 0 {
				t.Fatal("end marker has a topic or payload")
			}
			return out
		}
		if len(msg[1]) != 8 {
			t.Fatalf("seq frame of %d bytes", len(msg[1]))
		}
		out = append(out, batchRec{seq: binary.BigEndian.Uint64(msg[1]), topic: string(msg[0]), payload: msg[2]})
	}
}

func TestShouldBind(t *testing.T) {
	for ep, want := range map[string]bool{
		"tcp://*:5557": true, "tcp://[::]:5557": true, "ipc:///tmp/x": true, "inproc://x": true,
		"tcp://127.0.0.1:0": true, "tcp://127.0.0.1:5557": false, "tcp://router:5557": false,
	} {
		if shouldBind(ep) != want {
			t.Errorf("shouldBind(%q) = %v", ep, !want)
		}
	}
}

func TestEventsStream(t *testing.T) {
	for _, format := range []string{"map", "array"} {
		t.Run(format, func(t *testing.T) {
			s := startSim(t, "--kv-events-format", format, "--kv-events-topic", "kv@sim@sim-model",
				"--num-gpu-blocks", "24", "--max-model-len", "256", "--lora-modules", "ad=/ad")
			_, sub := newSocket(t, zmq.SUB)
			_ = sub.SetSubscribe("")
			if err := sub.Connect(s.info.Endpoint); err != nil {
				t.Fatal(err)
			}
			a := strings.Repeat("alpha beta gamma delta ", 6)
			s.complete(t, fmt.Sprintf(`{"prompt": %q, "max_tokens": 3}`, a))
			s.complete(t, fmt.Sprintf(`{"model": "ad", "prompt": %q, "max_tokens": 3, "cache_salt": "tenant-1"}`, a))
			// Capacity pressure: 24 blocks cannot hold all of these.
			for i := range 4 {
				s.complete(t, fmt.Sprintf(`{"prompt": %q, "max_tokens": 3}`, strings.Repeat(fmt.Sprint(i), 150)))
			}
			code, b := s.post(t, "/reset_prefix_cache", "")
			if code != http.StatusOK {
				t.Fatalf("reset: %d %s", code, b)
			}
			// The replay (from 0) is the complete stream; it ends with the
			// AllBlocksCleared batch once the reset is published.
			var batches []batchRec
			deadline := time.Now().Add(30 * time.Second)
			for {
				batches = replayFrom(t, s.info.ReplayEndpoint, 0, false)
				if len(batches) > 0 {
					_, evs, _, err := decodeBatch(batches[len(batches)-1].payload)
					if err == nil && len(evs) == 1 && evs[0].kind == "AllBlocksCleared" {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatal("reset never published")
				}
				time.Sleep(20 * time.Millisecond)
			}
			held := map[uint64]bool{}
			var stored, removed int
			var sawLoRA bool
			for i, br := range batches {
				if br.seq != uint64(i) || br.topic != "kv@sim@sim-model" {
					t.Fatalf("batch %d: seq %d topic %q", i, br.seq, br.topic)
				}
				ts, evs, rank, err := decodeBatch(br.payload)
				if err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
				if rank != uint64(0) || ts < 1.7e9 || len(evs) == 0 {
					t.Fatalf("batch %d: ts %v rank %v, %d events", i, ts, rank, len(evs))
				}
				for _, ev := range evs {
					switch ev.kind {
					case "BlockStored":
						stored++
						if ev.medium != "GPU" || ev.blockSize != 16 || len(ev.tokens) != 16*len(ev.hashes) {
							t.Fatalf("bad BlockStored %+v", ev)
						}
						if ev.parent != nil && !held[asU64(ev.parent)] {
							t.Errorf("parent %x not held", asU64(ev.parent))
						}
						xk, _ := ev.extraKeys.([]any)
						if len(xk) != len(ev.hashes) {
							t.Fatalf("extra_keys %v for %d blocks", ev.extraKeys, len(ev.hashes))
						}
						if ev.loraName == "ad" {
							sawLoRA = true
							if ev.parent == nil {
								k0, _ := xk[0].([]any)
								if len(k0) != 2 || k0[0] != "ad" || k0[1] != "tenant-1" {
									t.Errorf("block 0 extra keys %v, want [ad tenant-1]", xk[0])
								}
							}
						}
						if format == "map" {
							wantKeys := "type block_hashes parent_block_hash token_ids block_size lora_id medium lora_name extra_keys group_idx kv_cache_spec_kind"
							if got := strings.Join(ev.keys, " "); got != wantKeys {
								t.Fatalf("map keys %q", got)
							}
						}
						for _, h := range ev.hashes {
							held[h] = true
						}
					case "BlockRemoved":
						removed++
						for _, h := range ev.hashes {
							if !held[h] {
								t.Errorf("removed %x never stored", h)
							}
							delete(held, h)
						}
					case "AllBlocksCleared":
						clear(held)
					}
				}
			}
			if stored == 0 || removed == 0 || !sawLoRA {
				t.Errorf("stored %d removed %d lora %v", stored, removed, sawLoRA)
			}
			// Whatever the live subscriber got is byte-identical to the
			// replay. Its subscription may reach the PUB only after the
			// batches above were sent (ZeroMQ's slow joiner, on a loaded
			// machine): keep publishing small requests until it has seen
			// one, then compare everything it got with a fresh replay.
			var live []frameMsg
			var maxSeq uint64
			liveBy := time.Now().Add(30 * time.Second)
			for i := 0; len(live) == 0; i++ {
				for {
					msg, ok := recvTimeout(t, sub, 200*time.Millisecond)
					if !ok {
						break
					}
					if len(msg) != 3 || len(msg[1]) != 8 {
						t.Fatalf("live message has %d frames", len(msg))
					}
					live = append(live, msg)
					maxSeq = max(maxSeq, binary.BigEndian.Uint64(msg[1]))
				}
				if len(live) > 0 {
					break
				}
				if time.Now().After(liveBy) {
					t.Fatal("live subscriber received nothing in 30s")
				}
				s.complete(t, fmt.Sprintf(`{"prompt": %q, "max_tokens": 2}`, strings.Repeat(fmt.Sprint("z", i), 20)))
			}
			all := batches
			for uint64(len(all)) <= maxSeq {
				if time.Now().After(liveBy) {
					t.Fatalf("replay never reached sequence %d", maxSeq)
				}
				time.Sleep(20 * time.Millisecond)
				all = replayFrom(t, s.info.ReplayEndpoint, 0, false)
			}
			for _, msg := range live {
				seq := binary.BigEndian.Uint64(msg[1])
				if !bytes.Equal(msg[2], all[seq].payload) || string(msg[0]) != "kv@sim@sim-model" {
					t.Fatalf("live batch %d differs from its replay", seq)
				}
			}
		})
	}
}

// Injected drops consume sequence numbers; replay heals the gaps, in the
// current and the legacy framing.
func TestDropsAndReplay(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			args := []string{"--kv-events-drop-rate", "0.5"}
			if legacy {
				args = append(args, "--kv-events-replay-legacy")
			}
			s := startSim(t, args...)
			_, sub := newSocket(t, zmq.SUB)
			_ = sub.SetSubscribe("")
			if err := sub.Connect(s.info.Endpoint); err != nil {
				t.Fatal(err)
			}
			// Send until the subscriber has seen a batch (the subscription
			// takes a moment to reach the PUB) and at least 12 were made.
			live := map[uint64][]byte{}
			deadline := time.Now().Add(30 * time.Second)
			for i := 0; i < 12 || len(live) == 0; i++ {
				if time.Now().After(deadline) {
					t.Fatal("subscriber received nothing in 30s")
				}
				s.complete(t, fmt.Sprintf(`{"prompt": %q, "max_tokens": 2}`, strings.Repeat(fmt.Sprint(i), 40)))
				if msg, ok := recvTimeout(t, sub, 10*time.Millisecond); ok {
					live[binary.BigEndian.Uint64(msg[1])] = msg[2]
				}
			}
			var all []batchRec
			for len(all) < 12 {
				all = replayFrom(t, s.info.ReplayEndpoint, 0, legacy)
				if time.Now().After(deadline) {
					t.Fatalf("only %d batches buffered", len(all))
				}
			}
			for i, b := range all {
				if b.seq != uint64(i) {
					t.Fatalf("replay seq %d at %d", b.seq, i)
				}
			}
			for {
				msg, ok := recvTimeout(t, sub, 300*time.Millisecond)
				if !ok {
					break
				}
				live[binary.BigEndian.Uint64(msg[1])] = msg[2]
			}
			if len(live) == 0 || len(live) >= len(all) {
				t.Fatalf("live got %d of %d batches with drop rate 0.5", len(live), len(all))
			}
			for seq, p := range live {
				if !bytes.Equal(p, all[seq].payload) {
					t.Errorf("seq %d differs between live and replay", seq)
				}
			}
			// A replay from the middle starts there.
			tail := replayFrom(t, s.info.ReplayEndpoint, 5, legacy)
			if len(tail) != len(all)-5 || tail[0].seq != 5 {
				t.Errorf("replay from 5: %d batches, first %d", len(tail), tail[0].seq)
			}
		})
	}
}

// A non-wildcard endpoint connects to a subscriber that binds, as vLLM does.
func TestConnectMode(t *testing.T) {
	_, sub := newSocket(t, zmq.SUB)
	_ = sub.SetSubscribe("")
	if err := sub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := sub.GetLastEndpoint()
	s := startSim(t, "--kv-events-endpoint", ep, "--kv-events-hash", "bytes")
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		s.complete(t, fmt.Sprintf(`{"prompt": %q, "max_tokens": 1}`, strings.Repeat(fmt.Sprint(i), 40)))
		msg, ok := recvTimeout(t, sub, 200*time.Millisecond)
		if ok {
			_, evs, _, err := decodeBatch(msg[2])
			if err != nil || len(evs) == 0 {
				t.Fatalf("decode: %v", err)
			}
			// Bytes mode: 32-byte bin hashes.
			top, _ := mpDecode(msg[2])
			ev := top.([]any)[1].([]any)[0].(mapEntries)
			hs, _ := ev.get("block_hashes")
			if b, ok := hs.([]any)[0].([]byte); !ok || len(b) != 32 {
				t.Fatalf("hash is %T, want 32-byte bin", hs.([]any)[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("bound subscriber received nothing in 30s")
		}
	}
}

func TestEventsDisabled(t *testing.T) {
	s := startSim(t, "--kv-events-disable")
	if s.info.Endpoint != "" {
		t.Fatalf("endpoint %q with events disabled", s.info.Endpoint)
	}
	s.complete(t, `{"prompt": "still serves", "max_tokens": 2}`)
	if got := s.get(t, "/kv_event_sources"); !strings.Contains(got, `"sources":[]`) {
		t.Errorf("sources %s", got)
	}
}

// --slow-after and --slow-to slow the engine from a simulated time on:
// the same uncached prompt takes about ten times as long to its first
// token (in simulated time, as the engine's own histogram has it).
func TestSlowAfter(t *testing.T) {
	ttft := func(s *sim) float64 {
		body := fmt.Sprintf(`{"model": "sim-model", "prompt": %q, "max_tokens": 2}`, strings.Repeat("slow engines, ", 200))
		s.complete(t, body)
		for _, line := range strings.Split(s.get(t, "/metrics"), "\n") {
			if strings.HasPrefix(line, "vllm:time_to_first_token_seconds_sum") {
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
		t.Fatal("no time_to_first_token_seconds_sum")
		return 0
	}
	plain := ttft(startSim(t))
	slowed := ttft(startSim(t, "--slow-after", "1ms", "--slow-to", "0.1"))
	if !(slowed > 5*plain) {
		t.Fatalf("time to first token %.4f s slowed, %.4f s not: want about ten times", slowed, plain)
	}
	later := ttft(startSim(t, "--slow-after", "1h", "--slow-to", "0.1"))
	if !(later < 2*plain) {
		t.Fatalf("time to first token %.4f s an hour before the slowdown, %.4f s without one", later, plain)
	}
}

func TestFlagErrors(t *testing.T) {
	cases := map[string][]string{
		"bad format":    {"--kv-events-format", "json"},
		"bad hash":      {"--kv-events-hash", "hex"},
		"bad speed":     {"--speed", "0"},
		"bad drop rate": {"--kv-events-drop-rate", "2"},
		"slow to zero":  {"--slow-after", "1s", "--slow-to", "0"},
		"slow to more":  {"--slow-after", "1s", "--slow-to", "1.5"},
		"slow before":   {"--slow-after", "-1s", "--slow-to", "0.5"},
		"bad lora":      {"--lora-modules", "noequals"},
		"stray arg":     {"extra"},
		"small cache":   {"--num-gpu-blocks", "1", "--port", "0", "--kv-events-disable"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), args, io.Discard, nil)
			if err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// A restarted simulator starts its sequence at 0 again: a subscriber that
// stays bound across the restart sees the sequence go backwards.
func TestRestartResetsSequence(t *testing.T) {
	// A connect-mode PUB reaches the same bound subscriber in both lives.
	_, sub := newSocket(t, zmq.SUB)
	_ = sub.SetSubscribe("")
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	if err := sub.Bind(ep); err != nil {
		t.Fatal(err)
	}
	lives := make([][]uint64, 2)
	for life := range lives {
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan runInfo, 1)
		errc := make(chan error, 1)
		go func() {
			errc <- run(ctx, []string{"--host", "127.0.0.1", "--port", "0", "--kv-events-endpoint", ep,
				"--kv-events-replay-endpoint", "", "--seed", "1", "--speed", "50", "--log-level", "warn"},
				io.Discard, func(i runInfo) { ready <- i })
		}()
		var info runInfo
		select {
		case info = <-ready:
		case err := <-errc:
			cancel()
			t.Fatal(err)
		}
		s := &sim{info: info, base: "http://" + info.HTTPAddr, client: &http.Client{Timeout: time.Minute}}
		// The first life publishes at least 30 batches; the second stops
		// at its first received batch.
		enough := func() bool {
			got := lives[life]
			return len(got) > 0 && (life == 1 || got[len(got)-1] >= 30)
		}
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; !enough(); i++ {
			if time.Now().After(deadline) {
				t.Fatalf("life %d: received %v", life, lives[life])
			}
			s.complete(t, fmt.Sprintf(`{"prompt": %q, "max_tokens": 1}`, strings.Repeat(fmt.Sprint(life, i), 30)))
			for {
				msg, ok := recvTimeout(t, sub, 20*time.Millisecond)
				if !ok {
					break
				}
				lives[life] = append(lives[life], binary.BigEndian.Uint64(msg[1]))
			}
		}
		s.client.CloseIdleConnections()
		cancel()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for life, seqs := range lives {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Fatalf("life %d: sequence not increasing: %v", life, seqs)
			}
		}
	}
	if first, last := lives[1][0], lives[0][len(lives[0])-1]; first >= last {
		t.Errorf("restart did not reset the sequence: first life ended at %d, second began at %d", last, first)
	}
}

// checkVLLMError checks an error answer: the status, and vLLM's error body
// with its type, code and a message containing contains.
func checkVLLMError(t *testing.T, code int, b []byte, wantCode int, typ, contains string) {
	t.Helper()
	if code != wantCode {
		t.Fatalf("status %d, want %d: %s", code, wantCode, b)
	}
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Param   any    `json:"param"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error == nil {
		t.Fatalf("body is not a vLLM error: %s", b)
	}
	if e.Error.Type != typ || e.Error.Code != wantCode || !strings.Contains(e.Error.Message, contains) {
		t.Errorf("error %+v, want type %s containing %q", e.Error, typ, contains)
	}
}
