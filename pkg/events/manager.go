package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/pkg/index"
)

// Source is one event stream: one engine replica, or one data-parallel
// rank of it (see DPSources).
type Source struct {
	// ID names the replica's cache in the index.
	ID index.ReplicaID
	// Model is the served model; with an event's lora_name it selects the
	// chain root (kvblock.Root).
	Model string
	// Endpoint is the engine's PUB endpoint. The SUB connects to it, or,
	// with Listen, binds it (tcp://127.0.0.1:* picks a free port; Status
	// reports the bound one).
	Endpoint string
	// ReplayEndpoint is the engine's replay ROUTER (always connected to);
	// empty disables replay.
	ReplayEndpoint string
	// Topic is the subscription prefix matched against frame 0.
	Topic string
	// Engine is "vllm" (default) or "sglang"; it selects the HashMode.
	Engine string
	// Listen makes the router bind Endpoint and the engine connect.
	Listen bool
	// DPRank is the data-parallel rank of this stream (informational).
	DPRank int
	// BlockSize is the block size the router hashes this model's requests
	// with; stores with another size are indexed as given and counted. 0
	// disables the check.
	BlockSize int
	// GroupKinds labels the engine's KV-cache groups by index, comma
	// separated kv_cache_spec_kind values ("full_attention,sliding_window"
	// for a model whose group 1 is sliding window). vLLM 0.33 does not put
	// the kind on GPU events; without a label a group is presumed full
	// attention (see groups.go). A kind carried by an event wins. Empty
	// entries leave a group unlabelled.
	GroupKinds string
}

func (s Source) validate() error {
	if s.ID == "" {
		return errors.New("source has no ID")
	}
	if s.Endpoint == "" {
		return fmt.Errorf("source %q: no endpoint", s.ID)
	}
	if _, err := ParseEngine(s.Engine); err != nil {
		return fmt.Errorf("source %q: %w", s.ID, err)
	}
	if s.DPRank < 0 || s.BlockSize < 0 {
		return fmt.Errorf("source %q: negative rank or block size", s.ID)
	}
	if s.GroupKinds != "" {
		kinds := strings.Split(s.GroupKinds, ",")
		if len(kinds) > maxGroups {
			return fmt.Errorf("source %q: group kinds name %d groups, at most %d", s.ID, len(kinds), maxGroups)
		}
		for i, k := range kinds {
			if k = strings.TrimSpace(k); k != "" && classifyKind(k) == kindUnknown {
				return fmt.Errorf("source %q: group %d: unknown kv_cache_spec_kind %q", s.ID, i, k)
			}
		}
	}
	return nil
}

// ReplicaStatus is a replica's event-stream state, for explain output and
// readiness.
type ReplicaStatus struct {
	// Known is false for an ID that is not in the source set.
	Known bool
	// State is one of "connecting", "replaying", "resyncing", "live",
	// "backoff".
	State string
	// CaughtUp reports the view is complete: Credit is 1.
	CaughtUp bool
	// Resyncing is !CaughtUp: the view is known to be incomplete.
	Resyncing bool
	// Settled reports that the first warm-up attempt finished (however it
	// ended).
	Settled bool
	// Reason is why the replica last resynced.
	Reason string
	// HasSeq and LastSeq give the last sequence number accepted.
	HasSeq  bool
	LastSeq uint64
	// LastEvent is when the last batch arrived (zero if never).
	LastEvent time.Time
	// LastRouted is when a request was last routed to the replica.
	LastRouted time.Time
	// Silent: requests were routed to the replica SilentAfter ago or more
	// and it has published nothing since. Usual causes: prefix caching or
	// KV events disabled on the engine, or a wrong endpoint or topic.
	Silent bool
	// Endpoint is the endpoint in use (the bound one in listen mode).
	Endpoint string
	// Replay is the progress of the catch-up running, nil when none is.
	Replay *ReplayProgress
	// EngineBlockSize is the block size (SGLang: page size) the engine's
	// last BlockStored carried, 0 before any.
	EngineBlockSize int
	// Lookahead is how many tokens after each block the engine folds into
	// its block hashes (vLLM lookahead_token_ids), 0 if none seen: requests
	// for this replica must be hashed with kvblock.Options.WithLookahead
	// to meet its keys.
	Lookahead int
}

