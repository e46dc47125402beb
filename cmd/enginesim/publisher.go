package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/engine/kvwire"
)

// replayEnd is the sequence frame that ends a replay: -1 as 8 signed bytes.
var replayEnd = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

type pubConfig struct {
	endpoint, replayEndpoint string
	topic                    string
	bufferSteps              int
	dropRate                 float64
	legacyReplay             bool
	wire                     kvwire.Options
	seed                     uint64
	queue                    int
}

type buffered struct {
	seq     uint64
	payload []byte
}

// publisher owns the ZMQ PUB socket (one goroutine) and the replay ROUTER
// socket (a second goroutine); they share only the replay buffer. Batches
// enter through a bounded queue; a full queue drops the batch (counted)
// before it gets a sequence number, as vLLM's bounded queue does.
type publisher struct {
	cfg     pubConfig
	zctx    *zmq.Context
	pub     *zmq.Socket
	router  *zmq.Socket
	enc     *kvwire.Encoder
	rng     *rand.Rand
	in      chan []engine.Event
	stop    chan struct{}
	wg      sync.WaitGroup
	log     *slog.Logger
	nextSeq uint64

	endpoint, replayEndpoint string // as bound or connected

	mu  sync.Mutex
	buf []buffered // ring, oldest at head
	hd  int

	sent, injected, queueFull, replays atomic.Int64
	// seqs is the number of sequence numbers consumed so far.
	seqs atomic.Uint64
}

// shouldBind applies vLLM's rule: a PUB binds when the endpoint is a
// wildcard, an IPv6 any-address, ipc:// or inproc://, and connects otherwise.
// Port 0 also binds (to an ephemeral port read back), as vLLM does since it
// gained port-0 discovery.
func shouldBind(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://") ||
		strings.HasSuffix(ep, ":0")
}

func newPublisher(cfg pubConfig, log *slog.Logger) (p *publisher, err error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("zmq context: %w", err)
	}
	p = &publisher{
		cfg: cfg, zctx: zctx, enc: kvwire.NewEncoder(cfg.wire), log: log,
		rng:  rand.New(rand.NewPCG(cfg.seed, 0x6b76)),
		in:   make(chan []engine.Event, cfg.queue),
		stop: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			p.closeSockets()
		}
	}()
	if p.pub, err = zctx.NewSocket(zmq.PUB); err != nil {
		return nil, fmt.Errorf("zmq pub: %w", err)
	}
	_ = p.pub.SetLinger(0)
	_ = p.pub.SetSndhwm(100000)
	if shouldBind(cfg.endpoint) {
		if err = p.pub.Bind(cfg.endpoint); err != nil {
			return nil, fmt.Errorf("bind kv events endpoint %s: %w", cfg.endpoint, err)
		}
		p.endpoint, _ = p.pub.GetLastEndpoint()
	} else {
		if err = p.pub.Connect(cfg.endpoint); err != nil {
			return nil, fmt.Errorf("connect kv events endpoint %s: %w", cfg.endpoint, err)
		}
		p.endpoint = cfg.endpoint
	}
	if cfg.replayEndpoint != "" {
		if p.router, err = zctx.NewSocket(zmq.ROUTER); err != nil {
			return nil, fmt.Errorf("zmq router: %w", err)
		}
		_ = p.router.SetLinger(0)
		if err = p.router.Bind(cfg.replayEndpoint); err != nil {
			return nil, fmt.Errorf("bind replay endpoint %s: %w", cfg.replayEndpoint, err)
		}
		p.replayEndpoint, _ = p.router.GetLastEndpoint()
	}
	return p, nil
}

func (p *publisher) closeSockets() {
	if p.pub != nil {
		_ = p.pub.Close()
	}
	if p.router != nil {
		_ = p.router.Close()
	}
	_ = p.zctx.Term()
}

