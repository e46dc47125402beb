package main

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/engine/kvwire"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(1)
	}
}

type options struct {
	host, model          string
	port                 int
	cfg                  engine.Config
	promptDetails        bool
	scaleOut             bool
	apiKey               string
	loras                []loraModule
	eventsDisable        bool
	pub                  pubConfig
	format, hashMode     string
	speed                float64
	slowAfter            time.Duration // fault injection: slow to slowTo from this simulated time on (0: never)
	slowTo               float64
	seed                 uint64
	seedSet              bool
	stepMs, stepPerSeqMs float64
	logLevel             string
	tokenizerDir         string
	responsesStore       bool // the Responses API response store (store.go)
	responsesStoreMax    int
}

type loraFlag struct{ mods *[]loraModule }

func (l loraFlag) String() string { return "" }

func (l loraFlag) Set(v string) error {
	for f := range strings.FieldsFuncSeq(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		name, path, ok := strings.Cut(f, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("lora module %q: want name=path", f)
		}
		*l.mods = append(*l.mods, loraModule{name: name, path: path, id: len(*l.mods) + 1})
	}
	return nil
}

func parseFlags(args []string, out io.Writer) (*options, error) {
	o := &options{}
	storeDefault, err := storeEnabled(os.Getenv(storeEnv))
	if err != nil {
		return nil, err
	}
	fs := flag.NewFlagSet("enginesim", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.host, "host", "0.0.0.0", "HTTP listen host")
	fs.IntVar(&o.port, "port", 8000, "HTTP listen port (0 picks a free one)")
	fs.StringVar(&o.model, "model", "sim-model", "served model name")
	served := fs.String("served-model-name", "", "served model name (overrides --model)")
	fs.IntVar(&o.cfg.BlockSize, "block-size", 16, "tokens per KV block")
	fs.IntVar(&o.cfg.NumGPUBlocks, "num-gpu-blocks", 2048, "GPU KV capacity in blocks")
	fs.IntVar(&o.cfg.NumGPUBlocks, "num-gpu-blocks-override", 2048, "alias of --num-gpu-blocks")
	fs.IntVar(&o.cfg.NumCPUBlocks, "cpu-offload-blocks", 0, "CPU offload tier in blocks (0: none)")
	fs.IntVar(&o.cfg.SlidingWindow, "hybrid-sliding-window", 0, "hybrid-attention model: a sliding-window KV-cache group (group 1) of this window in tokens beside the full-attention group, as vLLM 0.33 publishes it (0: one full-attention group)")
	fs.IntVar(&o.cfg.MaxModelLen, "max-model-len", 4096, "max prompt plus output tokens")
	fs.IntVar(&o.cfg.MaxNumSeqs, "max-num-seqs", 256, "max running requests")
	fs.IntVar(&o.cfg.MaxNumBatchedTokens, "max-num-batched-tokens", 8192, "token budget per step (prefill chunk size)")
	fs.BoolVar(&o.promptDetails, "enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens")
	fs.StringVar(&o.apiKey, "api-key", "", "refuse /v1, /v2, /inference and /cohere requests without \"Authorization: Bearer KEY\" (401 {\"error\": \"Unauthorized\"}), as vLLM's --api-key does; /health, /metrics and /tokenize stay open")
	fs.BoolVar(&o.scaleOut, "enable-scale-out", false, "serve the render endpoints (POST /v1/chat/completions/render, /v1/completions/render, /v1/responses/render, /v1/messages/render): the prompt's token ids, as vLLM 0.33 serves them with this flag")
	fs.Var(loraFlag{&o.loras}, "lora-modules", "LoRA adapters as name=path (repeatable, or comma/space separated)")
	fs.BoolVar(&o.eventsDisable, "kv-events-disable", false, "publish no KV events")
	fs.StringVar(&o.pub.endpoint, "kv-events-endpoint", "tcp://*:5557", "ZMQ PUB endpoint (binds if it has * or :: or is ipc/inproc or port 0, else connects)")
	fs.StringVar(&o.pub.replayEndpoint, "kv-events-replay-endpoint", "tcp://*:5558", "ZMQ ROUTER replay endpoint (always binds; empty: no replay)")
	fs.StringVar(&o.pub.topic, "kv-events-topic", "", "topic frame of every batch")
	fs.IntVar(&o.pub.bufferSteps, "kv-events-buffer-steps", 10000, "batches kept for replay")
	fs.StringVar(&o.format, "kv-events-format", "map", "event encoding: map (current vLLM) or array (older vLLM)")
	fs.StringVar(&o.hashMode, "kv-events-hash", "int", "block hash encoding: int (uint64) or bytes (32-byte bin)")
	fs.Float64Var(&o.pub.dropRate, "kv-events-drop-rate", 0, "fault injection: fraction of batches not sent (their sequence numbers are consumed)")
	fs.BoolVar(&o.pub.legacyReplay, "kv-events-replay-legacy", false, "answer replays in vLLM <= v0.25 framing (no topic frame)")
	fs.Float64Var(&o.cfg.PrefillTokensPerSec, "prefill-tokens-per-s", 10000, "prefill speed for uncached tokens")
	fs.Float64Var(&o.stepMs, "decode-step-ms", 10, "time of one scheduler step with a batch of one")
	fs.Float64Var(&o.stepPerSeqMs, "decode-step-per-seq-ms", 0.1, "added step time per sequence in the batch")
	fs.Float64Var(&o.speed, "speed", 1, "time multiplier: 10 runs the simulation ten times faster than real time")
	fs.DurationVar(&o.slowAfter, "slow-after", 0, "fault injection: after this much simulated time the engine runs at --slow-to of its speed (prefill speed times it, step times divided by it), as a GPU that throttles; 0: never")
	fs.Float64Var(&o.slowTo, "slow-to", 1, "fault injection: the speed factor --slow-after applies, in (0, 1]")
	seed := fs.Uint64("seed", 0, "seed for block hashes, generated text and drops (default: random per process)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.tokenizerDir, "tokenizer-dir", "", "directory with a HuggingFace tokenizer.json (and tokenizer_config.json for chat) that POST /tokenize and the engine's text prompts use instead of the simulator's byte tokens; generated tokens then go out as one-token words (\" q\")")
	fs.BoolVar(&o.responsesStore, "enable-responses-store", storeDefault, "keep Responses API responses for previous_response_id and GET /v1/responses/{id}, as vLLM does with "+storeEnv+"=1 (the default is that variable's value)")
	fs.IntVar(&o.responsesStoreMax, "responses-store-max", 10000, "responses the store keeps, the oldest dropped (vLLM drops none)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "seed" {
			o.seedSet = true
		}
	})
	o.seed = *seed
	if !o.seedSet {
		var b [8]byte
		_, _ = crand.Read(b[:])
		o.seed = binary.LittleEndian.Uint64(b[:])
	}
	if *served != "" {
		o.model = *served
	}
	o.cfg.Model = o.model
	o.cfg.StepTime = time.Duration(o.stepMs * float64(time.Millisecond))
	o.cfg.StepTimePerSeq = time.Duration(o.stepPerSeqMs * float64(time.Millisecond))
	if o.pub.wire.Format, err = kvwire.ParseFormat(o.format); err != nil {
		return nil, err
	}
	if o.pub.wire.Hash, err = kvwire.ParseHashMode(o.hashMode); err != nil {
		return nil, err
	}
	switch {
	case o.speed <= 0:
		return nil, fmt.Errorf("--speed must be positive, got %v", o.speed)
	case o.slowAfter < 0 || !(o.slowTo > 0 && o.slowTo <= 1):
		return nil, fmt.Errorf("--slow-after must not be negative and --slow-to must be in (0, 1], got %v and %v", o.slowAfter, o.slowTo)
	case o.pub.dropRate < 0 || o.pub.dropRate > 1:
		return nil, fmt.Errorf("--kv-events-drop-rate must be in [0, 1], got %v", o.pub.dropRate)
	case o.pub.bufferSteps < 1:
		return nil, fmt.Errorf("--kv-events-buffer-steps must be positive, got %d", o.pub.bufferSteps)
	case o.stepMs <= 0 || o.stepPerSeqMs < 0:
		return nil, errors.New("--decode-step-ms must be positive and --decode-step-per-seq-ms not negative")
	case o.responsesStoreMax < 1:
		return nil, fmt.Errorf("--responses-store-max must be positive, got %d", o.responsesStoreMax)
	case o.port < 0 || o.port > 65535:
		return nil, fmt.Errorf("--port %d out of range", o.port)
	}
	for _, l := range o.loras {
		if l.name == o.model {
			return nil, fmt.Errorf("lora module %q has the served model's name", l.name)
		}
	}
	o.pub.seed = o.seed
	o.pub.queue = 10000
	return o, nil
}