// maxSockets is the ZMQ context's socket limit.
const maxSockets = 1 << 16

// ErrRunning is returned by Run when the Manager is already running.
var ErrRunning = errors.New("events: manager already running")

// Manager subscribes to every source's event stream and keeps the index in
// step with it. See the package documentation for the contract.
type Manager struct {
	idx *index.Index
	win *Windows
	cfg Config
	met *metrics
	log *slog.Logger

	mu       sync.RWMutex
	replicas map[index.ReplicaID]*replica
	running  bool

	update chan struct{}
	monSeq atomic.Uint64
}

// Matcher returns the index's matcher for the router: idx.Match with each
// hybrid-attention replica's match cut to what its sliding-window KV-cache
// group can serve (window.go). Use it instead of the index as
// route.Options.Matcher.
func (m *Manager) Matcher() Matcher { return Matcher{Full: m.idx, Windows: m.win} }

// NewManager returns a Manager applying events to idx. It starts nothing;
// Run does. reg may be nil (no metrics registered); log may be nil.
func NewManager(idx *index.Index, cfg Config, reg prometheus.Registerer, log *slog.Logger) *Manager {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{
		idx:      idx,
		win:      NewWindows(),
		cfg:      cfg.normalized(),
		met:      newMetrics(reg),
		log:      log,
		replicas: make(map[index.ReplicaID]*replica),
		update:   make(chan struct{}, 1),
	}
}

// replica is the state of one source shared between its stream goroutine,
// its worker and readers (Status, Credit, NoteRouted).
type replica struct {
	src    Source
	mode   HashMode
	target Target
	shard  int
	met    *replicaMetrics
	log    *slog.Logger

	// epoch counts resyncs; the worker skips batches of older epochs.
	epoch        atomic.Uint64
	caughtUp     atomic.Bool
	settled      atomic.Bool
	needResync   atomic.Bool // set by the worker when a batch was lost to decoding
	sizeLogged   atomic.Bool
	kindLogged   atomic.Bool
	rankLogged   atomic.Bool
	decodeLogged atomic.Bool
	lastEventNs  atomic.Int64
	orphanNs     atomic.Int64 // when a store whose parent the index did not hold was last applied; 0 if never or since the engine emptied its cache (ViewGaps); written by its worker only
	engineBlock  atomic.Int32 // block size of the last store
	lookahead    atomic.Int32 // lookahead tokens per block of the last store with them
	routedNs     atomic.Int64 // first request routed since the last event; 0 if none
	lastRouted   atomic.Int64

	mu       sync.Mutex
	state    string
	reason   string
	hasSeq   bool
	lastSeq  uint64
	endpoint string
	silent   bool
	// progress of the catch-up running, if replaying
	progress  ReplayProgress
	replaying bool
}

func (r *replica) set(f func(r *replica)) {
	r.mu.Lock()
	f(r)
	r.mu.Unlock()
}

// SetSources replaces the source set. New sources are subscribed, removed
// ones have their sockets closed and their blocks cleared, and a source
// whose settings changed is restarted (cleared and relearned). It is safe to
// call at any time, including before Run; the work happens in Run. It
// rejects the whole set, changing nothing, when a source is invalid or two
// share an ID.
func (m *Manager) SetSources(srcs []Source) error {
	seen := make(map[index.ReplicaID]bool, len(srcs))
	for _, s := range srcs {
		if err := s.validate(); err != nil {
			return fmt.Errorf("events: %w", err)
		}
		if seen[s.ID] {
			return fmt.Errorf("events: duplicate source ID %q", s.ID)
		}
		seen[s.ID] = true
	}
	m.mu.Lock()
	next := make(map[index.ReplicaID]*replica, len(srcs))
	for _, s := range srcs {
		if old := m.replicas[s.ID]; old != nil && old.src == s {
			next[s.ID] = old
			continue
		}
		next[s.ID] = m.newReplica(s)
	}
	m.replicas = next
	m.mu.Unlock()
	select {
	case m.update <- struct{}{}:
	default:
	}
	return nil
}