// start launches the two socket goroutines; Close stops and joins them.
func (p *publisher) start() {
	p.wg.Add(1)
	go p.pubLoop()
	if p.router != nil {
		p.wg.Add(1)
		go p.replayLoop()
	}
}

// Close stops both goroutines, waits for them and closes the sockets.
func (p *publisher) Close() {
	close(p.stop)
	p.wg.Wait()
	p.closeSockets()
}

// Publish queues one batch without blocking.
func (p *publisher) Publish(evs []engine.Event) {
	select {
	case p.in <- evs:
	default:
		p.queueFull.Add(1)
	}
}

func (p *publisher) pubLoop() {
	defer p.wg.Done()
	for {
		select {
		case <-p.stop:
			return
		case evs := <-p.in:
			p.send(evs)
		}
	}
}

func (p *publisher) send(evs []engine.Event) {
	ts := float64(time.Now().UnixNano()) / 1e9
	payload, err := p.enc.Encode(ts, evs)
	if err != nil {
		p.log.Error("encode kv event batch", slog.Any("error", err))
		return
	}
	seq := p.nextSeq
	p.nextSeq++
	p.seqs.Store(p.nextSeq)
	p.mu.Lock()
	if len(p.buf) < p.cfg.bufferSteps {
		p.buf = append(p.buf, buffered{seq, payload})
	} else {
		p.buf[p.hd] = buffered{seq, payload}
		p.hd = (p.hd + 1) % len(p.buf)
	}
	p.mu.Unlock()
	if p.cfg.dropRate > 0 && p.rng.Float64() < p.cfg.dropRate {
		p.injected.Add(1)
		return
	}
	var s8 [8]byte
	binary.BigEndian.PutUint64(s8[:], seq)
	if _, err := p.pub.SendMessage([]byte(p.cfg.topic), s8[:], payload); err != nil {
		p.log.Warn("send kv event batch", slog.Any("error", err))
		return
	}
	p.sent.Add(1)
}

// since returns the buffered batches with seq >= start, oldest first.
func (p *publisher) since(start uint64) []buffered {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []buffered
	for i := range p.buf {
		b := p.buf[(p.hd+i)%len(p.buf)]
		if b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

func (p *publisher) replayLoop() {
	defer p.wg.Done()
	poller := zmq.NewPoller()
	poller.Add(p.router, zmq.POLLIN)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		polled, err := poller.Poll(50 * time.Millisecond)
		if err != nil {
			if errors.Is(zmq.AsErrno(err), zmq.Errno(zmq.ETERM)) {
				return
			}
			continue
		}
		if len(polled) == 0 {
			continue
		}
		msg, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			continue
		}
		if len(msg) != 3 || len(msg[1]) != 0 || len(msg[2]) == 0 || len(msg[2]) > 8 {
			p.log.Warn("malformed replay request", slog.Int("frames", len(msg)))
			continue
		}
		var start uint64
		for _, b := range msg[2] {
			start = start<<8 | uint64(b)
		}
		p.replays.Add(1)
		p.replay(msg[0], start)
	}
}

func (p *publisher) replay(id []byte, start uint64) {
	for _, b := range p.since(start) {
		var s8 [8]byte
		binary.BigEndian.PutUint64(s8[:], b.seq)
		var err error
		if p.cfg.legacyReplay {
			_, err = p.router.SendMessage(id, "", s8[:], b.payload)
		} else {
			_, err = p.router.SendMessage(id, "", []byte(p.cfg.topic), s8[:], b.payload)
		}
		if err != nil {
			p.log.Warn("send replay batch", slog.Any("error", err))
			return
		}
	}
	var err error
	if p.cfg.legacyReplay {
		_, err = p.router.SendMessage(id, "", replayEnd, "")
	} else {
		_, err = p.router.SendMessage(id, "", "", replayEnd, "")
	}
	if err != nil {
		p.log.Warn("send replay end", slog.Any("error", err))
	}
}