// runInfo is what a started simulator listens on.
type runInfo struct {
	HTTPAddr       string
	Endpoint       string
	ReplayEndpoint string
}

// run starts the simulator and blocks until ctx ends; ready, if not nil, is
// called once everything listens.
func run(ctx context.Context, args []string, logw io.Writer, ready func(runInfo)) error {
	o, err := parseFlags(args, logw)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: level}))
	eng, err := engine.New(o.cfg, o.seed)
	if err != nil {
		return err
	}
	var realTok *realTokenizer
	if o.tokenizerDir != "" {
		if realTok, err = loadRealTokenizer(o.tokenizerDir); err != nil {
			return err
		}
	}
	var pub *publisher
	publish := func([]engine.Event) {}
	if !o.eventsDisable {
		if pub, err = newPublisher(o.pub, log); err != nil {
			return err
		}
		pub.start()
		defer pub.Close()
		publish = pub.Publish
	}
	d := newDriver(eng, o.speed, publish)
	if o.slowAfter > 0 && o.slowTo < 1 {
		slow := eng.Config().AtSpeed(o.slowTo)
		if err := slow.Validate(); err != nil {
			return fmt.Errorf("--slow-to: %w", err)
		}
		d.slowAt, d.slow = o.slowAfter, &slow
	}
	reg := prometheus.NewRegistry()
	if err := newMetrics(reg, o.model, eng.Config(), d, pub); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s := &server{
		model: o.model, maxModelLen: eng.Config().MaxModelLen, promptDetails: o.promptDetails, scaleOut: o.scaleOut,
		loras: o.loras, d: d, pub: pub, reg: reg, created: time.Now().Unix(), log: log, realTok: realTok,
		blockSize: eng.Config().BlockSize, bg: newBackgroundRuns(),
	}
	if o.responsesStore {
		s.store = newResponseStore(o.responsesStoreMax)
		for _, c := range s.store.collectors() {
			if err := reg.Register(c); err != nil {
				return fmt.Errorf("metrics: %w", err)
			}
		}
	}
	srv := &http.Server{Handler: guarded(s.handler(), o.apiKey), ReadHeaderTimeout: 10 * time.Second}

	driverCtx, stopDriver := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.run(driverCtx)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	info := runInfo{HTTPAddr: ln.Addr().String()}
	if pub != nil {
		info.Endpoint, info.ReplayEndpoint = pub.endpoint, pub.replayEndpoint
	}
	log.Info("enginesim serving", slog.String("http", info.HTTPAddr), slog.String("model", o.model),
		slog.String("kv_events", info.Endpoint), slog.String("kv_replay", info.ReplayEndpoint),
		slog.Uint64("seed", o.seed), slog.Float64("speed", o.speed), slog.Bool("responses_store", o.responsesStore))
	if ready != nil {
		ready(info)
	}

	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("http serve: %w", err)
	}
	// Background responses are aborted first (their runs joined): the
	// streams that replay their events then end, and the HTTP server can
	// drain.
	s.bg.close()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if e := srv.Shutdown(shutdownCtx); e != nil {
		_ = srv.Close()
	}
	cancel()
	if err == nil {
		if e := <-serveErr; e != nil && !errors.Is(e, http.ErrServerClosed) {
			err = fmt.Errorf("http serve: %w", e)
		}
	}
	stopDriver()
	wg.Wait()
	log.Info("enginesim stopped")
	return err
}
