package overhead

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvroute/kvroute/pkg/extproc"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

// staticState is four healthy idle replicas of model "m".
type staticState struct{ reps []route.Replica }

func (s staticState) Replicas() []route.Replica      { return s.reps }
func (s staticState) Load(index.ReplicaID) load.Load { return load.Load{Healthy: true} }
func (s staticState) Trust(index.ReplicaID) float64  { return 1 }

// tokenizerDir finds the fetched Qwen3 tokenizer files (make fixtures).
func tokenizerDir(tb testing.TB) string {
	dir := os.Getenv("KVROUTE_TOKENIZER_CACHE")
	if dir == "" {
		dir = "../../.cache/tokenizers"
	}
	dir = filepath.Join(dir, "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		tb.Skipf("Qwen3 tokenizer files missing (%v): run `make fixtures`", err)
	}
	return dir
}

type streamBench struct {
	client extprocv3.ExternalProcessorClient
	stop   func()
}

func newTokenizer(dir string) (*tokenize.Tokenizer, error) {
	return tokenize.New(tokenize.Config{Models: map[string]tokenize.ModelConfig{"m": {
		Kind: tokenize.KindLocal, TokenizerJSON: filepath.Join(dir, "tokenizer.json"),
		TokenizerConfig: filepath.Join(dir, "tokenizer_config.json"),
	}}}, tokenize.Options{})
}

// newStreamBench serves a real route.Router (index, kvroute policy, local
// Qwen3 tokenizer) behind extproc over TCP loopback, one client
// connection, as Envoy has one per worker.
var (
	sharedTokOnce sync.Once
	sharedTok     *tokenize.Tokenizer
	sharedTokErr  error
)

func newStreamBench(tb testing.TB, opts []grpc.ServerOption) *streamBench {
	dir := tokenizerDir(tb)
	sharedTokOnce.Do(func() { sharedTok, sharedTokErr = newTokenizer(dir) })
	if sharedTokErr != nil {
		tb.Fatal(sharedTokErr)
	}
	tok := sharedTok
	pol, err := policy.New(policy.NameKVRoute, policy.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	var reps []route.Replica
	for i := range 4 {
		reps = append(reps, route.Replica{ID: index.ReplicaID(fmt.Sprint("r", i)), Address: fmt.Sprintf("127.0.0.1:%d", 8001+i), Model: "m", BlockSize: 16})
	}
	r := route.New(route.Options{Matcher: index.New(index.Config{}), State: staticState{reps}, Policy: pol, Tokenizer: tok})
	tr, _ := load.NewTracker(nil)
	srv, err := extproc.New(extproc.Config{Decider: r, Tracker: tr})
	if err != nil {
		tb.Fatal(err)
	}
	return serveBench(tb, opts, srv)
}

// serveBench serves srv over TCP loopback, one client connection, as
// Envoy has one per worker.
func serveBench(tb testing.TB, opts []grpc.ServerOption, srv extprocv3.ExternalProcessorServer) *streamBench {
	g := grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(g, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		tb.Fatal(err)
	}
	return &streamBench{client: extprocv3.NewExternalProcessorClient(conn), stop: func() { conn.Close(); g.Stop(); <-done }}
}

func hdrs(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// chatBody is a chat of turns alternating messages of about size/turns
// bytes each, of varied English-like text.
func chatBody(size, turns int) []byte {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches and " +
		"numbers like 42 or 3.14 appear with code fragments such as func main() { return nil } inside prose")
	var msgs []map[string]string
	per := size / turns
	for t := range turns {
		var sb strings.Builder
		for i := 0; sb.Len() < per; i++ {
			sb.WriteString(words[(i*7+t*13)%len(words)])
			sb.WriteByte(' ')
		}
		role := "user"
		if t%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": fmt.Sprintf("%s turn %d: %s", uniqueMark, t, sb.String())})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "stream": true, "max_tokens": 64,
		"stream_options": map[string]any{"include_usage": true}})
	return b
}

// uniqueMark is replaced per request (unique) so that every request is
// cold for the tokenizer's caches.
const uniqueMark = "#00000000#"

// stamp returns body with every uniqueMark replaced by n.
func stamp(body []byte, n uint64) []byte {
	return bytes.ReplaceAll(body, []byte(uniqueMark), fmt.Appendf(nil, "#%08d#", n%100_000_000))
}

// sseChunks is a streamed response of n events, usage in the last.
func sseChunks(n int) [][]byte {
	out := make([][]byte, 0, n+1)
	for i := range n {
		out = append(out, fmt.Appendf(nil, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i))
	}
	out = append(out, []byte("data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":80,\"completion_tokens\":64,\"total_tokens\":144,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n"))
	return out
}

// route opens a router stream on ctx and sends it a chat's request
// headers and BUFFERED body, as Envoy does (respMode the response body
// mode the stream announces); it returns the stream and the body's
// answer, failing tb unless the request was routed.
func (sb *streamBench) route(ctx context.Context, tb testing.TB, body []byte, respMode filterv3.ProcessingMode_BodySendMode) (extprocv3.ExternalProcessor_ProcessClient, *extprocv3.ProcessingResponse) {
	s, err := sb.client.Process(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	pc := &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: respMode}
	if err := s.Send(&extprocv3.ProcessingRequest{ProtocolConfig: pc, Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":path", "/v1/chat/completions", ":method", "POST", "content-type", "application/json")}}}); err != nil {
		tb.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		tb.Fatal(err)
	}
	if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		tb.Fatal(err)
	}
	r, err := s.Recv()
	if err != nil {
		tb.Fatal(err)
	}
	if r.GetImmediateResponse() != nil || r.GetRequestBody() == nil {
		tb.Fatalf("not routed: %v", r)
	}
	return s, r
}

