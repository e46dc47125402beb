package load

import "testing"

func BenchmarkTrackerStartDone(b *testing.B) {
	tr, _ := NewTracker(nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h := tr.Start("r1", 4, 8)
			h.FirstToken()
			h.Done()
		}
	})
}

func BenchmarkViewLoad(b *testing.B) {
	tr, _ := NewTracker(nil)
	defer tr.Start("r1", 4, 8).Done()
	sc, _ := NewScraper(ScraperConfig{})
	injectState(sc, "r1", Scraped{Healthy: true, Running: 3})
	v := &View{Tracker: tr, Scraper: sc}
	b.ReportAllocs()
	for b.Loop() {
		_ = v.Load("r1")
	}
}