func (m *Manager) newReplica(s Source) *replica {
	mode, _ := ParseEngine(s.Engine)
	h := fnv.New32a()
	_, _ = h.Write([]byte(s.ID))
	r := &replica{
		src:    s,
		mode:   mode,
		target: Target{Replica: s.ID, Model: s.Model, BlockSize: s.BlockSize, GroupKinds: s.GroupKinds},
		shard:  int(h.Sum32() % uint32(m.cfg.Workers)),
		met:    m.met.forReplica(string(s.ID)),
		log:    m.log.With("replica", string(s.ID)),
		state:  "connecting",
	}
	r.met.resyncing.Set(1)
	return r
}

func (m *Manager) lookup(id index.ReplicaID) *replica {
	m.mu.RLock()
	r := m.replicas[id]
	m.mu.RUnlock()
	return r
}

// Credit returns the cache credit the replica's index view deserves: 0
// while it is resyncing or has not finished its warm-up (the view is known
// to be incomplete, so the router treats the replica as cold), 1 otherwise.
// Unknown replicas get 0. It never blocks on event handling.
func (m *Manager) Credit(id index.ReplicaID) float64 {
	if r := m.lookup(id); r != nil && r.caughtUp.Load() {
		return 1
	}
	return 0
}

// ViewGaps reports whether the replica's view is known to miss blocks the
// engine holds: a store whose parent the index did not hold was applied
// within index.GapHold (a batch lost without replay below it, or stores
// resumed on blocks the engine kept through a clear of the view). An
// engine restart or AllBlocksCleared ends the mark: the engine then holds
// nothing the view misses. It implements route.ViewGaps for the router
// (through fleet.Set). Cheap and non-blocking.
func (m *Manager) ViewGaps(id index.ReplicaID) bool {
	r := m.lookup(id)
	if r == nil {
		return false
	}
	ns := r.orphanNs.Load()
	return ns != 0 && m.cfg.Now().UnixNano()-ns < int64(index.GapHold)
}

// Warm reports whether every source has settled its first warm-up attempt
// (replayed, failed to, or has no replay endpoint): the readiness signal.
// Sources that stay unreachable do not hold readiness back forever; they
// stay at Credit 0 instead.
func (m *Manager) Warm() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, r := range m.replicas {
		if !r.settled.Load() {
			return false
		}
	}
	return true
}

// Readiness is the events side of readiness, with the detail /readyz
// shows.
type Readiness struct {
	// Warm is Manager.Warm: every source finished its first warm-up.
	Warm bool
	// Sources and CaughtUp count the sources and those whose view is
	// complete (Credit 1).
	Sources, CaughtUp int
	// Degraded lists, by ID, the sources whose view is not complete, and
	// why.
	Degraded []Degraded
}

// Degraded is a source whose view is incomplete: its cache credit is 0.
type Degraded struct {
	ID index.ReplicaID
	// State is ReplicaStatus.State.
	State string
	// Reason: "warming" (first warm-up not finished), "replaying" (a
	// catch-up is running; Replay has its progress), "unreachable" (the
	// engine never connected), "no_replay_endpoint" (waiting for the quiet
	// window), or the reason of the last resync (replay_truncated,
	// replay_failed, replay_rounds, gap, decode_error, restart, ...).
	Reason string
	// Settled reports the first warm-up finished.
	Settled bool
	// Replay is the running catch-up's progress, if any.
	Replay *ReplayProgress
}

// Readiness reports whether the sources are warm and which are degraded
// and why. A source is warm once its first warm-up finished: its replay
// reached the live stream (complete: Credit 1), or ended without a complete
// view (truncated or failed: degraded, Credit 0 until the quiet window), or
// its engine did not connect in time (degraded "unreachable"). Replays go
// on round after round while they make progress, so a full engine buffer
// (vLLM keeps 10,000 batches) is replayed to the end before the source
// counts as warm.
func (m *Manager) Readiness() Readiness {
	m.mu.RLock()
	reps := make([]*replica, 0, len(m.replicas))
	for _, r := range m.replicas {
		reps = append(reps, r)
	}
	m.mu.RUnlock()
	slices.SortFunc(reps, func(a, b *replica) int { return cmp.Compare(a.src.ID, b.src.ID) })
	rd := Readiness{Warm: true, Sources: len(reps)}
	for _, r := range reps {
		st := m.Status(r.src.ID)
		if !st.Known {
			continue // removed meanwhile
		}
		if !st.Settled {
			rd.Warm = false
		}
		if st.CaughtUp {
			rd.CaughtUp++
			continue
		}
		d := Degraded{ID: r.src.ID, State: st.State, Reason: st.Reason, Settled: st.Settled, Replay: st.Replay}
		switch {
		case st.Replay != nil:
			d.Reason = "replaying"
		case st.State == "connecting" && st.Settled:
			d.Reason = "unreachable"
		case !st.Settled:
			d.Reason = "warming"
		case r.src.ReplayEndpoint == "":
			d.Reason = "no_replay_endpoint"
		}
		rd.Degraded = append(rd.Degraded, d)
	}
	return rd
}