// exchange runs one request on a single stream: BUFFERED request body,
// FULL_DUPLEX_STREAMED response answered chunk by chunk (a proxy that
// sends the response on the router stream; envoy/envoy.yaml's own pattern,
// with the observer filter, is exchangeObserved).
func (sb *streamBench) exchange(tb testing.TB, body []byte, chunks [][]byte) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, _ := sb.route(ctx, tb, body, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	send := func(r *extprocv3.ProcessingRequest) {
		if err := s.Send(r); err != nil {
			tb.Fatal(err)
		}
	}
	recv := func() *extprocv3.ProcessingResponse {
		r, err := s.Recv()
		if err != nil {
			tb.Fatal(err)
		}
		return r
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "200", "content-type", "text/event-stream")}}})
	recv()
	for i, c := range chunks {
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: c, EndOfStream: i == len(chunks)-1}}})
		recv()
	}
	_ = s.CloseSend()
	_, _ = s.Recv()
}

// exchangeCases are the request sizes the exchange benchmarks run: a chat
// body of size bytes in turns messages, answered in chunks streamed
// chunks.
var exchangeCases = []struct {
	name                string
	size, turns, chunks int
}{{"small", 1000, 2, 64}, {"229KB", 229_000, 16, 64}, {"533KB", 533_000, 16, 64}}

// BenchmarkStream runs whole ext_proc exchanges in parallel against the
// real decision path: profile it with -cpuprofile / -memprofile.
//
//	go test -run '^$' -bench BenchmarkStream -cpuprofile cpu.out ./pkg/overhead/
func BenchmarkStream(b *testing.B) {
	for _, c := range exchangeCases {
		b.Run(c.name, func(b *testing.B) {
			sb := newStreamBench(b, []grpc.ServerOption{grpc.MaxRecvMsgSize(32 << 20)})
			defer sb.stop()
			benchExchanges(b, chatBody(c.size, c.turns), sseChunks(c.chunks), sb.exchange)
		})
	}
}

// benchExchanges runs exchange in parallel, each on body made unique
// (stamp), and reports the process's CPU per exchange. Both ends run in
// this process: the client's share (marshal and send the body, read the
// answers) is included.
func benchExchanges(b *testing.B, body []byte, chunks [][]byte, exchange func(testing.TB, []byte, [][]byte)) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var seq atomic.Uint64
	t0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			exchange(b, stamp(body, seq.Add(1)), chunks)
		}
	})
	b.ReportMetric(float64((cpuTime()-t0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// newFloorBench serves an extproc.FloorProcessor the way newStreamBench
// serves kvroute.
func newFloorBench(tb testing.TB, opts []grpc.ServerOption) *streamBench {
	f, err := extproc.NewFloorProcessor([]string{"127.0.0.1:8001", "127.0.0.1:8002"})
	if err != nil {
		tb.Fatal(err)
	}
	return serveBench(tb, opts, f)
}

// exchangeObserved runs one request the way Envoy does with
// envoy/envoy.yaml: the router filter's stream (request headers and a
// BUFFERED body, each answered) and the observer filter's
// observability-mode stream (the decision id in its request headers, the
// response headers and every chunk, none answered), which Envoy feeds
// without waiting. The observer sends every chunk whatever the server
// does: a server that stops reading early still has the frames already
// sent to read, as with an engine streaming faster than the round trip.
func (sb *streamBench) exchangeObserved(tb testing.TB, body []byte, chunks [][]byte) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	router, r := sb.route(ctx, tb, body, filterv3.ProcessingMode_NONE)
	id := ""
	for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == extproc.DecisionHeader {
			id = string(h.GetHeader().GetRawValue())
		}
	}
	if id == "" {
		tb.Fatalf("routed without a decision id: %v", r)
	}

	obs, err := sb.client.Process(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	opc := &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_NONE, ResponseBodyMode: filterv3.ProcessingMode_STREAMED}
	msgs := []*extprocv3.ProcessingRequest{
		{ProtocolConfig: opc, ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(extproc.DecisionHeader, id)}}},
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "200", "content-type", "text/event-stream")}}},
	}
	for i, c := range chunks {
		msgs = append(msgs, &extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: c, EndOfStream: i == len(chunks)-1}}})
	}
	for _, m := range msgs {
		if obs.Send(m) != nil {
			break // the server ended the stream
		}
	}
	_ = obs.CloseSend()
	_, _ = obs.Recv() // the server's end of the stream
	// The response is over: Envoy ends the router stream.
	_ = router.CloseSend()
	_, _ = router.Recv()
}

// BenchmarkExchangeFloor runs envoy/envoy.yaml's two streams per request
// in parallel against kvroute (the real decision path, as BenchmarkStream)
// and against extproc.FloorProcessor, side by side: kvroute's cpu-µs/op less the
// floor's is what kvroute does beyond gRPC and protobuf. Both ends run in
// this process, so each figure includes the client's (Envoy's) share.
//
//	go test -run '^$' -bench BenchmarkExchangeFloor -count 5 ./pkg/overhead/
func BenchmarkExchangeFloor(b *testing.B) {
	for _, c := range exchangeCases[:2] {
		for _, server := range []string{"kvroute", "floor"} {
			b.Run(c.name+"/"+server, func(b *testing.B) {
				// kvroute's own server options (its codec, windows and
				// stream workers) for both.
				opts := extproc.Config{}.ServerOptions()
				var sb *streamBench
				if server == "kvroute" {
					sb = newStreamBench(b, opts)
				} else {
					sb = newFloorBench(b, opts)
				}
				defer sb.stop()
				benchExchanges(b, chatBody(c.size, c.turns), sseChunks(c.chunks), sb.exchangeObserved)
			})
		}
	}
}
