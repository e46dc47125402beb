package extproc

import (
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"gopkg.in/yaml.v3"
)

func TestConfigDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.MaxBodyBytes != DefaultMaxBodyBytes || c.MaxResponseBodyBytes != DefaultMaxResponseBodyBytes ||
		c.DecideTimeout != DefaultDecideTimeout || c.DestinationHeader != DefaultDestinationHeader ||
		c.FallbackHeader != DefaultFallbackHeader || c.SessionHeader != DefaultSessionHeader {
		t.Errorf("defaults not applied: %+v", c)
	}
	if got := (Config{}).MaxRecvMsgBytes(); got <= DefaultMaxBodyBytes {
		t.Errorf("MaxRecvMsgBytes %d does not admit a %d-byte body", got, DefaultMaxBodyBytes)
	}
	if got := (Config{MaxBodyBytes: 5 << 20}).MaxRecvMsgBytes(); got <= 5<<20 || got > 7<<20 {
		t.Errorf("MaxRecvMsgBytes for 5 MiB = %d", got)
	}
	// Set values survive; header names are lower-cased.
	c = Config{MaxBodyBytes: 7, DecideTimeout: time.Second, SessionHeader: "X-Conv"}.WithDefaults()
	if c.MaxBodyBytes != 7 || c.DecideTimeout != time.Second || c.SessionHeader != "x-conv" {
		t.Errorf("WithDefaults overwrote settings: %+v", c)
	}
}

func TestConfigYAML(t *testing.T) {
	var c Config
	in := "max_body_bytes: 1048576\nmax_response_body_bytes: 2048\ndecide_timeout: 300ms\nsession_header: x-s\n" +
		"destination_header: x-d\nfallback_header: x-f\nfallbacks_in_destination: true\nignore_subset_hint: true\n"
	dec := yaml.NewDecoder(strings.NewReader(in))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	want := Config{MaxBodyBytes: 1 << 20, MaxResponseBodyBytes: 2048, DecideTimeout: 300 * time.Millisecond,
		SessionHeader: "x-s", DestinationHeader: "x-d", FallbackHeader: "x-f", FallbacksInDestination: true, IgnoreSubsetHint: true}
	if c.MaxBodyBytes != want.MaxBodyBytes || c.MaxResponseBodyBytes != want.MaxResponseBodyBytes || c.DecideTimeout != want.DecideTimeout ||
		c.SessionHeader != want.SessionHeader || c.DestinationHeader != want.DestinationHeader || c.FallbackHeader != want.FallbackHeader ||
		!c.FallbacksInDestination || !c.IgnoreSubsetHint {
		t.Errorf("decoded %+v", c)
	}
}

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	c := Config{
		DestinationHeader: "x bad", SessionHeader: ":path", MaxBodyBytes: -1,
		MaxResponseBodyBytes: -2, DecideTimeout: -time.Second, UsageSampleEvery: -1, UsageSampleInterval: -time.Second,
	}
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted a bad config")
	}
	for _, want := range []string{
		"decider: required", `destination_header: invalid header name "x bad"`, `session_header: invalid header name ":path"`,
		"max_body_bytes: must be positive", "max_response_body_bytes: must be positive", "decide_timeout: must be positive",
		"usage_sample_every: must be positive", "usage_sample_interval: must be positive",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if n := len(strings.Split(err.Error(), "\n")); n != 8 {
		t.Errorf("%d problems reported, want 8:\n%v", n, err)
	}
	err = Config{Decider: &fakeDecider{}, DestinationHeader: "X-A", FallbackHeader: "x-a"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "fallback_header: must differ") {
		t.Errorf("same headers: %v", err)
	}
	err = Config{Decider: &fakeDecider{}, MaxBodyBytes: MaxBodyBytesLimit + 1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "max_body_bytes: must be at most") {
		t.Errorf("huge body limit: %v", err)
	}
	if err := (Config{Decider: &fakeDecider{}}).WithDefaults().Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	if _, err := New(Config{MaxBodyBytes: -1}); err == nil || !strings.HasPrefix(err.Error(), "extproc: ") {
		t.Errorf("New: %v", err)
	}
}

// TestBodyAtTheLimitIsRouted: a body of exactly MaxBodyBytes arrives in
// one BUFFERED message above gRPC's 4 MiB default receive limit and is
// routed; one byte more is a 413 from the router, never a transport error
// (which the proxy would turn into a silent fail-open).
func TestBodyAtTheLimitIsRouted(t *testing.T) {
	const limit = 5 << 20
	fd := &fakeDecider{dec: decision()}
	h := newHarness(t, Config{Decider: fd, MaxBodyBytes: limit})
	bodyOf := func(n int) string {
		head, tail := `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
		return head + strings.Repeat("a", n-len(head)-len(tail)) + tail
	}
	buffered := func() *extprocv3.ProcessingRequest {
		return withMode(reqHeaders(false, ":path", "/v1/chat/completions", "content-type", "application/json"),
			filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	}
	got := h.exchange(buffered(), reqBody(bodyOf(limit), true))
	if len(got) != 2 || got[1].GetRequestBody().GetResponse().GetHeaderMutation() == nil {
		t.Fatalf("body of exactly %d bytes not routed: %v", limit, summarize(got))
	}
	if reqs := fd.requests(); len(reqs) != 1 || len(reqs[0].Input.Messages) < limit-100 {
		t.Fatalf("decider saw %d requests", len(reqs))
	}
	got = h.exchange(buffered(), reqBody(bodyOf(limit+1), true))
	if len(got) != 2 || got[1].GetImmediateResponse().GetStatus().GetCode() != 413 {
		t.Fatalf("body of %d bytes: want headers answer then 413, got %v", limit+1, summarize(got))
	}
	if !strings.Contains(string(got[1].GetImmediateResponse().GetBody()), "max_body_bytes") {
		t.Errorf("413 body does not name the setting: %s", got[1].GetImmediateResponse().GetBody())
	}
	// Streamed in chunks (full duplex), the same limit applies to the sum.
	half := bodyOf(limit + 1)
	got = h.exchange(reqHeaders(false, ":path", "/v1/chat/completions"), reqBody(half[:limit/2], false), reqBody(half[limit/2:], true))
	if len(got) != 1 || got[0].GetImmediateResponse().GetStatus().GetCode() != 413 {
		t.Fatalf("chunked body over the limit: %v", summarize(got))
	}
}

// summarize keeps test failure output small (bodies are megabytes).
func summarize(rs []*extprocv3.ProcessingResponse) []string {
	var out []string
	for _, r := range rs {
		s := r.String()
		if len(s) > 200 {
			s = s[:200] + "..."
		}
		out = append(out, s)
	}
	return out
}