// NoteRouted tells the Manager a request was routed to id at now; it feeds
// the silent-replica check. Cheap and non-blocking.
func (m *Manager) NoteRouted(id index.ReplicaID, now time.Time) {
	r := m.lookup(id)
	if r == nil {
		return
	}
	ns := now.UnixNano()
	r.lastRouted.Store(ns)
	r.routedNs.CompareAndSwap(0, ns)
}

func (r *replica) noteEvent(now time.Time) {
	r.lastEventNs.Store(now.UnixNano())
	r.routedNs.Store(0)
}

// lostBatch is the worker's report that a batch was not applied: the
// view has a hole from now on, so the replica's credit is withdrawn at
// once, and its subscriber clears and relearns it at its next tick.
func (r *replica) lostBatch() {
	r.caughtUp.Store(false)
	r.needResync.Store(true)
}

func (r *replica) silentAt(now time.Time, after time.Duration) bool {
	f := r.routedNs.Load()
	return f != 0 && now.UnixNano()-f >= int64(after)
}

// Status returns the replica's event-stream state.
func (m *Manager) Status(id index.ReplicaID) ReplicaStatus {
	r := m.lookup(id)
	if r == nil {
		return ReplicaStatus{}
	}
	st := ReplicaStatus{
		Known:    true,
		CaughtUp: r.caughtUp.Load(),
		Settled:  r.settled.Load(),
		Silent:   r.silentAt(m.cfg.Now(), m.cfg.SilentAfter),
	}
	st.Resyncing = !st.CaughtUp
	st.EngineBlockSize, st.Lookahead = int(r.engineBlock.Load()), int(r.lookahead.Load())
	if ns := r.lastEventNs.Load(); ns != 0 {
		st.LastEvent = time.Unix(0, ns)
	}
	if ns := r.lastRouted.Load(); ns != 0 {
		st.LastRouted = time.Unix(0, ns)
	}
	r.mu.Lock()
	st.State, st.Reason, st.HasSeq, st.LastSeq, st.Endpoint = r.state, r.reason, r.hasSeq, r.lastSeq, r.endpoint
	if r.replaying {
		p := r.progress
		st.Replay = &p
	}
	r.mu.Unlock()
	return st
}

type itemKind uint8

const (
	itemBatch  itemKind = iota
	itemReset           // clear the replica, if the epoch is still current
	itemRemove          // clear the replica: it left the source set
)

// item is one unit of work for a worker.
type item struct {
	rep     *replica
	kind    itemKind
	epoch   uint64
	payload []byte
	// empty is set on a reset for an engine that restarted: its cache is
	// empty, so the view misses nothing it holds (ViewGaps ends).
	empty bool
}

// running is a started stream goroutine.
type running struct {
	rep    *replica
	cancel context.CancelFunc
	done   chan struct{}
}

// Run starts the worker pool and one goroutine per source, follows
// SetSources, and returns after joining every goroutine it started once ctx
// ends. All ZMQ sockets live in a Context owned by this call and terminated
// before it returns.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return ErrRunning
	}
	m.running = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.running = false
		m.mu.Unlock()
	}()

	zctx, err := zmq.NewContext()
	if err != nil {
		return fmt.Errorf("events: zmq context: %w", err)
	}
	// Each source holds about four sockets (SUB, its monitor pair, a
	// replay DEALER): lift libzmq's default cap of 1023 for large fleets.
	if err := zctx.SetMaxSockets(maxSockets); err != nil {
		m.log.Warn("could not raise the zmq socket limit", slog.Any("error", err))
	}
	queues := make([]chan item, m.cfg.Workers)
	var workers sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan item, m.cfg.QueueSize)
		workers.Add(1)
		go func() {
			defer workers.Done()
			m.work(i, queues[i])
		}()
	}
	var streams sync.WaitGroup
	run := make(map[index.ReplicaID]*running)
	m.reconcile(ctx, zctx, queues, run, &streams)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-m.update:
			m.reconcile(ctx, zctx, queues, run, &streams)
		}
	}
	for _, r := range run {
		r.cancel()
	}
	streams.Wait()
	for _, q := range queues {
		close(q)
	}
	workers.Wait()
	if err := zctx.Term(); err != nil {
		m.log.Warn("zmq context did not terminate cleanly", slog.Any("error", err))
	}
	return nil
}

