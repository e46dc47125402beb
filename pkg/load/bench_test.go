package load

import (
	"fmt"
	"strings"
	"testing"
)

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

// benchExposition is a vLLM-sized exposition: the load families among
// 40 histograms of 20 buckets.
func benchExposition() string {
	var b strings.Builder
	b.WriteString(vllmExposition + "\n")
	for h := range 40 {
		fmt.Fprintf(&b, "# HELP vllm:hist_%d A histogram.\n# TYPE vllm:hist_%d histogram\n", h, h)
		for i := range 20 {
			fmt.Fprintf(&b, "vllm:hist_%d_bucket{engine=\"0\",le=\"%d.0\",model_name=\"m\"} %d.0\n", h, i, i*7)
		}
		fmt.Fprintf(&b, "vllm:hist_%d_sum{engine=\"0\",model_name=\"m\"} 12.5\nvllm:hist_%d_count{engine=\"0\",model_name=\"m\"} 140.0\n", h, h)
	}
	return b.String()
}

// BenchmarkParseExposition: one scrape's parse, the wanted families cut
// out first (as the scraper does) and, for comparison, the whole
// exposition through the text parser (as it did before).
func BenchmarkParseExposition(b *testing.B) {
	text := benchExposition()
	s, _ := NewScraper(ScraperConfig{})
	b.Run("kept", func(b *testing.B) {
		var bufs scrapeBuffers
		b.SetBytes(int64(len(text)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.parseWith(&bufs, strings.NewReader(text)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("whole", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		b.ReportAllocs()
		for b.Loop() {
			p := s.parser
			fams, err := p.TextToMetricFamilies(strings.NewReader(text))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := engineFigures(fams); err != nil {
				b.Fatal(err)
			}
		}
	})
}
