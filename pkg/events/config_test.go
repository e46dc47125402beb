package events

import (
	"bytes"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

func TestConfigYAMLKeys(t *testing.T) {
	// The keys kvroute's config file has used for this section.
	doc := `
workers: 3
queue_size: 10
replay_timeout: 3s
replay_buffer: 20
backoff_min: 50ms
backoff_max: 5s
silent_after: 1m
resync_quiet: 10s
poll_interval: 20ms
max_message_bytes: 1024
`
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader([]byte(doc)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	want := Config{
		Workers: 3, QueueSize: 10, ReplayTimeout: 3 * time.Second, ReplayBuffer: 20,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 5 * time.Second, SilentAfter: time.Minute,
		ResyncQuiet: 10 * time.Second, PollInterval: 20 * time.Millisecond, MaxMessageBytes: 1024,
	}
	if c.Now != nil {
		t.Fatal("Now decoded from YAML")
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("decoded %+v, want %+v", c, want)
	}
	if err := c.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.Workers != runtime.GOMAXPROCS(0) || c.QueueSize != DefaultQueueSize || c.ReplayTimeout != DefaultReplayTimeout ||
		c.ReplayBuffer != DefaultReplayBuffer || c.BackoffMin != DefaultBackoffMin || c.BackoffMax != DefaultBackoffMax ||
		c.SilentAfter != DefaultSilentAfter || c.ResyncQuiet != DefaultResyncQuiet ||
		c.PollInterval != DefaultPollInterval || c.MaxMessageBytes != DefaultMaxMessageBytes || c.Now == nil {
		t.Fatalf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// Idempotent, and set fields are kept.
	set := Config{QueueSize: 7, ReplayTimeout: time.Second}.WithDefaults()
	if set.QueueSize != 7 || set.ReplayTimeout != time.Second || set.WithDefaults().QueueSize != 7 {
		t.Fatalf("set fields not kept: %+v", set)
	}
	// An unset maximum never undercuts a configured minimum.
	if c := (Config{BackoffMin: 20 * time.Second}).WithDefaults(); c.BackoffMax != 20*time.Second || c.Validate() != nil {
		t.Fatalf("backoff_max %v, err %v", c.BackoffMax, c.Validate())
	}
}

func TestConfigValidateReportsEveryField(t *testing.T) {
	c := Config{
		Workers: -1, QueueSize: -2, ReplayTimeout: -time.Second, ReplayBuffer: -3,
		BackoffMin: -time.Second, BackoffMax: -time.Second, SilentAfter: -time.Second,
		ResyncQuiet: -time.Second, PollInterval: -time.Second, MaxMessageBytes: -1,
	}.WithDefaults()
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, f := range []string{"workers", "queue_size", "replay_timeout", "replay_buffer", "backoff_min",
		"backoff_max", "silent_after", "resync_quiet", "poll_interval", "max_message_bytes"} {
		if !strings.Contains(err.Error(), "\n"+f+": ") && !strings.HasPrefix(err.Error(), f+": ") {
			t.Errorf("no error for %s in:\n%v", f, err)
		}
	}
	err = Config{BackoffMin: time.Second, BackoffMax: time.Millisecond}.WithDefaults().Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "backoff_max: ") {
		t.Fatalf("max below min: %v", err)
	}
}

func TestNewManagerNormalizesInvalidConfig(t *testing.T) {
	m := NewManager(nil, Config{QueueSize: -1, BackoffMin: time.Second, BackoffMax: time.Millisecond}, nil, nil)
	if m.cfg.QueueSize != DefaultQueueSize || m.cfg.BackoffMax != time.Second {
		t.Fatalf("cfg %+v", m.cfg)
	}
}