// reconcile stops streams whose replica left (or changed in) the source set,
// clears their blocks, and starts streams for new replicas.
func (m *Manager) reconcile(ctx context.Context, zctx *zmq.Context, queues []chan item, run map[index.ReplicaID]*running, wg *sync.WaitGroup) {
	m.mu.RLock()
	want := maps.Clone(m.replicas)
	m.mu.RUnlock()
	var stopping []*running
	for id, r := range run {
		if want[id] != r.rep {
			r.cancel()
			stopping = append(stopping, r)
			delete(run, id)
		}
	}
	for _, r := range stopping {
		select {
		case <-r.done:
		case <-ctx.Done():
			return
		}
		// Queued after everything the stream enqueued: the worker clears
		// the replica once its last batch is through.
		r.rep.epoch.Add(1)
		select {
		case queues[r.rep.shard] <- item{rep: r.rep, kind: itemRemove}:
		case <-ctx.Done():
			return
		}
		id := r.rep.src.ID
		if want[id] == nil {
			m.met.forget(string(id))
			r.rep.log.Info("event source removed")
		}
	}
	for id, rep := range want {
		if run[id] != nil {
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		r := &running{rep: rep, cancel: cancel, done: make(chan struct{})}
		run[id] = r
		s := newZMQSubscriber(m, rep, zctx, queues[rep.shard])
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(r.done)
			s.run(sctx)
		}()
	}
}

// work applies one worker's queue until it is closed.
func (m *Manager) work(i int, q chan item) {
	w := &worker{m: m, ap: NewApplier(m.idx), depth: m.met.queueDepth.WithLabelValues(workerLabel(i))}
	w.ap.SetWindows(m.win)
	for it := range q {
		w.depth.Set(float64(len(q)))
		w.handle(it)
	}
	w.depth.Set(0)
}

type worker struct {
	m     *Manager
	ap    *Applier
	dec   Decoder
	b     Batch
	depth prometheus.Gauge
}

