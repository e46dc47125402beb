package events

import (
	"errors"
	"fmt"
	"runtime"
	"time"
)

// Defaults of Config. Workers has no constant: 0 means GOMAXPROCS, read
// when the defaults are applied.
const (
	DefaultQueueSize       = 1024
	DefaultReplayTimeout   = 2 * time.Second
	DefaultReplayBuffer    = 4096
	DefaultBackoffMin      = 100 * time.Millisecond
	DefaultBackoffMax      = 10 * time.Second
	DefaultSilentAfter     = 60 * time.Second
	DefaultResyncQuiet     = 30 * time.Second
	DefaultPollInterval    = time.Second
	DefaultMaxMessageBytes = 64 << 20
)

// Config tunes a Manager. It is the "events" section of kvroute's config
// file; zero fields take the Default* values (WithDefaults).
type Config struct {
	// Workers is the size of the apply pool (0 = GOMAXPROCS). A replica's
	// events are always applied by the same worker, in order.
	Workers int `yaml:"workers"`
	// QueueSize bounds each worker's queue, in batches. A live batch that
	// finds its queue full is counted and resyncs its replica.
	QueueSize int `yaml:"queue_size"`
	// ReplayTimeout bounds every wait for a replay reply.
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// ReplayBuffer bounds the live batches buffered while a replay runs;
	// overflowing it fails the replay.
	ReplayBuffer int `yaml:"replay_buffer"`
	// BackoffMin and BackoffMax bound the reconnect backoff. An unset
	// BackoffMax below a configured BackoffMin takes BackoffMin.
	BackoffMin time.Duration `yaml:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max"`
	// SilentAfter is how long a replica may receive requests without
	// publishing any event before it is flagged silent.
	SilentAfter time.Duration `yaml:"silent_after"`
	// ResyncQuiet is the window of gap-free live events after which a
	// replica that could not be replayed counts as caught up.
	ResyncQuiet time.Duration `yaml:"resync_quiet"`
	// PollInterval is the longest a socket loop waits with nothing to do.
	// Messages, the stream's timers and shutdown wake it sooner; what it
	// bounds is how late the silence flag and a worker-requested resync
	// are noticed (the worker withdraws the replica's credit at once).
	PollInterval time.Duration `yaml:"poll_interval"`
	// MaxMessageBytes bounds one ZMQ message.
	MaxMessageBytes int64 `yaml:"max_message_bytes"`
	// Now is the clock (default time.Now); tests only.
	Now func() time.Time `yaml:"-"`
}

// WithDefaults returns c with every zero field set to its default.
// Negative values are left for Validate to report.
func (c Config) WithDefaults() Config {
	dur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	num := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	num(&c.Workers, runtime.GOMAXPROCS(0))
	num(&c.QueueSize, DefaultQueueSize)
	num(&c.ReplayBuffer, DefaultReplayBuffer)
	dur(&c.ReplayTimeout, DefaultReplayTimeout)
	dur(&c.BackoffMin, DefaultBackoffMin)
	if c.BackoffMax == 0 {
		c.BackoffMax = max(DefaultBackoffMax, c.BackoffMin)
	}
	dur(&c.SilentAfter, DefaultSilentAfter)
	dur(&c.ResyncQuiet, DefaultResyncQuiet)
	dur(&c.PollInterval, DefaultPollInterval)
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate checks a defaulted Config and reports every problem, each
// prefixed with its field's YAML path ("replay_timeout: must be positive").
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	for _, f := range []struct {
		field string
		n     int64
	}{
		{"workers", int64(c.Workers)}, {"queue_size", int64(c.QueueSize)},
		{"replay_buffer", int64(c.ReplayBuffer)}, {"max_message_bytes", c.MaxMessageBytes},
	} {
		if f.n <= 0 {
			bad(f.field, "%d: must be positive", f.n)
		}
	}
	for _, f := range []struct {
		field string
		d     time.Duration
	}{
		{"replay_timeout", c.ReplayTimeout}, {"backoff_min", c.BackoffMin}, {"backoff_max", c.BackoffMax},
		{"silent_after", c.SilentAfter}, {"resync_quiet", c.ResyncQuiet}, {"poll_interval", c.PollInterval},
	} {
		if f.d <= 0 {
			bad(f.field, "%v: must be positive", f.d)
		}
	}
	if c.BackoffMin > 0 && c.BackoffMax > 0 && c.BackoffMax < c.BackoffMin {
		bad("backoff_max", "%v: must not be below backoff_min (%v)", c.BackoffMax, c.BackoffMin)
	}
	return errors.Join(errs...)
}

// normalized is what a Manager runs with: the defaults, and for a value
// Validate would reject the default too (NewManager has no error to
// return; cmd validates the config before building a Manager).
func (c Config) normalized() Config {
	if c.Workers < 0 {
		c.Workers = 0
	}
	if c.QueueSize < 0 {
		c.QueueSize = 0
	}
	if c.ReplayBuffer < 0 {
		c.ReplayBuffer = 0
	}
	if c.MaxMessageBytes < 0 {
		c.MaxMessageBytes = 0
	}
	for _, d := range []*time.Duration{&c.ReplayTimeout, &c.BackoffMin, &c.BackoffMax, &c.SilentAfter, &c.ResyncQuiet, &c.PollInterval} {
		if *d < 0 {
			*d = 0
		}
	}
	c = c.WithDefaults()
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = c.BackoffMin
	}
	return c
}
