package load

import "time"

// DefaultStaleAfter is how old scraped engine figures may be before View
// stops using them.
const DefaultStaleAfter = 2 * time.Second

// View combines the router's in-flight view (Tracker), the engines' scraped
// figures and health (Scraper) and cache fidelity (Fidelity) into one Load
// per replica. Every part may be nil; a View is safe for concurrent use and
// never blocks.
//
// How the figures combine, for replica r with local in-flight requests L
// and scraped running R and waiting W (fresh, i.e. younger than StaleAfter):
//
//	Requests()          = max(L, R+W)  (the engine's totals include other routers' load;
//	                                    ours covers what it has not reported yet)
//	WaitingRequests     = W
//	ActiveRequests      = max(L, R+W) - W
//	ActivePrefillBlocks = the tracker's prefill blocks (only this router knows them)
//	ActiveDecodeBlocks  = the tracker's decode blocks
//	KVUsage             = scraped usage
//	Healthy             = the prober's verdict; true when r is not a scrape target
//
// With stale or missing scraped figures, requests are L and waiting and KV
// usage are 0. A scrape target's health never goes stale: the prober keeps
// deciding it, and a target not yet probed is unhealthy.
type View struct {
	Tracker  *Tracker
	Scraper  *Scraper
	Fidelity *Fidelity
	// StaleAfter bounds the age of usable scraped figures; 0 means
	// DefaultStaleAfter.
	StaleAfter time.Duration
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
	total := max(local.Requests, s.Running+s.Waiting)
	l.WaitingRequests = s.Waiting
	l.ActiveRequests = total - s.Waiting
	l.KVUsage = s.KVUsage
	return l
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
