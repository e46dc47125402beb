package events

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
)

// fakeEngine behaves like vLLM's publisher: a PUB socket sending [topic,
// seq, payload], and a ROUTER replay socket serving the last `steps`
// batches from a requested sequence, then an end marker. Its sockets live
// on one goroutine; tests talk to it through call.
type fakeEngine struct {
	t          testing.TB
	zctx       *zmq.Context
	pubEP      string // the endpoint the manager uses
	replayEP   string
	topic      string
	newFraming bool // vLLM >= 0.26: replies carry the topic frame
	steps      int
	holes      map[uint64]bool // replay replies dropped (a ROUTER over its HWM)
	cmds       chan func()
	stop       chan struct{}
	done       chan struct{}

	// owned by the loop goroutine
	pub, router *zmq.Socket
	seq         uint64
	ring        []liveMsg
	replays     int
}

type engineOpts struct {
	newFraming bool
	steps      int
	noReplay   bool
	connectTo  string // connect the PUB to this endpoint (router listens)
	holes      map[uint64]bool
	// vllmHWM leaves the replay ROUTER at libzmq's default send HWM (1000
	// messages), as vLLM does: a long replay overruns it and the ROUTER
	// drops replies, the END marker included.
	vllmHWM bool
}

func newFakeEngine(t testing.TB, o engineOpts) *fakeEngine {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	if o.steps == 0 {
		o.steps = 10000
	}
	e := &fakeEngine{t: t, zctx: zctx, topic: "kv@test@m", newFraming: o.newFraming, steps: o.steps, holes: o.holes,
		cmds: make(chan func()), stop: make(chan struct{}), done: make(chan struct{})}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	e.pub, err = zctx.NewSocket(zmq.PUB)
	must(err)
	must(e.pub.SetLinger(0))
	must(e.pub.SetSndhwm(0))
	if o.connectTo != "" {
		must(e.pub.Connect(o.connectTo))
		e.pubEP = o.connectTo
	} else {
		must(e.pub.Bind("tcp://127.0.0.1:*"))
		e.pubEP, err = e.pub.GetLastEndpoint()
		must(err)
	}
	if !o.noReplay {
		e.router, err = zctx.NewSocket(zmq.ROUTER)
		must(err)
		must(e.router.SetLinger(0))
		if !o.vllmHWM {
			must(e.router.SetSndhwm(0))
		}
		must(e.router.Bind("tcp://127.0.0.1:*"))
		e.replayEP, err = e.router.GetLastEndpoint()
		must(err)
	}
	go e.loop()
	t.Cleanup(e.close)
	return e
}

func (e *fakeEngine) loop() {
	defer close(e.done)
	poller := zmq.NewPoller()
	if e.router != nil {
		poller.Add(e.router, zmq.POLLIN)
	}
	for {
		select {
		case f := <-e.cmds:
			f()
			continue
		case <-e.stop:
			_ = e.pub.Close()
			if e.router != nil {
				_ = e.router.Close()
			}
			return
		default:
		}
		if e.router == nil {
			select {
			case f := <-e.cmds:
				f()
			case <-e.stop:
				_ = e.pub.Close()
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		polled, err := poller.Poll(5 * time.Millisecond)
		if err != nil || len(polled) == 0 {
			continue
		}
		for {
			frames, err := e.router.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break
			}
			e.serve(frames)
		}
	}
}

func seq8(s uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], s)
	return b[:]
}

func (e *fakeEngine) serve(frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 0 {
		return
	}
	e.replays++
	id := frames[0]
	start := binary.BigEndian.Uint64(frames[2])
	for _, m := range e.ring {
		if m.seq < start || e.holes[m.seq] {
			continue
		}
		if e.newFraming {
			_, _ = e.router.SendMessage(id, []byte{}, e.topic, seq8(m.seq), m.payload)
		} else {
			_, _ = e.router.SendMessage(id, []byte{}, seq8(m.seq), m.payload)
		}
	}
	if e.newFraming {
		_, _ = e.router.SendMessage(id, []byte{}, []byte{}, seq8(endSeq), []byte{})
	} else {
		_, _ = e.router.SendMessage(id, []byte{}, seq8(endSeq), []byte{})
	}
}

// call runs f on the engine's goroutine and waits for it.
func (e *fakeEngine) call(f func()) {
	ok := make(chan struct{})
	select {
	case e.cmds <- func() { f(); close(ok) }:
	case <-e.done:
		e.t.Fatal("engine stopped")
	}
	<-ok
}

// publish assigns the next sequence number to payload, buffers it for
// replay and sends it unless drop is set (a batch lost on the wire).
func (e *fakeEngine) publish(payload []byte, drop bool) uint64 {
	var s uint64
	e.call(func() {
		s = e.seq
		e.seq++
		e.ring = append(e.ring, liveMsg{s, payload})
		if len(e.ring) > e.steps {
			e.ring = e.ring[1:]
		}
		if !drop {
			_, _ = e.pub.SendMessage(e.topic, seq8(s), payload)
		}
	})
	return s
}

// publishAll publishes payloads in order, in one call.
func (e *fakeEngine) publishAll(payloads [][]byte) {
	e.call(func() {
		for _, p := range payloads {
			e.ring = append(e.ring, liveMsg{e.seq, p})
			_, _ = e.pub.SendMessage(e.topic, seq8(e.seq), p)
			e.seq++
		}
		if len(e.ring) > e.steps {
			e.ring = e.ring[len(e.ring)-e.steps:]
		}
	})
}

// sendRaw sends arbitrary frames on the PUB socket.
func (e *fakeEngine) sendRaw(parts ...any) {
	e.call(func() { _, _ = e.pub.SendMessage(parts...) })
}