// handle applies one item; a panic is contained, counted, and resyncs the
// replica, so one bad batch cannot stop the pool.
func (w *worker) handle(it item) {
	r := it.rep
	defer func() {
		if p := recover(); p != nil {
			w.m.met.decodeErrors.WithLabelValues(string(r.src.ID), "panic").Inc()
			r.log.Error("event worker recovered from a panic", slog.Any("panic", p))
			r.lostBatch()
		}
	}()
	switch it.kind {
	case itemRemove:
		w.m.idx.Cleared(r.src.ID)
		w.ap.Forget(r.src.ID)
		return
	case itemReset:
		if it.empty {
			r.orphanNs.Store(0) // the engine's cache is empty, whatever epoch follows
		}
		if it.epoch == r.epoch.Load() {
			w.m.idx.Cleared(r.src.ID)
			w.ap.Reset(r.src.ID)
		}
		return
	}
	if it.epoch != r.epoch.Load() {
		return // superseded by a resync: the replica is being relearned
	}
	if err := w.dec.Decode(it.payload, r.mode, &w.b); err != nil {
		reason := ErrorReason(err)
		w.m.met.decodeErrors.WithLabelValues(string(r.src.ID), reason).Inc()
		if !r.decodeLogged.Swap(true) {
			r.log.Warn("undecodable event batch; resyncing replica", slog.String("reason", reason), slog.Any("error", err))
		}
		r.lostBatch()
		return
	}
	b := &w.b
	if b.Invalid > 0 {
		w.m.met.decodeErrors.WithLabelValues(string(r.src.ID), "invalid_event").Add(float64(b.Invalid))
		if !r.decodeLogged.Swap(true) {
			r.log.Warn("event with a malformed field; resyncing replica", slog.Int("events", b.Invalid))
		}
		r.lostBatch()
	}
	if b.Unknown > 0 {
		r.met.unkn.Add(float64(b.Unknown))
	}
	if b.UnknownKeys > 0 {
		w.m.met.skipped.WithLabelValues(string(r.src.ID), "unknown_key").Add(float64(b.UnknownKeys))
	}
	if b.DPRank >= 0 && b.DPRank != r.src.DPRank {
		w.m.met.decodeErrors.WithLabelValues(string(r.src.ID), "dp_rank_mismatch").Inc()
		if !r.rankLogged.Swap(true) {
			r.log.Warn("batch names another data-parallel rank than the source; check endpoint port offsets",
				slog.Int("batch_rank", b.DPRank), slog.Int("source_rank", r.src.DPRank))
		}
	}
	st := w.ap.Apply(r.target, b)
	rm := r.met
	rm.batches.Inc()
	if st.Stored > 0 {
		rm.stored.Add(float64(st.Stored))
	}
	if st.Removed > 0 {
		rm.removed.Add(float64(st.Removed))
	}
	if st.Cleared > 0 {
		rm.cleared.Add(float64(st.Cleared))
		r.orphanNs.Store(0) // the engine emptied its cache: it holds nothing the view misses
	}
	if st.UnknownParentBlocks > 0 {
		rm.unknownParent.Add(float64(st.UnknownParentBlocks))
		r.orphanNs.Store(w.m.cfg.Now().UnixNano())
	}
	if st.BadShape > 0 {
		rm.badShape.Add(float64(st.BadShape))
	}
	if st.UnknownMedium > 0 {
		rm.unknownMedium.Add(float64(st.UnknownMedium))
	}
	if st.NoSlot > 0 {
		w.m.met.skipped.WithLabelValues(string(r.src.ID), "no_slot").Add(float64(st.NoSlot))
	}
	if st.OtherGroup > 0 {
		rm.group.Add(float64(st.OtherGroup))
	}
	if st.UnknownKind > 0 {
		rm.unknownKind.Add(float64(st.UnknownKind))
		if !r.kindLogged.Swap(true) {
			r.log.Warn("KV-cache group of an unknown kind; presumed full attention",
				slog.String("kv_cache_spec_kind", st.UnknownKindName))
		}
	}
	if st.GroupHeld > 0 {
		rm.groupHeld.Add(float64(st.GroupHeld))
	}
	if st.EngineBlockSize > 0 {
		rm.engineBlock.Set(float64(st.EngineBlockSize))
		r.engineBlock.Store(int32(min(st.EngineBlockSize, math.MaxInt32)))
	}
	if st.Lookahead > 0 {
		r.lookahead.Store(int32(min(st.Lookahead, math.MaxInt32)))
	}
	if st.BlockSizeMismatch > 0 {
		rm.sizeMismatch.Add(float64(st.BlockSizeMismatch))
		if !r.sizeLogged.Swap(true) {
			r.log.Warn("engine block size differs from the replica's; requests will not match these blocks",
				slog.String("fix", blockSizeAdvice(r.mode, st.EngineBlockSize, r.src.BlockSize)),
				slog.Int("engine", st.EngineBlockSize), slog.Int("configured", r.src.BlockSize))
		}
	}
	if b.TS > 0 {
		lag := w.m.cfg.Now().Sub(time.Unix(0, int64(b.TS*1e9)))
		rm.lag.Set(lag.Seconds())
	}
}

// blockSizeAdvice is the warning for an engine whose blocks (SGLang: pages)
// differ from the replica's configured block size: requests will not match
// them until one of the two settings changes.
func blockSizeAdvice(mode HashMode, engine, configured int) string {
	if mode == HashSGLang {
		return fmt.Sprintf("SGLang publishes pages of %d tokens but the replica's block_size is %d; requests will not match: "+
			"set block_size: %d on the replica, or start SGLang with --page-size %d", engine, configured, engine, configured)
	}
	return fmt.Sprintf("engine block size %d differs from the replica's block_size %d; requests will not match: "+
		"set block_size: %d on the replica, or start vLLM with --block-size %d", engine, configured, engine, configured)
}
