package load

import "time"

// DefaultStaleAfter is how old scraped engine figures may be before View
// stops using them.
const DefaultStaleAfter = 2 * time.Second

// DefaultRequestBlocks is the size, in blocks, View gives another router's
// request while this router has started none of its own to measure (512
// tokens at vLLM's default block size of 16).
const DefaultRequestBlocks = 32

// View combines the router's in-flight view (Tracker), the engines' scraped
// figures and health (Scraper) and cache fidelity (Fidelity) into one Load
// per replica. Every part may be nil; a View is safe for concurrent use and
// never blocks.
//
// How the figures combine, for replica r. Local: this router's in-flight
// requests L, prefill blocks P and decode blocks D (exact, updated at
// once). Scraped (fresh, i.e. younger than StaleAfter): the engine's running
// R and waiting W, which count every router's requests, and B, this
// router's own in-flight count sampled around that scrape
// (Scraped.LocalRequests; L when it was not sampled):
//
//	U (others' requests)  = max(0, R+W - B)   as of the scrape
//	Requests()            = L + U
//	WaitingRequests       = min(W, L + U)
//	ActiveRequests        = L + U - WaitingRequests
//	ActivePrefillBlocks   = P + U·W/(R+W) · mean prefill blocks
//	ActiveDecodeBlocks    = D + U·R/(R+W) · mean decode blocks
//	KVUsage, KVBlocks     = scraped usage and GPU KV block count
//	Preempting            = the scraped preemption counter rose within PreemptionHold
//	Healthy               = the prober's verdict; true when r is not a scrape target
//
// U is what the engine reported beyond this router's own requests at the
// time, so a request this router routed is never counted twice: not while
// the engine has yet to report it, and not after it finished while the
// engine's figure still shows it. Without a sampled B it falls back to the
// current L, and Requests() to max(L, R+W). Other routers' requests reach
// the view only as counts; they are sized with this router's mean request
// at r (Tracker.MeanRequest: uncached prompt blocks for the waiting share,
// held KV blocks for the running share, split in the engine's own
// waiting:running proportion), else the average of its means at the
// other replicas, else
// DefaultRequestBlocks (RequestBlocks when set) for both. The estimate is
// off by how much other routers' requests differ from this router's (other
// clients, other cache hit rates), counts running requests that are still
// prefilling (chunked prefill) as decode only, and lags by the scrape age:
// requests other routers sent since are missing, those finished since are
// still counted.
//
// With stale or missing scraped figures, the load is the local view alone
// and waiting and KV usage are 0. A scrape target's health never goes
// stale: the prober keeps deciding it, and a target not yet probed is
// unhealthy.
type View struct {
	Tracker  *Tracker
	Scraper  *Scraper
	Fidelity *Fidelity
	// StaleAfter bounds the age of usable scraped figures; 0 means
	// DefaultStaleAfter.
	StaleAfter time.Duration
	// RequestBlocks sizes other routers' requests before the Tracker has a
	// mean; 0 means DefaultRequestBlocks.
	RequestBlocks float64
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Load returns replica's combined load.
func (v *View) Load(replica string) Load {
	var local InFlight
	if v.Tracker != nil {
		local = v.Tracker.Get(replica)
	}
	l := Load{
		ActivePrefillBlocks: float64(local.PrefillBlocks),
		ActiveDecodeBlocks:  float64(local.DecodeBlocks),
		ActiveRequests:      local.Requests,
		OldestPrefillWait:   local.OldestWait,
		OldestPrefillBlocks: float64(local.OldestBlocks),
		Healthy:             true,
	}
	if v.Scraper == nil {
		return l
	}
	s, ok := v.Scraper.Get(replica)
	if !ok {
		return l
	}
	l.Healthy = s.Healthy
	if s.MetricsAt.IsZero() || v.now().Sub(s.MetricsAt) > v.staleAfter() {
		return l
	}
	l.KVUsage = s.KVUsage
	l.KVBlocks = float64(s.KVBlocks)
	l.Preempting = s.PreemptingAt(v.now())
	base := local.Requests
	if s.LocalKnown {
		base = s.LocalRequests
	}
	engine := max(s.Running, 0) + max(s.Waiting, 0)
	unseen := max(0, engine-base)
	total := local.Requests + unseen
	l.WaitingRequests = min(max(s.Waiting, 0), total)
	l.ActiveRequests = total - l.WaitingRequests
	if unseen > 0 {
		size := v.meanRequest(replica)
		waitShare := float64(max(s.Waiting, 0)) / float64(engine)
		l.ActivePrefillBlocks += float64(unseen) * waitShare * size.PrefillBlocks
		l.ActiveDecodeBlocks += float64(unseen) * (1 - waitShare) * size.DecodeBlocks
	}
	return l
}

// meanRequest sizes a request of another router at replica.
func (v *View) meanRequest(replica string) RequestSize {
	if v.Tracker != nil {
		if size, ok := v.Tracker.MeanRequest(replica); ok {
			return size
		}
	}
	b := v.RequestBlocks
	if !(b > 0) {
		b = DefaultRequestBlocks
	}
	return RequestSize{PrefillBlocks: b, DecodeBlocks: b}
}

// Credit returns replica's cache credit from Fidelity (1 without one).
func (v *View) Credit(replica string) float64 {
	return v.Fidelity.Credit(replica)
}

func (v *View) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func (v *View) staleAfter() time.Duration {
	if v.StaleAfter > 0 {
		return v.StaleAfter
	}
	return DefaultStaleAfter
}