// restart simulates an engine restart: sequence and replay buffer start
// over.
func (e *fakeEngine) restart() {
	e.call(func() { e.seq, e.ring = 0, nil })
}

func (e *fakeEngine) lastSeq() uint64 {
	var s uint64
	e.call(func() { s = e.seq - 1 })
	return s
}

func (e *fakeEngine) close() {
	select {
	case <-e.stop:
	default:
		close(e.stop)
	}
	<-e.done
	_ = e.zctx.Term()
}

// workload generates event batches for one engine and applies every batch
// it generates to an oracle index: the state the engine holds.
type workload struct {
	t       testing.TB
	r       *rand.Rand
	bs      int
	model   string
	prompts [][]uint32
	hashes  [][]uint64
	stored  []int
	oracle  *index.Index
	ap      *Applier
	id      index.ReplicaID
}

func newWorkload(t testing.TB, seed uint64, id index.ReplicaID, nPrompts, nBlocks int) *workload {
	w := &workload{t: t, r: rand.New(rand.NewPCG(seed, 3)), bs: 4, model: "m", id: id, oracle: index.New(index.Config{})}
	w.ap = NewApplier(w.oracle)
	for range nPrompts {
		toks := make([]uint32, nBlocks*w.bs)
		for i := range toks {
			toks[i] = uint32(w.r.IntN(150000))
		}
		hs := make([]uint64, nBlocks)
		for i := range hs {
			hs[i] = w.r.Uint64() | 1
		}
		w.prompts = append(w.prompts, toks)
		w.hashes = append(w.hashes, hs)
		w.stored = append(w.stored, 0)
	}
	return w
}

func (w *workload) storeEvent(p, k int) any {
	from := w.stored[p]
	k = min(k, len(w.hashes[p])-from)
	var parent any
	if from > 0 {
		parent = w.hashes[p][from-1]
	}
	hs := w.hashes[p][from : from+k]
	toks := w.prompts[p][from*w.bs : (from+k)*w.bs]
	w.stored[p] += k
	if w.r.IntN(2) == 0 {
		return []any{"BlockStored", hs, parent, toks, w.bs, nil, "GPU", nil}
	}
	return map[string]any{"type": "BlockStored", "block_hashes": hs, "parent_block_hash": parent, "token_ids": toks,
		"block_size": w.bs, "lora_id": nil, "medium": "GPU", "lora_name": nil}
}

func (w *workload) removeEvent(p int) any {
	w.stored[p]--
	h := w.hashes[p][w.stored[p]]
	if w.r.IntN(2) == 0 {
		return []any{"BlockRemoved", []uint64{h}, "GPU"}
	}
	return map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{h}, "medium": "GPU"}
}

// next returns one batch of 1-4 events and applies it to the oracle.
func (w *workload) next(allowClear bool) []byte {
	evs := []any{}
	for range 1 + w.r.IntN(4) {
		p := w.r.IntN(len(w.prompts))
		switch x := w.r.IntN(100); {
		case allowClear && x < 2:
			evs = append(evs, map[string]any{"type": "AllBlocksCleared"})
			for i := range w.stored {
				w.stored[i] = 0
			}
		case x < 30 && w.stored[p] > 0:
			evs = append(evs, w.removeEvent(p))
		case w.stored[p] < len(w.hashes[p]):
			evs = append(evs, w.storeEvent(p, 1+w.r.IntN(3)))
		}
	}
	payload := enc(w.t, []any{float64(time.Now().UnixNano()) / 1e9, evs, 0})
	w.apply(payload)
	return payload
}

func (w *workload) apply(payload []byte) {
	b, err := DecodeBatch(payload, HashVLLM)
	if err != nil {
		w.t.Fatal(err)
	}
	w.ap.Apply(Target{Replica: w.id, Model: w.model}, &b)
}

// reset forgets everything (an engine restart).
func (w *workload) reset() {
	w.oracle.Cleared(w.id)
	for i := range w.stored {
		w.stored[i] = 0
	}
}

// diff compares what idx says about id with the oracle, for every prompt.
func (w *workload) diff(idx *index.Index, id index.ReplicaID) error {
	root := kvblock.Root(w.model, "")
	for p, toks := range w.prompts {
		keys := kvblock.Keys(nil, root, toks, w.bs, kvblock.Options{})
		got, want := matchOf(idx, keys, id), matchOf(w.oracle, keys, w.id)
		if got != want {
			return fmt.Errorf("prompt %d: index matches %d blocks, engine holds %d", p, got, want)
		}
	}
	// Nothing stale beyond the prefixes either (one replica per index).
	if got, want := idx.Stats().Engine, w.oracle.Stats().Engine; got != want {
		return fmt.Errorf("index maps %d engine hashes, engine holds %d", got, want)
	}
	return nil
}

func matchOf(idx *index.Index, keys []kvblock.Key, id index.ReplicaID) int {
	for _, m := range idx.Match(keys, nil) {
		if m.Replica == id {
			return m.Blocks
		}
	}
	return 0
}

// rebind closes the PUB socket and binds a new one on the same endpoint:
// subscribers see a disconnect and a reconnect.
func (e *fakeEngine) rebind() {
	e.call(func() {
		_ = e.pub.Close()
		var err error
		deadline := time.Now().Add(10 * time.Second)
		for {
			e.pub, err = e.zctx.NewSocket(zmq.PUB)
			if err == nil {
				_ = e.pub.SetLinger(0)
				if err = e.pub.Bind(e.pubEP); err == nil {
					return
				}
				_ = e.pub.Close()
			}
			if time.Now().After(deadline) {
				e.t.Errorf("rebind %s: %v", e.pubEP, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
