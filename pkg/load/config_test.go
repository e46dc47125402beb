package load

import (
	"strings"
	"testing"
	"time"
)

func TestConfigWithDefaults(t *testing.T) {
	got := Config{}.WithDefaults()
	want := Config{
		ScrapeInterval: DefaultScrapeInterval, IdleScrapeInterval: DefaultIdleScrapeInterval, ScrapeTimeout: DefaultScrapeTimeout, StaleAfter: DefaultStaleAfter,
		FidelityAlpha: DefaultFidelityAlpha, FidelityFloor: DefaultFidelityFloor, FidelityMinSamples: DefaultFidelityMinSamples,
	}
	if got != want {
		t.Fatalf("WithDefaults = %+v, want %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	set := Config{ScrapeInterval: time.Second, FidelityAlpha: 1, FidelityMinSamples: 2}.WithDefaults()
	if set.ScrapeInterval != time.Second || set.FidelityAlpha != 1 || set.FidelityMinSamples != 2 {
		t.Fatalf("WithDefaults overwrote set fields: %+v", set)
	}
	// The idle interval's default stays within [scrape_interval, stale_after/2].
	for _, c := range []struct{ interval, stale, want time.Duration }{
		{0, 0, DefaultIdleScrapeInterval},
		{0, time.Second, 500 * time.Millisecond},
		{800 * time.Millisecond, time.Second, 800 * time.Millisecond},
		{20 * time.Millisecond, 10 * time.Second, DefaultIdleScrapeInterval},
	} {
		got := Config{ScrapeInterval: c.interval, StaleAfter: c.stale}.WithDefaults()
		if got.IdleScrapeInterval != c.want {
			t.Errorf("scrape_interval %v, stale_after %v: idle_scrape_interval %v, want %v", c.interval, c.stale, got.IdleScrapeInterval, c.want)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("scrape_interval %v, stale_after %v: %v", c.interval, c.stale, err)
		}
	}
	if sc := set.Scraper(); sc.Interval != time.Second || sc.Timeout != DefaultScrapeTimeout || sc.IdleInterval != time.Second {
		t.Errorf("Scraper() = %+v", sc)
	}
	if fc := set.Fidelity(); fc.Alpha != 1 || fc.Floor != DefaultFidelityFloor || fc.MinSamples != 2 {
		t.Errorf("Fidelity() = %+v", fc)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string // every one of these, each with its field path
	}{
		{"negative durations", func(c *Config) { c.ScrapeInterval, c.ScrapeTimeout, c.StaleAfter = -1, -1, -1 },
			[]string{"scrape_interval: ", "scrape_timeout: ", "stale_after: "}},
		{"idle interval below the interval", func(c *Config) { c.ScrapeInterval, c.IdleScrapeInterval = time.Second, 500*time.Millisecond },
			[]string{"idle_scrape_interval: 500ms: must be at least scrape_interval (1s)"}},
		{"idle interval not below stale_after", func(c *Config) { c.IdleScrapeInterval = 2 * time.Second },
			[]string{"idle_scrape_interval: 2s: must be below stale_after (2s)"}},
		{"negative idle interval", func(c *Config) { c.IdleScrapeInterval = -1 },
			[]string{"idle_scrape_interval: -1ns: must be positive"}},
		{"alpha above 1", func(c *Config) { c.FidelityAlpha = 1.5 }, []string{"fidelity_alpha: 1.5: must be in (0, 1]"}},
		{"negative alpha", func(c *Config) { c.FidelityAlpha = -0.1 }, []string{"fidelity_alpha: "}},
		{"floor above 1", func(c *Config) { c.FidelityFloor = 2 }, []string{"fidelity_floor: 2: must be in [0, 1]"}},
		{"negative samples, all reported", func(c *Config) { c.FidelityMinSamples = -1; c.FidelityFloor = -1 },
			[]string{"fidelity_min_samples: -1: must not be negative", "fidelity_floor: "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{}
			tt.edit(&c)
			err := c.WithDefaults().Validate()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if n := len(strings.Split(err.Error(), "\n")); n != len(tt.want) {
				t.Errorf("%d errors, want %d: %q", n, len(tt.want), err)
			}
		})
	}
}
